"""The in-process Watcher against real databases: dispatch, gates, retries, leases, steals, shutdown.

Each watcher runs `Watcher.run()` on its own event loop in a background thread (`watching`), so a
test can read the database with the plain `Feed` API and wait on it with a deadline. Processors are
defined here; they record when each delivery started and ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import make_url, select, text, update

from feedproc import Feed, Item, PermanentError, Processor, Response
from feedproc.store import Store
from feedproc.store.foundations import db_now, seconds_from_now
from feedproc.store.schema import items, partitions

from ..support import WatcherThread, history_of, lease_of, wait_status, wait_until, watching

# ---------------------------------------------------------------- running a watcher in a thread


# ---------------------------------------------------------------- recording deliveries


@dataclass
class Call:
    item_id: int
    partition: str
    gate: int
    attempt: int
    data: Any
    watcher: str
    start: float  # time.time()
    end: float | None = None

    @property
    def ended(self) -> float:
        """When the call returned: the calls a test compares have all returned."""
        assert self.end is not None, f"call of item {self.item_id} still running"
        return self.end


class Recorder:
    """Thread-safe log of the deliveries processors saw."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[Call] = []
        self.active = 0
        self.peak = 0

    def begin(self, item: Item, watcher: str = "") -> Call:
        try:
            data = item.json()
        except ValueError:
            data = item.data
        call = Call(item.id, item.partition, item.gate, item.attempt, data, watcher, time.time())
        with self.lock:
            self.calls.append(call)
            self.active += 1
            self.peak = max(self.peak, self.active)
        return call

    def end(self, call: Call) -> None:
        with self.lock:
            call.end = time.time()
            self.active -= 1

    @contextlib.contextmanager
    def delivery(self, item: Item, watcher: str = "") -> Iterator[Call]:
        call = self.begin(item, watcher)
        try:
            yield call
        finally:
            self.end(call)

    def of(self, partition: str | None = None, gate: int | None = None) -> list[Call]:
        with self.lock:
            return [
                c
                for c in self.calls
                if (partition is None or c.partition == partition) and (gate is None or c.gate == gate)
            ]

    def per_item(self) -> Counter[int]:
        with self.lock:
            return Counter(c.item_id for c in self.calls)


def js(value: Any) -> bytes:
    return json.dumps(value).encode()


# ---------------------------------------------------------------- fan-out, fan-in


class FanOut(Processor):
    """gate 0: spawn `width` children at gate 1 and move to gate 2; children: done; gate 2: done."""

    def __init__(self, recorder: Recorder, width: int) -> None:
        self.recorder = recorder
        self.width = width

    async def process(self, item: Item) -> Response:
        with self.recorder.delivery(item):
            data = item.json()
            if data.get("root") and item.gate == 0:
                children = [(1, js({"child": n})) for n in range(self.width)]
                return Response(gate=2, data=js({"root": True, "spawned": self.width}), items=children)
            if data.get("root"):
                return Response(done=True)
            await asyncio.sleep(0.05 + 0.04 * (data["child"] % 4))  # children finish at different times
            return Response(done=True)


@pytest.mark.smoke  # the fast tier's database smoke
def test_fan_out_children_then_fan_in_behind_the_gate_barrier(db_url: str, feed: Feed) -> None:
    feed.add_partition("fan", items=[(0, js({"root": True}))])
    recorder = Recorder()
    with watching(db_url, FanOut(recorder, width=6), concurrency=8):
        final = wait_status(feed, "fan", "complete")

    assert final.items["total"] == 7
    assert final.items["complete"] == 7
    assert final.gate == 2
    root_first, children, root_last = recorder.of(gate=0), recorder.of(gate=1), recorder.of(gate=2)
    assert len(root_first) == 1 and len(root_last) == 1
    assert sorted(c.data["child"] for c in children) == list(range(6))
    assert root_last[0].data == {"root": True, "spawned": 6}  # the data stored with the gate move
    # The barrier: no item at gate g+1 starts before every item at gate g has finished.
    assert min(c.start for c in children) >= root_first[0].ended
    assert root_last[0].start >= max(c.ended for c in children)


# ---------------------------------------------------------------- "not yet"


