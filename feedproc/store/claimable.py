"""Which items of a pull-mode queue a claim may take now, in claim order, locked: one statement per
dialect, side by side (`claimable`). The claim itself (`pulling.py`) then keeps those that fit the
queue's and its gates' limits.

Claim order is lease order (priority, then age) over partitions no live watcher holds, each
partition's items at its current gate in due order. Partitions at a gate in `blocked` (full, or
outside its windows) are left out: read on, they would use up the claim's `max_items`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import bindparam, literal, select, text
from sqlalchemy.engine import Connection

from .base import IS_AVAILABLE, I, P
from .dialects import db_now, pg_bigint_array
from .schema import items, partitions

MAX_CLAIM = 1000  # items per claim call (and answers per call), at most


def claimable(
    conn: Connection, queue: str, max_items: int, blocked: Sequence[int], *, postgres: bool, mysql: bool
) -> list[Any]:
    """Up to `max_items` claimable items of `queue` in claim order, at gates not in `blocked`,
    locked for this transaction (other claimers skip them): rows of id, version, partition_id, key,
    queue, gate, attempts, data, weight, deliveries, lost, windows, window_tz, collect."""
    if mysql:
        return _claimable_mysql(conn, queue, max_items, blocked)
    if postgres:
        params = {"queue": queue, "max": max_items, "blocked": pg_bigint_array(sorted(blocked))}
        rows = list(conn.execute(_PG_CANDIDATES, params).all())
        rows.sort(key=lambda r: (r.rank, r.id))  # see _PG_CANDIDATES: no sort in the database
        return rows
    if blocked:
        return list(conn.execute(_CANDIDATES_UNBLOCKED, {"queue": queue, "max": max_items, "blocked": list(blocked)}))
    return list(conn.execute(_CANDIDATES, {"queue": queue, "max": max_items}))


# The next `:max` claimable items of a queue on PostgreSQL: its partitions in lease order (priority,
# then age), each one's items at its current gate in due order, locked with SKIP LOCKED so that
# concurrent claimers never wait for each other nor take the same item. There is deliberately no
# ORDER BY over the join: the nested loop yields the partitions in order, and the LIMIT stops it as
# soon as it has enough (an outer sort would walk and lock every ready partition's items first).
_PG_CANDIDATES = text(
    """
    SELECT i.id, i.version, i.partition_id, p.key, p.queue, i.gate, i.attempts, i.data, p.weight,
           i.deliveries, i.lost, p.windows, p.window_tz, p.rank, i.collect
    FROM (SELECT id, key, queue, gate, weight, windows, window_tz,
                 row_number() OVER (ORDER BY priority DESC, created_at, id) AS rank
          FROM feedproc_partitions
          WHERE queue = :queue AND status = 'available' AND ready_at IS NOT NULL AND ready_at <= now()
            AND (not_before IS NULL OR not_before <= now())
            AND (lease_owner IS NULL OR lease_expires_at < now())
            AND gate <> ALL(CAST(:blocked AS int[]))
          ORDER BY priority DESC, created_at, id) AS p
    CROSS JOIN LATERAL (
        SELECT id, version, partition_id, gate, attempts, data, deliveries, lost, next_attempt_at, collect
        FROM feedproc_items
        WHERE partition_id = p.id AND gate = p.gate AND status = 'available' AND next_attempt_at <= now()
          AND claimed_until IS NULL
        ORDER BY next_attempt_at, id
        LIMIT :max
        FOR UPDATE SKIP LOCKED
    ) AS i
    LIMIT :max
    """
)
# A partition of `:queue` whose items workers may claim now (not leased by a live watcher).
_CLAIMABLE_PARTITION = (
    P.queue == bindparam("queue"),
    P.status == IS_AVAILABLE,
    P.ready_at.is_not(None),
    P.ready_at <= db_now(),
    (P.not_before.is_(None)) | (P.not_before <= db_now()),
    (P.lease_owner.is_(None)) | (P.lease_expires_at < db_now()),
)
# SQLite's twin: its write transaction holds the database's lock, so a plain ordered join does.
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
        *_CLAIMABLE_PARTITION,
        I.status == IS_AVAILABLE,
        I.next_attempt_at <= db_now(),
        I.claimed_until.is_(None),
    )
    .order_by(P.priority.desc(), P.created_at, P.id, I.next_attempt_at, I.id)
    .limit(bindparam("max"))
)
# Partitions at a gate in `:blocked` (full, or outside its windows) are left out: read on, they would
# use up the claim's `:max`. A statement of its own, for claims of queues with such gates only.
_NOT_BLOCKED = P.gate.not_in(bindparam("blocked", expanding=True))
_CANDIDATES_UNBLOCKED = _CANDIDATES.where(_NOT_BLOCKED)
# MariaDB/MySQL's twin, in steps, all plain reads but the last: it has no LATERAL, and InnoDB locks
# every row a locking read reads before its sort and LIMIT (a locking ordered join would lock every
# claimable item of the queue, and concurrent claimers would skip them all). First the partitions in
# lease order that have a claimable item (`_MYSQL_CLAIMABLE_PARTITIONS`), then each one's claimable
# items walked in due order in one UNION ALL (`_mysql_claimable`), then those items locked by id with
# SKIP LOCKED, their conditions checked again on the locked rows (`_MYSQL_LOCK_ITEMS`: a version
# changed since the walk means the item changed, and it is left out).
_CLAIMABLE_ITEM = (
    I.status == IS_AVAILABLE,
    I.next_attempt_at <= db_now(),
    I.claimed_until.is_(None),
)
_MYSQL_CLAIMABLE_PARTITIONS = (
    select(P.id, P.gate)
    .where(
        *_CLAIMABLE_PARTITION,
        # One claimable item at least: a scalar subquery probing feedproc_items_by_gate per
        # partition (MariaDB would make an EXISTS a semi-join that reads every item of the table).
        select(literal(1))
        .where(
            I.partition_id == P.id, I.gate == P.gate, *_CLAIMABLE_ITEM, I.id.not_in(bindparam("seen", expanding=True))
        )
        .limit(1)
        .scalar_subquery()
        .is_not(None),
    )
    .order_by(P.priority.desc(), P.created_at, P.id)
    .limit(bindparam("max"))
)
_MYSQL_CLAIMABLE_PARTITIONS_UNBLOCKED = _MYSQL_CLAIMABLE_PARTITIONS.where(_NOT_BLOCKED)
_MYSQL_LOCK_ITEMS = (
    select(I.id, I.version)
    .where(I.id.in_(bindparam("ids", expanding=True)), *_CLAIMABLE_ITEM)
    .with_hint(items, "FORCE INDEX (PRIMARY)", "mysql")  # by id only, whatever the table's size
    .with_hint(items, "FORCE INDEX (PRIMARY)", "mariadb")
    .with_for_update(skip_locked=True)
)
#: Rounds of the MariaDB/MySQL claim's steps before settling for fewer items than asked: each round
#: walks on past the items that concurrent claimers locked meanwhile, twice as far as the one before.
CLAIM_ROUNDS = 4


def _mysql_claimable(parts: Sequence[Any], limit: int, seen: Sequence[int]) -> str:
    """The first `limit` claimable items of partitions `parts` (id, gate; in lease order), in claim
    order, with what `claim` returns of them: one index walk per partition (feedproc_items_by_gate,
    in due order, stopping at the limit), the rows joined once the items are chosen. Numbers only are
    written into the text."""
    skip = f" AND c.id NOT IN ({','.join(map(str, map(int, seen)))})" if seen else ""
    walks = " UNION ALL ".join(
        f"(SELECT c.id, {n} AS n, c.next_attempt_at AS due FROM feedproc_items AS c"
        f" WHERE c.partition_id = {int(p.id)} AND c.gate = {int(p.gate)} AND c.status = 'available'"
        f" AND c.next_attempt_at <= UTC_TIMESTAMP(6) AND c.claimed_until IS NULL{skip}"
        f" ORDER BY c.next_attempt_at, c.id LIMIT {int(limit)})"
        for n, p in enumerate(parts)
    )
    return (
        'SELECT i.id, i.version, i.partition_id, p."key", p.queue, i.gate, i.attempts, i.data, p.weight,'
        " i.deliveries, i.lost, p.windows, p.window_tz, i.collect"
        f" FROM (SELECT u.id, u.n, u.due FROM ({walks}) AS u ORDER BY u.n, u.due, u.id LIMIT {int(limit)}) AS t"
        " JOIN feedproc_items AS i ON i.id = t.id JOIN feedproc_partitions AS p ON p.id = i.partition_id"
        " ORDER BY t.n, t.due, t.id"
    )


def _claimable_mysql(conn: Connection, queue: str, max_items: int, blocked: Sequence[int]) -> list[Any]:
    """Up to `max_items` claimable items of `queue` in claim order, at gates not `blocked`, locked
    (MariaDB/MySQL: see `_mysql_claimable`). Items other claimers locked are skipped; each round past
    them walks twice as far (the extra items it locks stay untouched until the commit)."""
    rows: list[Any] = []
    seen: list[int] = []
    for n in range(CLAIM_ROUNDS):
        want = max_items - len(rows)
        walk = min(want << n, MAX_CLAIM)  # (a partition a branch of the UNION at most)
        if blocked:
            params = {"queue": queue, "max": walk, "seen": seen, "blocked": list(blocked)}
            parts = conn.execute(_MYSQL_CLAIMABLE_PARTITIONS_UNBLOCKED, params).all()
        else:
            parts = conn.execute(_MYSQL_CLAIMABLE_PARTITIONS, {"queue": queue, "max": walk, "seen": seen}).all()
        if not parts:
            break
        found = conn.exec_driver_sql(_mysql_claimable(parts, walk, seen)).all()
        if not found:
            break
        locked = {(r.id, r.version) for r in conn.execute(_MYSQL_LOCK_ITEMS, {"ids": [r.id for r in found]})}
        rows += [r for r in found if (r.id, r.version) in locked][:want]
        # Each of the partitions had one at least: fewer than walked for means they were all walked.
        if len(found) < walk or len(rows) >= max_items:
            break
        seen += [r.id for r in found]
    return rows
