"""The Store directly, on SQLite, PostgreSQL and MariaDB: producer operations, the gate rules as the database
applies them, and the watcher side (leasing, fencing, optimistic concurrency, steals, fan-out)."""

import contextlib
import functools
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, Row, func, insert, select, text
from sqlalchemy.exc import IntegrityError

from feedproc.core.errors import DatabaseUnavailable, DuplicateKey, InvalidInput, NotFound, Refused
from feedproc.core.models import MAX_CHILDREN, NewItem
from feedproc.core.records import Kind, Lease
from feedproc.store import INSERT_CHUNK, Store
from feedproc.store.dialect.postgresql import PG_FETCH_READY
from feedproc.store.schema import items, partitions

from ..support import A, B, answer, fail, lease_and_fetch, register, statements_observed, wait_until, work_off

# ---------------------------------------------------------------- helpers


def item_rows(store: Store, key: str) -> Sequence[Row[Any]]:
    with store.read() as conn:
        return conn.execute(
            select(items)
            .join(partitions, partitions.c.id == items.c.partition_id)
            .where(partitions.c.key == key)
            .order_by(items.c.id)
        ).all()


def history(store: Store, key: str, kind: str | None = None) -> list[dict[str, Any]]:
    events = store.status(key, history=50)["history"]
    return [e for e in events if kind is None or e["kind"] == kind]


def db_clock(store: Store) -> datetime:
    with store.read() as conn:
        if store.dialect.name == "postgresql":
            return conn.execute(select(func.now())).scalar_one()
    return datetime.now(UTC)


# ---------------------------------------------------------------- rule 1: a new partition


def test_new_partition_starts_at_the_lowest_item_gate(store: Store) -> None:
    store.add_partition("p", [(3, b"a"), (1, b"b"), (5, b"c")])
    status = store.status("p")
    assert (status["status"], status["gate"]) == ("available", 1)


def test_empty_sealed_partition_completes_at_once(store: Store) -> None:
    assert store.add_partition("p", []) == 0
    status = store.status("p")
    assert (status["status"], status["gate"], status["sealed"]) == ("complete", 0, True)


def test_empty_open_partition_stays_available_at_gate_zero(store: Store) -> None:
    store.add_partition("p", [], sealed=False)
    status = store.status("p")
    assert (status["status"], status["gate"], status["sealed"]) == ("available", 0, False)


def test_add_partition_returns_the_number_of_items_and_stores_their_data(store: Store) -> None:
    assert store.add_partition("p", [(0, b"one"), {"gate": 0, "data": {"x": 1}}, NewItem(2, b"three")]) == 3
    assert [(r.gate, r.data) for r in item_rows(store, "p")] == [(0, b"one"), (0, b'{"x":1}'), (2, b"three")]


def test_add_partition_with_more_items_than_one_insert_chunk_keeps_them_all(store: Store) -> None:
    gates = [2] * INSERT_CHUNK + [1]  # the lowest gate arrives in the last chunk
    assert store.add_partition("p", [(g, b"x") for g in gates]) == INSERT_CHUNK + 1
    status = store.status("p")
    assert (status["gate"], status["items"]["total"]) == (1, INSERT_CHUNK + 1)


def test_add_partition_defaults_queue_priority_and_flags(store: Store) -> None:
    store.add_partition("p", [(0, b"x")])
    status = store.status("p")
    assert (status["queue"], status["priority"], status["sealed"], status["manual_checkpoint"]) == (
        "default",
        0,
        True,
        False,
    )


# ---------------------------------------------------------------- input errors


def test_duplicate_key_raises_duplicate_key_and_leaves_the_first_partition_untouched(store: Store) -> None:
    store.add_partition("p", [(0, b"first")], sealed=False, priority=3)
    before = store.status("p")
    with pytest.raises(DuplicateKey):
        store.add_partition("p", [(0, b"second"), (1, b"third")], priority=9)
    assert store.status("p") == before
    assert [r.data for r in item_rows(store, "p")] == [b"first"]


def test_duplicate_key_is_a_refusal() -> None:
    assert issubclass(DuplicateKey, Refused)


def test_bad_partition_keys_raise_invalid_input_and_write_nothing(store: Store) -> None:
    for key in ("", "has space", "x" * 201, "semi;colon", "ümlaut", "new\nline"):
        with pytest.raises(InvalidInput):
            store.add_partition(key, [(0, b"x")])
    assert store.summary()["items"]["total"] == 0
    assert sum(store.summary()["partitions"].values()) == 0


def test_a_not_before_that_is_not_a_time_is_refused_and_writes_nothing(store: Store) -> None:
    with pytest.raises(InvalidInput, match="not_before must be a datetime, got 3600"):
        store.add_partition("p", [(0, b"x")], not_before=3600)  # type: ignore[arg-type]
    with pytest.raises(NotFound):
        store.status("p")


def test_key_of_200_allowed_characters_is_accepted(store: Store) -> None:
    key = ("Az09._:/-" * 23)[:200]
    store.add_partition(key, [(0, b"x")])
    assert store.status(key)["key"] == key


def test_negative_gate_in_a_new_partition_raises_invalid_input_and_writes_nothing(store: Store) -> None:
    with pytest.raises(InvalidInput):
        store.add_partition("p", [(0, b"ok"), (-1, b"bad")])
    with pytest.raises(NotFound):
        store.status("p")
    assert store.summary()["items"]["total"] == 0


def test_negative_gate_in_add_items_raises_invalid_input_and_writes_nothing(store: Store) -> None:
    store.add_partition("p", [(0, b"x")], sealed=False)
    before = store.status("p")
    with pytest.raises(InvalidInput):
        store.add_items("p", [(0, b"ok"), (-1, b"bad")])
    assert store.status("p") == before


def test_unknown_key_raises_not_found_which_is_a_key_error(store: Store) -> None:
    for operation in (store.status, store.seal, store.retry, store.cancel, store.checkpoint):
        with pytest.raises(NotFound):
            operation("missing")
    with pytest.raises(KeyError):
        store.add_items("missing", [(0, b"x")])


# ---------------------------------------------------------------- rule 4 and add_items


