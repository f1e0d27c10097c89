"""Scheduling controls (issue 7): per-item timeouts, the global concurrency limit per queue with weights,
progress reports, and time windows, on SQLite, PostgreSQL and MariaDB.

In-process watchers (`watching`, from test_watcher) check the behaviour of one watcher; the
concurrency limit across several watchers is checked with real `feedproc watch` processes.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from feedproc import Feed, Item, Processor, Response
from feedproc.core.views import GateProgress
from feedproc.store import Store

from ..support import HandlerService, history_of, run_cli, statements_observed, wait_status, wait_until, watching


def js(value: Any) -> bytes:
    return json.dumps(value).encode()


# ---------------------------------------------------------------- per-item timeout


class SlowFirstAttempt(Processor):
    """Sleeps `seconds` on an item's first attempt, answers at once afterwards."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.attempts: list[int] = []

    async def process(self, item: Item) -> Response:
        self.attempts.append(item.attempt)
        if item.attempt == 1:
            await asyncio.sleep(self.seconds)
        return Response(done=True)


def retried_errors(feed: Feed, key: str) -> list[str]:
    return [e.detail["error"] for e in history_of(feed, key, "item_retried")]


def test_a_call_running_past_the_watchers_item_timeout_is_abandoned_and_retried(db_url: str, feed: Feed) -> None:
    feed.add_partition("slow", [(0, b"{}")])
    processor = SlowFirstAttempt(30)
    started = time.monotonic()
    with watching(db_url, processor, item_timeout=0.3):
        wait_status(feed, "slow", "complete")
    assert time.monotonic() - started < 15  # not the 30 s the first call would have taken
    assert processor.attempts == [1, 2]
    assert retried_errors(feed, "slow") == ["item timed out after 0.3s"]


def test_a_partitions_item_timeout_overrides_the_watchers(db_url: str, feed: Feed) -> None:
    feed.add_partition("strict", [(0, b"{}")], item_timeout=0.2)
    feed.add_partition("lenient", [(0, b"{}")], item_timeout=5)
    with watching(db_url, SlowFirstAttempt(0.6), item_timeout=2):
        wait_status(feed, "strict", "complete")
        wait_status(feed, "lenient", "complete")
    assert retried_errors(feed, "strict") == ["item timed out after 0.2s"]
    assert retried_errors(feed, "lenient") == []


def test_an_item_timing_out_on_every_attempt_fails_with_the_timeout_as_its_error(db_url: str, feed: Feed) -> None:
    feed.add_partition("hopeless", [(0, b"{}")], item_timeout=0.1)

    class Forever(Processor):
        async def process(self, item: Item) -> Response:
            await asyncio.sleep(60)
            return Response(done=True)

    with watching(db_url, Forever(), max_attempts=2):
        final = wait_status(feed, "hopeless", "failed")
    assert final.failed_items[0].attempts == 2
    assert final.failed_items[0].last_error == "item timed out after 0.1s"


