"""SQLite's statements: standard SQL, in-process.

SQLite runs one writer at a time (a write transaction begins with BEGIN IMMEDIATE: `dialects.py`),
so what the other databases lock row by row is locked here by the write transaction itself, and a
statement per row costs no round trip: executemany runs in C against a local file. PostgreSQL and
MariaDB/MySQL run several of these statements too, where standard SQL serves them; their classes
say which.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import (
    Boolean,
    Float,
    Insert,
    Row,
    Select,
    Table,
    Update,
    and_,
    bindparam,
    case,
    delete,
    exists,
    func,
    insert,
    or_,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.dialects.sqlite import insert as sqlite_upsert
from sqlalchemy.engine import Connection

from ...core.records import Outcome, ProgressReport, ReadyItem
from ..answers import from_micros, with_results
from ..base import AVAILABLE, IS_AVAILABLE, PULL, C, F, I, P, Q, W, event, touch
from ..claimable import CLAIMABLE_PARTITION, NOT_BLOCKED
from ..collecting import PAGE_COLUMNS
from ..dialects import db_minute, db_now, seconds_from_now, seconds_until, stored_bytes
from ..pulling import CLAIM_COLUMNS, item_rows
from ..queues import started_of
from ..schema import accumulators, attempts, claims, events, inflight, items, partitions, stats, watchers
from . import AccumulatorRow

# ---------------------------------------------------------------- the group commit (answers.py)

_LOCK_HELD_LEASES = (
    select(P.id, P.lease_epoch)
    .where(P.id.in_(bindparam("pids", expanding=True)), P.lease_owner == bindparam("watcher"), P.status == IS_AVAILABLE)
    .order_by(P.id)
    .with_for_update()
)
# An answer's item update: one row per execution (SQLite runs executemany in-process).
UPDATE_ITEM = (
    update(items)
    .where(I.id == bindparam("b_id"), I.version == bindparam("b_version"), I.status == IS_AVAILABLE)
    .values(
        status=bindparam("b_status"),
        gate=bindparam("b_gate"),
        data=func.coalesce(bindparam("b_data", type_=items.c.data.type), I.data),
        attempts=bindparam("b_attempts"),
        last_error=case(
            (bindparam("b_error", type_=items.c.last_error.type).is_not(None), bindparam("b_error")),
            (bindparam("b_clear", type_=Boolean()).is_(True), None),
            else_=I.last_error,
        ),
        next_attempt_at=seconds_from_now(bindparam("b_delay")),
        progress=bindparam("b_progress", type_=items.c.progress.type),  # kept only by a "not yet" answer with it
        deliveries=I.deliveries + 1,
        lost=0,
        started_at=bindparam("b_started", type_=items.c.started_at.type),
        duration=bindparam("b_duration", type_=items.c.duration.type),
        delivered_by=bindparam("b_watcher"),
        claimed_until=None,
        version=I.version + 1,
        updated_at=db_now(),
    )
)
_UPDATE_ITEM_WITH_RESULT = UPDATE_ITEM.values(
    result=func.coalesce(bindparam("b_result", type_=items.c.result.type), I.result)
)
# Each answered partition's ready_at, from the earliest available item at its gate (NULL: drained).
SET_READY_AT = (
    update(partitions)
    .where(P.id.in_(bindparam("pids", expanding=True)))
    .values(
        ready_at=select(func.min(I.next_attempt_at))
        .where(I.partition_id == P.id, I.gate == P.gate, I.status == IS_AVAILABLE)
        .scalar_subquery()
    )
)
IDLE = (P.ready_at > seconds_from_now(bindparam("idle_after", type_=Float()))).label("idle")
# With the columns that say whether a failure may cross its gate's tolerance.
REFRESH_READY_AT = SET_READY_AT.returning(P.id, P.ready_at, IDLE, P.gate, P.queue, P.tolerate)
# The leases a long group commit wrote under, renewed before it commits (`Answers._renew`).
RENEW_WRITTEN_LEASES = (
    update(partitions)
    .where(P.id.in_(bindparam("pids", expanding=True)), P.lease_owner == bindparam("watcher"), P.status == IS_AVAILABLE)
    .values(lease_expires_at=seconds_from_now(bindparam("seconds", type_=Float())))
)

# ---------------------------------------------------------------- dispatch (dispatch.py)

# The leased partitions in dispatch order, then each one's due items.
LEASED_FOR_DISPATCH = (
    select(P.id, P.key, P.queue, P.lease_epoch, P.gate, P.priority, P.created_at, P.weight)
    .where(
        P.lease_owner == bindparam("watcher"),
        P.status == IS_AVAILABLE,
        P.wanted_by.is_(None),
        P.lease_expires_at > db_now(),
        P.ready_at <= db_now(),
    )
    .order_by(P.priority.desc(), P.created_at, P.id)
)


def _ready_items_of(pid: int, gate: int, excluded: list[int], limit: int) -> Select[Any]:
    query = select(I.id, I.version, I.gate, I.attempts, I.data, I.deliveries, I.lost, I.collect).where(
        I.partition_id == pid,
        I.gate == gate,
        I.status == IS_AVAILABLE,
        I.next_attempt_at <= db_now(),
    )
    if excluded:
        query = query.where(I.id.not_in(bindparam("excluded", excluded, expanding=True)))
    return query.order_by(I.next_attempt_at, I.id).limit(limit)


# A fetch appends its runs to the partition's record, so what is still in flight from earlier fetches
# is not sent again; now and then a watcher rewrites the record whole (entries starting with "="),
# leaving out what was answered meanwhile. A record of an older lease is always replaced. (A first
# record keeps its "=", which decoding ignores.)
APPEND_OR_REPLACE = """CASE
            WHEN f.epoch = excluded.epoch AND substr(excluded.entries, 1, 1) <> '='
                THEN f.entries || ',' || excluded.entries
            ELSE ltrim(excluded.entries, '=') END"""
# One partition's record, in standard SQL: run with executemany by a fetch here (the fetch runs in a
# write transaction), and by `isolate` here and on PostgreSQL.
MARK_INFLIGHT = text(
    f"""
    INSERT INTO feedproc_inflight AS f (partition_id, watcher, epoch, entries)
    VALUES (:pid, :watcher, :epoch, :entries)
    ON CONFLICT (partition_id) DO UPDATE
        SET watcher = excluded.watcher, epoch = excluded.epoch, entries = {APPEND_OR_REPLACE}
        WHERE f.epoch <= excluded.epoch
    """
)

# ---------------------------------------------------------------- items entering (gating.py)

INSERT_ITEMS = insert(items).values(next_attempt_at=db_now(), created_at=db_now(), updated_at=db_now())


def new_item_rows(
    pid: int, gates: list[int], data: list[bytes], collects: list[int | None] | None
) -> list[dict[str, Any]]:
    """A producer's items of partition `pid` as item rows."""
    rows = [{"partition_id": pid, "gate": g, "status": AVAILABLE, "data": d} for g, d in zip(gates, data, strict=True)]
    if collects is not None:
        for row, collect in zip(rows, collects, strict=True):
            row["collect"] = collect
    return rows