def test_add_items_below_the_current_gate_is_refused_and_writes_nothing(store: Store) -> None:
    store.add_partition("p", [(2, b"x")], sealed=False)
    before = store.status("p")
    with pytest.raises(Refused, match="below the partition's current gate 2"):
        store.add_items("p", [(2, b"ok"), (5, b"ok"), (1, b"too low")])
    assert store.status("p") == before
    assert len(item_rows(store, "p")) == 1


def test_add_items_refused_after_a_full_insert_chunk_writes_nothing(store: Store) -> None:
    store.add_partition("p", [(1, b"x")], sealed=False)
    before = store.status("p")
    with pytest.raises(Refused):
        store.add_items("p", [(1, b"ok")] * INSERT_CHUNK + [(0, b"too low")])
    assert store.status("p") == before


def test_add_items_at_and_above_the_current_gate_is_accepted(store: Store) -> None:
    store.add_partition("p", [(2, b"x")], sealed=False)
    assert store.add_items("p", [(2, b"same"), (7, b"above")]) == 2
    assert store.status("p")["gates"] == {
        "2": {"available": 2, "complete": 0, "failed": 0, "cancelled": 0},
        "7": {"available": 1, "complete": 0, "failed": 0, "cancelled": 0},
    }


def test_add_items_to_a_drained_open_partition_advances_to_their_gate(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"x")], sealed=False)
    work_off(store, "p")
    assert store.status("p")["gate"] == 0
    store.add_items("p", [(4, b"later")])
    status = store.status("p")
    assert (status["status"], status["gate"]) == ("available", 4)


def test_add_items_is_refused_for_sealed_and_finished_partitions(store: Store) -> None:
    register(store, A)
    store.add_partition("sealed", [(0, b"x")])
    store.add_partition("complete", [])
    store.add_partition("cancelled", [(0, b"x")], sealed=False)
    store.cancel("cancelled")
    store.add_partition("failed", [(0, b"x")], sealed=False)
    work_off(store, "failed", Kind.FAIL)
    for key in ("sealed", "complete", "cancelled", "failed"):
        before = store.status(key)
        with pytest.raises(Refused, match=key):
            store.add_items(key, [(0, b"y")])
        assert store.status(key) == before


# ---------------------------------------------------------------- seal


def test_seal_completes_a_drained_open_partition(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"x")], sealed=False)
    work_off(store, "p")
    assert store.status("p")["status"] == "available"
    store.seal("p")
    status = store.status("p")
    assert (status["status"], status["sealed"]) == ("complete", True)


def test_seal_keeps_a_partition_with_work_available(store: Store) -> None:
    store.add_partition("p", [(0, b"x")], sealed=False)
    store.seal("p")
    status = store.status("p")
    assert (status["status"], status["sealed"]) == ("available", True)


def test_sealing_twice_is_a_no_op(store: Store) -> None:
    store.add_partition("p", [(0, b"x")])
    before = store.status("p")
    store.seal("p")
    assert store.status("p") == before


# ---------------------------------------------------------------- retry


def test_retry_is_refused_unless_the_partition_failed(store: Store) -> None:
    register(store, A)
    store.add_partition("available", [(0, b"x")])
    store.add_partition("complete", [])
    store.add_partition("cancelled", [(0, b"x")])
    store.cancel("cancelled")
    for key in ("available", "complete", "cancelled"):
        before = store.status(key)
        with pytest.raises(Refused, match="not failed"):
            store.retry(key)
        assert store.status(key) == before


def test_retry_resets_attempts_and_makes_the_partition_available_again(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"x"), (0, b"y"), (1, b"z")])
    ready = [r for r in lease_and_fetch(store) if r.partition == "p"]
    store.apply(A, [fail(ready[0], attempts=5, error="gave up"), answer(ready[1], Kind.DONE)])
    failed = store.status("p")
    assert (failed["status"], failed["gate"]) == ("failed", 0)
    assert failed["failed_items"] == [{"id": ready[0].id, "gate": 0, "attempts": 5, "last_error": "gave up"}]

    assert store.retry("p") == 1
    status = store.status("p")
    assert (status["status"], status["gate"], status["items"]["failed"]) == ("available", 0, 0)
    row = next(r for r in item_rows(store, "p") if r.id == ready[0].id)
    assert (row.status, row.attempts) == ("available", 0)
    again = lease_and_fetch(store)
    assert [(r.id, r.attempts) for r in again] == [(ready[0].id, 0)]


# ---------------------------------------------------------------- cancel


def test_cancel_cancels_the_available_items(store: Store) -> None:
    store.add_partition("p", [(0, b"x"), (3, b"y")])
    store.cancel("p")
    status = store.status("p")
    assert status["status"] == "cancelled"
    assert status["items"] == {"total": 2, "available": 0, "complete": 0, "failed": 0, "cancelled": 2}


def test_cancel_leaves_failed_items_failed(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"x"), (1, b"y")])
    work_off(store, "p", Kind.FAIL)
    assert store.status("p")["status"] == "failed"
    store.cancel("p")
    status = store.status("p")
    assert status["status"] == "cancelled"
    assert status["gates"]["0"]["failed"] == 1
    assert status["gates"]["1"]["cancelled"] == 1
    assert [f["gate"] for f in status["failed_items"]] == [0]


def test_cancelling_twice_is_a_no_op(store: Store) -> None:
    store.add_partition("p", [(0, b"x")])
    store.cancel("p")
    before = store.status("p", history=50)
    store.cancel("p")
    assert store.status("p", history=50) == before


def test_cancelling_a_complete_partition_is_refused(store: Store) -> None:
    store.add_partition("p", [])
    before = store.status("p")
    with pytest.raises(Refused, match="complete"):
        store.cancel("p")
    assert store.status("p") == before


def test_cancel_fences_out_the_watcher_holding_the_lease(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"x")])
    (ready,) = lease_and_fetch(store)
    store.cancel("p")
    assert store.status("p")["lease"] is None
    applied = store.apply(A, [answer(ready, Kind.DONE)])
    assert applied.written == []
    assert applied.lost == {ready.partition_id}
    assert item_rows(store, "p")[0].status == "cancelled"


