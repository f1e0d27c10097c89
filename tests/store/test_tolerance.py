"""Tolerated failures (issue 31) in the store, on every database: a gate's `tolerate` ("5%" of its
items, or a count; the partition's own over its pipeline gate's) lets that many of its items fail
without failing the partition; one more fails it at once, and the items still available at the gate
are cancelled saying why. Driven through the watchers' group commit (`Store.apply`) and the pull
workers' answers, as a watcher or a worker would."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import update

from feedproc import Feed
from feedproc.core.errors import InvalidInput, Refused, StaleClaim
from feedproc.core.pipelines import parse_toml
from feedproc.core.policy import RetryPolicy
from feedproc.core.records import Kind
from feedproc.core.views import Tolerated
from feedproc.store.foundations import seconds_from_now
from feedproc.store.schema import partitions

from ..support import A, B, answer, db_state, fail, history_of, lease_and_fetch, register

PIPELINE = """
queue = "default"
[[gate]]
name = "list"
number = 0
[[gate]]
name = "classify"
number = 1
tolerate = "{tolerate}"
[[gate]]
name = "rank"
number = 2
"""


def with_pipeline(feed: Feed, tolerate: str = "5%") -> None:
    feed.apply_pipeline(parse_toml(PIPELINE.format(tolerate=tolerate)))


def add(feed: Feed, key: str, count: int, *, gate: int = 1, then: int | None = 2, **kwargs: Any) -> None:
    """Partition `key`: `count` items at `gate` and one at `then` (a later gate's work)."""
    items = [(gate, b'{"n": %d}' % n) for n in range(count)] + ([(then, b"{}")] if then is not None else [])
    feed.add_partition(key, items, **kwargs)


def at_gate(feed: Feed, key: str) -> list[Any]:
    """Lease and fetch: `key`'s items ready at its current gate."""
    return [r for r in lease_and_fetch(feed.store, A) if r.partition == key]


def finish(feed: Feed, key: str, *, failing: int, kind: Kind = Kind.DONE) -> Any:
    """Fail `failing` of `key`'s items at its gate, then answer the rest with `kind`, in two commits."""
    ready = at_gate(feed, key)
    feed.store.apply(A, [fail(r) for r in ready[:failing]])
    return feed.store.apply(A, [answer(r, kind, new_gate=2 if kind == Kind.MOVE else None) for r in ready[failing:]])


@pytest.fixture
def feed_a(feed: Feed) -> Feed:
    register(feed.store, A)
    return feed


# ---------------------------------------------------------------- within the tolerance


def test_a_gate_tolerating_5_percent_of_40_items_advances_past_2_failures_and_completes(feed_a: Feed) -> None:
    with_pipeline(feed_a, "5%")
    add(feed_a, "p", 40)
    applied = finish(feed_a, "p", failing=2)
    assert applied.advances and feed_a.status("p").gate == 2, "the gate did not advance past tolerated failures"
    finish(feed_a, "p", failing=0)
    status = feed_a.status("p")
    assert status.status == "complete"
    assert status.gates["1"] == {"available": 0, "complete": 38, "failed": 2, "cancelled": 0}


def test_a_count_tolerance_lets_that_many_items_fail(feed_a: Feed) -> None:
    with_pipeline(feed_a, "3")
    add(feed_a, "p", 5)
    finish(feed_a, "p", failing=3)
    assert feed_a.status("p").gate == 2


def test_items_that_moved_on_from_the_gate_count_among_its_items(feed_a: Feed) -> None:
    """38 items move on to gate 2: the gate's 40 items are those 38 and the 2 that failed there."""
    with_pipeline(feed_a, "5%")
    add(feed_a, "p", 40, then=None)
    finish(feed_a, "p", failing=2, kind=Kind.MOVE)
    status = feed_a.status("p")
    assert status.gate == 2 and status.status == "available"
    assert status.tolerated["1"] == Tolerated(failed=2, allowed="5%", items=40, limit=2, exceeded=False)


def test_a_gate_that_tolerates_nothing_keeps_the_rule_without_a_tolerance(feed_a: Feed) -> None:
    """No tolerance anywhere: a failure holds the gate until it drains, then fails the partition
    (the rule as it always was: a guard against the tolerance leaking where none is set)."""
    add(feed_a, "p", 4)
    ready = at_gate(feed_a, "p")
    feed_a.store.apply(A, [fail(ready[0])])
    assert feed_a.status("p").status == "available"
    feed_a.store.apply(A, [answer(r, Kind.DONE) for r in ready[1:]])
    status = feed_a.status("p")
    assert status.status == "failed" and status.gate == 1 and status.items["cancelled"] == 0


# ---------------------------------------------------------------- crossing it


def test_crossing_the_tolerance_fails_the_partition_at_once_and_cancels_what_is_left_saying_why(feed_a: Feed) -> None:
    with_pipeline(feed_a, "5%")
    add(feed_a, "p", 40)
    ready = at_gate(feed_a, "p")
    feed_a.store.apply(A, [answer(r, Kind.DONE) for r in ready[:10]])
    applied = feed_a.store.apply(A, [fail(r) for r in ready[10:13]])
    assert applied.moves == {ready[0].partition_id: "fail"}, "the partition did not fail at once"
    status = feed_a.status("p")
    assert status.status == "failed" and status.gate == 1
    assert status.gates["1"] == {"available": 0, "complete": 10, "failed": 3, "cancelled": 27}
    assert status.gates["2"]["available"] == 1, "a later gate's items are not touched"
    reason = "cancelled: 3 of 40 items failed at gate 1 (classify), more than the 5% tolerated"
    cancelled = feed_a.items("p", status="cancelled")
    assert len(cancelled) == 27 and {c.last_error for c in cancelled} == {reason}
    record = feed_a.item(cancelled[0].id).history[-1]
    assert (record.outcome, record.watcher, record.error) == ("cancelled", "tolerance", reason)
    (failed,) = history_of(feed_a, "p", "failed")
    assert failed.detail == {
        "gate": 1,
        "tolerate": "5%",
        "failed": 3,
        "items": 40,
        "cancelled": 27,
        "error": "3 of 40 items failed at gate 1 (classify), more than the 5% tolerated",
    }
    assert status.tolerated["1"].exceeded is True


def test_crossing_a_count_tolerance_fails_at_once(feed_a: Feed) -> None:
    with_pipeline(feed_a, "1")
    add(feed_a, "p", 10)
    ready = at_gate(feed_a, "p")
    feed_a.store.apply(A, [fail(ready[0])])
    assert feed_a.status("p").status == "available"
    feed_a.store.apply(A, [fail(ready[1])])
    status = feed_a.status("p")
    assert status.status == "failed" and status.items["cancelled"] == 8


def test_a_tolerance_of_0_fails_at_the_first_failure_without_waiting_for_the_gate(feed_a: Feed) -> None:
    add(feed_a, "p", 10, tolerate="0")
    feed_a.store.apply(A, [fail(at_gate(feed_a, "p")[0])])
    assert feed_a.status("p").status == "failed"


def test_retrying_a_crossed_partition_brings_back_its_failed_and_cancelled_items(feed_a: Feed) -> None:
    with_pipeline(feed_a, "5%")
    add(feed_a, "p", 40)
    feed_a.store.apply(A, [fail(r) for r in at_gate(feed_a, "p")[:3]])
    assert feed_a.retry("p") == 40
    status = feed_a.status("p")
    assert status.status == "available" and status.gates["1"]["available"] == 40


# ---------------------------------------------------------------- where the tolerance comes from


def test_the_partitions_own_tolerate_overrides_its_pipeline_gates(feed_a: Feed) -> None:
    with_pipeline(feed_a, "5%")
    add(feed_a, "strict", 40, tolerate="0")
    add(feed_a, "lenient", 40, tolerate="50%")
    ready = at_gate(feed_a, "strict")
    feed_a.store.apply(A, [fail(ready[0])])
    assert feed_a.status("strict").status == "failed", "its own 0 did not win over the gate's 5%"
    finish(feed_a, "lenient", failing=10)
    lenient = feed_a.status("lenient")
    assert lenient.gate == 2 and lenient.tolerate == "50%"


def test_the_partitions_own_tolerate_applies_to_a_queue_without_a_pipeline(feed_a: Feed) -> None:
    add(feed_a, "p", 10, gate=0, then=1, tolerate="2")
    finish(feed_a, "p", failing=2)
    assert feed_a.status("p").gate == 1


def test_a_tolerate_written_by_hand_that_cannot_be_read_is_as_if_not_given(feed_a: Feed) -> None:
    with_pipeline(feed_a, "5%")
    add(feed_a, "p", 40)
    with feed_a.store.write() as conn:  # a SQL producer's typo
        conn.execute(update(partitions).where(partitions.c.key == "p").values(tolerate="lots"))
    finish(feed_a, "p", failing=2)
    assert feed_a.status("p").gate == 2, "the pipeline gate's 5% should apply"


@pytest.mark.parametrize("bad", ["lots", "-1", "101%", "5.5", "%", True, -3, [5]])
def test_a_bad_tolerate_is_refused_and_nothing_is_written(feed: Feed, bad: Any) -> None:
    before = db_state(feed)
    with pytest.raises(InvalidInput, match="tolerate"):
        feed.add_partition("p", [(0, b"{}")], tolerate=bad)
    assert db_state(feed) == before


def test_tolerate_is_stored_in_its_shortest_form(feed: Feed) -> None:
    feed.add_partition("a", [(0, b"{}")], tolerate=" 12.50% ")
    feed.add_partition("b", [(0, b"{}")], tolerate=7)
    assert (feed.status("a").tolerate, feed.status("b").tolerate) == ("12.5%", "7")


# ---------------------------------------------------------------- shown


def test_status_shows_the_failures_a_gate_tolerated(feed_a: Feed) -> None:
    with_pipeline(feed_a, "5%")
    add(feed_a, "p", 40)
    finish(feed_a, "p", failing=2)
    status = feed_a.status("p")
    assert status.tolerate is None  # its own: none, the pipeline gate's applies
    assert status.tolerated == {"1": Tolerated(failed=2, allowed="5%", items=40, limit=2, exceeded=False)}
    (row,) = feed_a.partitions()
    assert row.tolerated == {"1": Tolerated(failed=2, allowed="5%", exceeded=False)}
    assert row.gates == status.gates and row.items == status.items


def test_status_shows_nothing_tolerated_without_a_tolerance_or_a_failure(feed_a: Feed) -> None:
    add(feed_a, "none", 2, gate=0, then=None)
    add(feed_a, "clean", 2, gate=0, then=None, tolerate="5%")
    feed_a.store.apply(A, [fail(at_gate(feed_a, "none")[0])])
    assert feed_a.status("none").tolerated == {} and feed_a.status("clean").tolerated == {}


# ---------------------------------------------------------------- behind the gate


def test_failures_a_gate_tolerated_stay_behind_when_a_later_gate_fails_and_is_retried(feed_a: Feed) -> None:
    add(feed_a, "p", 10, gate=0, then=1, tolerate="2")
    finish(feed_a, "p", failing=2)  # tolerated at gate 0
    feed_a.store.apply(A, [fail(r) for r in at_gate(feed_a, "p")])  # gate 1's one item: 1 of 1, within 2
    assert feed_a.status("p").status == "complete"

    add(feed_a, "q", 10, gate=0, then=1, tolerate="10%")
    finish(feed_a, "q", failing=1)  # 1 of 10 at gate 0: tolerated
    feed_a.store.apply(A, [fail(r) for r in at_gate(feed_a, "q")])  # 1 of 1 at gate 1: crossed
    assert feed_a.status("q").status == "failed"
    assert feed_a.retry("q") == 1, "only the failed item at its gate is retried"
    status = feed_a.status("q")
    assert status.gate == 1 and status.gates["0"]["failed"] == 1 and status.gates["1"]["available"] == 1


def test_an_item_whose_failure_was_tolerated_behind_the_gate_cannot_be_retried(feed_a: Feed) -> None:
    add(feed_a, "p", 10, gate=0, then=1, tolerate="2")
    finish(feed_a, "p", failing=1)
    (failed,) = feed_a.items("p", status="failed")
    with pytest.raises(Refused, match="behind its partition's"):
        feed_a.act_on_items("retry", ids=[failed.id])
    assert feed_a.act_on_items("retry", key="p")["items"] == 1  # gate 1's available item, not the one behind
    assert feed_a.item(failed.id).status == "failed"
    assert feed_a.act_on_items("skip", ids=[failed.id])["items"] == 1


# ---------------------------------------------------------------- pull workers


def test_a_pull_workers_failure_crossing_the_tolerance_cancels_the_other_claims(feed: Feed) -> None:
    feed.set_queue("gpu", mode="pull")
    feed.policy = RetryPolicy(max_attempts=1, retry_delay=0.0)
    feed.add_partition("p", [(0, b"{}")] * 4, queue="gpu", tolerate="1")
    claimed = feed.claim("gpu", "w", max_items=10)
    assert len(claimed) == 4
    feed.answer(claimed[0]["id"], claimed[0]["token"], {"error": {"message": "bad file", "no_retry": True}})
    assert feed.status("p").status == "available"
    feed.answer(claimed[1]["id"], claimed[1]["token"], {"error": {"message": "bad file", "no_retry": True}})
    status = feed.status("p")
    assert status.status == "failed" and status.items["cancelled"] == 2
    with pytest.raises(StaleClaim) as refused:
        feed.answer(claimed[2]["id"], claimed[2]["token"], {"done": True})
    assert refused.value.reason == "cancelled"


# ---------------------------------------------------------------- lost deliveries


def test_a_lost_delivery_that_fails_its_item_crosses_the_tolerance_when_it_is_charged(feed: Feed) -> None:
    store = feed.store
    for watcher in (A, B):
        register(store, watcher)
    feed.add_partition("p", [(0, b"1"), (0, b"2"), (0, b"3")], tolerate="0")
    store.acquire(A, "default", 10, 30)
    (suspect,) = store.fetch_ready(A, 1)
    assert store.isolate(A, suspect)  # delivered alone: its loss counts fully
    with store.write() as conn:  # A dies: its lease runs out
        conn.execute(update(partitions).where(partitions.c.key == "p").values(lease_expires_at=seconds_from_now(-1)))
    (lease,) = store.acquire(B, "default", 10, 30)
    (charged,) = store.charge_lost(B, lease, max_attempts=1)
    assert charged["failed"]
    status = feed.status("p")
    assert status.status == "failed" and status.items["cancelled"] == 2