# ---------------------------------------------------------------- leases (leasing.py)

_LEASE_SCHEDULE = (P.weight, P.item_timeout, P.windows, P.window_tz)
#: A partition of `:queue` a watcher may lease now.
LEASABLE = (
    P.queue == bindparam("queue"),
    P.status == IS_AVAILABLE,
    P.ready_at.is_not(None),
    P.ready_at <= db_now(),
    or_(P.not_before.is_(None), P.not_before <= db_now()),
    or_(P.lease_owner.is_(None), P.lease_expires_at < db_now()),
    ~exists().where(Q.name == bindparam("queue"), Q.mode == PULL),  # workers claim its items
)
# `acquire` in three statements of one write transaction: the candidates, their leasing (and
# history, `lease_picked`), the leases with what their previous holder left in flight.
ACQUIRE_CANDIDATES = (
    select(P.id, P.lease_owner)
    .where(*LEASABLE)
    .order_by(P.priority.desc(), P.created_at, P.id)
    .limit(bindparam("limit"))
)
_ACQUIRED = (
    select(
        P.id,
        P.key,
        P.lease_epoch,
        *_LEASE_SCHEDULE,
        seconds_until(P.lease_expires_at).label("remaining"),
        F.watcher.label("pending_watcher"),
        F.entries.label("pending_entries"),
    )
    .select_from(partitions.outerjoin(inflight, and_(F.partition_id == P.id, F.epoch < P.lease_epoch)))
    .where(P.id.in_(bindparam("ids", expanding=True)))
    .order_by(P.id)
)
#: A partition of `:victim` that a steal may mark as wanted.
STEAL_CANDIDATE = (
    P.lease_owner == bindparam("victim"),
    P.status == IS_AVAILABLE,
    P.wanted_by.is_(None),
    P.ready_at.is_not(None),
)
# A heartbeat's renewal of its watcher's leases.
RENEW = (
    update(partitions)
    .where(P.lease_owner == bindparam("watcher"), P.status == IS_AVAILABLE)
    .values(lease_expires_at=seconds_from_now(bindparam("seconds", type_=Float())))
)


