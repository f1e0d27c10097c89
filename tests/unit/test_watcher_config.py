"""The watcher's settings: what they allow, and what follows from them."""

from __future__ import annotations

import pytest

from feedproc import WatcherConfig


@pytest.mark.parametrize(
    "settings",
    [{"batch": 0}, {"batch": 1001}, {"batch_wait": -0.1}, {"concurrency": 0}, {"fetch_ahead": 0}],
)
def test_settings_out_of_range_are_refused(settings: dict[str, float]) -> None:
    name = next(iter(settings))
    with pytest.raises(ValueError, match="prefetch" if name == "fetch_ahead" else name):
        WatcherConfig(**settings)  # type: ignore[arg-type]


def test_items_are_fetched_ahead_for_every_worker_and_for_four_full_batches() -> None:
    assert WatcherConfig(concurrency=10).prefetch == 200  # at least 200
    assert WatcherConfig(concurrency=100).prefetch == 400  # four per worker
    assert WatcherConfig(concurrency=50, batch=100).prefetch == 400  # four batches of 100
    assert WatcherConfig(concurrency=10, batch=1000).prefetch == 4000


def test_a_prefetch_given_replaces_the_default_far_from_the_database() -> None:
    assert WatcherConfig(concurrency=50, fetch_ahead=800).prefetch == 800
    assert WatcherConfig(concurrency=50, fetch_ahead=20).prefetch == 20  # fewer too: as told
