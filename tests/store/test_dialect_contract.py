"""The dialect contract: each database's `Dialect` class (feedproc/store/dialect/) has every member of
the protocol, and its operations do what the protocol says on its real database.

The conformance suite of a dialect is tests/store as a whole: every test there runs on every database
(the `db_url` fixture), through the store's concerns, which reach the database only through their
dialect's operations. This module adds what the store-level tests do not pin on their own: the shape
of each class, and the operations whose effect is plain only when called directly.

A fourth database must pass tests/store with its URL (add it to `DATABASES` in tests/conftest.py, with
a fixture that makes a fresh migrated database per test, as `fresh_mariadb_database` does), and this
module with it: see docs/guides/adding-a-database.md. mypy checks that each class is a `Dialect`
(`dialect_for` returns each as one); the first test checks the same at run time, signatures included.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import delete, func, insert, select, update

from feedproc.store import Store
from feedproc.store.dialect import Dialect, dialect_for
from feedproc.store.dialect.mysql import MySQLDialect
from feedproc.store.dialect.postgresql import PostgreSQLDialect
from feedproc.store.dialect.sqlite import SQLiteDialect
from feedproc.store.foundations import db_now, seconds_from_now
from feedproc.store.schema import accumulators, events, items, partitions, stats

CLASSES = [SQLiteDialect, PostgreSQLDialect, MySQLDialect]
P, I = partitions.c, items.c  # noqa: E741 - column namespaces, read as table initials


def protocol_members() -> dict[str, Callable[..., Any] | None]:
    """The protocol's members: its attributes (annotations, None here) and its operations (functions)."""
    members: dict[str, Callable[..., Any] | None] = dict.fromkeys(Dialect.__annotations__)
    members.update({name: f for name, f in vars(Dialect).items() if inspect.isfunction(f) and not name.startswith("_")})
    return members


@pytest.mark.parametrize("dialect", CLASSES, ids=lambda cls: cls.name)
def test_each_dialect_class_has_every_member_of_the_protocol_with_its_signature(dialect: type) -> None:
    for name, operation in protocol_members().items():
        assert hasattr(dialect, name), f"{dialect.__name__} lacks {name}"
        if operation is None:
            continue
        theirs = inspect.signature(getattr(dialect, name))
        assert list(theirs.parameters) == list(inspect.signature(operation).parameters), f"{dialect.__name__}.{name}"


def test_the_protocol_names_operations_after_what_they_do_not_after_a_database() -> None:
    for name in protocol_members():
        assert not any(word in name for word in ("pg", "postgres", "sqlite", "mysql", "mariadb")), name


def test_a_store_runs_the_dialect_of_its_database(store: Store, db_url: str) -> None:
    expected = {"sqlite": "sqlite", "postgresql": "postgresql", "mysql": "mysql", "mariadb": "mysql"}
    assert store.dialect.name == expected[db_url.split(":")[0].split("+")[0]]
    assert type(dialect_for(store.engine)) is type(store.dialect)
    assert store.dialect.notifies == (store.dialect.name == "postgresql")


def test_insert_partition_returns_the_id_of_the_row_it_inserted(store: Store) -> None:
    with store.write() as conn:
        statement = insert(partitions).values(
            key="k",
            queue="q",
            status="available",
            gate=0,
            sealed=True,
            manual_checkpoint=False,
            created_at=db_now(),
            updated_at=db_now(),
        )
        pid = store.dialect.insert_partition(conn, statement)
        assert conn.execute(select(P.key).where(P.id == pid)).scalar_one() == "k"


def test_insert_stamped_sets_the_clock_columns_to_the_database_clock(store: Store) -> None:
    pid = _partition(store, "k")
    with store.write() as conn:
        rows = [{"partition_id": pid, "kind": "note", "item_id": None, "watcher": "w", "detail": None}] * 3
        store.dialect.insert_stamped(conn, events, rows, ("at",))
        store.dialect.insert_stamped(conn, events, [], ("at",))  # nothing: no statement
        stamped = conn.execute(select(events.c.at, db_now()).where(events.c.kind == "note")).all()
    assert len(stamped) == 3
    assert all(abs(at - now) < timedelta(seconds=5) for at, now in stamped)


