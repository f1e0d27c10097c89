"""MariaDB's and MySQL's statements: no RETURNING, no arrays, no LATERAL, and InnoDB's locking reads.

What sets them apart from the others, and shapes every statement of theirs:

* an UPDATE returns no rows: what it wrote is read back, the rows locked by the transaction;
* PyMySQL's executemany sends one statement per row unless VALUES holds nothing but placeholders:
  rows go in as multi-row INSERTs (`insert_many_mysql`) or as a derived table of one SELECT per row
  (`mysql_rows`) joined to the table in one UPDATE;
* InnoDB locks every row a locking read reads, before its sort and LIMIT: an ordered
  `FOR UPDATE SKIP LOCKED` could lock a whole queue, so rows are picked with a plain read and then
  locked by primary key (`lock_picked`, `by_id`);
* the sessions run with ANSI_QUOTES and PIPES_AS_CONCAT (`foundations.MYSQL_SESSION`), so SQLite's
  standard statements mean the same here: where the class runs one, it says so.

The statements, with what explains each one's shape, are in `statements.py`; the class here runs them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Insert, Row, Select, Table, Update, insert, select, text
from sqlalchemy.dialects.mysql import insert as mysql_upsert
from sqlalchemy.engine import Connection

from ....core.records import Outcome, ProgressReport, ReadyItem
from ...base import P
from ...foundations import db_minute, db_now
from ...queues import started_of
from ...schema import attempts, items, stats
from .. import AccumulatorRow
from ..sqlite.statements import (
    SET_READY_AT,
    lease_picked,
    merge_by_combination,
    new_item_rows,
)
from .statements import (
    DEAD_WATCHERS,
    FORGET_WATCHERS,
    MERGE_ACCUMULATOR,
    MYSQL_ACQUIRE_LOCK,
    MYSQL_ACQUIRE_PICK,
    MYSQL_ACQUIRE_PICK_AGED,
    MYSQL_CHARGE_CELLS,
    MYSQL_CHARGE_LOST,
    MYSQL_CLAIMED,
    MYSQL_MARK_ISOLATED,
    MYSQL_OWNED,
    MYSQL_PAGE,
    MYSQL_PROGRESS_CELLS,
    MYSQL_READ_READY_AT,
    MYSQL_RENEW,
    MYSQL_RENEW_WRITTEN_LEASES,
    MYSQL_STEAL_LOCK,
    MYSQL_STEAL_PICK,
    MYSQL_STORE_PROGRESS,
    SQLITE,
    by_id,
    claimable,
    find_ready_mysql,
    insert_many_mysql,
    lock_picked,
    mark_inflight_mysql,
    mysql_rows,
    update_items_mysql,
)


class MySQLDialect:
    """MariaDB (10.6 or newer) and MySQL (8), through PyMySQL."""

    name = "mysql"
    notifies = False  # no LISTEN: watchers poll
    # `single()` is an ordinary write transaction: autocommit is a server setting of the session, so
    # switching a pooled connection to it and back would cost two round trips where the COMMIT costs
    # one (and the switch on a connection the server dropped raises outside SQLAlchemy's handling).
    autocommits_single_statements = False
    writes_done_narrowly = False  # every answer goes through `update_items`
    ready_at_rows_carry_settle_facts = False  # no RETURNING: `refresh_ready_at` reads back less

    def insert_stamped(
        self, conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]], now: tuple[str, ...]
    ) -> None:
        if rows:
            insert_many_mysql(conn, table.name, rows, now=now)

    def add_to_stats(self, conn: Connection, queue: str, source: str, values: Mapping[str, int]) -> None:
        added = mysql_upsert(stats).values(bucket=db_minute(), queue=queue, source=source[:120], **values)
        conn.execute(added.on_duplicate_key_update({k: stats.c[k] + added.inserted[k] for k in values}))

    def insert_partition(self, conn: Connection, statement: Insert) -> int:
        # No INSERT ... RETURNING: the id InnoDB gave it, as the driver reports it
        return int(conn.execute(statement).lastrowid)

    def notify_ready(self, conn: Connection, queue: str) -> None:
        SQLITE.notify_ready(conn, queue)  # no LISTEN/NOTIFY, as on SQLite: watchers poll

    def notify_wanted(self, conn: Connection, owner: str) -> None:
        SQLITE.notify_wanted(conn, owner)  # no LISTEN/NOTIFY, as on SQLite

    def notify_finished(self, conn: Connection, key: str) -> None:
        SQLITE.notify_finished(conn, key)  # no LISTEN/NOTIFY, as on SQLite

    def limit_lock_waits(self, conn: Connection, seconds: float) -> None:
        # The metadata lock a schema change waits for; a session setting (MariaDB has no local
        # one): `migrate`'s connection is closed after it, not pooled on.
        conn.execute(text("SET SESSION lock_wait_timeout = :s"), {"s": max(1, round(seconds))})

    def lock_held_leases(self, conn: Connection, pids: list[int], watcher_id: str) -> dict[int, int]:
        return SQLITE.lock_held_leases(conn, pids, watcher_id)  # SQLite's SELECT ... FOR UPDATE, by key

    def lock_live_leases(self, conn: Connection, pids: list[int], watcher_id: str) -> dict[int, int]:
        return SQLITE.lock_live_leases(conn, pids, watcher_id)  # UTC_TIMESTAMP(6) is the statement's clock

    def complete_items(
        self, conn: Connection, completed: list[Outcome], watcher_id: str, accumulate: list[AccumulatorRow]
    ) -> int:
        raise NotImplementedError("MariaDB/MySQL writes every answer with update_items (writes_done_narrowly is False)")

    def update_items(self, conn: Connection, rows: list[dict[str, Any]], watcher_id: str) -> int:
        return update_items_mysql(conn, rows, watcher_id)

    def bump_version(self, conn: Connection, statement: Update, matched_version: int) -> int | None:
        # no UPDATE ... RETURNING: the version it set is the one it matched, plus one
        return matched_version + 1 if conn.execute(statement).rowcount == 1 else None

    def refresh_ready_at(self, conn: Connection, pids: list[int], idle_after: float) -> Sequence[Row[Any]]:
        # no UPDATE ... RETURNING: the refresh, then what it wrote
        params = {"pids": pids, "idle_after": float(idle_after)}
        conn.execute(SET_READY_AT, params)
        return conn.execute(MYSQL_READ_READY_AT, params).all()

    def renew_written_leases(self, conn: Connection, pids: list[int], watcher_id: str, seconds: float) -> None:
        conn.execute(MYSQL_RENEW_WRITTEN_LEASES, {"pids": pids, "watcher": watcher_id, "seconds": float(seconds)})

    def merge_accumulators(self, conn: Connection, rows: list[AccumulatorRow]) -> None:
        merge_by_combination(conn, rows, MERGE_ACCUMULATOR)  # one statement per combination, as on SQLite

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
        return find_ready_mysql(conn, watcher_id, limit, excluded, closed, after, aging)

    def mark_inflight(
        self, conn: Connection, watcher_id: str, pids: list[int], epochs: list[int], entries: list[str]
    ) -> set[int]:
        return mark_inflight_mysql(conn, watcher_id, pids, epochs, entries)

    def mark_isolated(self, conn: Connection, params: dict[str, Any]) -> None:
        conn.execute(MYSQL_MARK_ISOLATED, params)

    def insert_new_items(
        self, conn: Connection, pid: int, gates: list[int], data: list[bytes], collects: list[int | None] | None
    ) -> None:
        self.insert_item_rows(conn, new_item_rows(pid, gates, data, collects))

    def insert_item_rows(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        insert_many_mysql(conn, items.name, rows, now=("next_attempt_at", "created_at", "updated_at"))

    def acquire_leases(
        self,
        conn: Connection,
        watcher_id: str,
        queue: str,
        limit: int,
        lease_seconds: float,
        aging: float | None = None,
    ) -> Sequence[Row[Any]]:
        """The candidates picked, then locked row by row (`lock_picked`); then leased as on SQLite."""
        pick = MYSQL_ACQUIRE_PICK if aging is None else MYSQL_ACQUIRE_PICK_AGED
        candidates = lock_picked(conn, pick, MYSQL_ACQUIRE_LOCK, {"queue": queue, "aging": aging}, limit)
        return lease_picked(self, conn, candidates, watcher_id, lease_seconds)

    def renew_leases(self, conn: Connection, watcher_id: str, seconds: float) -> None:
        owned = list(conn.execute(MYSQL_OWNED, {"watcher": watcher_id}).scalars())  # by primary key: see MYSQL_OWNED
        if owned:
            conn.execute(MYSQL_RENEW, {"ids": owned, "watcher": watcher_id, "seconds": float(seconds)})

    def forget_dead_watchers(self, conn: Connection, lease_seconds: float) -> None:
        dead = list(conn.execute(DEAD_WATCHERS, {"lease_seconds": float(lease_seconds)}).scalars())
        if dead:
            conn.execute(FORGET_WATCHERS, {"ids": dead, "lease_seconds": float(lease_seconds)})

    def pick_partitions_to_steal(self, conn: Connection, victim: str, take: int) -> list[int]:
        return [r.id for r in lock_picked(conn, MYSQL_STEAL_PICK, MYSQL_STEAL_LOCK, {"victim": victim}, take)]

    def lock_leases(self, conn: Connection, watcher_id: str, pairs: list[tuple[int, int]]) -> list[int]:
        # By id, the epochs compared here: a row-value IN may scan the table (see `by_id`).
        held = conn.execute(
            by_id(select(P.id, P.lease_epoch))
            .where(P.id.in_(sorted({pid for pid, _ in pairs})), P.lease_owner == watcher_id)
            .order_by(P.id)
            .with_for_update()
        ).all()
        ours = set(pairs)
        return [r.id for r in held if (r.id, r.lease_epoch) in ours]

    def charge_lost(self, conn: Connection, updates: list[dict[str, Any]], records: list[dict[str, Any]]) -> None:
        keys = ("b_id", "b_version", "b_status", "b_attempts", "b_error")
        charges = mysql_rows(MYSQL_CHARGE_CELLS, len(updates))
        conn.exec_driver_sql(MYSQL_CHARGE_LOST.format(rows=charges), tuple(u[k] for u in updates for k in keys))
        # one multi-row INSERT (PyMySQL's executemany runs a statement per row when VALUES hold SQL)
        conn.execute(insert(attempts).values([{**r, "ended_at": db_now()} for r in records]))

    def store_progress(self, conn: Connection, reports: Sequence[ProgressReport]) -> None:
        # (the driver's own parameters: a start as a naive UTC DATETIME, as UTCDateTime binds it)
        values = [v for r in reports for v in (r.item_id, r.gate, r.fraction, started_of(r, naive=True))]
        rows = mysql_rows(MYSQL_PROGRESS_CELLS, len(reports))
        conn.exec_driver_sql(MYSQL_STORE_PROGRESS.format(rows=rows), tuple(values))

    def find_claimable(
        self, conn: Connection, queue: str, max_items: int, blocked: Sequence[int], priorities: tuple[int, int]
    ) -> list[Any]:
        return claimable(conn, queue, max_items, blocked, priorities)

    def claim_items(self, conn: Connection, claiming: Update, ids: list[int]) -> Sequence[Any]:
        # no UPDATE ... RETURNING: read back (the rows are locked by this transaction)
        conn.execute(claiming)
        return conn.execute(MYSQL_CLAIMED, {"ids": ids}).all()

    def claims_of(self, conn: Connection, tokens: list[str]) -> list[Any]:
        return SQLITE.claims_of(conn, tokens)  # an IN list, as on SQLite

    def items_of(self, conn: Connection, ids: list[int]) -> list[Any]:
        return SQLITE.items_of(conn, ids)  # an IN list, as on SQLite

    def end_claims(self, conn: Connection, tokens: list[str], state: str) -> None:
        SQLITE.end_claims(conn, tokens, state)  # an IN list, as on SQLite

    def read_collected(self, conn: Connection, params: dict[str, Any]) -> Sequence[Row[Any]]:
        return conn.execute(MYSQL_PAGE, params).all()

    def deletable(self, chunk: Select[Any]) -> Select[Any]:
        # No LIMIT in an IN subquery there, nor a DELETE reading its own table: the chunk goes
        # through a derived table (materialized: its LIMIT keeps it unmerged).
        return select(chunk.subquery("chunk").c[0])