class NotYetTwice(Processor):
    def __init__(self, recorder: Recorder, retry_after: float) -> None:
        self.recorder = recorder
        self.retry_after = retry_after

    async def process(self, item: Item) -> Response:
        with self.recorder.delivery(item):
            asked = item.json()["asked"]
            if asked < 2:
                return Response(gate=item.gate, data=js({"asked": asked + 1}), retry_after=self.retry_after)
            return Response(done=True)


def test_not_yet_answer_reasks_after_retry_after_and_is_not_a_failure(db_url: str, feed: Feed) -> None:
    feed.add_partition("later", items=[(0, js({"asked": 0}))])
    recorder = Recorder()
    with watching(db_url, NotYetTwice(recorder, retry_after=0.4), retry_delay=5.0, max_attempts=2):
        wait_status(feed, "later", "complete")

    calls = recorder.of("later")
    assert [c.attempt for c in calls] == [1, 1, 1]  # attempts stayed 0: a "not yet" is not a failure
    assert [c.data["asked"] for c in calls] == [0, 1, 2]  # the data given with "not yet" was stored
    for before, after in itertools.pairwise(calls):
        assert after.start - before.ended >= 0.4 - 0.01
    assert history_of(feed, "later", "item_retried") == []


# ---------------------------------------------------------------- transient and permanent failures


class Flaky(Processor):
    """A plain-def processor that raises on its first `failures` attempts of each item."""

    def __init__(self, recorder: Recorder, failures: int) -> None:
        self.recorder = recorder
        self.failures = failures

    def process(self, item: Item) -> Response:
        with self.recorder.delivery(item):
            if item.attempt <= self.failures:
                raise ValueError(f"flaky on attempt {item.attempt}")
            return Response(done=True)


def test_exception_is_a_transient_failure_retried_with_backoff_then_success(db_url: str, feed: Feed) -> None:
    feed.add_partition("flaky", items=[(0, js({}))])
    recorder = Recorder()
    with watching(db_url, Flaky(recorder, failures=2), retry_delay=0.2, max_attempts=5):
        final = wait_status(feed, "flaky", "complete")

    calls = recorder.of("flaky")
    assert [c.attempt for c in calls] == [1, 2, 3]
    assert calls[1].start - calls[0].ended >= 0.2 - 0.01
    assert calls[2].start - calls[1].ended >= 0.4 - 0.01
    assert final.failed_items == ()
    retried = history_of(feed, "flaky", "item_retried")
    assert [e.detail["attempts"] for e in retried] == [1, 2]
    assert retried[0].detail["error"] == "ValueError: flaky on attempt 1"


def test_running_out_of_attempts_fails_the_item_with_its_last_error(db_url: str, feed: Feed) -> None:
    feed.add_partition("hopeless", items=[(0, js({}))])
    recorder = Recorder()
    with watching(db_url, Flaky(recorder, failures=100), retry_delay=0.02, max_attempts=3):
        final = wait_status(feed, "hopeless", "failed")

    assert [c.attempt for c in recorder.of("hopeless")] == [1, 2, 3]
    [failed] = final.failed_items
    assert failed.attempts == 3
    assert failed.last_error == "ValueError: flaky on attempt 3"


