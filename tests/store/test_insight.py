"""The dashboard's reads (every database): items running now, throughput by minute and the backlog
walked back from it, partitions sorted and filtered, and a partition's per-gate timings."""

from __future__ import annotations

import time
from typing import Any

import pytest

from feedproc import Feed
from feedproc.core.errors import InvalidInput
from feedproc.core.records import Kind, ProgressReport

from ..support import A, answer, fail, lease_and_fetch, register


def test_an_item_a_watcher_took_shows_as_running_with_its_watcher(feed: Feed) -> None:
    feed.add_partition("p", [(0, b"1")])
    register(feed.store, A)
    (taken,) = lease_and_fetch(feed.store)
    (row,) = feed.running()
    assert (row.item, row.partition, row.gate, row.attempt, row.by, row.via) == (
        taken.id,
        "p",
        0,
        1,
        A,
        "watcher",
    )
    assert row.elapsed is None  # no heartbeat has reported the delivery yet


def test_a_heartbeat_reports_a_running_delivery_s_start_and_progress(feed: Feed) -> None:
    feed.add_partition("p", [(0, b"1")])
    register(feed.store, A)
    (taken,) = lease_and_fetch(feed.store)
    started_us = int(time.time() * 1e6)
    time.sleep(0.2)
    report = ProgressReport(taken.id, taken.partition_id, taken.epoch, taken.gate, 0.25, started_us)
    feed.store.heartbeat(A, 30, [report])
    (row,) = feed.running()
    assert row.elapsed is not None and 0.1 < row.elapsed < 60 and row.progress == 0.25


def test_an_answered_item_is_no_longer_running(feed: Feed) -> None:
    feed.add_partition("p", [(0, b"1"), (0, b"2")])
    register(feed.store, A)
    first, second = lease_and_fetch(feed.store)
    feed.store.apply(A, [answer(first, Kind.LATER, delay=60)])  # still available, at a newer version
    assert [row.item for row in feed.running()] == [second.id]


def test_a_pull_worker_s_claim_shows_as_running_from_the_claim(feed: Feed) -> None:
    feed.set_queue("pulled", mode="pull")
    feed.add_partition("p", [(0, b"1")], queue="pulled")
    (claimed,) = feed.claim("pulled", "worker-1", max_items=1, lease_seconds=30)
    (row,) = feed.running(queue="pulled")
    assert (row.item, row.by, row.via) == (claimed["id"], "worker-1", "worker")
    assert row.elapsed is not None and row.elapsed >= 0
    assert feed.running(queue="other") == []


def test_throughput_counts_what_producers_added_and_watchers_finished(feed: Feed) -> None:
    feed.add_partition("p", [(0, b"1"), (0, b"2"), (0, b"3")])
    register(feed.store, A)
    done, failed, _waiting = lease_and_fetch(feed.store)
    feed.store.apply(A, [answer(done, Kind.DONE), fail(failed, attempts=5)])
    feed.store.heartbeat(A, 30, tally={"processed": 2, "completed": 1, "failed": 1}, queue="default")
    now = feed.throughput(seconds=3600, step=60)
    last = now.buckets[-1]
    assert (last.added, last.processed, last.completed, last.failed) == (3, 2, 1, 1)
    assert now.backlog == 1  # the third item
    assert len(now.buckets) in (60, 61) and now.step == 60


def test_the_backlog_is_walked_back_through_what_was_added_and_finished(feed: Feed) -> None:
    feed.add_partition("p", [(0, b"1"), (0, b"2")])
    feed.store.tally("default", "earlier", {"completed": 5})  # 5 finished this minute: 7 were waiting
    buckets = feed.throughput(seconds=600, step=60).buckets
    assert buckets[-1].backlog == 2
    assert buckets[-2].backlog == 2 - (2 - 5)


def test_throughput_of_one_queue_leaves_the_others_out(feed: Feed) -> None:
    feed.add_partition("a", [(0, b"1")], queue="one")
    feed.add_partition("b", [(0, b"1"), (0, b"2")], queue="two")
    assert feed.throughput(queue="two").buckets[-1].added == 2
    assert feed.throughput(queue="two").backlog == 2


