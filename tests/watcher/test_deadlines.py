"""Deadlines and bounded waiting with a real processor (every database): a handler that never stops
answering "not yet" fails its item at the gate's `max_not_yet`; a partition past its deadline fails,
its call in flight cancelled."""

from __future__ import annotations

import asyncio
import threading

from feedproc import Feed, Item, Processor, Response

from ..support import wait_status, watching


class NeverReady(Processor):
    """Answers "not yet" to every delivery, noting each one's attempt and delivery number."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    async def process(self, item: Item) -> Response:
        self.seen.append((item.attempt, item.deliveries))
        return Response(gate=item.gate, retry_after=0)


def test_a_processor_that_only_answers_not_yet_fails_its_item_at_max_not_yet(db_url: str, feed: Feed) -> None:
    processor = NeverReady()
    feed.add_partition("waits", [(0, b"{}")])
    with watching(db_url, processor, max_not_yet=4):
        final = wait_status(feed, "waits", "failed", timeout=10)
    assert processor.seen == [(1, 1), (1, 2), (1, 3), (1, 4)]
    [item] = feed.items("waits")
    assert item.last_error == "not yet answered 4 times (max_not_yet 4)"
    assert final.status == "failed"


class Hangs(Processor):
    """Calls for partition "late" hang until cancelled (and say so); any other item completes at once."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.cancelled = threading.Event()

    async def process(self, item: Item) -> Response:
        if item.partition != "late":
            return Response(done=True)
        self.started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return Response(done=True)


def test_a_partition_past_its_deadline_fails_and_its_call_in_flight_is_cancelled(db_url: str, feed: Feed) -> None:
    processor = Hangs()
    with watching(db_url, processor) as running:
        feed.add_partition("warm-up", [(0, b"{}")])  # the watcher is at work: the deadline is not spent starting it
        wait_status(feed, "warm-up", "complete")
        feed.add_partition("late", [(0, b"{}"), (1, b"{}")], deadline=1.0)
        assert processor.started.wait(10)
        final = wait_status(feed, "late", "failed", timeout=10)
        assert processor.cancelled.wait(10), "the call was not cancelled"
        assert running.watcher.fatal is None
    assert [(i.status, i.last_error) for i in feed.items("late")] == [("cancelled", "deadline exceeded")] * 2
    assert final.schedule.deadline is not None
