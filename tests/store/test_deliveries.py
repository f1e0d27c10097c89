"""Deliveries are counted when they start, and every delivery is on record (store level, every database).

A fetch records what it takes as in flight; whoever takes the partition over charges what is still
unanswered as lost deliveries; a watcher that lets deliveries go unanswered (stopped past its grace,
or an answer it could not write) charges them itself, recorded as abandoned or given back. Each
delivery that does not complete its item has a record with its error; the completing one is read
from the item row.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import select, update

from feedproc.core.errors import NotFound
from feedproc.core.records import (
    ABANDONED,
    GIVEN_BACK,
    Kind,
    Outcome,
    ReadyItem,
    Unanswered,
    decode_inflight,
    encode_inflight,
)
from feedproc.store import RECORDS_KEPT, Store
from feedproc.store.foundations import seconds_from_now
from feedproc.store.schema import attempts, inflight, partitions

from ..support import A, B, answer, register

C = "watcher-c"


def expire(store: Store, key: str) -> None:
    """The lease on `key` ran out (its holder died or stalled)."""
    with store.write() as conn:
        conn.execute(update(partitions).where(partitions.c.key == key).values(lease_expires_at=seconds_from_now(-1)))


def take(store: Store, watcher: str, limit: int = 100, **kwargs: Any) -> list[ReadyItem]:
    """Lease what is free (charging what a previous holder left) and fetch, as a watcher does."""
    max_attempts, gate_attempts = kwargs.pop("max_attempts", 5), kwargs.pop("gate_attempts", None)
    for lease in store.acquire(watcher, "default", 10, 30):
        store.charge_lost(watcher, lease, max_attempts=max_attempts, gate_attempts=gate_attempts)
    return store.fetch_ready(watcher, limit, **kwargs)


def recorded(store: Store, item_id: int) -> list[str]:
    return [h["outcome"] for h in store.item(item_id)["history"]]


def delivered(ready: ReadyItem, outcome: Outcome, n_started: float = 0.0) -> Outcome:
    """Give an outcome the record fields a watcher fills in."""
    outcome.n, outcome.attempt = ready.deliveries + 1, ready.attempts + 1
    outcome.started_us, outcome.duration_us = time.time_ns() // 1000, 250_000
    return outcome


@pytest.fixture
def three(store: Store) -> Store:
    for watcher in (A, B, C):
        register(store, watcher)
    return store


def test_a_fetch_records_what_it_takes_as_in_flight(three: Store) -> None:
    three.add_partition("p", [(0, b"1"), (0, b"2")])
    ready = take(three, A)
    with three.read() as conn:
        row = conn.execute(select(inflight)).one()
    assert (row.watcher, row.epoch) == (A, ready[0].epoch)
    assert decode_inflight(row.entries) == {r.id: (r.version, False) for r in ready}


def test_a_fetch_keeps_the_entries_still_in_flight_from_earlier_fetches(three: Store) -> None:
    three.add_partition("p", [(0, b"1"), (0, b"2")])
    first = take(three, A, limit=1)
    kept = {first[0].partition_id: [(first[0].id, first[0].version)]}
    second = three.fetch_ready(A, 10, exclude=[first[0].id], kept=kept)
    with three.read() as conn:
        entries = conn.execute(select(inflight.c.entries)).scalar_one()
    assert decode_inflight(entries) == {r.id: (r.version, False) for r in first + second}


def test_a_takeover_charges_the_unanswered_deliveries_of_a_dead_watcher(three: Store) -> None:
    three.add_partition("p", [(0, b"1"), (0, b"2")])
    answered, lost = take(three, A)
    three.apply(A, [delivered(answered, answer(answered, Kind.DONE))])
    expire(three, "p")
    (again,) = take(three, B)
    assert again.id == lost.id and again.attempts == 1 and again.lost == 1
    item = three.item(lost.id)
    assert item["attempts"] == 1 and "died or stalled during delivery 1" in item["last_error"]
    assert A in item["last_error"]
    assert recorded(three, lost.id) == ["lost"]
    assert recorded(three, answered.id) == ["done"]  # answered before the takeover: not charged


def test_a_charged_loss_is_in_the_partition_history(three: Store) -> None:
    three.add_partition("p", [(0, b"1")])
    (ready,) = take(three, A)
    expire(three, "p")
    take(three, B)
    (event,) = [e for e in three.status("p", history=50)["history"] if e["kind"] == "item_lost"]
    assert event["item"] == ready.id and event["detail"]["attempts"] == 1


def test_losses_among_others_never_use_up_the_last_attempt(three: Store) -> None:
    three.add_partition("p", [(0, b"1")])
    for watcher in (A, B, C, A):
        take(three, watcher, max_attempts=3)
        expire(three, "p")
    (ready,) = take(three, B, max_attempts=3)
    assert ready.attempts == 2 and ready.lost == 4  # capped at max_attempts - 1, still available


def test_a_loss_while_delivered_alone_counts_fully_and_fails_the_item_and_its_partition(three: Store) -> None:
    three.add_partition("p", [(0, b"1")])
    (ready,) = take(three, A, max_attempts=2)
    expire(three, "p")
    (suspect,) = take(three, B, max_attempts=2)
    assert suspect.lost == 1 and suspect.attempts == 1
    assert three.isolate(B, suspect)
    expire(three, "p")
    assert take(three, C, max_attempts=2) == []
    status = three.status("p")
    assert status["status"] == "failed"
    (failed,) = status["failed_items"]
    assert failed["attempts"] == 2 and "during delivery 2" in failed["last_error"]
    assert "delivered alone" in failed["last_error"]
    assert recorded(three, ready.id) == ["lost", "lost"]


def test_a_loss_is_charged_against_its_gates_own_attempts(three: Store) -> None:
    three.add_partition("p", [(1, b"ocr")])
    take(three, A, max_attempts=5, gate_attempts={1: 2})
    expire(three, "p")
    (suspect,) = take(three, B, max_attempts=5, gate_attempts={1: 2})
    assert suspect.attempts == 1  # one lost among others: never the last of gate 1's two attempts
    assert three.isolate(B, suspect)
    expire(three, "p")
    assert take(three, C, max_attempts=5, gate_attempts={1: 2}) == []  # lost alone: the second of two
    assert three.status("p")["failed_items"][0]["attempts"] == 2


def test_a_release_charges_against_the_gates_own_attempts(three: Store) -> None:
    three.add_partition("p", [(2, b"rank")])
    for watcher in (A, B):
        (running,) = take(three, watcher, max_attempts=5, gate_attempts={2: 2})
        abandoned = {running.partition_id: [(running.id, running.version)]}
        three.release(watcher, three.owned(watcher), abandoned=abandoned, max_attempts=5, gate_attempts={2: 2})
    item = three.item(running.id)
    assert (item["status"], item["attempts"]) == ("available", 1)  # capped below gate 2's two attempts, not 5


def test_an_item_answered_after_it_was_taken_is_not_charged(three: Store) -> None:
    three.add_partition("p", [(0, b"1")])
    (ready,) = take(three, A)
    three.apply(A, [delivered(ready, answer(ready, Kind.LATER, delay=0.0))])  # "not yet": still available
    expire(three, "p")
    (again,) = take(three, B)
    assert again.attempts == 0 and again.lost == 0
    assert recorded(three, ready.id) == ["not yet"]


def test_release_on_stop_charges_the_deliveries_it_abandons_and_only_those(three: Store) -> None:
    three.add_partition("p", [(0, b"1"), (0, b"2")])
    running, buffered = take(three, A)
    leases = three.owned(A)
    three.release(A, leases, abandoned={running.partition_id: [(running.id, running.version)]}, max_attempts=5)
    item = three.item(running.id)
    assert item["attempts"] == 1 and "stopped during delivery 1" in item["last_error"]
    assert three.item(buffered.id)["attempts"] == 0  # taken, never started: not charged
    again = {r.id: r for r in take(three, B)}
    assert again[buffered.id].attempts == 0


def test_a_release_charges_with_the_reason_given_braces_and_all(three: Store) -> None:
    three.add_partition("p", [(0, b"1")])
    (answered,) = take(three, A)
    reason = "watcher {watcher} could not write the answer of delivery {attempt}: TypeError: {'label': 1}"
    abandoned = {answered.partition_id: [(answered.id, answered.version)]}
    three.release(A, three.owned(A), abandoned=abandoned, max_attempts=5, reason=reason)
    error = three.item(answered.id)["last_error"]
    assert error == f"watcher {A} could not write the answer of delivery 1: TypeError: {{'label': 1}}"


def test_a_release_records_each_abandoned_delivery_with_its_start_duration_and_watcher(three: Store) -> None:
    three.add_partition("p", [(0, b"1")])
    (running,) = take(three, A)
    started_us = time.time_ns() // 1000 - 2_000_000
    abandoned = {running.partition_id: [Unanswered(running.id, running.version, ABANDONED, started_us, 1_750_000)]}
    assert three.release(A, three.owned(A), abandoned=abandoned, max_attempts=5) == 1
    item = three.item(running.id)
    (record,) = item["history"]
    assert (record["n"], record["attempt"], record["outcome"], record["watcher"]) == (1, 1, "abandoned", A)
    assert record["duration"] == 1.75
    assert abs(datetime.fromisoformat(record["started_at"]).timestamp() - started_us / 1e6) < 0.001
    assert record["ended_at"] and "stopped during delivery 1" in record["error"]
    assert (item["attempts"], item["deliveries"], item["status"]) == (1, 1, "available")
    assert three.status("p")["lease"] is None  # released in the same transaction as the record


def test_a_delivery_given_back_is_recorded_as_such_with_its_own_reason(three: Store) -> None:
    three.add_partition("p", [(0, b"1"), (0, b"2")])
    unwritable, running = take(three, A)
    given = [
        Unanswered(unwritable.id, unwritable.version, GIVEN_BACK, reason="watcher {watcher}: answer {attempt} lost"),
        Unanswered(running.id, running.version, GIVEN_BACK),
    ]
    reason = "watcher {watcher} could not write the answer of delivery {attempt}: ValueError"
    three.release(A, three.owned(A), kind="released", abandoned={running.partition_id: given}, reason=reason)
    (first,) = three.item(unwritable.id)["history"]
    (second,) = three.item(running.id)["history"]
    assert (first["outcome"], first["error"]) == ("given back", f"watcher {A}: answer 1 lost")
    assert (second["outcome"], second["error"]) == (
        "given back",
        f"watcher {A} could not write the answer of delivery 1: ValueError",
    )


def test_a_release_charges_what_an_earlier_holder_left_before_the_takeover_charged_it(three: Store) -> None:
    three.add_partition("p", [(0, b"1")])
    (lost,) = take(three, A)
    expire(three, "p")
    three.acquire(B, "default", 10, 30)  # taken over; B stops before charging what A left
    three.release(B, three.owned(B))
    item = three.item(lost.id)
    assert [(h["outcome"], h["watcher"]) for h in item["history"]] == [("lost", A)]
    assert item["attempts"] == 1 and "died or stalled during delivery 1" in item["last_error"]
    (again,) = take(three, C)
    assert again.attempts == 1 and again.deliveries == 1


def test_delivering_alone_leaves_the_records_of_lost_leases_to_their_new_holder(three: Store) -> None:
    three.add_partition("lost", [(0, b"1")])
    three.add_partition("kept", [(0, b"2")])
    taken = {r.partition: r for r in take(three, A)}
    expire(three, "lost")
    (lease,) = three.acquire(B, "default", 10, 30)  # B took "lost" over; its charge comes next
    assert three.isolate(A, taken["kept"])  # A, which still holds "kept", delivers an item of it alone
    (charged,) = three.charge_lost(B, lease, max_attempts=5)
    assert charged["item"] == taken["lost"].id
    assert recorded(three, taken["lost"].id) == ["lost"]


def test_lost_deliveries_keep_only_the_first_and_the_last_records(three: Store) -> None:
    three.add_partition("p", [(0, b"1")])
    losses = 2 * RECORDS_KEPT + 5
    for n in range(losses):
        take(three, (A, B, C)[n % 3], max_attempts=1000)
        expire(three, "p")
    (ready,) = take(three, A, max_attempts=1000)
    assert ready.deliveries == losses
    numbers = [h["n"] for h in three.item(ready.id)["history"]]
    assert numbers == list(range(1, RECORDS_KEPT + 1)) + list(range(losses - RECORDS_KEPT + 1, losses + 1))


def test_a_hand_over_leaves_nothing_to_charge(three: Store) -> None:
    three.add_partition("p", [(0, b"1"), (0, b"2")])
    first, _ = take(three, A)
    three.apply(A, [delivered(first, answer(first, Kind.DONE))])
    (lease,) = three.owned(A)
    with three.write() as conn:
        conn.execute(update(partitions).values(wanted_by=B))
    (lease,) = three.owned(A)
    assert three.hand_over(A, lease, 30) == B
    with three.read() as conn:
        assert conn.execute(select(inflight)).all() == []


# ---------------------------------------------------------------- the records


def test_every_delivery_that_does_not_complete_its_item_is_recorded_with_its_error(three: Store) -> None:
    three.add_partition("p", [(0, b"1")])
    (ready,) = take(three, A)
    failure = delivered(ready, answer(ready, Kind.RETRY, attempts=1, delay=0.0, error="KeyError: 'x'"))
    failure.detail = "Traceback (most recent call last):\n  ...\nKeyError: 'x'"
    three.apply(A, [failure])
    (ready,) = three.fetch_ready(A, 10)
    three.apply(A, [delivered(ready, answer(ready, Kind.MOVE, new_gate=3))])
    (ready,) = three.fetch_ready(A, 10)
    three.apply(A, [delivered(ready, answer(ready, Kind.DONE, attempts=ready.attempts))])
    item = three.item(ready.id)
    assert [(h["n"], h["attempt"], h["gate"], h["outcome"]) for h in item["history"]] == [
        (1, 1, 0, "retry"),
        (2, 2, 0, "moved"),
        (3, 1, 3, "done"),
    ]
    retry, moved, done = item["history"]
    assert retry["error"].startswith("Traceback") and retry["error"].endswith("KeyError: 'x'")
    assert moved["error"] is None and done["error"] is None
    assert all(h["watcher"] == A and h["duration"] == 0.25 and h["started_at"] for h in item["history"])
    assert item["deliveries"] == 3 and item["status"] == "complete" and item["attempts"] == 0


def test_a_failed_delivery_keeps_the_end_of_a_long_traceback(three: Store) -> None:
    three.add_partition("p", [(0, b"1")])
    (ready,) = take(three, A)
    failure = delivered(ready, answer(ready, Kind.FAIL, attempts=1, error="ValueError: deep"))
    failure.detail = "Traceback\n" + "  frame\n" * 2000 + "ValueError: deep"
    three.apply(A, [failure])
    (record,) = three.item(ready.id)["history"]
    assert record["outcome"] == "failed" and len(record["error"]) <= 4096
    assert record["error"].endswith("ValueError: deep")


def test_a_not_yet_loop_keeps_only_the_first_and_the_last_records(three: Store) -> None:
    three.add_partition("p", [(0, b"1")])
    (ready,) = take(three, A)
    loops = 3 * RECORDS_KEPT
    for _ in range(loops):
        three.apply(A, [delivered(ready, answer(ready, Kind.LATER, delay=0.0))])
        (ready,) = three.fetch_ready(A, 10)
    numbers = [h["n"] for h in three.item(ready.id)["history"]]
    assert numbers == list(range(1, RECORDS_KEPT + 1)) + list(range(loops - RECORDS_KEPT + 1, loops + 1))


def test_an_unknown_item_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        store.item(12345)


def test_retention_removes_the_records_with_their_partition(three: Store) -> None:
    three.add_partition("p", [(0, b"1")])
    (ready,) = take(three, A)
    three.apply(A, [delivered(ready, answer(ready, Kind.FAIL, attempts=1, error="no"))])
    assert three.status("p")["status"] == "failed"
    deleted = three.cleanup(-60, statuses=("failed",))
    assert deleted["partitions"] == 1 and deleted["attempts"] == 1
    with three.read() as conn:
        assert conn.execute(select(attempts)).all() == []


# ---------------------------------------------------------------- the record's encoding


def test_an_in_flight_record_keeps_runs_of_consecutive_ids_short() -> None:
    deliveries = [(n, 0) for n in range(100, 300)] + [(301, 2), (302, 2), (400, 0)]
    text = encode_inflight(deliveries)
    assert text == "100-299/0,301-302/2,400/0"
    assert decode_inflight(text) == {item: (version, False) for item, version in deliveries}


def test_an_isolated_delivery_is_marked_alone_and_malformed_runs_are_skipped() -> None:
    assert decode_inflight(encode_inflight([(7, 3)], alone=True)) == {7: (3, True)}
    assert decode_inflight("x/1,5-/2,9/z,1-99999999999/0,8/4") == {8: (4, False)}


def test_a_fetch_appends_to_the_record_and_a_rewrite_leaves_out_what_was_answered(three: Store) -> None:
    three.add_partition("p", [(0, b"1"), (0, b"2"), (0, b"3")])
    first = take(three, A, limit=1)
    second = three.fetch_ready(A, 1, exclude=[first[0].id])  # appended: both recorded
    with three.read() as conn:
        entries = conn.execute(select(inflight.c.entries)).scalar_one()
    assert set(decode_inflight(entries)) == {first[0].id, second[0].id}
    three.apply(A, [delivered(first[0], answer(first[0], Kind.DONE))])
    kept = {second[0].partition_id: [(second[0].id, second[0].version)]}  # first is answered: not kept
    third = three.fetch_ready(A, 1, exclude=[second[0].id], kept=kept)
    with three.read() as conn:
        entries = conn.execute(select(inflight.c.entries)).scalar_one()
    assert set(decode_inflight(entries)) == {second[0].id, third[0].id}
