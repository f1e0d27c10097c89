"""Partition limits with a real watcher (issue 34), every database: a partition's own, its queue's
and its pipeline gate's `partition_limit` bound its items in flight at once, exactly (the watcher
that leases a partition alone delivers its items), while other partitions use the rest of the
watcher's concurrency; the smallest limit that applies wins."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

from feedproc import Feed, Item, Processor, Response
from feedproc.core.pipelines import parse_toml

from ..support import wait_status, wait_until, watching


class Meter(Processor):
    """Completes each item after a short pause, keeping the peak of calls in flight at once per
    (partition, gate)."""

    def __init__(self, pause: float = 0.03) -> None:
        self.pause = pause
        self._lock = threading.Lock()
        self._now: Counter[tuple[str, int]] = Counter()
        self.peak: Counter[tuple[str, int]] = Counter()

    async def process(self, item: Item) -> Response:
        where = (item.partition, item.gate)
        with self._lock:
            self._now[where] += 1
            self.peak[where] = max(self.peak[where], self._now[where])
        await asyncio.sleep(self.pause)
        with self._lock:
            self._now[where] -= 1
        return Response(done=True)


def test_a_partitions_own_limit_holds_while_another_partition_uses_the_rest(db_url: str, feed: Feed) -> None:
    meter = Meter()
    feed.add_partition("limited", [(0, b"{}")] * 40, partition_limit=2)
    feed.add_partition("free", [(0, b"{}")] * 40)
    with watching(db_url, meter, concurrency=8):
        wait_status(feed, "limited", "complete")
        wait_status(feed, "free", "complete")
    assert meter.peak[("limited", 0)] == 2
    assert meter.peak[("free", 0)] > 2


def test_a_queues_partition_limit_holds_for_each_of_its_partitions(db_url: str, feed: Feed) -> None:
    meter = Meter()
    feed.set_queue("default", partition_limit=3)
    for key in ("a", "b"):
        feed.add_partition(key, [(0, b"{}")] * 30)
    with watching(db_url, meter, concurrency=10):
        for key in ("a", "b"):
            wait_status(feed, key, "complete")
    assert meter.peak[("a", 0)] == 3 and meter.peak[("b", 0)] == 3


def test_the_smallest_limit_that_applies_wins(db_url: str, feed: Feed) -> None:
    meter = Meter()
    feed.set_queue("default", partition_limit=4)
    feed.add_partition("tight", [(0, b"{}")] * 20, partition_limit=1)
    feed.add_partition("loose", [(0, b"{}")] * 30, partition_limit=9)
    with watching(db_url, meter, concurrency=10):
        wait_status(feed, "tight", "complete")
        wait_status(feed, "loose", "complete")
    assert meter.peak[("tight", 0)] == 1
    assert meter.peak[("loose", 0)] == 4


PIPELINE = """
queue = "default"
[[gate]]
name = "ocr"
number = 0
partition_limit = 2
[[gate]]
name = "rank"
number = 1
"""


def test_a_pipeline_gates_partition_limit_holds_at_that_gate_only(db_url: str, feed: Feed) -> None:
    meter = Meter()
    feed.apply_pipeline(parse_toml(PIPELINE))
    feed.add_partition("upload", [(0, b"{}")] * 20 + [(1, b"{}")] * 20)
    with watching(db_url, meter, concurrency=8):
        wait_status(feed, "upload", "complete")
    assert meter.peak[("upload", 0)] == 2
    assert meter.peak[("upload", 1)] > 2


def test_a_limited_partitions_waiting_items_neither_pile_up_nor_hold_up_the_others(db_url: str, feed: Feed) -> None:
    """A partition at its limit is not fetched from (its backlog does not pile up in the buffer and
    in its in-flight record), and what it has buffered does not count as the buffer being full:
    another partition's 300 items are fetched and done while its two calls hold."""
    release = threading.Event()
    holding: Counter[str] = Counter()

    class HoldsBig(Processor):
        async def process(self, item: Item) -> Response:
            holding[item.partition] += 1
            while item.partition == "big" and not release.is_set():
                await asyncio.sleep(0.01)
            return Response(done=True)

    feed.add_partition("big", [(0, b"{}")] * 500, partition_limit=2)
    with watching(db_url, HoldsBig(), concurrency=4, prefetch=20) as running:
        try:
            # Alone, it takes the whole first fetch: 2 calls, 18 items waiting for them.
            wait_until(lambda: holding["big"] == 2, what="the big partition's two calls")
            feed.add_partition("free", [(0, b"{}")] * 300)
            wait_status(feed, "free", "complete", timeout=60)
            held = [item for item in running.watcher._flight.items.values() if item.partition == "big"]
            assert 2 <= len(held) <= 20, len(held)  # its first share of a 20-item fetch at most
        finally:
            release.set()
        wait_status(feed, "big", "complete", timeout=60)
