"""What a watcher tells the dashboard (every database): a delivery still running at a heartbeat
shows in the running view with its elapsed time, and the watcher's throughput reaches the charts."""

from __future__ import annotations

import asyncio

from feedproc import Feed, Item, Processor, Response

from ..support import wait_until, watching


class Held(Processor):
    """Holds every item until released; completes the rest at once."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def process(self, item: Item) -> Response:
        if item.data == b'"slow"':
            while not self.release.is_set():
                await asyncio.sleep(0.02)
        return Response(done=True)


def test_a_slow_delivery_shows_as_running_with_elapsed_time_then_leaves(db_url: str, feed: Feed) -> None:
    processor = Held()
    feed.add_partition("p", [(0, b'"slow"'), (0, b'"quick"')])
    with watching(db_url, processor, lease_seconds=1.5) as watcher:  # a heartbeat every 0.5 s
        (row,) = wait_until(
            lambda: [r for r in feed.running() if r.elapsed is not None] or None, what="the elapsed time"
        )
        assert (row.partition, row.by, row.via) == ("p", watcher.id, "watcher")
        processor.release.set()
        wait_until(lambda: feed.status("p").status == "complete", what="the partition to complete")
        assert feed.running() == []


def test_a_watcher_s_throughput_reaches_the_charts_with_its_heartbeat(db_url: str, feed: Feed) -> None:
    feed.add_partition("p", [(0, b"1"), (0, b"2"), (0, b"3")])
    processor = Held()
    with watching(db_url, processor, lease_seconds=1.5):
        wait_until(lambda: sum(b.completed for b in feed.throughput().buckets) == 3, what="3 completions counted")
    buckets = feed.throughput().buckets
    assert sum(b.completed for b in buckets) == 3 and sum(b.added for b in buckets) == 3
