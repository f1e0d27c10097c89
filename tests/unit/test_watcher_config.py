"""The watcher's settings: what they allow, and what follows from them."""

from __future__ import annotations

import pytest

from feedproc import WatcherConfig


@pytest.mark.parametrize("settings", [{"batch": 0}, {"batch": 1001}, {"batch_wait": -0.1}, {"concurrency": 0}])
def test_settings_out_of_range_are_refused(settings: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(settings))):
        WatcherConfig(**settings)  # type: ignore[arg-type]


def test_items_are_fetched_ahead_for_every_worker_and_for_four_full_batches() -> None:
    assert WatcherConfig(concurrency=10).prefetch == 200  # at least 200
    assert WatcherConfig(concurrency=100).prefetch == 400  # four per worker
    assert WatcherConfig(concurrency=50, batch=100).prefetch == 400  # four batches of 100
    assert WatcherConfig(concurrency=10, batch=1000).prefetch == 4000