class Strict(Processor):
    """Fails items whose data says `ok: false` permanently, until `fixed` is set."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.fixed = threading.Event()

    async def process(self, item: Item) -> Response:
        with self.recorder.delivery(item):
            if not item.json()["ok"] and not self.fixed.is_set():
                raise PermanentError("bad input: not ok")
            return Response(done=True)


def test_permanent_error_fails_item_and_partition_and_retry_then_completes(db_url: str, feed: Feed) -> None:
    feed.add_partition("strict", items=[(0, js({"ok": False})), (0, js({"ok": True})), (1, js({"ok": True}))])
    recorder = Recorder()
    processor = Strict(recorder)
    with watching(db_url, processor, max_attempts=5):
        failed = wait_status(feed, "strict", "failed")
        assert failed.gate == 0
        assert [(f.gate, f.attempts, f.last_error) for f in failed.failed_items] == [(0, 1, "bad input: not ok")]
        assert failed.items == {"total": 3, "available": 1, "complete": 1, "failed": 1, "cancelled": 0}
        assert recorder.of("strict", gate=1) == []  # the failed gate holds the partition back
        assert len(recorder.of("strict", gate=0)) == 2  # one delivery each: no retry of a permanent failure

        processor.fixed.set()
        assert feed.retry("strict") == 1
        final = wait_status(feed, "strict", "complete")

    assert final.items["complete"] == 3
    assert final.failed_items == ()
    assert len(recorder.of("strict", gate=1)) == 1
    assert Counter(c.data["ok"] for c in recorder.of("strict", gate=0)) == {False: 2, True: 1}


# ---------------------------------------------------------------- dispatch


class Slow(Processor):
    def __init__(self, recorder: Recorder, seconds: float, name: str = "") -> None:
        self.recorder = recorder
        self.seconds = seconds
        self.name = name

    async def process(self, item: Item) -> Response:
        with self.recorder.delivery(item, self.name):
            data = item.json()
            await asyncio.sleep(self.seconds + 0.05 * data.get("n", 0) if isinstance(data, dict) else self.seconds)
            return Response(done=True)


def test_an_item_in_flight_is_never_dispatched_twice(db_url: str, feed: Feed) -> None:
    for key in ("slow-a", "slow-b"):
        feed.add_partition(key, items=[(0, js({"n": n})) for n in range(5)])
    recorder = Recorder()
    # Far more workers than items and a fast poll: every item is in flight across many polls.
    with watching(db_url, Slow(recorder, 0.3), concurrency=30, poll_interval=0.02):
        wait_status(feed, "slow-a", "complete")
        wait_status(feed, "slow-b", "complete")

    per_item = recorder.per_item()
    assert len(per_item) == 10
    assert set(per_item.values()) == {1}, per_item


class Counting(Processor):
    """A plain-def processor: sleeps a little and counts how many run at once."""

    def __init__(self, recorder: Recorder, seconds: float) -> None:
        self.recorder = recorder
        self.seconds = seconds

    def process(self, item: Item) -> Response:
        with self.recorder.delivery(item):
            time.sleep(self.seconds)
            return Response(done=True)


def test_concurrency_bounds_simultaneous_process_calls(db_url: str, feed: Feed) -> None:
    for n in range(3):
        feed.add_partition(f"busy-{n}", items=[(0, js({"n": i})) for i in range(5)])
    recorder = Recorder()
    with watching(db_url, Counting(recorder, 0.1), concurrency=3):
        for n in range(3):
            wait_status(feed, f"busy-{n}", "complete")

    assert len(recorder.calls) == 15
    assert recorder.peak == 3


def test_partitions_are_served_by_priority_then_age_and_items_oldest_first(db_url: str, feed: Feed) -> None:
    for key, priority in (("low", 0), ("high", 5), ("mid-old", 1), ("mid-new", 1)):
        feed.add_partition(key, items=[(0, js({"key": key, "n": n})) for n in range(2)], priority=priority)
    recorder = Recorder()
    with watching(db_url, Slow(recorder, 0.01), concurrency=1):
        wait_status(feed, "low", "complete")

    order = [(c.partition, c.data["n"]) for c in recorder.calls]
    assert order == [(key, n) for key in ("high", "mid-old", "mid-new", "low") for n in range(2)]


class NotYetForHours(Processor):
    """Answers "not yet, ask again in an hour" for partitions named wait-*, done for the rest."""

    async def process(self, item: Item) -> Response:
        if item.partition.startswith("wait-"):
            return Response(gate=item.gate, retry_after=3600)
        return Response(done=True)


def test_a_watcher_full_of_waiting_partitions_still_serves_ready_ones(db_url: str, feed: Feed) -> None:
    feed.add_partition("wait-1", items=[(0, b"{}")], priority=5)
    feed.add_partition("wait-2", items=[(0, b"{}")], priority=5)
    feed.add_partition("ready", items=[(0, b"{}")])
    with watching(db_url, NotYetForHours(), max_partitions=2):
        wait_status(feed, "ready", "complete", timeout=15)
        waiting = wait_status(feed, "wait-1", "available", history=50)
    assert waiting.items["available"] == 1 and waiting.failed_items == ()
    assert any(e.kind == "released" for e in waiting.history or ())


# ---------------------------------------------------------------- leases


class Gated(Processor):
    """A plain-def processor that holds deliveries of partition `held` until `release` is set."""

    def __init__(self, recorder: Recorder, held: str) -> None:
        self.recorder = recorder
        self.held = held
        self.release = threading.Event()

    def process(self, item: Item) -> Response:
        with self.recorder.delivery(item):
            if item.partition == self.held:
                self.release.wait(20)
            return Response(done=True)


def test_lost_lease_late_answer_changes_nothing_and_partition_is_no_longer_dispatched(
    db_url: str, feed: Feed, store: Store
) -> None:
    feed.add_partition("taken", items=[(0, js({"n": n})) for n in range(3)])
    recorder = Recorder()
    processor = Gated(recorder, "taken")
    # Capacity 1: holding "taken", the first watcher leases nothing more, so it cannot re-lease its own
    # expired lease between the test's expiry and the thief's acquire (two transactions).
    with watching(db_url, processor, concurrency=1, max_partitions=1) as first:
        wait_until(lambda: recorder.of("taken"), what="the first item in flight")

        def take_over() -> list[Any]:
            # The first watcher stalled past its lease: expire it, then another watcher leases the partition.
            with store.write() as conn:
                conn.execute(
                    update(partitions).where(partitions.c.key == "taken").values(lease_expires_at=seconds_from_now(-1))
                )
            return store.acquire("thief", "default", 10, 60.0)

        [lease] = wait_until(take_over, what="the takeover")
        wait_until(lambda: lease.partition_id not in first.watcher.owned, what="the first watcher to notice")
        processor.release.set()  # the late answer: done

        # Another partition is served end to end: the first watcher has polled, flushed and fetched since.
        feed.add_partition("after", items=[(0, js({"n": 0}))])
        wait_status(feed, "after", "complete")
        wait_until(lambda: not first.watcher.inflight, what="the late answer to be flushed")

    taken = feed.status("taken", history=100)
    assert taken.status == "available"
    assert taken.items["complete"] == 0  # the late "done" was discarded
    assert taken.items["available"] == 3
    assert lease_of(taken).owner == "thief"
    assert [e.kind for e in taken.history or () if e.kind in ("completed", "item_retried", "item_failed")] == []
    assert len(recorder.of("taken")) == 1  # never dispatched again by the first watcher
    with store.read() as conn:
        states = conn.execute(
            select(items.c.status, items.c.attempts, items.c.version).where(items.c.partition_id == lease.partition_id)
        ).all()
    assert sorted(states) == [("available", 0, 0)] * 3


def add_partitions(feed: Feed, prefix: str, count: int, size: int) -> list[str]:
    """`count` partitions of `size` items each ({"n": 0}); their keys."""
    keys = [f"{prefix}-{n:02d}" for n in range(count)]
    for key in keys:
        feed.add_partition(key, items=[(0, js({"n": 0})) for _ in range(size)])
    return keys


def wait_all_leased_by(feed: Feed, keys: list[str], watcher: WatcherThread) -> None:
    wait_until(
        lambda: all(getattr(feed.status(k).lease, "owner", None) == watcher.id for k in keys),
        what=f"watcher {watcher.id} to lease every partition",
    )


def test_cooperative_steal_gives_the_second_watcher_a_share_without_double_delivery(db_url: str, feed: Feed) -> None:
    # 80 items of 0.25 s at 4 at a time: ~5 s of work for the first alone, time enough for the
    # second to start and take a share on a loaded machine (with 3 items each the first could
    # finish them all before the second had started).
    keys = add_partitions(feed, "steal", 10, 8)
    recorder = Recorder()
    # Leases of 10 s, not 3: on a loaded machine (CI, SQLite) the first's heartbeat once missed 3 s,
    # its leases lapsed mid-delivery and the second delivered those items again, as it must then.
    with watching(db_url, Slow(recorder, 0.25, "first"), concurrency=4, lease_seconds=10) as first:
        wait_all_leased_by(feed, keys, first)
        with watching(db_url, Slow(recorder, 0.25, "second"), concurrency=4, lease_seconds=10):
            for key in keys:
                wait_status(feed, key, "complete")

    per_item = recorder.per_item()
    assert len(per_item) == 80
    assert set(per_item.values()) == {1}, "an item was delivered twice"
    by_second = {c.partition for c in recorder.calls if c.watcher == "second"}
    assert len(by_second) >= 2, f"the second watcher only served {sorted(by_second)}"
    stolen = [k for k in keys if history_of(feed, k, "stolen")]
    assert by_second <= set(stolen)  # it got them by steal / hand-over: all were leased before it started
    # A partition changes hands only once its in-flight items have finished.
    for key in stolen:
        firsts = [c for c in recorder.of(key) if c.watcher == "first"]
        seconds = [c for c in recorder.of(key) if c.watcher == "second"]
        if firsts and seconds:
            assert max(c.ended for c in firsts) <= min(c.start for c in seconds)


@pytest.mark.postgres_only  # the hand-over's notification wakes the thief; SQLite has only polling
def test_a_handed_over_partition_is_served_at_once_not_at_the_thiefs_next_poll(db_url: str, feed: Feed) -> None:
    # ~24 s of work for the first alone: the thief gets a share while there is work left to hand
    # over, however slow its start-up on a loaded machine. The test ends at the thief's first call.
    keys = add_partitions(feed, "handed", 4, 60)
    recorder = Recorder()
    # Leases (and registrations) of 10 s, not the tests' 3: the thief asks for its share once, on
    # start-up, and a loaded machine that let the first watcher's registration lapse for a moment
    # made that one request find nobody to ask, with the next a whole poll interval (60 s) later.
    with watching(db_url, Slow(recorder, 0.2, "first"), concurrency=2, lease_seconds=10.0) as first:
        wait_all_leased_by(feed, keys, first)
        started = time.time()
        # The thief asks for its share on start-up and would read its leases again only 60 s later.
        with watching(db_url, Slow(recorder, 0.2, "second"), concurrency=2, poll_interval=60.0, lease_seconds=10.0):
            wait_until(lambda: any(c.watcher == "second" for c in recorder.calls), timeout=15.0, what="a steal")
        first_call = min(c.start for c in recorder.calls if c.watcher == "second")
    assert first_call - started < 15.0
    assert set(recorder.per_item().values()) == {1}, "an item was delivered twice"


@pytest.mark.postgres_only  # the steal request's notification wakes the owner; SQLite has only polling
def test_an_owner_hands_over_when_asked_not_at_its_next_poll(db_url: str, feed: Feed) -> None:
    # ~24 s of work: the owner cannot finish it all before the thief has started (see above).
    keys = add_partitions(feed, "asked", 4, 60)
    recorder = Recorder()
    # The owner reads its leases on start-up and would look for steal requests only 60 s later.
    # 10 s leases, as above: a lapsed registration of the owner must not make the thief's request void.
    with watching(db_url, Slow(recorder, 0.2, "owner"), concurrency=2, poll_interval=60.0, lease_seconds=10.0) as owner:
        wait_all_leased_by(feed, keys, owner)
        with watching(db_url, Slow(recorder, 0.2, "thief"), concurrency=2, lease_seconds=10.0):
            wait_until(lambda: any(c.watcher == "thief" for c in recorder.calls), timeout=15.0, what="a hand-over")
    assert any(history_of(feed, key, "stolen") for key in keys)
    assert set(recorder.per_item().values()) == {1}, "an item was delivered twice"


def test_stop_releases_leases_at_once_and_another_watcher_finishes_long_before_expiry(db_url: str, feed: Feed) -> None:
    lease_seconds = 10.0
    feed.add_partition("handover", items=[(0, js({"n": 0})) for _ in range(12)])
    recorder = Recorder()
    first = WatcherThread(db_url, Slow(recorder, 0.1, "first"), concurrency=1, lease_seconds=lease_seconds)
    try:
        wait_until(lambda: len(recorder.calls) >= 2, what="the first watcher to be working")
    finally:
        first.stop()
    stopped = time.monotonic()

    after_stop = feed.status("handover", history=50)
    assert after_stop.lease is None
    yielded = [e for e in after_stop.history or () if e.kind == "yielded"]
    assert [e.watcher for e in yielded] == [first.id]
    assert after_stop.items["available"] > 0

    with watching(db_url, Slow(recorder, 0.1, "second"), concurrency=4, lease_seconds=lease_seconds):
        wait_status(feed, "handover", "complete", timeout=lease_seconds)
    assert time.monotonic() - stopped < lease_seconds / 2
    assert "second" in {c.watcher for c in recorder.calls}


def test_stop_writes_the_answer_of_the_item_in_flight_before_releasing(db_url: str, feed: Feed) -> None:
    feed.add_partition("inflight", items=[(0, js({"n": 0})), (0, js({"n": 1}))])
    recorder = Recorder()
    first = WatcherThread(db_url, Slow(recorder, 0.3), concurrency=1, poll_interval=0.01, shutdown_grace=10.0)
    try:
        wait_until(lambda: recorder.calls, what="an item in flight")
    finally:
        first.stop()  # the item in flight finishes well within the grace period

    [call] = recorder.calls
    assert call.end is not None
    after_stop = feed.status("inflight")
    assert after_stop.lease is None
    assert after_stop.items["complete"] == 1, (
        f"the answer of item {call.item_id}, finished during the grace period, was not written before the "
        "lease was released: it will be delivered again"
    )
    assert after_stop.items["available"] == 1


@pytest.mark.postgres_only
def test_answer_held_up_by_a_database_blip_is_written_on_stop(db_url: str, feed: Feed) -> None:
    """An answer whose write failed once (the database was briefly unavailable) and that is still
    waiting for its write when the watcher is told to stop is written during the shutdown, once the
    database answers again — not dropped and left for redelivery."""
    # PostgreSQL only: it needs a per-database lock_timeout to make one write fail promptly.
    with feed.store.write() as conn:  # new sessions (the watcher's) give up on a row lock after 200 ms
        conn.execute(text(f"ALTER DATABASE \"{make_url(db_url).database}\" SET lock_timeout = '200ms'"))
    feed.add_partition("blip", items=[(0, js({"n": 0}))])
    recorder = Recorder()
    processor = Gated(recorder, "blip")
    locker = feed.store.engine.connect()
    lock = locker.begin()
    running = WatcherThread(db_url, processor, concurrency=1, shutdown_grace=10.0)

    class OnOutage(logging.Handler):
        """On the first failed write: ask the watcher to stop, and end the outage."""

        def emit(self, record: logging.LogRecord) -> None:
            if "database unavailable (write)" in record.getMessage() and lock.is_active:
                running.watcher.stop()  # we are on the watcher's loop, inside its write-retry
                lock.commit()

    watcher_log = logging.getLogger("feedproc.watcher")
    handler = OnOutage(logging.WARNING)
    watcher_log.addHandler(handler)
    try:
        wait_until(lambda: recorder.calls, what="the item in flight")
        locker.execute(select(partitions.c.id).where(partitions.c.key == "blip").with_for_update())
        processor.release.set()  # the answer arrives while the partition row is locked: its write fails once
        running.thread.join(30)
        assert not lock.is_active, "the write never failed: the scenario did not happen"
    finally:
        watcher_log.removeHandler(handler)
        if lock.is_active:
            lock.rollback()
        locker.close()
        running.stop()

    after_stop = feed.status("blip", history=50)
    assert after_stop.lease is None
    assert after_stop.items["complete"] == 1, (
        "the answer that was waiting for its write when stop() came was dropped: "
        f"{after_stop.items}, history {[e.kind for e in after_stop.history or ()]}"
    )


def test_scheduled_retry_survives_a_watcher_restart(db_url: str, feed: Feed, store: Store) -> None:
    retry_delay = 1.5
    feed.add_partition("restart", items=[(0, js({}))])
    recorder = Recorder()
    with watching(db_url, Flaky(recorder, failures=1), retry_delay=retry_delay):
        wait_until(lambda: history_of(feed, "restart", "item_retried"), what="the first failure to be recorded")

    with store.read() as conn:
        row = conn.execute(select(items.c.attempts, items.c.next_attempt_at, items.c.last_error)).one()
        now = conn.execute(select(db_now())).scalar_one()
    assert row.attempts == 1
    assert row.last_error == "ValueError: flaky on attempt 1"
    assert row.next_attempt_at > now  # the backoff is stored, not kept in the watcher's memory

    with watching(db_url, Flaky(recorder, failures=1)):
        wait_status(feed, "restart", "complete")

    first, second = recorder.of("restart")
    assert second.attempt == 2
    assert second.start >= row.next_attempt_at.timestamp() - 0.01
    assert second.start - first.ended >= retry_delay - 0.01