# ---------------------------------------------------------------- manual checkpoints


def test_checkpoint_is_refused_without_manual_checkpoint(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"x"), (1, b"y")], manual_checkpoint=False)
    before = store.status("p")
    with pytest.raises(Refused, match="no manual checkpoint"):
        store.checkpoint("p")
    assert store.status("p") == before


def test_checkpoint_is_refused_while_the_gate_has_available_items(store: Store) -> None:
    store.add_partition("p", [(0, b"x"), (1, b"y")], manual_checkpoint=True)
    before = store.status("p")
    with pytest.raises(Refused, match="still has available items"):
        store.checkpoint("p")
    assert store.status("p") == before


def test_checkpoint_is_refused_when_no_gate_above_holds_work(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"x")], sealed=False, manual_checkpoint=True)
    work_off(store, "p")
    before = store.status("p")
    with pytest.raises(Refused, match="no gate above"):
        store.checkpoint("p")
    assert store.status("p") == before


def test_checkpoint_is_refused_for_a_finished_partition(store: Store) -> None:
    store.add_partition("p", [], manual_checkpoint=True)
    with pytest.raises(Refused, match="complete"):
        store.checkpoint("p")


def test_manual_checkpoint_partition_waits_at_its_drained_gate(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"x"), (2, b"y")], manual_checkpoint=True)
    work_off(store, "p")
    status = store.status("p")
    assert (status["status"], status["gate"]) == ("available", 0)
    assert lease_and_fetch(store) == []


def test_checkpoint_advances_to_the_next_gate_with_work_skipping_empty_gates(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"x"), (3, b"y"), (5, b"z")], manual_checkpoint=True)
    work_off(store, "p")
    assert store.checkpoint("p") == 3
    assert store.status("p")["gate"] == 3
    assert [r.gate for r in lease_and_fetch(store)] == [3]


# ---------------------------------------------------------------- status and summary


def test_status_has_the_contract_fields(store: Store) -> None:
    store.add_partition("p", [(0, b"x"), (2, b"y")], queue="q1", priority=4, sealed=False)
    status = store.status("p")
    expected = {"key", "queue", "status", "gate", "priority", "sealed", "items", "gates", "failed_items"}
    assert expected <= set(status)
    assert (status["key"], status["queue"], status["status"], status["gate"]) == ("p", "q1", "available", 0)
    assert (status["priority"], status["sealed"]) == (4, False)
    assert status["items"] == {"total": 2, "available": 2, "complete": 0, "failed": 0, "cancelled": 0}
    assert status["gates"] == {
        "0": {"available": 1, "complete": 0, "failed": 0, "cancelled": 0},
        "2": {"available": 1, "complete": 0, "failed": 0, "cancelled": 0},
    }
    assert status["failed_items"] == []


def test_status_timestamps_are_iso_utc(store: Store) -> None:
    store.add_partition("p", [(0, b"x")], not_before=datetime(2020, 1, 2, 3, 4, 5))
    status = store.status("p")
    assert status["not_before"] == "2020-01-02T03:04:05.000Z"
    for field in ("created_at", "updated_at"):
        assert status[field].endswith("Z")
        datetime.fromisoformat(status[field].replace("Z", "+00:00"))


def test_status_lists_at_most_100_failed_items(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"x")] * 105)
    ready = lease_and_fetch(store, limit=200)
    assert len(ready) == 105
    store.apply(A, [fail(r) for r in ready])
    status = store.status("p")
    assert status["status"] == "failed"
    assert status["items"]["failed"] == 105
    assert len(status["failed_items"]) == 100
    assert set(status["failed_items"][0]) == {"id", "gate", "attempts", "last_error"}


def test_summary_counts_partitions_and_items_by_status(store: Store) -> None:
    register(store, A)
    store.add_partition("open", [(0, b"x"), (1, b"y")])
    store.add_partition("done", [])
    store.add_partition("gone", [(0, b"x")])
    store.cancel("gone")
    store.add_partition("bad", [(0, b"x")], priority=9)
    work_off(store, "bad", Kind.FAIL)
    assert store.summary() == {
        "partitions": {"available": 1, "complete": 1, "failed": 1, "cancelled": 1},
        "items": {"total": 4, "available": 2, "complete": 0, "failed": 1, "cancelled": 1},
    }


# ---------------------------------------------------------------- acquiring leases


def test_acquire_orders_by_priority_then_age(store: Store) -> None:
    register(store, A)
    for key, priority in (("old-low", 0), ("old-high", 5), ("new-low", 0), ("new-high", 5), ("top", 9)):
        store.add_partition(key, [(0, b"x")], priority=priority)
    order = [lease.key for _ in range(5) for lease in store.acquire(A, "default", 1, 30)]
    assert order == ["top", "old-high", "new-high", "old-low", "new-low"]


def test_acquire_takes_at_most_limit_partitions(store: Store) -> None:
    register(store, A)
    for n in range(5):
        store.add_partition(f"p{n}", [(0, b"x")])
    assert len(store.acquire(A, "default", 3, 30)) == 3
    assert len(store.owned(A)) == 3
    assert store.acquire(A, "default", 0, 30) == []


def test_acquire_leases_only_its_queue(store: Store) -> None:
    register(store, A, queue="q1")
    store.add_partition("other", [(0, b"x")], queue="q2")
    store.add_partition("mine", [(0, b"x")], queue="q1")
    assert [lease.key for lease in store.acquire(A, "q1", 10, 30)] == ["mine"]


def test_acquire_does_not_take_a_live_lease(store: Store) -> None:
    register(store, A)
    register(store, B)
    store.add_partition("p", [(0, b"x")])
    assert len(store.acquire(A, "default", 10, 30)) == 1
    assert store.acquire(B, "default", 10, 30) == []


def test_acquire_skips_a_partition_whose_not_before_is_in_the_future(store: Store) -> None:
    register(store, A)
    now = db_clock(store)
    store.add_partition("later", [(0, b"x")], not_before=now + timedelta(hours=1))
    store.add_partition("due", [(0, b"x")], not_before=now - timedelta(seconds=1))
    assert [lease.key for lease in store.acquire(A, "default", 10, 30)] == ["due"]