def lease_picked(
    dialect: SQLiteDialect | Any, conn: Connection, candidates: Sequence[Any], watcher_id: str, lease_seconds: float
) -> Sequence[Row[Any]]:
    """Lease `candidates` (locked rows of id, lease_owner) to `watcher_id`, log each, and read the
    leases back (with what their previous holder left in flight)."""
    if not candidates:
        return []
    ids = [c.id for c in candidates]
    touch(
        conn,
        ids,
        lease_owner=watcher_id,
        lease_epoch=P.lease_epoch + 1,
        lease_expires_at=seconds_from_now(lease_seconds),
        wanted_by=None,
    )
    logged = [
        event(
            c.id,
            "expired" if c.lease_owner else "leased",
            watcher=watcher_id,
            detail={"previous": c.lease_owner} if c.lease_owner else None,
        )
        for c in candidates
    ]
    dialect.insert_stamped(conn, events, logged, ("at",))
    return conn.execute(_ACQUIRED, {"ids": ids}).all()


# ---------------------------------------------------------------- lost deliveries (lost.py)

# A lost delivery charged (version-guarded: an item answered meanwhile is left alone).
CHARGE_LOST = (
    update(items)
    .where(I.id == bindparam("b_id"), I.version == bindparam("b_version"), I.status == IS_AVAILABLE)
    .values(
        status=bindparam("b_status"),
        attempts=bindparam("b_attempts"),
        lost=I.lost + 1,
        deliveries=I.deliveries + 1,
        last_error=bindparam("b_error"),
        next_attempt_at=db_now(),
        progress=None,
        version=I.version + 1,
        updated_at=db_now(),
    )
)

# ---------------------------------------------------------------- progress (queues.py)

# A report without a fraction (or a start) keeps the stored one. A start is written for a delivery
# still running at a heartbeat: the running view's "elapsed" (the answer overwrites it).
STORE_PROGRESS = (
    update(items)
    .where(I.id == bindparam("b_id"), I.gate == bindparam("b_gate"), I.status == IS_AVAILABLE)
    .values(
        progress=func.coalesce(bindparam("b_progress", type_=items.c.progress.type), I.progress),
        started_at=func.coalesce(bindparam("b_started", type_=items.c.started_at.type), I.started_at),
    )
)

# ---------------------------------------------------------------- pull workers (pulling.py)

# Claimable items: the write transaction holds the database's lock, so a plain ordered join does.
_CANDIDATES = (
    select(
        I.id,
        I.version,
        I.partition_id,
        P.key,
        P.queue,
        I.gate,
        I.attempts,
        I.data,
        P.weight,
        I.deliveries,
        I.lost,
        P.windows,
        P.window_tz,
        P.priority,
        I.collect,
    )
    .select_from(partitions.join(items, (I.partition_id == P.id) & (I.gate == P.gate)))
    .where(
        *CLAIMABLE_PARTITION,
        I.status == IS_AVAILABLE,
        I.next_attempt_at <= db_now(),
        I.claimed_until.is_(None),
    )
    .order_by(P.priority.desc(), P.created_at, P.id, I.next_attempt_at, I.id)
    .limit(bindparam("max"))
)
# Partitions at a gate in `:blocked` left out: a statement of its own, for claims of queues with such
# gates only.
_CANDIDATES_UNBLOCKED = _CANDIDATES.where(NOT_BLOCKED)
# ---------------------------------------------------------------- accumulators (accumulating.py)

# An accumulator's rows inserted, each merged into the row already there (`ON CONFLICT ... DO
# UPDATE`, with `excluded`): by addition, or keeping the lesser or the greater (SQLite's min() and
# max() with two arguments are scalar functions). The rows must not repeat a key.
_ACCUMULATOR_UPSERT = sqlite_upsert(accumulators)
MERGE_ACCUMULATOR = {
    how: _ACCUMULATOR_UPSERT.on_conflict_do_update(index_elements=["partition_id", "name"], set_={"value": merged})
    for how, merged in (
        ("add", accumulators.c.value + _ACCUMULATOR_UPSERT.excluded.value),
        ("min", func.min(accumulators.c.value, _ACCUMULATOR_UPSERT.excluded.value)),
        ("max", func.max(accumulators.c.value, _ACCUMULATOR_UPSERT.excluded.value)),
    )
}


def merge_by_combination(conn: Connection, rows: list[AccumulatorRow], upserts: Mapping[str, Any]) -> None:
    """`rows` merged with one statement of `upserts` (combination -> upsert) per combination."""
    by_combination: dict[str, list[dict[str, object]]] = {}
    for pid, name, how, value in rows:
        by_combination.setdefault(how, []).append({"partition_id": pid, "name": name, "value": value})
    for how, values in sorted(by_combination.items()):
        conn.execute(upserts[how], values)


# ---------------------------------------------------------------- reading

# One page of collected results (`collecting.py`: why the partition and gate terms are kept off every
# index, SQLite's unary `+` here).
_PAGE = text(
    f"SELECT {PAGE_COLUMNS.format(length='length')} FROM feedproc_items"
    " WHERE id > :after AND id <= :until AND +partition_id = :pid AND +gate = :gate"
    " AND status IN ('complete', 'failed') ORDER BY id LIMIT :limit"
)


