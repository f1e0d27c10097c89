"""PostgreSQL's statements: arrays (bound as text literals, `pg_bigint_array`), LATERAL, data-modifying
CTEs, SKIP LOCKED, LISTEN/NOTIFY; the watcher's hot path (the fetch, its in-flight record, the common
"done") on the driver's own cursor (`DriverStatement`). Each statement was made narrow by
measurement: the comments above them in `statements.py` say what it saved. Where standard SQL serves, the class runs
SQLite's statement and says so.

The statements, with what explains each one's shape, are in `statements.py`; the class here runs them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Insert, Row, Select, Table, Update, text
from sqlalchemy.dialects.postgresql import insert as pg_upsert
from sqlalchemy.engine import Connection

from ....core.records import Outcome, ProgressReport, ReadyItem
from ...answers import with_results
from ...foundations import pg_bigint_array
from ...gating import ITEM_COLUMNS
from .. import AccumulatorRow
from ..sqlite import add_to_stats_by
from .statements import (
    NOTIFY,
    NOTIFY_FINISHED,
    NOTIFY_WANTED,
    PG_ACQUIRE,
    PG_ACQUIRE_AGED,
    PG_CANDIDATES,
    PG_CLAIMS_OF,
    PG_COMPLETE_ITEMS,
    PG_COMPLETE_ITEMS_ACCUMULATING,
    PG_END_CLAIMS,
    PG_FETCH_READY,
    PG_INSERT_COLLECTING,
    PG_INSERT_ITEMS,
    PG_INSERT_NEW_COLLECTING,
    PG_INSERT_NEW_ITEMS,
    PG_INT_COLUMNS,
    PG_ITEMS_OF,
    PG_LOCK_HELD_LEASES,
    PG_LOCK_LIVE_LEASES,
    PG_MARK_INFLIGHT,
    PG_PAGE,
    PG_REFRESH_READY_AT,
    PG_RENEW_LEASES,
    PG_UPDATE_ITEMS,
    PG_UPDATE_ITEMS_WITH_RESULT,
    PG_UPSERT,
    SQLITE,
    micros_array,
    pg_accumulator_params,
    pg_int_array,
    update_items_params,
)


class PostgreSQLDialect:
    """PostgreSQL (psycopg 3)."""

    name = "postgresql"
    notifies = True  # LISTEN/NOTIFY: `notify.Listener`, `notify.FinishedListener`
    # One round trip instead of three (BEGIN, the statement, COMMIT): what a watcher's latency path
    # is made of (`StoreBase.single`).
    autocommits_single_statements = True
    writes_done_narrowly = True  # `complete_items`: four arrays instead of twelve
    ready_at_rows_carry_settle_facts = True  # `PG_REFRESH_READY_AT`

    def insert_stamped(
        self, conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]], now: tuple[str, ...]
    ) -> None:
        SQLITE.insert_stamped(conn, table, rows, now)  # an executemany of one INSERT, as SQLite's

    def add_to_stats(self, conn: Connection, queue: str, source: str, values: Mapping[str, int]) -> None:
        add_to_stats_by(pg_upsert, conn, queue, source, values)  # SQLite's ON CONFLICT, PostgreSQL's insert

    def insert_partition(self, conn: Connection, statement: Insert) -> int:
        return SQLITE.insert_partition(conn, statement)  # INSERT ... RETURNING, as SQLite's

    def notify_ready(self, conn: Connection, queue: str) -> None:
        conn.execute(NOTIFY, {"queue": queue})

    def notify_wanted(self, conn: Connection, owner: str) -> None:
        conn.execute(NOTIFY_WANTED, {"watcher": owner})

    def notify_finished(self, conn: Connection, key: str) -> None:
        conn.execute(NOTIFY_FINISHED, {"key": key})

    def limit_lock_waits(self, conn: Connection, seconds: float) -> None:
        # LOCAL: the setting ends with the transaction (a pooler lends the connection on after it).
        conn.execute(text("SELECT set_config('lock_timeout', :ms, true)"), {"ms": f"{int(seconds * 1000)}ms"})

    def lock_held_leases(self, conn: Connection, pids: list[int], watcher_id: str) -> dict[int, int]:
        return dict(conn.execute(PG_LOCK_HELD_LEASES, {"pids": pg_bigint_array(pids), "watcher": watcher_id}).all())

    def lock_live_leases(self, conn: Connection, pids: list[int], watcher_id: str) -> dict[int, int]:
        return dict(conn.execute(PG_LOCK_LIVE_LEASES, {"pids": pg_bigint_array(pids), "watcher": watcher_id}).all())

    def complete_items(
        self, conn: Connection, completed: list[Outcome], watcher_id: str, accumulate: list[AccumulatorRow]
    ) -> int:
        params = {
            "id": pg_bigint_array(o.item_id for o in completed),
            "version": pg_bigint_array(o.version for o in completed),
            "started": micros_array(o.started_us for o in completed),
            "duration": micros_array(o.duration_us for o in completed),
            "watcher": watcher_id,
        }
        statement = PG_COMPLETE_ITEMS
        if accumulate:  # merged by this statement
            params.update(pg_accumulator_params(accumulate))
            statement = PG_COMPLETE_ITEMS_ACCUMULATING
        return statement.run(conn, params)

    def update_items(self, conn: Connection, rows: list[dict[str, Any]], watcher_id: str) -> int:
        statement = PG_UPDATE_ITEMS_WITH_RESULT if with_results(rows) else PG_UPDATE_ITEMS
        return int(conn.execute(statement, {**update_items_params(rows), "watcher": watcher_id}).rowcount)

    def bump_version(self, conn: Connection, statement: Update, matched_version: int) -> int | None:
        return SQLITE.bump_version(conn, statement, matched_version)  # UPDATE ... RETURNING, as SQLite's

    def refresh_ready_at(self, conn: Connection, pids: list[int], idle_after: float) -> Sequence[Row[Any]]:
        return conn.execute(PG_REFRESH_READY_AT, {"pids": pids, "idle_after": float(idle_after)}).all()

    def renew_written_leases(self, conn: Connection, pids: list[int], watcher_id: str, seconds: float) -> None:
        params = {"pids": pg_bigint_array(pids), "watcher": watcher_id, "seconds": float(seconds)}
        conn.execute(PG_RENEW_LEASES, params)

    def merge_accumulators(self, conn: Connection, rows: list[AccumulatorRow]) -> None:
        PG_UPSERT.run(conn, pg_accumulator_params(rows))

    def find_ready(
        self,
        conn: Connection,
        watcher_id: str,
        limit: int,
        excluded: list[int],
        closed: list[int],
        after: int = 0,
        aging: float | None = None,
    ) -> list[ReadyItem]:
        params = {"watcher": watcher_id, "excluded": pg_bigint_array(excluded), "limit": limit}
        params.update(closed=pg_bigint_array(closed), after=after, aging=aging)
        # fetchall and positional rows: the columns are ReadyItem's fields, in order.
        return [ReadyItem(*row) for row in PG_FETCH_READY.rows(conn, params)]

    def mark_inflight(
        self, conn: Connection, watcher_id: str, pids: list[int], epochs: list[int], entries: list[str]
    ) -> set[int]:
        params = {
            "watcher": watcher_id,
            "pids": pg_bigint_array(pids),
            "epochs": pg_bigint_array(epochs),
            "entries": entries,
        }
        return {row[0] for row in PG_MARK_INFLIGHT.rows(conn, params)}

    def mark_isolated(self, conn: Connection, params: dict[str, Any]) -> None:
        SQLITE.mark_isolated(conn, params)  # `sqlite.MARK_INFLIGHT`: standard ON CONFLICT ... WHERE

    def insert_new_items(
        self, conn: Connection, pid: int, gates: list[int], data: list[bytes], collects: list[int | None] | None
    ) -> None:
        # One statement, two arrays (the gates as a text literal: see pg_bigint_array).
        if collects is not None:
            params = {"pid": pid, "gate": pg_bigint_array(gates), "data": data, "collect": pg_int_array(collects)}
            conn.execute(PG_INSERT_NEW_COLLECTING, params)
            return
        conn.execute(PG_INSERT_NEW_ITEMS, {"pid": pid, "gate": pg_bigint_array(gates), "data": data})

    def insert_item_rows(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        params: dict[str, Any] = {column: [row[column] for row in rows] for column in ITEM_COLUMNS}
        # The integers as text literals (pg_bigint_array): for 100,000 children, 0.06 s against 0.22 s
        # in psycopg's list dumper.
        for column in PG_INT_COLUMNS:
            params[column] = pg_bigint_array(params[column])
        if "collect" in rows[0]:
            params["collect"] = pg_int_array(row["collect"] for row in rows)
            conn.execute(PG_INSERT_COLLECTING, params)
            return
        conn.execute(PG_INSERT_ITEMS, params)

    def acquire_leases(
        self,
        conn: Connection,
        watcher_id: str,
        queue: str,
        limit: int,
        lease_seconds: float,
        aging: float | None = None,
    ) -> Sequence[Row[Any]]:
        params = {"queue": queue, "limit": limit, "watcher": watcher_id, "seconds": float(lease_seconds)}
        if aging is None:
            return conn.execute(PG_ACQUIRE, params).all()
        return conn.execute(PG_ACQUIRE_AGED, {**params, "aging": aging}).all()

    def renew_leases(self, conn: Connection, watcher_id: str, seconds: float) -> None:
        SQLITE.renew_leases(conn, watcher_id, seconds)  # one UPDATE by owner, as SQLite's

    def forget_dead_watchers(self, conn: Connection, lease_seconds: float) -> None:
        SQLITE.forget_dead_watchers(conn, lease_seconds)  # one DELETE, as SQLite's

    def pick_partitions_to_steal(self, conn: Connection, victim: str, take: int) -> list[int]:
        return SQLITE.pick_partitions_to_steal(conn, victim, take)  # SQLite's query, its SKIP LOCKED rendered here

    def lock_leases(self, conn: Connection, watcher_id: str, pairs: list[tuple[int, int]]) -> list[int]:
        return SQLITE.lock_leases(conn, watcher_id, pairs)  # a row-value IN, FOR UPDATE: as SQLite's

    def charge_lost(self, conn: Connection, updates: list[dict[str, Any]], records: list[dict[str, Any]]) -> None:
        SQLITE.charge_lost(conn, updates, records)  # an executemany UPDATE and INSERT, as SQLite's

    def store_progress(self, conn: Connection, reports: Sequence[ProgressReport]) -> None:
        SQLITE.store_progress(conn, reports)  # an executemany UPDATE, as SQLite's

    def find_claimable(
        self, conn: Connection, queue: str, max_items: int, blocked: Sequence[int], priorities: tuple[int, int]
    ) -> list[Any]:
        params = {
            "queue": queue,
            "max": max_items,
            "blocked": pg_bigint_array(sorted(blocked)),
            "min_priority": priorities[0],
            "max_priority": priorities[1],
        }
        rows = list(conn.execute(PG_CANDIDATES, params).all())
        rows.sort(key=lambda r: (r.rank, r.id))  # see PG_CANDIDATES: no sort in the database
        return rows

    def claim_items(self, conn: Connection, claiming: Update, ids: list[int]) -> Sequence[Any]:
        return SQLITE.claim_items(conn, claiming, ids)  # UPDATE ... RETURNING, as SQLite's

    def claims_of(self, conn: Connection, tokens: list[str]) -> list[Any]:
        return list(conn.execute(PG_CLAIMS_OF, {"tokens": tokens}))

    def items_of(self, conn: Connection, ids: list[int]) -> list[Any]:
        return list(conn.execute(PG_ITEMS_OF, {"ids": pg_bigint_array(ids)}))

    def end_claims(self, conn: Connection, tokens: list[str], state: str) -> None:
        conn.execute(PG_END_CLAIMS, {"tokens": tokens, "state": state})

    def read_collected(self, conn: Connection, params: dict[str, Any]) -> Sequence[Row[Any]]:
        return conn.execute(PG_PAGE, params).all()

    def deletable(self, chunk: Select[Any]) -> Select[Any]:
        return SQLITE.deletable(chunk)  # an IN subquery with a LIMIT, as SQLite's