def test_acquire_skips_partitions_without_ready_work(store: Store) -> None:
    register(store, A)
    store.add_partition("empty-open", [], sealed=False)
    store.add_partition("checkpoint", [(0, b"x"), (1, b"y")], manual_checkpoint=True)
    work_off(store, "checkpoint")
    store.add_partition("backoff", [(0, b"x")])
    (ready,) = lease_and_fetch(store)
    store.apply(A, [answer(ready, Kind.RETRY, attempts=1, error="later", delay=3600)])
    store.release(A, store.owned(A))
    assert store.acquire(A, "default", 10, 30) == []


def test_a_partition_let_go_with_nothing_due_has_its_updated_at_moved(store: Store) -> None:
    """Every change of a partition moves its updated_at (what cleanup and the recent list order by),
    the release of one whose items are all due later included."""
    register(store, A)
    store.add_partition("backoff", [(0, b"x")])
    (ready,) = lease_and_fetch(store)
    before = store.status("backoff")["updated_at"]
    time.sleep(0.01)
    applied = store.apply(A, [answer(ready, Kind.RETRY, attempts=1, error="later", delay=3600)])
    assert applied.moves == {ready.partition_id: "wait"}
    after = store.status("backoff")
    assert after["lease"] is None
    assert after["updated_at"] > before


def test_acquire_records_a_leased_event_with_a_new_epoch(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"x")])
    (first,) = store.acquire(A, "default", 10, 30)
    store.release(A, [first])
    (second,) = store.acquire(A, "default", 10, 30)
    assert second.epoch > first.epoch
    assert [e["watcher"] for e in history(store, "p", "leased")] == [A, A]


@pytest.mark.postgres_only
def test_leasing_is_one_autocommit_statement_and_fetching_two_on_postgres(store: Store) -> None:
    """The path from a notification to a dispatch: no BEGIN and COMMIT round trips around them; the
    fetch's second statement records what it took as in flight."""
    register(store, A)
    store.add_partition("p", [(0, b"x")])
    seen: list[tuple[bool, str]] = []

    def record(conn: Connection, statement: str) -> None:
        driver = conn.connection.driver_connection
        assert driver is not None
        seen.append((driver.autocommit, statement.split()[0]))

    with statements_observed(store, record):
        (lease,) = store.acquire(A, "default", 10, 30)
        leased, seen[:] = list(seen), []
        (item,) = store.fetch_ready(A, 10)
        fetched = list(seen)
    assert leased == [(True, "WITH")]
    assert fetched == [(True, "WITH"), (True, "INSERT")]
    assert item.epoch == lease.epoch


@pytest.mark.servers_only
def test_a_connection_lost_under_a_hot_path_statement_is_an_outage_and_is_not_reused(db_url: str) -> None:
    """The fetch runs on the driver's cursor: a server gone mid-way is DatabaseUnavailable like any
    statement's, and the dead connection is dropped from the pool instead of failing the next call."""
    pid, kill = ("pg_backend_pid()", "SELECT pg_terminate_backend({})")
    if not db_url.startswith("postgresql"):
        pid, kill = ("CONNECTION_ID()", "KILL {}")
    store = Store(db_url, pool_size=1, pre_ping=False)  # as a watcher's: no ping before each checkout
    try:
        register(store, A)
        store.add_partition("p", [(0, b"x")])
        store.acquire(A, "default", 10, 30)
        with store.read() as conn:
            backend = conn.exec_driver_sql(f"SELECT {pid}").scalar()
        killer = Store(db_url)
        try:
            with killer.write() as conn:
                conn.exec_driver_sql(kill.format(backend))
        finally:
            killer.close()
        with pytest.raises(DatabaseUnavailable):
            store.fetch_ready(A, 10)
        (item,) = store.fetch_ready(A, 10)
        assert item.partition == "p"
    finally:
        store.close()


@pytest.mark.postgres_only
def test_the_fetch_reads_each_partition_in_due_order_from_the_index_not_by_sorting_its_backlog(store: Store) -> None:
    """Without statistics PostgreSQL used to pick an index that made it sort every leased partition's
    whole backlog on every fetch (O(backlog)); the LATERAL must walk feedproc_items_by_gate in order."""
    register(store, A)
    for n in range(3):
        store.add_partition(f"p{n}", [(0, b"x")] * 300)
    store.acquire(A, "default", 10, 30)
    params = {"watcher": A, "excluded": "{}", "limit": 50, "closed": "{}", "after": 0, "aging": None}
    with store.read() as conn:
        plan = "\n".join(row[0] for row in conn.execute(text("EXPLAIN " + PG_FETCH_READY.clause.text), params))
    assert "feedproc_items_by_gate" in plan, plan
    assert "Sort Key: c.next_attempt_at" not in plan, plan
    assert len(store.fetch_ready(A, 50)) == 50


@pytest.mark.postgres_only
def test_the_fetch_stops_reading_once_it_has_its_limit_however_many_partitions_are_leased(store: Store) -> None:
    """Dispatch order takes the first partitions' items: reading `limit` entries from each of the
    leased partitions and sorting them (partitions x limit per fetch) is work thrown away."""
    register(store, A)
    for n in range(10):
        store.add_partition(f"p{n}", [(0, b"x")] * 100)
    store.acquire(A, "default", 10, 30)
    params = {"watcher": A, "excluded": "{}", "limit": 50, "closed": "{}", "after": 0, "aging": None}
    with store.read() as conn:
        plan = [row[0] for row in conn.execute(text("EXPLAIN ANALYZE " + PG_FETCH_READY.clause.text), params)]
    scans = [line for line in plan if "Index Only Scan using feedproc_items_by_gate" in line]
    read = sum(int(rows) * int(loops) for rows, loops in (re.findall(r"rows=(\d+) loops=(\d+)", x)[-1] for x in scans))
    assert scans and read <= 50, "\n".join(plan)
    assert [item.partition for item in store.fetch_ready(A, 50)] == ["p0"] * 50