def test_an_http_call_running_past_the_item_timeout_is_a_transient_failure(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    from feedproc import HTTPProcessor

    handler.behavior = lambda body: (200, {"done": True}, {}, 5 if body["attempt"] == 1 else 0)
    feed.add_partition("web", [(0, b"{}")])
    with watching(db_url, HTTPProcessor(handler.url, timeout=30), item_timeout=0.3):
        wait_status(feed, "web", "complete")
    assert [d.body["attempt"] for d in handler.of("web")][-1] == 2
    assert retried_errors(feed, "web") == ["item timed out after 0.3s"]


def test_a_plain_def_call_waiting_for_a_free_thread_is_not_timed(db_url: str, feed: Feed) -> None:
    """Abandoned plain-def calls keep their threads busy; items queued behind them have not started,
    so their wait is not charged as a timeout."""

    class Sleepy(Processor):
        def process(self, item: Item) -> Response:
            if item.partition == "slow" and item.attempt == 1:
                time.sleep(3)
            return Response(done=True)

    feed.add_partition("slow", [(0, b"{}")] * 4)
    feed.add_partition("quick", [(0, b"{}")] * 3)
    with watching(db_url, Sleepy(), concurrency=2, item_timeout=0.5, retry_delay=0.05):
        wait_status(feed, "quick", "complete", timeout=60)
        wait_status(feed, "slow", "complete", timeout=60)
    assert retried_errors(feed, "quick") == []
    assert retried_errors(feed, "slow") == ["item timed out after 0.5s"] * 4


def test_add_item_timeout_option_is_stored_and_shown_in_status(db_url: str) -> None:
    result = run_cli(db_url, "add", "job", "--item-timeout", "90s", "--weight", "3", "--open")
    assert result.returncode == 0, result.stderr
    status = json.loads(run_cli(db_url, "status", "job", "--json").stdout)
    assert status["schedule"]["item_timeout"] == 90
    assert status["schedule"]["weight"] == 3


def test_a_non_positive_item_timeout_is_malformed_input(db_url: str) -> None:
    result = run_cli(db_url, "add", "job", "--item-timeout", "0", "--open")
    assert result.returncode == 2
    assert "--item-timeout" in result.stderr
    watch = run_cli(db_url, "watch", "--handler", "http://127.0.0.1:9/x", "--item-timeout", "-1")
    assert watch.returncode == 2


# ---------------------------------------------------------------- global concurrency limit, with weights


def register(store: Store, watcher_id: str, queue: str = "default") -> None:
    store.register_watcher(watcher_id, host="test", pid=1, queue=queue, concurrency=10, capacity=10, lease_seconds=30)


def lease_all(store: Store, watcher_id: str, queue: str = "default") -> None:
    assert store.acquire(watcher_id, queue, 100, 30)


def test_queue_set_limit_is_stored_and_a_limit_below_1_means_none(feed: Feed) -> None:
    assert feed.set_queue("q", limit=4).limit == 4
    assert feed.queue("q").limit == 4
    assert feed.set_queue("q", limit=0).limited is False
    assert feed.queue("q").limit is None


def test_a_fetch_takes_no_more_than_the_limit_in_slots(feed: Feed, store: Store) -> None:
    from feedproc.core.records import SlotClaim

    feed.set_queue("default", limit=3)
    feed.add_partition("p", [(0, b"{}")] * 10)
    register(store, "w1")
    lease_all(store, "w1")
    assert len(store.fetch_ready("w1", 10, slots=SlotClaim("default"))) == 3
    assert feed.queue("default").slots_in_use == 3


def test_slots_held_by_one_watcher_are_not_given_to_another(feed: Feed, store: Store) -> None:
    from feedproc.core.records import SlotClaim

    feed.set_queue("default", limit=3)
    feed.add_partition("a", [(0, b"{}")] * 5)
    feed.add_partition("b", [(0, b"{}")] * 5)
    register(store, "w1")
    register(store, "w2")
    assert store.acquire("w1", "default", 1, 30) and store.acquire("w2", "default", 1, 30)
    first = store.fetch_ready("w1", 2, slots=SlotClaim("default"))
    second = store.fetch_ready("w2", 10, slots=SlotClaim("default"))
    assert (len(first), len(second)) == (2, 1)
    assert store.fetch_ready("w2", 10, [i.id for i in second], slots=SlotClaim("default", held=1)) == []


def test_weights_count_against_the_limit_and_a_heavier_item_than_the_limit_runs_alone(feed: Feed, store: Store) -> None:
    from feedproc.core.records import SlotClaim

    feed.set_queue("default", limit=4)
    feed.add_partition("heavy", [(0, b"{}")] * 3, weight=3, priority=1)
    register(store, "w1")
    lease_all(store, "w1")
    taken = store.fetch_ready("w1", 10, slots=SlotClaim("default"))
    assert [i.weight for i in taken] == [3]  # 3 + 3 > 4
    feed.set_queue("default", limit=2)
    again = store.fetch_ready("w1", 10, [i.id for i in taken], slots=SlotClaim("default", held=0))
    assert [i.weight for i in again] == [2]  # weight 3 > limit 2 counts as 2: it runs, alone


def test_the_next_fetch_gives_back_the_slots_of_answered_items(feed: Feed, store: Store) -> None:
    from feedproc.core.records import SlotClaim

    feed.set_queue("default", limit=2)
    feed.add_partition("p", [(0, b"{}")] * 4)
    register(store, "w1")
    lease_all(store, "w1")
    taken = store.fetch_ready("w1", 10, slots=SlotClaim("default"))
    assert feed.queue("default").slots_in_use == 2
    # Both calls returned (held 0), no worker is idle: the fetch only hands the slots back.
    assert store.fetch_ready("w1", 0, [i.id for i in taken], slots=SlotClaim("default", held=0)) == []
    assert feed.queue("default").slots_in_use == 0


def test_a_dead_watchers_slots_come_back_when_its_registration_expires(feed: Feed, store: Store) -> None:
    from sqlalchemy import update

    from feedproc.core.records import SlotClaim
    from feedproc.store.foundations import seconds_from_now
    from feedproc.store.schema import watchers

    feed.set_queue("default", limit=2)
    feed.add_partition("a", [(0, b"{}")] * 4)
    feed.add_partition("b", [(0, b"{}")] * 4)
    register(store, "dead")
    register(store, "alive")
    assert store.acquire("dead", "default", 1, 30) and store.acquire("alive", "default", 1, 30)
    assert len(store.fetch_ready("dead", 10, slots=SlotClaim("default"))) == 2
    assert store.fetch_ready("alive", 10, slots=SlotClaim("default")) == []
    with store.write() as conn:  # it stopped heartbeating: its registration ran out
        conn.execute(update(watchers).where(watchers.c.id == "dead").values(expires_at=seconds_from_now(-1)))
    assert len(store.fetch_ready("alive", 10, slots=SlotClaim("default"))) == 2


def test_queue_set_command_stores_the_limit_and_queue_show_reports_it(db_url: str) -> None:
    result = run_cli(db_url, "queue", "set", "imports", "--limit", "5")
    assert result.returncode == 0, result.stderr
    assert "limit 5" in result.stdout
    shown = json.loads(run_cli(db_url, "queue", "show", "imports", "--json").stdout)
    assert shown["limit"] == 5 and shown["slots_in_use"] == 0


class ConcurrencyMeter:
    """A handler behaviour that records how many requests (and how much weight) are in flight at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.lock = threading.Lock()
        self.active = self.weight = self.peak = self.peak_weight = 0
        self.samples: list[tuple[float, int]] = []  # (time, weight in flight) at each change

    def __call__(self, body: dict[str, Any]) -> tuple[Any, ...]:
        weight = body["data"].get("weight", 1)
        with self.lock:
            self.active += 1
            self.weight += weight
            self.peak, self.peak_weight = max(self.peak, self.active), max(self.peak_weight, self.weight)
            self.samples.append((time.monotonic(), self.weight))
        time.sleep(self.seconds)
        with self.lock:
            self.active -= 1
            self.weight -= weight
            self.samples.append((time.monotonic(), self.weight))
        return (200, {"done": True})

    def throughput(self) -> float:
        """Requests answered per second from the first request to the last answer."""
        with self.lock:
            samples = list(self.samples)
        return len(samples) / 2 / max(samples[-1][0] - samples[0][0], 1e-9)

    def mean_weight(self) -> float:
        """Time-averaged weight in flight from the first request to the last answer."""
        with self.lock:
            samples = list(self.samples)
        area = sum(w * (t2 - t1) for (t1, w), (t2, _) in itertools.pairwise(samples))
        return area / max(samples[-1][0] - samples[0][0], 1e-9)


@pytest.mark.slow
def test_several_watcher_processes_never_exceed_the_queue_limit_and_reach_it(
    db_url: str, feed: Feed, handler: HandlerService, watchers: Any
) -> None:
    limit, seconds, items = 4, 0.2, 60
    meter = ConcurrencyMeter(seconds)
    handler.behavior = meter
    feed.set_queue("default", limit=limit)
    for n in range(6):
        feed.add_partition(f"p{n}", [(0, js({"n": i})) for i in range(items // 6)])
    for _ in range(3):
        watchers.start("--handler", handler.url, "--concurrency", "5", "--poll-interval", "0.05")
    for n in range(6):
        wait_status(feed, f"p{n}", "complete", timeout=120)
    mean, rate = meter.mean_weight(), meter.throughput()
    print(
        f"\nlimit {limit}: observed peak {meter.peak} in flight, mean {mean:.2f}; {rate:.1f} items/s "
        f"while busy (at most {limit / seconds:.0f}/s at the limit)"
    )
    assert meter.peak <= limit
    assert meter.peak == limit  # throughput reaches the limit
    assert mean >= 0.5 * limit, f"mean concurrency {mean:.2f} is far below the limit {limit}"
    wait_until(lambda: feed.queue("default").slots_in_use == 0, timeout=10, what="the slots to come back")


@pytest.mark.slow
def test_weighted_items_in_flight_never_exceed_the_limit_across_watcher_processes(
    db_url: str, feed: Feed, handler: HandlerService, watchers: Any
) -> None:
    meter = ConcurrencyMeter(0.15)
    handler.behavior = meter
    feed.set_queue("default", limit=5)
    feed.add_partition("heavy", [(0, js({"weight": 2})) for _ in range(12)], weight=2)
    feed.add_partition("light", [(0, js({"weight": 1})) for _ in range(12)])
    for _ in range(2):
        watchers.start("--handler", handler.url, "--concurrency", "5", "--poll-interval", "0.05")
    wait_status(feed, "heavy", "complete", timeout=120)
    wait_status(feed, "light", "complete", timeout=120)
    print(f"\nlimit 5 with weights 2 and 1: observed peak weight {meter.peak_weight}, mean {meter.mean_weight():.2f}")
    assert meter.peak_weight <= 5
    assert meter.peak_weight >= 4


@pytest.mark.slow
def test_a_killed_watchers_slots_come_back_and_another_watcher_goes_on(
    db_url: str, feed: Feed, handler: HandlerService, watchers: Any
) -> None:
    release = threading.Event()
    meter = ConcurrencyMeter(0.05)

    def behavior(body: dict[str, Any]) -> tuple[Any, ...]:
        release.wait(30)  # the first watcher's calls hang until it has been killed
        return meter(body)

    handler.behavior = behavior
    feed.set_queue("default", limit=3)
    feed.add_partition("p", [(0, js({"n": i})) for i in range(9)])
    fast = ("--handler", handler.url, "--concurrency", "5", "--poll-interval", "0.05", "--lease-seconds", "2")
    first = watchers.start(*fast)
    wait_until(lambda: feed.queue("default").slots_in_use == 3, timeout=30, what="the first watcher's 3 slots")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)
    release.set()
    watchers.start(*fast)
    wait_status(feed, "p", "complete", timeout=60)
    assert meter.peak <= 3


def test_without_a_limit_fetching_and_answering_lock_no_slot_or_queue_rows(feed: Feed, store: Store) -> None:
    from feedproc.core.records import Kind, Outcome

    feed.add_partition("p", [(0, b"{}")] * 3)
    register(store, "w1")
    lease_all(store, "w1")
    statements: list[str] = []
    with statements_observed(store, lambda conn, statement: statements.append(statement)):
        taken = store.fetch_ready("w1", 10)
        store.apply("w1", [Outcome(i.id, i.version, i.partition_id, i.epoch, i.gate, Kind.DONE) for i in taken])
    assert len(taken) == 3
    touching = [s for s in statements if "feedproc_watchers" in s or "feedproc_queues" in s]
    # The one read: the queue's completion hooks, once, in the transaction that completed the
    # partition (a plain read: no row lock, nothing written).
    assert [s.split()[:2] for s in touching] == [["SELECT", "feedproc_queues.hooks"]], touching
    assert "FOR UPDATE" not in touching[0]


# ---------------------------------------------------------------- progress


class ReportsThenWaits(Processor):
    """Reports `fraction` for every item, then holds it until `release` is set."""

    def __init__(self, fraction: float) -> None:
        self.fraction = fraction
        self.release = threading.Event()

    async def process(self, item: Item) -> Response:
        await item.progress(self.fraction)
        while not self.release.is_set():
            await asyncio.sleep(0.02)
        return Response(done=True)


def gate_progress(feed: Feed, key: str, gate: int = 0) -> GateProgress:
    return feed.status(key).progress.gates[str(gate)]


def test_python_processor_progress_is_stored_with_the_heartbeat_and_shown_per_gate(db_url: str, feed: Feed) -> None:
    feed.add_partition("long", [(0, b"{}"), (0, b"{}"), (0, b"{}")])
    processor = ReportsThenWaits(0.4)
    with watching(db_url, processor, concurrency=2, lease_seconds=1.5):
        shown = wait_until(
            lambda: (g := gate_progress(feed, "long")).in_flight == 2 and g,
            timeout=20,
            what="the progress of two items in flight",
        )
        assert shown.mean_progress == pytest.approx(0.4)
        assert (shown.done, shown.total) == (0, 3)
        processor.release.set()
        wait_status(feed, "long", "complete")
    final = gate_progress(feed, "long")
    assert (final.done, final.total, final.in_flight, final.mean_progress) == (3, 3, 0, None)


def test_a_plain_def_processor_may_report_progress_without_await(db_url: str, feed: Feed) -> None:
    feed.add_partition("sync", [(0, b"{}")])
    release = threading.Event()

    class Sync(Processor):
        def process(self, item: Item) -> Response:
            item.progress(0.25)
            release.wait(20)
            return Response(done=True)

    with watching(db_url, Sync(), lease_seconds=1.5):
        wait_until(lambda: gate_progress(feed, "sync").mean_progress == 0.25, timeout=20, what="progress 0.25")
        release.set()
        wait_status(feed, "sync", "complete")


def test_progress_outside_0_to_1_is_refused() -> None:
    item = Item(1, "p", "default", 0, 1, b"{}", lambda fraction: None)
    with pytest.raises(ValueError, match="from 0 to 1"):
        item.progress(1.5)


def test_http_not_yet_answer_with_progress_is_accepted_and_shown(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    from feedproc import HTTPProcessor

    asked = threading.Event()

    def behavior(body: dict[str, Any]) -> tuple[Any, ...]:
        if not asked.is_set():
            return (200, {"gate": 0, "progress": 0.4, "retry_after": 0.1})
        return (200, {"done": True})

    handler.behavior = behavior
    feed.add_partition("web", [(0, b"{}")])
    with watching(db_url, HTTPProcessor(handler.url)):
        wait_until(lambda: gate_progress(feed, "web").mean_progress == 0.4, timeout=20, what="progress 0.4")
        assert feed.status("web").items["failed"] == 0
        asked.set()
        wait_status(feed, "web", "complete")
    assert history_of(feed, "web", "item_retried") == []  # "not yet" is not a failure


def test_http_answer_with_progress_out_of_range_is_an_invalid_answer() -> None:
    from feedproc.core.errors import InvalidAnswer
    from feedproc.processors import read_answer

    with pytest.raises(InvalidAnswer, match="progress"):
        read_answer(200, b'{"gate": 0, "progress": 1.5}', None)
    assert read_answer(200, b'{"gate": 0, "progress": 0.4}', None).progress == 0.4


def test_a_progress_report_under_a_lost_lease_is_not_stored(feed: Feed, store: Store) -> None:
    from feedproc.core.records import ProgressReport

    feed.add_partition("p", [(0, b"{}")])
    register(store, "w1")
    (lease,) = store.acquire("w1", "default", 1, 30)
    (item,) = store.fetch_ready("w1", 10)
    stale = ProgressReport(item.id, item.partition_id, lease.epoch - 1, item.gate, 0.9)
    store.heartbeat("w1", 30, [stale])
    assert gate_progress(feed, "p").mean_progress is None
    store.heartbeat("w1", 30, [ProgressReport(item.id, item.partition_id, lease.epoch, item.gate, 0.5)])
    assert gate_progress(feed, "p").mean_progress == 0.5


# ---------------------------------------------------------------- time windows


def window_around_now(start_minutes: int, end_minutes: int) -> str:
    """A UTC window from now + start to now + end minutes (it may wrap midnight)."""
    now = datetime.now(UTC)
    minute = now.hour * 60 + now.minute

    def hhmm(offset: int) -> str:
        value = (minute + offset) % (24 * 60)
        return f"{value // 60:02d}:{value % 60:02d}"

    return f"{hhmm(start_minutes)}-{hhmm(end_minutes)}"


def test_a_partition_whose_window_is_closed_is_not_dispatched_while_an_open_one_is(db_url: str, feed: Feed) -> None:
    closed, opened = window_around_now(120, 180), window_around_now(-60, 60)
    feed.add_partition("night", [(0, b"{}")] * 3, windows=closed)
    feed.add_partition("now", [(0, b"{}")] * 3, windows=opened)
    recorder = SlowFirstAttempt(0)
    with watching(db_url, recorder):
        wait_status(feed, "now", "complete")
        wait_until(lambda: history_of(feed, "night", "deferred"), timeout=10, what="the closed partition deferred")
    night = feed.status("night")
    assert night.items["available"] == 3 and recorder.attempts == [1, 1, 1]
    schedule = night.schedule
    assert schedule.window_open is False
    assert schedule.next_window_opens_at is not None
    opens = datetime.fromisoformat(schedule.next_window_opens_at.replace("Z", "+00:00"))
    assert timedelta(minutes=118) < opens - datetime.now(UTC) < timedelta(minutes=121)
    assert feed.status("now").schedule.window_open is True


def test_a_queue_window_closed_now_holds_all_its_partitions_until_it_is_removed(db_url: str, feed: Feed) -> None:
    feed.set_queue("default", windows=window_around_now(120, 180))
    feed.add_partition("held", [(0, b"{}")])
    processor = SlowFirstAttempt(0)
    with watching(db_url, processor):
        time.sleep(1.0)  # many poll intervals (0.05 s): a dispatch would have happened by now
        assert processor.attempts == []
        assert feed.queue("default").window_open is False
        feed.set_queue("default", clear_windows=True)
        wait_status(feed, "held", "complete")


def test_window_options_are_checked_and_stored(db_url: str) -> None:
    bad = run_cli(db_url, "add", "job", "--window", "25:00-06:00", "--open")
    assert bad.returncode == 2 and "window" in bad.stderr
    zone = run_cli(db_url, "queue", "set", "q", "--window", "22:00-06:00", "--timezone", "Nowhere/Land")
    assert zone.returncode == 2 and "time zone" in zone.stderr
    ok = run_cli(
        db_url,
        "add",
        "job",
        "--window",
        "22:00-06:00",
        "--window",
        "12:00-13:00",
        "--timezone",
        "Europe/Paris",
        "--open",
    )
    assert ok.returncode == 0, ok.stderr
    schedule = json.loads(run_cli(db_url, "status", "job", "--json").stdout)["schedule"]
    assert (schedule["windows"], schedule["timezone"]) == ("22:00-06:00,12:00-13:00", "Europe/Paris")
    shown = run_cli(db_url, "queue", "set", "q", "--window", "22:00-06:00")
    assert shown.returncode == 0 and "22:00-06:00" in shown.stdout


# ---------------------------------------------------------------- malformed scheduling input


def test_an_infinite_item_timeout_is_malformed_input(db_url: str) -> None:
    result = run_cli(db_url, "add", "job", "--item-timeout", "inf", "--open")
    assert result.returncode == 2 and "--item-timeout" in result.stderr


def test_a_time_zone_without_windows_is_malformed_and_changes_nothing(db_url: str, feed: Feed) -> None:
    result = run_cli(db_url, "add", "job", "--timezone", "Europe/Paris", "--open")
    assert result.returncode == 2 and "--window" in result.stderr
    assert run_cli(db_url, "status", "job").returncode == 1
    queue = run_cli(db_url, "queue", "set", "q", "--timezone", "Europe/Paris")
    assert queue.returncode == 2 and "--window" in queue.stderr
    assert feed.queue("q").timezone == "UTC"


def test_progress_is_kept_by_a_not_yet_answer_and_cleared_by_a_transient_failure(feed: Feed, store: Store) -> None:
    from feedproc.core.records import Kind, Outcome, ProgressReport

    feed.add_partition("p", [(0, b"{}")])
    register(store, "w1")
    (lease,) = store.acquire("w1", "default", 1, 30)
    (item,) = store.fetch_ready("w1", 10)
    store.heartbeat("w1", 30, [ProgressReport(item.id, item.partition_id, lease.epoch, item.gate, 0.5)])
    fields: dict[str, Any] = {
        "item_id": item.id,
        "partition_id": item.partition_id,
        "epoch": lease.epoch,
        "gate": item.gate,
    }
    store.apply("w1", [Outcome(version=item.version, kind=Kind.LATER, progress=0.7, **fields)])
    assert gate_progress(feed, "p").mean_progress == pytest.approx(0.7)
    store.apply("w1", [Outcome(version=item.version + 1, kind=Kind.RETRY, attempts=1, error="boom", **fields)])
    assert (gate_progress(feed, "p").in_flight, gate_progress(feed, "p").mean_progress) == (0, None)
