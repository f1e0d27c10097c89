"""A finished partition's lifecycle (every database): resubmitted, it runs again from its first gate
with the items its producer added, children and results gone, history kept; removed, nothing of it
is left; an available partition is refused both. Keys generated for a producer that gave none."""

from __future__ import annotations

import re
import time
import uuid

import pytest
from sqlalchemy import func, select

from feedproc import Feed
from feedproc.core.errors import NotFound, Refused
from feedproc.core.models import AddedPartition, NewItem, uuid7
from feedproc.core.records import Kind
from feedproc.store import Store
from feedproc.store.schema import accumulators, attempts, events, items, partitions

from ..support import A, answer, lease_and_fetch, register, work_off


def finished_with_children(store: Store) -> None:
    """Partition "p": two producer items at gate 0; the first answers with a child at gate 1 and a
    result, the second fails; the partition fails at gate 0."""
    register(store, A)
    store.add_partition("p", [(0, b'"one"'), (0, b'"two"')])
    first, second = lease_and_fetch(store)
    child = NewItem(gate=1, data=b'"child"')
    store.apply(
        A,
        [
            answer(first, Kind.DONE, children=(child,), result=b'"r"'),
            answer(second, Kind.FAIL, error="broken", attempts=1),
        ],
    )
    assert store.status("p")["status"] == "failed"


def rows_of(store: Store, key: str) -> list[tuple[int, str, bytes, bytes | None, int, object]]:
    with store.read() as conn:
        pid = conn.execute(select(partitions.c.id).where(partitions.c.key == key)).scalar_one()
        return [
            (r.gate, r.status, bytes(r.data), r.result, r.attempts, r.last_error)
            for r in conn.execute(select(items).where(items.c.partition_id == pid).order_by(items.c.id))
        ]


def test_resubmit_puts_the_producers_items_back_at_the_first_gate_and_drops_children(store: Store) -> None:
    finished_with_children(store)

    assert store.resubmit("p") == 2

    assert rows_of(store, "p") == [(0, "available", b'"one"', None, 0, None), (0, "available", b'"two"', None, 0, None)]
    partition = store.status("p")
    assert (partition["status"], partition["gate"]) == ("available", 0)


def test_resubmit_brings_moved_and_rewritten_items_back_to_the_gate_and_data_they_were_added_with(
    store: Store,
) -> None:
    register(store, A)
    store.add_partition("p", [(0, b'"one"'), (0, b'"two"')])
    first, second = lease_and_fetch(store)
    store.apply(A, [answer(first, Kind.MOVE, new_gate=2, data=b'"moved"'), answer(second, Kind.DONE, data=b'"out"')])
    (moved,) = lease_and_fetch(store)
    store.apply(A, [answer(moved, Kind.MOVE, new_gate=3, data=b'"moved again"')])
    (again,) = lease_and_fetch(store)
    store.apply(A, [answer(again, Kind.DONE)])
    assert store.status("p")["status"] == "complete"

    store.resubmit("p")

    assert rows_of(store, "p") == [(0, "available", b'"one"', None, 0, None), (0, "available", b'"two"', None, 0, None)]


def test_answers_that_only_complete_items_store_no_second_copy(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"{}"), (0, b"{}")])
    first, second = lease_and_fetch(store)
    store.apply(A, [answer(first, Kind.DONE), answer(second, Kind.RETRY, error="later", attempts=1)])

    with store.read() as conn:
        kept = conn.execute(select(func.count()).where(items.c.origin_gate.is_not(None))).scalar_one()
    assert kept == 0


def test_resubmit_keeps_the_history_and_records_a_resubmitted_event(store: Store) -> None:
    finished_with_children(store)
    before = [e["kind"] for e in store.history("p")]

    store.resubmit("p", by="tester")

    history = store.history("p")
    assert [e["kind"] for e in history][: len(before)] == before
    assert history[-1]["kind"] == "resubmitted"
    assert history[-1]["detail"] == {"items": 2, "children_removed": 1, "was": "failed", "by": "tester"}