def test_the_fetch_takes_one_item_from_each_of_many_partitions_in_dispatch_order(store: Store) -> None:
    register(store, A)
    for n in range(60):
        store.add_partition(f"p{n:02d}", [(0, b"x")], priority=n % 3)
    store.acquire(A, "default", 100, 30)
    fetched = [item.partition for item in store.fetch_ready(A, 50)]
    expected = sorted((f"p{n:02d}" for n in range(60)), key=lambda key: -(int(key[1:]) % 3))[:50]
    assert fetched == expected  # priority first, then age (insertion order here)


def test_release_records_yielded_and_frees_the_partition(store: Store) -> None:
    register(store, A)
    register(store, B)
    store.add_partition("p", [(0, b"x")])
    leases = store.acquire(A, "default", 10, 30)
    assert store.release(A, leases) == 1
    assert store.status("p")["lease"] is None
    assert [e["watcher"] for e in history(store, "p", "yielded")] == [A]
    assert [lease.key for lease in store.acquire(B, "default", 10, 30)] == ["p"]


def test_release_of_a_lease_no_longer_held_does_nothing(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"x")])
    (old,) = store.acquire(A, "default", 10, 30)
    store.release(A, [old])
    store.acquire(A, "default", 10, 30)
    assert store.release(A, [old]) == 0
    assert store.status("p")["lease"]["owner"] == A


# ---------------------------------------------------------------- fencing


def test_answers_from_a_watcher_whose_expired_lease_was_taken_over_change_nothing(store: Store) -> None:
    register(store, A)
    register(store, B)
    store.add_partition("p", [(0, b"x")])
    store.acquire(A, "default", 10, 30)
    (ready,) = store.fetch_ready(A, 10)
    store.heartbeat(A, 0.2)  # A's leases now run out in 0.2 s: A stalls
    wait_until(lambda: store.acquire(B, "default", 10, 30), timeout=10, what="B taking over the expired lease")
    before = store.status("p")
    applied = store.apply(A, [answer(ready, Kind.DONE, children=(NewItem(0, b"child"),))])
    assert applied.written == []
    assert applied.lost == {ready.partition_id}
    assert store.status("p") == before
    assert [r.status for r in item_rows(store, "p")] == ["available"]


def test_a_group_commit_that_outlasts_the_lease_renews_it_before_committing(store: Store) -> None:
    """Writing 100,000 children takes seconds, its partition's row locked all along (the heartbeat
    waits behind it): the lease is renewed in the same transaction, so that no watcher can take
    the partition over the moment it commits."""
    register(store, A)
    register(store, B)
    store.add_partition("p", [(0, b"root"), (0, b"sibling")])
    store.acquire(A, "default", 10, 30)
    root = store.fetch_ready(A, 10)[0]
    store.heartbeat(A, 0.3)  # 0.3 s left: less than the write takes
    fan_out = answer(root, Kind.DONE, children=tuple(NewItem(1, b"{}") for _ in range(MAX_CHILDREN)))
    assert store.apply(A, [fan_out], lease_seconds=1.0).written == [root.id]
    assert store.acquire(B, "default", 10, 30) == []
    assert store.status("p")["lease"]["owner"] == A
    assert store.status("p")["items"]["total"] == 2 + MAX_CHILDREN


def test_a_long_group_commit_that_releases_its_partition_leaves_it_released(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"root")], manual_checkpoint=True)
    (root,) = lease_and_fetch(store)
    fan_out = answer(root, Kind.DONE, children=tuple(NewItem(1, b"{}") for _ in range(20_000)))
    assert store.apply(A, [fan_out], lease_seconds=0.3).released == {root.partition_id}  # gate 0 drained: waits
    assert store.status("p")["lease"] is None


def test_expiry_takeover_records_an_expired_event(store: Store) -> None:
    register(store, A)
    register(store, B)
    store.add_partition("p", [(0, b"x")])
    store.acquire(A, "default", 10, 30)
    store.heartbeat(A, 0.2)
    wait_until(lambda: store.acquire(B, "default", 10, 30), timeout=10, what="B taking over the expired lease")
    (expired,) = history(store, "p", "expired")
    assert expired["watcher"] == B
    assert expired["detail"] == {"previous": A}
    assert store.status("p")["lease"]["owner"] == B


@pytest.mark.postgres_only
def test_a_batch_of_answers_is_written_by_index_look_ups_on_postgres(store: Store) -> None:
    """On a small, never-analyzed table the planner would read every item per batch (a hash join over
    a sequential scan): sequential scans are off for the batch's statements after the lease lock."""
    register(store, A)
    store.add_partition("p", [(0, b"x")] * 3)
    ready = lease_and_fetch(store)
    seen: list[str] = []

    def record(conn: Connection, statement: str) -> None:
        if statement.lstrip().startswith("UPDATE feedproc_items"):
            driver = conn.connection.driver_connection
            assert driver is not None
            seen.append(driver.execute("SHOW enable_seqscan").fetchone()[0])

    with statements_observed(store, record):
        applied = store.apply(A, [answer(item, Kind.DONE) for item in ready])
    assert len(applied.written) == 3
    assert seen == ["off"]
    with store.read() as conn:  # a transaction-local setting: gone after the batch
        assert conn.exec_driver_sql("SHOW enable_seqscan").scalar() == "on"


def test_an_answer_under_a_stale_lease_epoch_is_dropped(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"x")])
    (lease,) = store.acquire(A, "default", 10, 30)
    (ready,) = store.fetch_ready(A, 10)
    store.release(A, [lease])
    store.acquire(A, "default", 10, 30)  # the same watcher, a new epoch
    before = store.status("p")
    applied = store.apply(A, [answer(ready, Kind.DONE)])
    assert applied.written == []
    assert applied.lost == {ready.partition_id}
    assert store.status("p") == before


def test_a_stale_item_version_drops_only_that_answer_and_writes_the_rest(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"x"), (0, b"y")])
    first, second = lease_and_fetch(store)
    store.apply(A, [answer(second, Kind.LATER)])  # a newer version of `second`
    second_before = [r for r in item_rows(store, "p") if r.id == second.id]
    applied = store.apply(A, [answer(first, Kind.DONE, children=(NewItem(1, b"child"),)), fail(second)])
    assert (applied.written, applied.superseded) == ([first.id], [second.id])
    assert [r for r in item_rows(store, "p") if r.id == second.id] == second_before
    assert [r.data for r in item_rows(store, "p") if r.parent_id == first.id] == [b"child"]


