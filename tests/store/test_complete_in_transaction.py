"""Complete in your transaction (issue 33), at the store: `apply(within=store.transaction())` writes
an answer in the transaction a processor wrote its own rows in, and commits it only if the answer is
accepted. A stale lease epoch, a lease taken over, a lease expired on the database's clock or an item
changed by an operator refuses the answer and rolls the processor's rows back with it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
from sqlalchemy import text, update

from feedproc.core.records import Kind, ReadyItem
from feedproc.store import Store
from feedproc.store.base import I, P
from feedproc.store.schema import items, partitions

from ..support import A, B, answer, lease_and_fetch


@pytest.fixture
def ledger(store: Store) -> Iterator[None]:
    """The processor's own table, beside feedproc's in the same database."""
    with store.engine.begin() as conn:
        conn.execute(text("CREATE TABLE ledger (item_id BIGINT PRIMARY KEY)"))
    yield


def ledger_rows(store: Store) -> list[int]:
    with store.engine.connect() as conn:
        return sorted(conn.execute(text("SELECT item_id FROM ledger")).scalars())


def one_ready(store: Store) -> ReadyItem:
    store.add_partition("p", [(0, b"{}")])
    [ready] = lease_and_fetch(store)
    return ready


def write_and_answer(store: Store, ready: ReadyItem, *, epoch: int | None = None) -> tuple[int, list[int], set[int]]:
    """The processor's row and its answer in one transaction: (items written, superseded, lost)."""
    conn = store.transaction()
    conn.execute(text("INSERT INTO ledger (item_id) VALUES (:id)"), {"id": ready.id})
    outcome = answer(replace(ready, epoch=ready.epoch if epoch is None else epoch), Kind.DONE)
    applied = store.apply(A, [outcome], within=conn)
    assert conn.closed
    return len(applied.written), applied.superseded, applied.lost


def item_status(store: Store, item_id: int) -> str:
    with store.read() as conn:
        return str(conn.execute(text("SELECT status FROM feedproc_items WHERE id = :id"), {"id": item_id}).scalar())


@pytest.mark.usefixtures("ledger")
def test_an_accepted_answer_commits_the_processors_row_with_it(store: Store) -> None:
    ready = one_ready(store)
    assert write_and_answer(store, ready) == (1, [], set())
    assert ledger_rows(store) == [ready.id]
    assert item_status(store, ready.id) == "complete"
    assert store.status("p")["status"] == "complete"


@pytest.mark.usefixtures("ledger")
def test_a_stale_lease_epoch_rolls_the_processors_row_back(store: Store) -> None:
    ready = one_ready(store)
    assert write_and_answer(store, ready, epoch=ready.epoch - 1) == (0, [], {ready.partition_id})
    assert ledger_rows(store) == []
    assert item_status(store, ready.id) == "available"


@pytest.mark.usefixtures("ledger")
def test_a_lease_taken_over_by_another_watcher_rolls_the_processors_row_back(store: Store) -> None:
    ready = one_ready(store)
    with store.write() as conn:  # what a steal leaves: another owner, the next epoch
        conn.execute(update(partitions).values(lease_owner=B, lease_epoch=P.lease_epoch + 1))
    assert write_and_answer(store, ready)[2] == {ready.partition_id}
    assert ledger_rows(store) == []


@pytest.mark.usefixtures("ledger")
def test_a_lease_expired_on_the_database_clock_rolls_the_processors_row_back(store: Store) -> None:
    """Still this watcher's by owner and epoch, yet ended: on SQLite no one could take it over while the
    processor's transaction held the lock, but the watcher may have been told so by its own clock."""
    ready = one_ready(store)
    conn = store.transaction()
    conn.execute(text("INSERT INTO ledger (item_id) VALUES (:id)"), {"id": ready.id})
    # The lease ends while the processor works (in the same transaction: SQLite has one writer).
    conn.execute(update(partitions).values(lease_expires_at=P.created_at))
    applied = store.apply(A, [answer(ready, Kind.DONE)], within=conn)
    assert applied.lost == {ready.partition_id} and applied.written == []
    assert ledger_rows(store) == []
    assert item_status(store, ready.id) == "available"


@pytest.mark.usefixtures("ledger")
def test_an_item_changed_by_an_operator_meanwhile_rolls_the_processors_row_back(store: Store) -> None:
    ready = one_ready(store)
    with store.write() as conn:  # a retry, skip or cancel bumps the item's version
        conn.execute(update(items).where(I.id == ready.id).values(version=I.version + 1))
    assert write_and_answer(store, ready) == (0, [ready.id], set())
    assert ledger_rows(store) == []


@pytest.mark.usefixtures("ledger")
def test_a_discarded_transaction_leaves_nothing_and_the_answer_can_be_written_after(store: Store) -> None:
    """A processor that raised: its rows are rolled back, its failure is written in a group commit."""
    ready = one_ready(store)
    conn = store.transaction()
    conn.execute(text("INSERT INTO ledger (item_id) VALUES (:id)"), {"id": ready.id})
    store.discard(conn)
    assert conn.closed
    assert ledger_rows(store) == []
    store.apply(A, [answer(ready, Kind.RETRY, attempts=1, error="boom")])
    assert item_status(store, ready.id) == "available"
