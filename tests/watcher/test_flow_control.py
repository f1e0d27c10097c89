"""Flow control with real watchers (issue 34), every database: a queue's group limit holds exactly
across three watchers while other groups use the rest; a pipeline gate's holds at that gate; a
rate shared by three watchers and a pull worker holds within a few percent of its rate over 30
seconds; a rate-limited gate does not hold up another gate."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from contextlib import ExitStack

import pytest

from feedproc import Feed, Item, Processor, Response
from feedproc.core.pipelines import parse_toml

from ..support import wait_status, wait_until, watching


class Meter(Processor):
    """Completes each item after a short pause, keeping per (group, gate) the peak of calls in
    flight at once (across every watcher that shares it), and when each call started."""

    def __init__(self, groups: dict[str, str], pause: float = 0.02) -> None:
        self.groups, self.pause = groups, pause  # partition key -> group
        self._lock = threading.Lock()
        self._now: Counter[tuple[str, int]] = Counter()
        self.peak: Counter[tuple[str, int]] = Counter()
        self.starts: list[tuple[float, str, int]] = []

    async def process(self, item: Item) -> Response:
        where = (self.groups.get(item.partition, ""), item.gate)
        with self._lock:
            self._now[where] += 1
            self.peak[where] = max(self.peak[where], self._now[where])
            self.starts.append((time.monotonic(), item.partition, item.gate))
        await asyncio.sleep(self.pause)
        with self._lock:
            self._now[where] -= 1
        return Response(done=True)


def add_tenants(
    feed: Feed, tenants: dict[str, int], items: int, gate: int = 0, queue: str = "default"
) -> dict[str, str]:
    """`tenants[name]` partitions of `items` items each per tenant; partition key -> group."""
    groups = {}
    for tenant, partitions in tenants.items():
        for n in range(partitions):
            key = f"{tenant}-{n}"
            feed.add_partition(key, [(gate, b"{}")] * items, queue=queue, group=tenant)
            groups[key] = tenant
    return groups


def test_a_group_limit_holds_exactly_across_three_watchers(db_url: str, feed: Feed) -> None:
    feed.set_queue("default", group_limit=3)
    meter = Meter(add_tenants(feed, {"acme": 6, "globex": 2}, items=25))
    with ExitStack() as running:
        for _ in range(3):
            running.enter_context(watching(db_url, meter, concurrency=6))
        for key in meter.groups:
            wait_status(feed, key, "complete", timeout=90)
    assert meter.peak[("acme", 0)] == 3
    assert meter.peak[("globex", 0)] == 3


def test_other_groups_use_the_slots_a_full_group_cannot(db_url: str, feed: Feed) -> None:
    """acme's 200 items wait behind its limit of 2; globex's 40 are done meanwhile, not after."""
    feed.set_queue("default", group_limit=2)
    meter = Meter(add_tenants(feed, {"acme": 2}, items=100), pause=0.05)
    with watching(db_url, meter, concurrency=8):
        wait_until(lambda: len(meter.starts) >= 4, what="acme under way")
        meter.groups.update(add_tenants(feed, {"globex": 1}, items=40))
        wait_status(feed, "globex-0", "complete", timeout=60)
        acme_done = sum(feed.status(f"acme-{n}").items.get("complete", 0) for n in range(2))
        assert acme_done < 150, acme_done  # globex did not wait for acme's backlog
        for n in range(2):
            wait_status(feed, f"acme-{n}", "complete", timeout=90)
    assert meter.peak[("acme", 0)] == 2


PIPELINE = """
queue = "default"
[[gate]]
name = "ocr"
number = 0
group_limit = 2
[[gate]]
name = "rank"
number = 1
"""


def test_a_pipeline_gates_group_limit_holds_at_that_gate_only(db_url: str, feed: Feed) -> None:
    feed.apply_pipeline(parse_toml(PIPELINE))
    groups = add_tenants(feed, {"acme": 3}, items=15)
    groups |= add_tenants(feed, {"beta": 3}, items=15, gate=1)
    meter = Meter(groups)
    with ExitStack() as running:
        for _ in range(2):
            running.enter_context(watching(db_url, meter, concurrency=8))
        for key in groups:
            wait_status(feed, key, "complete", timeout=90)
    assert meter.peak[("acme", 0)] == 2
    assert meter.peak[("beta", 1)] > 2


def test_a_rate_limited_gate_does_not_hold_up_another_gate(db_url: str, feed: Feed) -> None:
    feed.apply_pipeline(
        parse_toml(
            'queue = "default"\n[[gate]]\nname = "ocr"\nnumber = 0\nrate = "2/s"\n[[gate]]\nname = "rank"\nnumber = 1\n'
        )
    )
    feed.add_partition("slow", [(0, b"{}")] * 50)
    feed.add_partition("fast", [(1, b"{}")] * 200)
    meter = Meter({})
    began = time.monotonic()
    with watching(db_url, meter, concurrency=8):
        wait_status(feed, "fast", "complete", timeout=60)
        took = time.monotonic() - began
        started_slow = sum(1 for _, key, _ in meter.starts if key == "slow")
    assert took < 20, took  # not behind the slow gate's 50 items at 2/s (25 s)
    assert started_slow <= 2 + 2 * took + 1, (started_slow, took)  # its burst, then 2 a second


@pytest.mark.slow
def test_a_shared_rate_holds_across_three_watchers_and_a_pull_worker_over_15_seconds(db_url: str, feed: Feed) -> None:
    """40 items a second, shared by a push queue's three watchers and a pull queue's worker:
    between 3 s and 18 s after the start (past the first burst) 600 items start, within 5%. (It was
    20 a second over 30 s: the same 600 items and tolerance, at half the full tier's 105 s.)"""
    rate, window = 40.0, 15.0
    feed.set_rate("ocr-api", rate)
    feed.set_queue("pushed", rate="ocr-api")
    feed.set_queue("pulled", mode="pull", rate="ocr-api")
    for n in range(4):
        feed.add_partition(f"p{n}", [(0, b"{}")] * 250, queue="pushed")
    feed.add_partition("q", [(0, b"{}")] * 1000, queue="pulled")
    meter = Meter({})
    stop = threading.Event()

    def pull_worker() -> None:
        while not stop.is_set():
            claimed = feed.claim("pulled", "worker-1", max_items=5)
            for entry in claimed:
                with meter._lock:
                    meter.starts.append((time.monotonic(), entry["partition"], entry["gate"]))
                feed.answer(entry["id"], entry["token"], Response(done=True))
            if not claimed:
                stop.wait(0.02)

    worker = threading.Thread(target=pull_worker, daemon=True)
    started = time.monotonic()
    with ExitStack() as running:
        for _ in range(3):
            running.enter_context(watching(db_url, meter, queue="pushed", concurrency=8))
        worker.start()
        try:
            wait_until(lambda: time.monotonic() - started > window + 4, timeout=window + 30, every=0.5)
        finally:
            stop.set()
            worker.join(10)
    with meter._lock:
        times = [at - started for at, _, _ in meter.starts]
        pulled = sum(1 for _, key, _ in meter.starts if key == "q")
    inside = sum(1 for at in times if 3.0 <= at < 3.0 + window)
    assert abs(inside - rate * window) <= 0.05 * rate * window, inside
    assert pulled > 0 and len(times) - pulled > 0, "both kinds of consumer drew from the shared rate"
