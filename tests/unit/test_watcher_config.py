"""The watcher's settings: what they allow, what follows from them, and that each is the `feedproc
watch` option (and environment variable) of the same name."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import typer.main

from feedproc import WatcherConfig
from feedproc.cli import app
from feedproc.watcher.config import OPTIONS_OTHERWISE, RENAMED, option_of


@pytest.mark.parametrize(
    "settings",
    [{"batch": 0}, {"batch": 1001}, {"batch_wait": -0.1}, {"concurrency": 0}, {"prefetch": 0}],
)
def test_settings_out_of_range_are_refused(settings: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(settings))):
        WatcherConfig(**settings)  # type: ignore[arg-type]


def test_items_are_fetched_ahead_for_every_worker_and_for_four_full_batches() -> None:
    assert WatcherConfig(concurrency=10).effective_prefetch == 200  # at least 200
    assert WatcherConfig(concurrency=100).effective_prefetch == 400  # four per worker
    assert WatcherConfig(concurrency=50, batch=100).effective_prefetch == 400  # four batches of 100
    assert WatcherConfig(concurrency=10, batch=1000).effective_prefetch == 4000


def test_a_prefetch_given_replaces_the_default_far_from_the_database() -> None:
    assert WatcherConfig(concurrency=50, prefetch=800).effective_prefetch == 800
    assert WatcherConfig(concurrency=50, prefetch=20).effective_prefetch == 20  # fewer too: as told


def test_partitions_leased_at_most_default_to_four_per_worker_and_at_least_eight() -> None:
    assert WatcherConfig(concurrency=1).effective_max_partitions == 8
    assert WatcherConfig(concurrency=10).effective_max_partitions == 40
    assert WatcherConfig(concurrency=10, max_partitions=3).effective_max_partitions == 3


# ---------------------------------------------------------------- one name per setting


def watch_options() -> dict[str, Any]:
    """The `feedproc watch` command's options, by each of their flags."""
    command = typer.main.get_command(app).commands["watch"]  # type: ignore[attr-defined]
    return {flag: param for param in command.params for flag in param.opts}


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(WatcherConfig)])
def test_every_setting_is_the_watch_option_and_environment_variable_of_its_name(field: str) -> None:
    flag = option_of(field)
    if flag is None:  # tuning only Python sets, listed as such
        assert field in OPTIONS_OTHERWISE
        return
    option = watch_options()[flag]
    assert not option.hidden
    assert option.envvar == "FEEDPROC_" + flag.removeprefix("--").upper().replace("-", "_")
    # Spelled otherwise only with a unit the field (seconds) does not have, which the flag then says.
    assert option.name == field or (option.name == f"{field}_ms" and flag == f"--{field.replace('_', '-')}-ms")


def test_a_watch_option_spelled_otherwise_is_one_that_names_its_unit() -> None:
    assert {flag for flag in OPTIONS_OTHERWISE.values() if flag is not None} == {"--batch-wait-ms"}


# ---------------------------------------------------------------- the old names, for one release


@pytest.mark.parametrize(("old", "new"), list(RENAMED.items()))
def test_a_setting_given_by_its_old_name_is_taken_with_a_deprecation_warning(old: str, new: str) -> None:
    with pytest.warns(DeprecationWarning, match=f"{old}=.*deprecated.*use {new}="):
        config = WatcherConfig(**{old: 7})  # type: ignore[arg-type]  # an old name: not a field
    assert getattr(config, new) == 7
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated: use {new}"):
        assert getattr(config, old) == 7


@pytest.mark.parametrize(("old", "new"), list(RENAMED.items()))
def test_a_setting_given_by_both_names_is_refused(old: str, new: str) -> None:
    with pytest.warns(DeprecationWarning), pytest.raises(TypeError, match=f"both {old}= and {new}="):
        WatcherConfig(**{old: 7, new: 8})  # type: ignore[arg-type]  # an old name: not a field


def test_the_new_names_warn_of_nothing(recwarn: pytest.WarningsRecorder) -> None:
    config = dataclasses.replace(WatcherConfig(max_partitions=3, prefetch=50), concurrency=2)
    assert (config.max_partitions, config.prefetch, config.concurrency) == (3, 50, 2)
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]