def test_a_repeated_answer_is_superseded_and_its_children_are_inserted_once(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"x"), (0, b"y")])
    ready = lease_and_fetch(store)[0]
    outcome = answer(ready, Kind.DONE, children=(NewItem(1, b"c0"), NewItem(2, b"c1")))
    assert store.apply(A, [outcome]).written == [ready.id]
    again = store.apply(A, [outcome])
    assert (again.written, again.superseded) == ([], [ready.id])
    children = [(r.gate, r.data, r.parent_id, r.parent_gate, r.seq) for r in item_rows(store, "p") if r.parent_id]
    assert children == [(1, b"c0", ready.id, 0, 0), (2, b"c1", ready.id, 0, 1)]


def test_the_child_index_forbids_inserting_the_same_children_twice(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"x"), (0, b"y")])
    ready = lease_and_fetch(store)[0]
    store.apply(A, [answer(ready, Kind.DONE, children=(NewItem(1, b"c0"),))])
    now = datetime.now(UTC)
    duplicate = {
        "partition_id": ready.partition_id,
        "gate": 1,
        "status": "available",
        "data": b"again",
        "parent_id": ready.id,
        "parent_gate": 0,
        "seq": 0,
        "next_attempt_at": now,
        "created_at": now,
        "updated_at": now,
    }
    with pytest.raises(IntegrityError), store.engine.begin() as conn:
        conn.execute(insert(items).values(duplicate))
    assert len(item_rows(store, "p")) == 3


# ---------------------------------------------------------------- answers and the gate


@pytest.mark.smoke  # the fast tier's database smoke
def test_the_gate_advances_in_the_same_transaction_as_the_last_completion(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"x"), (0, b"y"), (2, b"z")])
    first, second = lease_and_fetch(store)
    store.apply(A, [answer(first, Kind.DONE)])
    assert store.status("p")["gate"] == 0
    store.apply(A, [answer(second, Kind.DONE)])
    status = store.status("p")
    assert (status["status"], status["gate"]) == ("available", 2)
    assert history(store, "p", "gate_advanced")[-1]["detail"] == {"from": 0, "to": 2}


def test_completing_the_last_item_of_a_sealed_partition_completes_and_releases_it(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"x")])
    (ready,) = lease_and_fetch(store)
    applied = store.apply(A, [answer(ready, Kind.DONE, data=b"result")])
    assert applied.released == {ready.partition_id}
    status = store.status("p")
    assert (status["status"], status["lease"]) == ("complete", None)
    assert item_rows(store, "p")[0].data == b"result"


def test_a_move_answer_moves_the_item_and_the_gate_follows_it(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"x")])
    (ready,) = lease_and_fetch(store)
    store.apply(A, [answer(ready, Kind.MOVE, new_gate=3)])
    status = store.status("p")
    assert (status["status"], status["gate"]) == ("available", 3)
    again = lease_and_fetch(store)
    assert [(r.id, r.gate, r.attempts) for r in again] == [(ready.id, 3, 0)]


def test_a_move_answer_starts_the_attempts_again_at_zero_and_clears_the_error(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"x")])
    (ready,) = lease_and_fetch(store)
    store.apply(A, [answer(ready, Kind.RETRY, attempts=2, error="HTTP 503")])
    (again,) = store.fetch_ready(A, 10)
    assert again.attempts == 2
    store.apply(A, [answer(again, Kind.MOVE, new_gate=1)])
    row = item_rows(store, "p")[0]
    assert (row.gate, row.attempts, row.last_error) == (1, 0, None)


def test_children_at_the_current_gate_hold_the_gate(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"x"), (1, b"y")])
    (ready,) = lease_and_fetch(store)
    store.apply(A, [answer(ready, Kind.DONE, children=(NewItem(0, b"child"),))])
    assert store.status("p")["gate"] == 0
    assert [r.data for r in lease_and_fetch(store)] == [b"child"]


def test_a_permanent_failure_fails_the_partition_at_its_gate_and_releases_it(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"x"), (1, b"y")])
    (ready,) = lease_and_fetch(store)
    applied = store.apply(A, [fail(ready, attempts=1, error="HTTP 400: bad")])
    assert applied.released == {ready.partition_id}
    status = store.status("p")
    assert (status["status"], status["gate"], status["lease"]) == ("failed", 0, None)
    assert status["failed_items"] == [{"id": ready.id, "gate": 0, "attempts": 1, "last_error": "HTTP 400: bad"}]


def test_a_failed_item_fails_the_partition_only_once_its_gate_drains(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"x"), (0, b"y")])
    first, second = lease_and_fetch(store)
    store.apply(A, [fail(first)])
    assert store.status("p")["status"] == "available"
    store.apply(A, [answer(second, Kind.DONE)])
    status = store.status("p")
    assert (status["status"], status["gate"]) == ("failed", 0)


def test_a_transient_failure_counts_the_attempt_and_backs_off(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"x")])
    (ready,) = lease_and_fetch(store)
    store.apply(A, [answer(ready, Kind.RETRY, attempts=1, error="HTTP 503", delay=3600)])
    row = item_rows(store, "p")[0]
    assert (row.status, row.attempts, row.last_error) == ("available", 1, "HTTP 503")
    assert store.status("p")["status"] == "available"
    assert store.fetch_ready(A, 10) == []


def test_a_not_yet_answer_is_not_a_failure(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"x")])
    (ready,) = lease_and_fetch(store)
    store.apply(A, [answer(ready, Kind.LATER, data=b"progress")])
    row = item_rows(store, "p")[0]
    assert (row.status, row.gate, row.attempts, row.last_error, row.data) == ("available", 0, 0, None, b"progress")
    assert [r.id for r in store.fetch_ready(A, 10)] == [ready.id]


# ---------------------------------------------------------------- fetch_ready