def test_partitions_sort_by_recent_activity_priority_and_age(feed: Feed) -> None:
    feed.add_partition("old", [(0, b"1")], priority=1)
    feed.add_partition("urgent", [(0, b"1")], priority=9)
    feed.add_partition("new", [(0, b"1")])

    def keys(**kw: Any) -> list[str]:
        return [p.key for p in feed.partitions(**kw)]

    assert keys(sort="priority") == ["urgent", "old", "new"]
    assert keys(sort="age") == ["old", "urgent", "new"]
    assert keys(sort="key") == ["new", "old", "urgent"]
    assert keys(sort="age", offset=1, limit=1) == ["urgent"]


def test_activity_puts_partitions_being_worked_on_first_then_the_last_changed(feed: Feed) -> None:
    feed.add_partition("worked", [(0, b"1")])
    feed.add_partition("idle", [(0, b"1")], not_before=None)
    feed.add_partition("newest", [(0, b"1")])
    register(feed.store, A)
    feed.store.acquire(A, "default", 1, 30)  # the oldest: "worked"
    assert [p.key for p in feed.partitions(sort="activity")] == ["worked", "newest", "idle"]


def test_partitions_filter_by_the_text_of_a_failed_item_s_error(feed: Feed) -> None:
    feed.add_partition("ocr/1", [(0, b"1")])
    feed.add_partition("ocr/2", [(0, b"1")])
    register(feed.store, A)
    one, two = sorted(lease_and_fetch(feed.store), key=lambda r: r.partition)
    feed.store.apply(A, [fail(one, attempts=5, error="PDF is Encrypted"), fail(two, attempts=5, error="timeout")])
    assert [p.key for p in feed.partitions(error="encrypted")] == ["ocr/1"]  # case-insensitive
    assert feed.partitions(error="100%_") == []  # LIKE wildcards are text


def test_an_unknown_sort_is_invalid_input(feed: Feed) -> None:
    with pytest.raises(InvalidInput, match="sort"):
        feed.partitions(sort="colour")


def test_timings_give_p50_and_p95_per_gate_and_the_current_gate_s_eta(feed: Feed) -> None:
    feed.add_partition("p", [(0, str(i).encode()) for i in range(10)] + [(1, b"x")])
    register(feed.store, A)
    taken = lease_and_fetch(feed.store)
    now_us = int(time.time() * 1e6)
    outcomes = [
        answer(r, Kind.DONE, n=1, attempt=1, started_us=now_us, duration_us=(i + 1) * 100_000)
        for i, r in enumerate(taken[:4])
    ]
    feed.store.apply(A, outcomes)
    timings = feed.timings("p")
    gate0 = timings.gates["0"]
    assert gate0.p50 is not None and gate0.p95 is not None
    assert gate0.deliveries == 4 and 0.2 <= gate0.p50 <= 0.3 and 0.35 <= gate0.p95 <= 0.4
    assert gate0.time_at_gate is not None
    current = timings.current
    assert current is not None
    assert (current.gate, current.remaining, current.finished) == (0, 6, 4)
    assert current.eta_seconds is not None and current.eta_seconds > 0


def test_time_at_gate_ends_at_the_gate_advance(feed: Feed) -> None:
    feed.add_partition("p", [(0, b"1"), (1, b"2")])
    register(feed.store, A)
    (first,) = lease_and_fetch(feed.store)
    feed.store.apply(A, [answer(first, Kind.DONE)])
    gates = feed.timings("p").gates
    assert gates["0"].time_at_gate is not None and gates["1"].arrived_at is not None


def test_an_error_filter_with_a_nul_is_invalid_input(feed: Feed) -> None:
    with pytest.raises(InvalidInput, match="NUL"):
        feed.partitions(error="a\x00b")


def test_a_finished_partition_s_last_gate_lasted_until_it_finished(feed: Feed) -> None:
    feed.add_partition("p", [(0, b"1")])
    register(feed.store, A)
    (only,) = lease_and_fetch(feed.store)
    feed.store.apply(A, [answer(only, Kind.DONE)])
    assert feed.status("p").status == "complete"
    timings = feed.timings("p")
    assert timings.gates["0"].time_at_gate is not None and timings.current is None
