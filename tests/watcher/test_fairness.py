"""Fair dispatch with real watchers (issue 34), every database: a 5-item partition added while a
400-item one of the same priority is being worked off is served within a few dozen deliveries of
its arrival, not after the 400 (positions 401-405 before), with one watcher and with three; a
higher priority still overtakes."""

from __future__ import annotations

import asyncio
import threading
from contextlib import ExitStack

import pytest

from feedproc import Feed, Item, Processor, Response

from ..support import wait_status, wait_until, watching


class Recording(Processor):
    """Completes each item after a short pause, noting the order of deliveries by partition."""

    def __init__(self, pause: float = 0.01) -> None:
        self.pause = pause
        self.seen: list[str] = []
        self._lock = threading.Lock()

    async def process(self, item: Item) -> Response:
        with self._lock:
            self.seen.append(item.partition)
        await asyncio.sleep(self.pause)
        return Response(done=True)

    def delivered(self) -> int:
        with self._lock:
            return len(self.seen)


def positions(processor: Recording, key: str) -> list[int]:
    with processor._lock:
        return [n for n, partition in enumerate(processor.seen) if partition == key]


@pytest.mark.parametrize("watchers", [1, 3])
def test_a_small_partition_is_not_served_after_a_big_ones_backlog(db_url: str, feed: Feed, watchers: int) -> None:
    processor = Recording()
    feed.add_partition("big", [(0, b"{}")] * 400)
    with ExitStack() as running:
        for _ in range(watchers):
            running.enter_context(watching(db_url, processor, concurrency=4))
        wait_until(lambda: processor.delivered() >= 40, what="the big partition under way")
        feed.add_partition("small", [(0, b"{}")] * 5)
        arrived = processor.delivered()
        wait_status(feed, "small", "complete")
        served = positions(processor, "small")
        assert len(served) == 5
        # Before: all of the big partition's backlog first (the small one's at 401-405).
        assert served[-1] - arrived <= 100, (arrived, served)
        assert positions(processor, "big")[-1] > served[-1], "the big partition was still being worked off"
        wait_status(feed, "big", "complete", timeout=60)


def test_a_higher_priority_partition_overtakes_a_lower_ones_backlog(db_url: str, feed: Feed) -> None:
    processor = Recording()
    feed.add_partition("low", [(0, b"{}")] * 300)
    with watching(db_url, processor, concurrency=4):
        wait_until(lambda: processor.delivered() >= 40, what="the low partition under way")
        feed.add_partition("urgent", [(0, b"{}")] * 20, priority=10)
        arrived = processor.delivered()
        wait_status(feed, "urgent", "complete")
        served = positions(processor, "urgent")
        assert served[-1] - arrived <= 100, (arrived, served)
        low_meanwhile = [n for n in positions(processor, "low") if served[0] < n < served[-1]]
        assert len(low_meanwhile) <= 8, low_meanwhile  # only what was already running or fetched into a batch
        wait_status(feed, "low", "complete", timeout=60)