class SQLiteDialect:
    """SQLite (3.35 or newer)."""

    name = "sqlite"
    notifies = False  # no LISTEN: watchers poll
    autocommits_single_statements = False  # `single()` is a write transaction (BEGIN IMMEDIATE)
    writes_done_narrowly = False  # every answer goes through `update_items`
    ready_at_rows_carry_settle_facts = False  # RETURNING renders columns unqualified: see postgresql.py

    def insert_stamped(
        self, conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]], now: tuple[str, ...]
    ) -> None:
        if rows:
            conn.execute(insert(table).values({column: db_now() for column in now}), rows)

    def add_to_stats(self, conn: Connection, queue: str, source: str, values: Mapping[str, int]) -> None:
        statement = sqlite_upsert(stats).values(bucket=db_minute(), queue=queue, source=source[:120], **values)
        excluded = statement.excluded
        conn.execute(
            statement.on_conflict_do_update(
                index_elements=["bucket", "queue", "source"],
                set_={k: stats.c[k] + excluded[k] for k in values},
            )
        )

    def insert_partition(self, conn: Connection, statement: Insert) -> int:
        return int(conn.execute(statement.returning(P.id)).scalar_one())

    def notify_ready(self, conn: Connection, queue: str) -> None:
        pass  # no LISTEN/NOTIFY: watchers find new work at their next poll

    def notify_wanted(self, conn: Connection, owner: str) -> None:
        pass  # the owner sees the request at its next heartbeat

    def notify_finished(self, conn: Connection, key: str) -> None:
        pass  # waiters poll

    def lock_held_leases(self, conn: Connection, pids: list[int], watcher_id: str) -> dict[int, int]:
        return dict(conn.execute(_LOCK_HELD_LEASES, {"pids": pids, "watcher": watcher_id}).all())

    def complete_items(
        self, conn: Connection, completed: list[Outcome], watcher_id: str, accumulate: list[AccumulatorRow]
    ) -> int:
        raise NotImplementedError("SQLite writes every answer with update_items (writes_done_narrowly is False)")

    def update_items(self, conn: Connection, rows: list[dict[str, Any]], watcher_id: str) -> int:
        for r in rows:
            r["started"] = from_micros(r["started"])
            r["duration"] = None if r["duration"] is None else r["duration"] / 1e6
        params = [{"b_watcher": watcher_id, **{f"b_{k}": v for k, v in r.items()}} for r in rows]
        statement = _UPDATE_ITEM_WITH_RESULT if with_results(rows) else UPDATE_ITEM
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
        self, conn: Connection, watcher_id: str, limit: int, excluded: list[int], closed: list[int]
    ) -> list[ReadyItem]:
        """The leased partitions in dispatch order, then each one's due items: one short query per
        partition, in-process."""
        found: list[ReadyItem] = []
        for p in conn.execute(LEASED_FOR_DISPATCH, {"watcher": watcher_id}).all():
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
                )
                for r in conn.execute(_ready_items_of(p.id, p.gate, excluded, limit - len(found)))
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
        self, conn: Connection, watcher_id: str, queue: str, limit: int, lease_seconds: float
    ) -> Sequence[Row[Any]]:
        """The candidates, locked by the write transaction, then `lease_picked`."""
        candidates = conn.execute(ACQUIRE_CANDIDATES, {"queue": queue, "limit": limit}).all()
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

    def find_claimable(self, conn: Connection, queue: str, max_items: int, blocked: Sequence[int]) -> list[Any]:
        if blocked:
            params = {"queue": queue, "max": max_items, "blocked": list(blocked)}
            return list(conn.execute(_CANDIDATES_UNBLOCKED, params))
        return list(conn.execute(_CANDIDATES, {"queue": queue, "max": max_items}))

    def claim_items(self, conn: Connection, claiming: Update, ids: list[int]) -> Sequence[Any]:
        return conn.execute(claiming.returning(I.id, I.version, I.claimed_until)).all()

    def claims_of(self, conn: Connection, tokens: list[str]) -> list[Any]:
        return list(conn.execute(select(*CLAIM_COLUMNS).where(C.token.in_(tokens))))

    def items_of(self, conn: Connection, ids: list[int]) -> list[Any]:
        return list(conn.execute(item_rows(ids)))

    def end_claims(self, conn: Connection, tokens: list[str], state: str) -> None:
        conn.execute(update(claims).where(C.token.in_(tokens)).values(state=state, ended_at=db_now()))

    def read_collected(self, conn: Connection, params: dict[str, Any]) -> Sequence[Row[Any]]:
        return conn.execute(_PAGE, params).all()

    def deletable(self, chunk: Select[Any]) -> Select[Any]:
        return chunk