def test_fetch_ready_returns_only_items_at_the_current_gate(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(1, b"a"), (2, b"b"), (1, b"c")])
    assert [(r.gate, r.data) for r in lease_and_fetch(store)] == [(1, b"a"), (1, b"c")]


def test_fetch_ready_serves_items_oldest_first_and_respects_the_limit(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, bytes([n])) for n in range(5)])
    store.acquire(A, "default", 10, 30)
    assert [r.data for r in store.fetch_ready(A, 3)] == [b"\x00", b"\x01", b"\x02"]


def test_fetch_ready_serves_higher_priority_partitions_first(store: Store) -> None:
    register(store, A)
    store.add_partition("low", [(0, b"low")] * 3, priority=0)
    store.add_partition("high", [(0, b"high")] * 3, priority=7)
    store.acquire(A, "default", 10, 30)
    assert [r.partition for r in store.fetch_ready(A, 4)] == ["high", "high", "high", "low"]


def test_fetch_ready_skips_the_excluded_ids(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"a"), (0, b"b"), (0, b"c")])
    first, second, third = lease_and_fetch(store)
    assert [r.id for r in store.fetch_ready(A, 10, exclude=[first.id, third.id])] == [second.id]


def test_fetch_ready_returns_nothing_of_partitions_it_does_not_hold(store: Store) -> None:
    register(store, A)
    register(store, B)
    store.add_partition("p", [(0, b"a")])
    store.acquire(A, "default", 10, 30)
    assert store.fetch_ready(B, 10) == []


# ---------------------------------------------------------------- steals


def _one_watcher_holds_everything(store: Store, partitions_: int = 6) -> None:
    register(store, A)
    register(store, B)
    for n in range(partitions_):
        store.add_partition(f"p{n}", [(0, b"x")])
    assert len(store.acquire(A, "default", 10, 30)) == partitions_


def wanted(store: Store, watcher: str) -> list[Lease]:
    return [lease for lease in store.owned(A) if lease.wanted_by == watcher]


def test_request_steals_marks_at_most_most_partitions(store: Store) -> None:
    _one_watcher_holds_everything(store)
    assert store.request_steals(B, "default", capacity=8, most=2) == 2
    assert len(wanted(store, B)) == 2


def test_request_steals_never_asks_beyond_the_fair_share(store: Store) -> None:
    _one_watcher_holds_everything(store)  # 6 partitions, 2 live watchers: a fair share is 3
    marked = [store.request_steals(B, "default", capacity=8, most=5) for _ in range(3)]
    assert sum(marked) == 3
    assert marked[-1] == 0
    assert len(wanted(store, B)) == 3


def test_request_steals_never_asks_beyond_the_thiefs_capacity(store: Store) -> None:
    _one_watcher_holds_everything(store)
    assert store.request_steals(B, "default", capacity=1, most=5) == 1
    assert store.request_steals(B, "default", capacity=1, most=5) == 0


def test_request_steals_needs_another_live_watcher(store: Store) -> None:
    register(store, A)
    for n in range(4):
        store.add_partition(f"p{n}", [(0, b"x")])
    store.acquire(A, "default", 10, 30)
    assert store.request_steals(A, "default", capacity=8, most=5) == 0


def test_fetch_ready_never_returns_items_of_a_partition_marked_wanted(store: Store) -> None:
    _one_watcher_holds_everything(store)
    store.request_steals(B, "default", capacity=8, most=2)
    marked = {lease.partition_id for lease in wanted(store, B)}
    ready = store.fetch_ready(A, 100)
    assert len(ready) == 4
    assert not {r.partition_id for r in ready} & marked


def test_hand_over_moves_the_lease_to_the_thief_with_a_new_epoch_and_a_stolen_event(store: Store) -> None:
    _one_watcher_holds_everything(store)
    store.request_steals(B, "default", capacity=8, most=1)
    (lease,) = wanted(store, B)
    ready = store.fetch_ready(A, 100)
    assert store.hand_over(A, lease, 30) == B
    (taken,) = store.owned(B)
    assert (taken.partition_id, taken.wanted_by) == (lease.partition_id, None)
    assert taken.epoch == lease.epoch + 1
    assert lease.partition_id not in {held.partition_id for held in store.owned(A)}
    (stolen,) = history(store, lease.key, "stolen")
    assert (stolen["watcher"], stolen["detail"]) == (B, {"from": A})
    assert [r.partition for r in store.fetch_ready(B, 10)] == [lease.key]
    assert ready  # the old owner's remaining partitions are unaffected
    assert lease.partition_id not in {r.partition_id for r in store.fetch_ready(A, 100)}


def test_an_answer_from_the_old_owner_after_a_hand_over_is_dropped(store: Store) -> None:
    _one_watcher_holds_everything(store, partitions_=2)
    before_steal = {r.partition_id: r for r in store.fetch_ready(A, 100)}
    store.request_steals(B, "default", capacity=8, most=1)
    (lease,) = wanted(store, B)
    store.hand_over(A, lease, 30)
    applied = store.apply(A, [answer(before_steal[lease.partition_id], Kind.DONE)])
    assert applied.lost == {lease.partition_id}
    assert store.status(lease.key)["items"]["available"] == 1


def test_hand_over_to_a_thief_whose_registration_expired_clears_the_request(store: Store) -> None:
    _one_watcher_holds_everything(store)
    store.heartbeat(B, 1.0)  # B stops heartbeating: its registration lapses in 1 s
    assert store.request_steals(B, "default", capacity=8, most=1) == 1
    (lease,) = wanted(store, B)
    wait_until(lambda: not next(w for w in store.watchers() if w["id"] == B)["alive"], timeout=10, what="B to expire")
    assert store.hand_over(A, lease, 30) is None
    status = store.status(lease.key)
    assert (status["lease"]["owner"], status["lease"]["wanted_by"]) == (A, None)
    assert lease.partition_id in {r.partition_id for r in store.fetch_ready(A, 100)}


def test_hand_over_without_a_request_does_nothing(store: Store) -> None:
    _one_watcher_holds_everything(store, partitions_=1)
    (lease,) = store.owned(A)
    assert store.hand_over(A, lease, 30) is None
    assert store.status(lease.key)["lease"]["owner"] == A


