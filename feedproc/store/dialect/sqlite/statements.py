"""SQLite's statements, each beside what explains its shape: what `SQLiteDialect` runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import (
    Boolean,
    ColumnElement,
    Float,
    Row,
    Select,
    and_,
    bindparam,
    case,
    exists,
    func,
    insert,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects.sqlite import insert as sqlite_upsert
from sqlalchemy.engine import Connection

from ....core.models import MAX_PRIORITY
from ...base import AVAILABLE, IS_AVAILABLE, PULL, F, I, P, Q, event, touch
from ...claimable import CLAIMABLE_PARTITION, NOT_BLOCKED
from ...collecting import PAGE_COLUMNS
from ...foundations import db_now, seconds_from_now, seconds_until, whole
from ...schema import accumulators, events, inflight, items, partitions
from .. import AccumulatorRow, Dialect

# ---------------------------------------------------------------- the group commit (answers.py)

LOCK_HELD_LEASES = (
    select(P.id, P.lease_epoch)
    .where(P.id.in_(bindparam("pids", expanding=True)), P.lease_owner == bindparam("watcher"), P.status == IS_AVAILABLE)
    .order_by(P.id)
    .with_for_update()
)
# A transactional processor's answer (`apply(within=)`): the lease must not have ended either. The
# database clock is read per statement (SQLite's 'now', MariaDB's UTC_TIMESTAMP(6)), as it must be.
LOCK_LIVE_LEASES = LOCK_HELD_LEASES.where(P.lease_expires_at > db_now())
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
        not_yet=func.coalesce(bindparam("b_not_yet", type_=items.c.not_yet.type), I.not_yet),
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
UPDATE_ITEM_WITH_RESULT = UPDATE_ITEM.values(
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

#: A queue's aging (seconds per step, NULL: none), bound where the aged priority is read.
AGING = bindparam("aging", type_=Float())


def aged_priority() -> ColumnElement[int]:
    """A partition's priority raised by one for every :aging seconds since it was created (its
    queue's `aging`), up to the highest priority; its priority when :aging is NULL."""
    steps = whole(-seconds_until(P.created_at) / AGING)
    return case(
        (AGING.is_(None), P.priority),
        (P.priority > MAX_PRIORITY - steps, MAX_PRIORITY),
        else_=P.priority + steps,
    )


# The leased partitions in dispatch order, then each one's due items: by priority, then from the
# one after :after (the last partition the previous fetch served) by id, wrapping around, so that
# successive fetches take turns through the partitions held.
LEASED_FOR_DISPATCH = (
    select(P.id, P.key, P.queue, P.lease_epoch, P.gate, aged_priority().label("priority"), P.created_at, P.weight)
    .where(
        P.lease_owner == bindparam("watcher"),
        P.status == IS_AVAILABLE,
        P.wanted_by.is_(None),
        P.lease_expires_at > db_now(),
        P.ready_at <= db_now(),
    )
    .order_by(aged_priority().desc(), P.id <= bindparam("after"), P.id)
)


def ready_items_of(pid: int, gate: int, excluded: list[int], limit: int) -> Select[Any]:
    query = select(I.id, I.version, I.gate, I.attempts, I.data, I.deliveries, I.lost, I.collect, I.not_yet).where(
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

_LEASE_SCHEDULE = (P.weight, P.item_timeout, P.windows, P.window_tz, P.partition_limit)
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
# With the queue's aging (:aging seconds a step): by aged priority, a sort of its leasable
# partitions instead of a walk of the leasable index (only queues with aging pay it).
ACQUIRE_CANDIDATES_AGED = ACQUIRE_CANDIDATES.order_by(None).order_by(aged_priority().desc(), P.created_at, P.id)
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
    dialect: Dialect, conn: Connection, candidates: Sequence[Any], watcher_id: str, lease_seconds: float
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
CANDIDATES = (
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
CANDIDATES_UNBLOCKED = CANDIDATES.where(NOT_BLOCKED)
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
PAGE = text(
    f"SELECT {PAGE_COLUMNS.format(length='length')} FROM feedproc_items"
    " WHERE id > :after AND id <= :until AND +partition_id = :pid AND +gate = :gate"
    " AND status IN ('complete', 'failed') ORDER BY id LIMIT :limit"
)