def test_add_to_stats_adds_to_the_row_of_the_current_minute(store: Store) -> None:
    with store.write() as conn:
        store.dialect.add_to_stats(conn, "q", "me", {"added": 2, "completed": 1})
        store.dialect.add_to_stats(conn, "q", "me", {"added": 3})
    with store.read() as conn:
        rows = conn.execute(select(stats.c.added, stats.c.completed).where(stats.c.source == "me")).all()
    assert [tuple(r) for r in rows] == [(5, 1)]


@pytest.mark.parametrize(("how", "merged"), [("add", 5.0), ("min", 2.0), ("max", 3.0)])
def test_merge_accumulators_merges_into_the_row_already_there(store: Store, how: str, merged: float) -> None:
    pid = _partition(store, "k")
    with store.write() as conn:
        store.dialect.merge_accumulators(conn, [(pid, "n", how, 2.0)])
        store.dialect.merge_accumulators(conn, [(pid, "n", how, 3.0)])
    with store.read() as conn:
        assert (
            conn.execute(select(accumulators.c.value).where(accumulators.c.partition_id == pid)).scalar_one() == merged
        )


def test_bump_version_returns_the_version_it_set_or_none_when_nothing_matched(store: Store) -> None:
    pid = _partition(store, "k", items=1)
    with store.write() as conn:
        item, version = conn.execute(select(I.id, I.version).where(I.partition_id == pid)).one()

        def bump(matched: int) -> int | None:
            statement = update(items).where(I.id == item, I.version == matched).values(version=I.version + 1)
            return store.dialect.bump_version(conn, statement, matched)

        assert bump(version) == version + 1
        assert bump(version) is None  # the version moved on


def test_lock_leases_keeps_only_the_partitions_leased_under_their_epoch(store: Store) -> None:
    first, second = _partition(store, "a"), _partition(store, "b")
    with store.write() as conn:
        conn.execute(update(partitions).values(lease_owner="w", lease_epoch=3))
        ids = store.dialect.lock_leases(conn, "w", [(first, 3), (second, 2)])
        assert ids == [first]
        assert store.dialect.lock_leases(conn, "someone else", [(first, 3)]) == []


def test_lock_held_leases_returns_the_epochs_of_the_partitions_still_held(store: Store) -> None:
    first, second = _partition(store, "a", items=1), _partition(store, "b", items=1)
    with store.write() as conn:
        conn.execute(update(partitions).where(P.id == first).values(lease_owner="w", lease_epoch=4))
        assert store.dialect.lock_held_leases(conn, [first, second], "w") == {first: 4}


def test_deletable_lets_a_delete_read_a_limited_chunk_of_its_own_table(store: Store) -> None:
    pid = _partition(store, "k", items=5)
    with store.write() as conn:
        chunk = select(I.id).where(I.partition_id == pid).limit(2)
        removed = conn.execute(delete(items).where(I.id.in_(store.dialect.deletable(chunk).scalar_subquery())))
        assert removed.rowcount == 2
        assert conn.execute(select(func.count()).select_from(items)).scalar_one() == 3


def test_refresh_ready_at_sets_each_partition_from_its_earliest_due_item(store: Store) -> None:
    pid = _partition(store, "k", items=2)
    with store.write() as conn:
        conn.execute(update(items).values(next_attempt_at=seconds_from_now(3600)))
        (row,) = store.dialect.refresh_ready_at(conn, [pid], idle_after=10.0)
        assert row.id == pid and row.idle  # nothing due for an hour
        due = conn.execute(select(func.min(I.next_attempt_at))).scalar_one()
        assert conn.execute(select(P.ready_at).where(P.id == pid)).scalar_one() == due


def _partition(store: Store, key: str, *, items: int = 0) -> int:
    store.add_partition(key, [(0, b"x")] * items)
    with store.read() as conn:
        pid: int = conn.execute(select(P.id).where(P.key == key)).scalar_one()
    return pid