# ---------------------------------------------------------------- concurrent callers


def run_together(*calls: Callable[[], Any]) -> list[Any]:
    """Run the calls in threads released at the same moment; returns their results or exceptions."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(n: int, call: Callable[[], Any]) -> None:
        barrier.wait()
        try:
            results[n] = call()
        except Exception as error:
            results[n] = error

    threads = [threading.Thread(target=run, args=(n, call)) for n, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


def test_two_watchers_acquiring_at_once_never_lease_the_same_partition(store: Store) -> None:
    register(store, A)
    register(store, B)
    for n in range(20):
        store.add_partition(f"p{n}", [(0, b"x")])
    mine, theirs = run_together(
        lambda: store.acquire(A, "default", 20, 30), lambda: store.acquire(B, "default", 20, 30)
    )
    keys_a, keys_b = {lease.key for lease in mine}, {lease.key for lease in theirs}
    assert not keys_a & keys_b
    assert keys_a | keys_b == {f"p{n}" for n in range(20)}


def test_an_item_added_at_the_gate_never_races_the_gate_advancing(store: Store) -> None:
    register(store, A)
    for n in range(10):
        key = f"p{n}"
        store.add_partition(key, [(0, b"last"), (1, b"next")], sealed=False)
        (ready,) = [r for r in lease_and_fetch(store) if r.partition == key]
        results = run_together(
            functools.partial(store.apply, A, [answer(ready, Kind.DONE)]),
            functools.partial(store.add_items, key, [(0, b"late")]),
        )
        status = store.status(key)
        if isinstance(results[1], Refused):  # the gate moved first: the item was rightly refused
            assert (status["gate"], status["items"]["total"]) == (1, 2), status
        else:
            assert results[1] == 1, results
            assert status["gate"] == 0 and status["gates"]["0"]["available"] == 1, status
        assert not isinstance(results[0], Exception), results


def test_two_producers_adding_the_same_key_at_once_create_it_once(store: Store) -> None:
    results = run_together(
        lambda: store.add_partition("p", [(0, b"first")]), lambda: store.add_partition("p", [(0, b"second")])
    )
    assert sorted(type(r).__name__ for r in results) == ["DuplicateKey", "int"], results
    assert len(item_rows(store, "p")) == 1


def test_the_fair_share_is_partitions_with_work_per_live_watcher_rounded_up(store: Store) -> None:
    for n in range(5):
        store.add_partition(f"p{n}", [(0, b"1")])
    store.add_partition("other-queue", [(0, b"1")], queue="elsewhere")
    store.add_partition("empty", [], sealed=False)  # no work: not shared
    assert store.fair_share("default") is None  # nobody to share with
    register(store, A)
    assert store.fair_share("default") is None
    register(store, B)
    assert store.fair_share("default") == 3  # ceil(5 / 2)
    register(store, "watcher-c", queue="elsewhere")  # another queue's watcher counts there only
    assert store.fair_share("default") == 3


def test_request_steals_takes_from_watchers_at_the_rounded_up_share_down_to_the_rounded_down_one(store: Store) -> None:
    """10 partitions over 3 watchers: a share is 3.33. Watchers at 4 (the share rounded up) each
    give one to a watcher at 2, down to 3 (rounded down), and no further: 4, 3, 3 is balanced."""
    for n in range(10):
        store.add_partition(f"p{n}", [(0, b"1")])
    for watcher in (A, B, "watcher-c"):
        register(store, watcher)
    for watcher, count in ((A, 4), (B, 4), ("watcher-c", 2)):
        assert len(store.acquire(watcher, "default", count, 30.0)) == count
    assert store.request_steals("watcher-c", "default", capacity=8, most=5) == 1
    assert store.request_steals("watcher-c", "default", capacity=8, most=5) == 0


@contextlib.contextmanager
def sent_statements(store: Store, seen: list[str]) -> Iterator[None]:
    """Record every statement sent to the server: on MariaDB/MySQL those the driver sends (PyMySQL
    turns an executemany it cannot batch into one statement per row, which SQLAlchemy's events see
    as one), elsewhere those SQLAlchemy executes."""
    if store.dialect.name != "mysql":
        with statements_observed(store, lambda conn, statement: seen.append(statement)):
            yield
        return
    import pymysql.cursors

    send = pymysql.cursors.Cursor._query  # type: ignore[attr-defined]  # private: not in the stubs

    def counted(cursor: Any, query: str) -> Any:
        seen.append(query)
        return send(cursor, query)

    pymysql.cursors.Cursor._query = counted  # type: ignore[attr-defined]
    try:
        yield
    finally:
        pymysql.cursors.Cursor._query = send  # type: ignore[attr-defined]


@pytest.mark.servers_only  # SQLite reads each leased partition's items with a query of its own, in-process
def test_no_statement_per_item_or_partition_in_a_fetch_or_per_item_in_its_group_commit(store: Store) -> None:
    """The hot path's statements do not grow with the batch: on MariaDB, which has neither arrays
    nor LATERAL, as on PostgreSQL. (A commit's statements grow with the partitions whose gate it
    advances, not with its items; each item here fans out a child, so the commit also inserts.)"""

    def hot_path(prefix: str, partitions: int, per_partition: int) -> tuple[int, int]:
        for n in range(partitions):
            store.add_partition(f"{prefix}-{n}", [(0, b"{}")] * per_partition)
        store.acquire(A, "default", 1000, 30)
        seen: list[str] = []
        with sent_statements(store, seen):
            ready = [r for r in store.fetch_ready(A, 1000) if r.partition.startswith(prefix)]
            fetched, seen[:] = len(seen), []
            store.apply(A, [answer(r, Kind.DONE, children=(NewItem(1, b"{}"),)) for r in ready])
        assert len(ready) == partitions * per_partition
        return fetched, len(seen)

    register(store, A)
    one_partition_fetch, _ = hot_path("one", 1, 2)
    small_fetch, small_commit = hot_path("small", 4, 2)
    large_fetch, large_commit = hot_path("large", 4, 50)
    assert one_partition_fetch == small_fetch == large_fetch
    assert small_commit == large_commit
