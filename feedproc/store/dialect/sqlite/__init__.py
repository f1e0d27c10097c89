"""SQLite's statements: standard SQL, in-process.

SQLite runs one writer at a time (a write transaction begins with BEGIN IMMEDIATE: `foundations.py`),
so what the other databases lock row by row is locked here by the write transaction itself, and a
statement per row costs no round trip: executemany runs in C against a local file. PostgreSQL and
MariaDB/MySQL run several of these statements too, where standard SQL serves them; their classes
say which.

The statements, with what explains each one's shape, are in `statements.py`; the class here runs them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import (
    Insert,
    Row,
    Select,
    Table,
    Update,
    delete,
    insert,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects.sqlite import insert as sqlite_upsert
from sqlalchemy.engine import Connection

from ....core.records import Outcome, ProgressReport, ReadyItem
from ...answers import from_micros, with_results
from ...base import C, I, P, W
from ...foundations import db_minute, db_now, seconds_from_now, stored_bytes
from ...pulling import CLAIM_COLUMNS, item_rows
from ...queues import started_of
from ...schema import attempts, claims, stats, watchers
from .. import AccumulatorRow
from .statements import (
    ACQUIRE_CANDIDATES,
    ACQUIRE_CANDIDATES_AGED,
    CANDIDATES,
    CANDIDATES_UNBLOCKED,
    CHARGE_LOST,
    INSERT_ITEMS,
    LEASED_FOR_DISPATCH,
    LOCK_HELD_LEASES,
    LOCK_LIVE_LEASES,
    MARK_INFLIGHT,
    MERGE_ACCUMULATOR,
    PAGE,
    REFRESH_READY_AT,
    RENEW,
    RENEW_WRITTEN_LEASES,
    STEAL_CANDIDATE,
    STORE_PROGRESS,
    UPDATE_ITEM,
    UPDATE_ITEM_WITH_RESULT,
    lease_picked,
    merge_by_combination,
    new_item_rows,
    ready_items_of,
)


class SQLiteDialect:
    """SQLite (3.35 or newer)."""

    name = "sqlite"
    notifies = False  # no LISTEN: watchers poll
    autocommits_single_statements = False  # `single()` is a write transaction (BEGIN IMMEDIATE)
    writes_done_narrowly = False  # every answer goes through `update_items`
    ready_at_rows_carry_settle_facts = False  # RETURNING renders columns unqualified: see PostgreSQL's

    def insert_stamped(
        self, conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]], now: tuple[str, ...]
    ) -> None:
        if rows:
            conn.execute(insert(table).values({column: db_now() for column in now}), rows)

    def add_to_stats(self, conn: Connection, queue: str, source: str, values: Mapping[str, int]) -> None:
        add_to_stats_by(sqlite_upsert, conn, queue, source, values)

    def insert_partition(self, conn: Connection, statement: Insert) -> int:
        return int(conn.execute(statement.returning(P.id)).scalar_one())

    def notify_ready(self, conn: Connection, queue: str) -> None:
        pass  # no LISTEN/NOTIFY: watchers find new work at their next poll

    def notify_wanted(self, conn: Connection, owner: str) -> None:
        pass  # the owner sees the request at its next heartbeat

    def notify_finished(self, conn: Connection, key: str) -> None:
        pass  # waiters poll

    def limit_lock_waits(self, conn: Connection, seconds: float) -> None:
        pass  # the write transaction holds the whole database's lock from its BEGIN IMMEDIATE

    def lock_held_leases(self, conn: Connection, pids: list[int], watcher_id: str) -> dict[int, int]:
        return dict(conn.execute(LOCK_HELD_LEASES, {"pids": pids, "watcher": watcher_id}).all())

    def lock_live_leases(self, conn: Connection, pids: list[int], watcher_id: str) -> dict[int, int]:
        return dict(conn.execute(LOCK_LIVE_LEASES, {"pids": pids, "watcher": watcher_id}).all())

    def complete_items(
        self, conn: Connection, completed: list[Outcome], watcher_id: str, accumulate: list[AccumulatorRow]
    ) -> int:
        raise NotImplementedError("SQLite writes every answer with update_items (writes_done_narrowly is False)")

    def update_items(self, conn: Connection, rows: list[dict[str, Any]], watcher_id: str) -> int:
        for r in rows:
            r["started"] = from_micros(r["started"])
            r["duration"] = None if r["duration"] is None else r["duration"] / 1e6
        params = [{"b_watcher": watcher_id, **{f"b_{k}": v for k, v in r.items()}} for r in rows]
        statement = UPDATE_ITEM_WITH_RESULT if with_results(rows) else UPDATE_ITEM
        return int(conn.execute(statement, params).rowcount)

    def bump_version(self, conn: Connection, statement: Update, matched_version: int) -> int | None:
        version: int | None = conn.execute(statement.returning(I.version)).scalar_one_or_none()
        return version

    def refresh_ready_at(self, conn: Connection, pids: list[int], idle_after: float) -> Sequence[Row[Any]]:
        return conn.execute(REFRESH_READY_AT, {"pids": pids, "idle_after": float(idle_after)}).all()

    def renew_written_leases(self, conn: Connection, pids: list[int], watcher_id: str, seconds: float) -> None:
        conn.execute(RENEW_WRITTEN_LEASES, {"pids": pids, "watcher": watcher_id, "seconds": float(seconds)})

    def merge_accumulators(self, conn: Connection, rows: list[AccumulatorRow]) -> None:
        """One upsert per combination (`MERGE_ACCUMULATOR`)."""
        merge_by_combination(conn, rows, MERGE_ACCUMULATOR)

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
        """The leased partitions in dispatch order, then each one's due items: one short query per
        partition, in-process."""
        found: list[ReadyItem] = []
        for p in conn.execute(LEASED_FOR_DISPATCH, {"watcher": watcher_id, "after": after, "aging": aging}).all():
            if p.id in closed:
                continue
            found += [
                ReadyItem(
                    r.id,
                    r.version,
                    p.id,
                    p.key,
                    p.queue,
                    p.lease_epoch,
                    r.gate,
                    r.attempts,
                    stored_bytes(r.data),  # TEXT, when written with SQL (see stored_bytes)
                    p.weight,
                    r.deliveries,
                    r.lost,
                    r.collect,
                    r.not_yet,
                    p.priority,
                )
                for r in conn.execute(ready_items_of(p.id, p.gate, excluded, limit - len(found)))
            ]
            if len(found) >= limit:
                break
        return found

    def mark_inflight(
        self, conn: Connection, watcher_id: str, pids: list[int], epochs: list[int], entries: list[str]
    ) -> set[int]:
        rows = [
            {"pid": pid, "watcher": watcher_id, "epoch": epoch, "entries": e}
            for pid, epoch, e in zip(pids, epochs, entries, strict=True)
        ]
        conn.execute(MARK_INFLIGHT, rows)
        return set(pids)  # SQLite's write lock rules out a newer lease holder's record

    def mark_isolated(self, conn: Connection, params: dict[str, Any]) -> None:
        conn.execute(MARK_INFLIGHT, params)

    def insert_new_items(
        self, conn: Connection, pid: int, gates: list[int], data: list[bytes], collects: list[int | None] | None
    ) -> None:
        self.insert_item_rows(conn, new_item_rows(pid, gates, data, collects))

    def insert_item_rows(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        conn.execute(INSERT_ITEMS, rows)

    def acquire_leases(
        self,
        conn: Connection,
        watcher_id: str,
        queue: str,
        limit: int,
        lease_seconds: float,
        aging: float | None = None,
    ) -> Sequence[Row[Any]]:
        """The candidates, locked by the write transaction, then `lease_picked`."""
        pick = ACQUIRE_CANDIDATES if aging is None else ACQUIRE_CANDIDATES_AGED
        candidates = conn.execute(pick, {"queue": queue, "limit": limit, "aging": aging}).all()
        return lease_picked(self, conn, candidates, watcher_id, lease_seconds)

    def renew_leases(self, conn: Connection, watcher_id: str, seconds: float) -> None:
        conn.execute(RENEW, {"watcher": watcher_id, "seconds": float(seconds)})

    def forget_dead_watchers(self, conn: Connection, lease_seconds: float) -> None:
        conn.execute(delete(watchers).where(W.expires_at < seconds_from_now(-10 * lease_seconds)))

    def pick_partitions_to_steal(self, conn: Connection, victim: str, take: int) -> list[int]:
        chosen = (
            select(P.id)
            .where(*STEAL_CANDIDATE)
            .order_by(P.priority, P.created_at.desc())
            .limit(take)
            .with_for_update(skip_locked=True)  # SQLite renders none: its write transaction holds the lock
        )
        return list(conn.execute(chosen, {"victim": victim}).scalars())

    def lock_leases(self, conn: Connection, watcher_id: str, pairs: list[tuple[int, int]]) -> list[int]:
        return list(
            conn.execute(
                select(P.id)
                .where(tuple_(P.id, P.lease_epoch).in_(pairs), P.lease_owner == watcher_id)
                .with_for_update()
            ).scalars()
        )

    def charge_lost(self, conn: Connection, updates: list[dict[str, Any]], records: list[dict[str, Any]]) -> None:
        conn.execute(CHARGE_LOST, updates)
        conn.execute(insert(attempts).values(ended_at=db_now()), records)

    def store_progress(self, conn: Connection, reports: Sequence[ProgressReport]) -> None:
        conn.execute(
            STORE_PROGRESS,
            [
                {"b_id": r.item_id, "b_gate": r.gate, "b_progress": r.fraction, "b_started": started_of(r)}
                for r in reports
            ],
        )

    def find_claimable(
        self, conn: Connection, queue: str, max_items: int, blocked: Sequence[int], priorities: tuple[int, int]
    ) -> list[Any]:
        params = {"queue": queue, "max": max_items, "min_priority": priorities[0], "max_priority": priorities[1]}
        if blocked:
            return list(conn.execute(CANDIDATES_UNBLOCKED, {**params, "blocked": list(blocked)}))
        return list(conn.execute(CANDIDATES, params))

    def claim_items(self, conn: Connection, claiming: Update, ids: list[int]) -> Sequence[Any]:
        return conn.execute(claiming.returning(I.id, I.version, I.claimed_until)).all()

    def claims_of(self, conn: Connection, tokens: list[str]) -> list[Any]:
        return list(conn.execute(select(*CLAIM_COLUMNS).where(C.token.in_(tokens))))

    def items_of(self, conn: Connection, ids: list[int]) -> list[Any]:
        return list(conn.execute(item_rows(ids)))

    def end_claims(self, conn: Connection, tokens: list[str], state: str) -> None:
        conn.execute(update(claims).where(C.token.in_(tokens)).values(state=state, ended_at=db_now()))

    def read_collected(self, conn: Connection, params: dict[str, Any]) -> Sequence[Row[Any]]:
        return conn.execute(PAGE, params).all()

    def deletable(self, chunk: Select[Any]) -> Select[Any]:
        return chunk


def add_to_stats_by(
    upsert: Callable[[Table], Any], conn: Connection, queue: str, source: str, values: Mapping[str, int]
) -> None:
    """Add `values` to this minute's stats row, creating it: INSERT ... ON CONFLICT DO UPDATE, which
    SQLite and PostgreSQL spell alike, each with its own dialect's `insert` (`upsert`)."""
    statement = upsert(stats).values(bucket=db_minute(), queue=queue, source=source[:120], **values)
    excluded = statement.excluded
    conn.execute(
        statement.on_conflict_do_update(
            index_elements=["bucket", "queue", "source"],
            set_={k: stats.c[k] + excluded[k] for k in values},
        )
    )