def test_resubmit_empties_the_accumulators(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"{}")])
    (ready,) = lease_and_fetch(store)
    store.apply(A, [answer(ready, Kind.DONE, accumulate={"n": 3.0}, operations={"n": "sum"})])
    with store.read() as conn:
        assert conn.execute(select(func.count()).select_from(accumulators)).scalar_one() == 1

    store.resubmit("p")

    with store.read() as conn:
        assert conn.execute(select(func.count()).select_from(accumulators)).scalar_one() == 0


def test_a_resubmitted_partition_is_worked_off_again_and_completes(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"{}"), (0, b"{}")])
    work_off(store, "p")
    assert store.status("p")["status"] == "complete"

    store.resubmit("p")
    work_off(store, "p")

    assert store.status("p")["status"] == "complete"


@pytest.mark.parametrize("finish", ["cancel", "complete"])
def test_complete_and_cancelled_partitions_can_be_resubmitted(store: Store, finish: str) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"{}")])
    if finish == "cancel":
        store.cancel("p")
    else:
        work_off(store, "p")

    assert store.resubmit("p") == 1
    assert store.status("p")["status"] == "available"


def test_an_available_partition_cannot_be_resubmitted_and_nothing_changes(store: Store) -> None:
    store.add_partition("p", [(0, b"{}")])
    before = rows_of(store, "p")

    with pytest.raises(Refused, match="not finished"):
        store.resubmit("p")

    assert rows_of(store, "p") == before


def test_an_answer_from_before_the_resubmit_is_dropped(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"{}")], sealed=False)
    (ready,) = lease_and_fetch(store)
    store.cancel("p")
    store.resubmit("p")

    applied = store.apply(A, [answer(ready, Kind.DONE)])

    assert not applied.written
    assert rows_of(store, "p")[0][1] == "available"


def test_remove_deletes_a_finished_partition_with_everything_that_refers_to_it(store: Store) -> None:
    finished_with_children(store)

    removed = store.remove("p")

    assert removed["partitions"] == 1 and removed["items"] == 3 and removed["events"] >= 2
    with store.read() as conn:
        for table in (partitions, items, events, attempts, accumulators):
            assert conn.execute(select(func.count()).select_from(table)).scalar_one() == 0, table.name
    with pytest.raises(NotFound):
        store.status("p")


def test_an_answer_for_a_removed_partition_is_dropped(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"{}")], sealed=False)
    (ready,) = lease_and_fetch(store)
    store.cancel("p")
    store.remove("p")

    applied = store.apply(A, [answer(ready, Kind.DONE, children=(NewItem(gate=1, data=b"{}"),))])

    assert not applied.written
    with store.read() as conn:
        assert conn.execute(select(func.count()).select_from(items)).scalar_one() == 0


def test_remove_leaves_other_partitions_alone(store: Store) -> None:
    store.add_partition("gone", [(0, b"{}")])
    store.add_partition("kept", [(0, b"{}")])
    store.cancel("gone")

    store.remove("gone")

    assert store.status("kept")["status"] == "available"


def test_an_available_partition_cannot_be_removed(store: Store) -> None:
    store.add_partition("p", [(0, b"{}")])

    with pytest.raises(Refused, match="cancel it first"):
        store.remove("p")

    assert store.status("p")["status"] == "available"


def test_an_unknown_partition_is_not_found_by_either(store: Store) -> None:
    with pytest.raises(NotFound):
        store.resubmit("nope")
    with pytest.raises(NotFound):
        store.remove("nope")


def test_add_partition_without_a_key_generates_a_uuid7_and_returns_it(feed: Feed) -> None:
    added = feed.add_partition(None, [(0, b"{}")], sealed=False)

    assert isinstance(added, AddedPartition) and added.items == 1
    assert uuid.UUID(added.key).version == 7
    assert feed.status(added.key).status == "available"


def test_add_partition_with_a_key_still_returns_the_number_of_items(feed: Feed) -> None:
    assert feed.add_partition("mine", [(0, b"{}"), (0, b"{}")]) == 2


def test_uuid7_has_the_rfc_layout_and_sorts_by_time() -> None:
    now = time.time_ns() // 1_000_000
    earlier, later = uuid7(now, b"\xff" * 10), uuid7(now + 1, b"\x00" * 10)

    parsed = uuid.UUID(earlier)
    assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
    assert int(parsed.hex[:12], 16) == now
    assert earlier < later
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", later)
