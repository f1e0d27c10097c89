"""A queue's pending work (`store/pending.py`), which the testing kit's fake clock rests on: when
its next work is due, every due time brought forward, unfinished partitions, deliveries made."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from feedproc import InvalidInput, NotFound
from feedproc.core.records import Kind
from feedproc.store import Store

from ..support import A, answer, lease_and_fetch, register, work_off


def retried(store: Store, key: str) -> None:
    """Deliver `key`'s ready items once, each failing transiently: due again in 60 s."""
    register(store, A)
    ready = [r for r in lease_and_fetch(store) if r.partition == key]
    store.apply(A, [answer(r, Kind.RETRY, attempts=1, delay=60.0, error="boom") for r in ready])
    store.release(A, store.owned(A))


def test_work_added_now_is_due_now(store: Store) -> None:
    store.add_partition("p", [(0, b"{}")])
    due = store.next_due("default")
    assert due is not None and due <= 0


def test_nothing_is_due_in_a_queue_whose_partitions_are_finished_or_waiting_for_items(store: Store) -> None:
    assert store.next_due("default") is None
    store.add_partition("empty-open", [], sealed=False)
    store.add_partition("done", [])
    assert store.next_due("default") is None
    assert store.unfinished("default") == ["empty-open"]


def test_a_retry_is_due_after_its_backoff_and_is_due_now_once_brought_forward(store: Store) -> None:
    store.add_partition("p", [(0, b"{}")])
    retried(store, "p")
    due = store.next_due("default")
    assert due is not None and 50 < due <= 60
    assert store.bring_forward("default", due) == 1
    now = store.next_due("default")
    assert now is not None and now <= 0
    assert [r.partition for r in lease_and_fetch(store)] == ["p"]


def test_a_partitions_not_before_is_its_due_time_and_is_brought_forward_too(store: Store) -> None:
    store.add_partition("later", [(0, b"{}")], not_before=datetime.now(UTC) + timedelta(hours=1))
    due = store.next_due("default")
    assert due is not None and 3500 < due <= 3600
    store.bring_forward("default", 3600)
    now = store.next_due("default")
    assert now is not None and now <= 0


def test_bringing_forward_moves_only_the_queues_own_work(store: Store) -> None:
    store.add_partition("mine", [(0, b"{}")], not_before=datetime.now(UTC) + timedelta(hours=1))
    store.add_partition("theirs", [(0, b"{}")], queue="other", not_before=datetime.now(UTC) + timedelta(hours=1))
    store.bring_forward("default", 3600)
    theirs = store.next_due("other")
    assert theirs is not None and theirs > 3500


def test_deliveries_made_counts_every_answered_delivery_of_the_queue(store: Store) -> None:
    store.add_partition("p", [(0, b"{}"), (0, b"{}")])
    assert store.deliveries_made("default") == 0
    register(store, A)
    work_off(store, "p", Kind.DONE)
    assert store.deliveries_made("default") == 2
    assert store.unfinished("default") == []


def test_a_partitions_id_is_found_by_its_key(store: Store) -> None:
    store.add_partition("p", [])
    assert store.accumulated(store.partition_id("p")) == {}
    with pytest.raises(NotFound, match="no partition 'nope'"):
        store.partition_id("nope")


def test_the_clock_moves_forward_only(store: Store) -> None:
    with pytest.raises(InvalidInput, match="seconds must be a number"):
        store.bring_forward("default", -1)
