"""Dispatch: a watcher's fetch of ready items, the in-flight record the fetch writes, and the slot
claim of a queue with a concurrency limit (the fetch within the limit).

On PostgreSQL the fetch and its in-flight record are the watcher's hot path: two statements run on
the driver's cursor (`DriverStatement`), each its own autocommit transaction. SQLite has no LATERAL;
it is in-process, so it fetches with one short query per leased partition inside a write transaction.
MariaDB/MySQL has neither LATERAL nor arrays: it reads the leased partitions, then every one's due
items in one UNION ALL of per-partition index walks, each stopping at the limit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from sqlalchemy import Select, bindparam, select, text
from sqlalchemy.engine import Connection

from ..core.records import ReadyItem, SlotClaim, encode_inflight
from .base import IS_AVAILABLE, I, P
from .dialects import DriverStatement, db_now, pg_bigint_array, stored_bytes
from .queues import Queues

InFlight = dict[int, list[tuple[int, int]]]  # partition id -> (item id, version) still in flight

# The ready items of a watcher's partitions, in dispatch order, in one statement that walks the
# leased partitions in order (priority, then age) and stops once it has `limit` items, as SQLite's
# twin does: the recursive `walk` takes from each partition, in due order on feedproc_items_by_gate
# (ids only: an index-only scan), what is still wanted, and the items are joined back to their rows
# for the data. The previous form (LATERAL per partition, each up to `limit`, then a sort) read
# partitions x limit index entries to keep `limit` of them: 4,000 for 200 items with 20 partitions
# leased, 6.2 ms per fetch against 0.6-1.3 ms now (EXPLAIN ANALYZE, with and without statistics),
# and dispatch order makes the first partitions' items the ones kept anyway. The walk reads the
# partitions from arrays (`walk_order`): joining the leased partitions at every step costs O(leased)
# per step (200 partitions with an item each: 7.4 ms against 1.3, and 3.3 for the LATERAL form).
# `OFFSET 0` keeps the per-partition subquery from being inlined (it would run twice: once per use
# of its result).
# An item a handler's 202 or a pull worker claimed is due when its claim ends (its next_attempt_at),
# plus a grace (`SETTLE_GRACE`) for the expiry to be settled first, so it is not fetched meanwhile;
# testing `claimed_until` here too would turn the walk's index-only scan into heap reads. Fetched
# before the settling all the same, the item's new delivery supersedes the claim (versions), and
# the late answer is refused.
# Items in flight here are skipped with `NOT IN (SELECT unnest(...))`, which PostgreSQL runs as one
# hashed subplan: `<> ALL(array)` compares each candidate with every excluded id (2-10x slower
# with a few hundred in flight). Its columns are ReadyItem's fields, in order (`collect` last: the
# gate whose results an item collects, given when it was added; NULL for nearly all).
PG_FETCH_READY = DriverStatement(
    """
    WITH RECURSIVE leased AS MATERIALIZED (
        SELECT p.id, p.key, p.queue, p.lease_epoch, p.weight, p.gate,
               row_number() OVER (ORDER BY p.priority DESC, p.created_at, p.id) AS n
        FROM feedproc_partitions AS p
        WHERE p.lease_owner = :watcher AND p.status = 'available' AND p.wanted_by IS NULL
          AND p.lease_expires_at > now() AND p.ready_at <= now()
          AND p.id NOT IN (SELECT unnest(CAST(:closed AS bigint[])))
    ), walk_order AS MATERIALIZED (
        SELECT array_agg(id ORDER BY n) AS pids, array_agg(gate ORDER BY n) AS gates, count(*) AS total
        FROM leased
    ), walk (n, taken, ids) AS (
        SELECT CAST(0 AS bigint), 0, CAST('{}' AS bigint[])
        UNION ALL
        SELECT w.n + 1, w.taken + cardinality(x.ids), x.ids
        FROM walk AS w
        CROSS JOIN walk_order AS o
        CROSS JOIN LATERAL (
            SELECT ARRAY(
                SELECT c.id
                FROM feedproc_items AS c
                WHERE c.partition_id = o.pids[w.n + 1] AND c.gate = o.gates[w.n + 1] AND c.status = 'available'
                  AND c.next_attempt_at <= now()
                  AND c.id NOT IN (SELECT unnest(CAST(:excluded AS bigint[])))
                ORDER BY c.next_attempt_at, c.id
                LIMIT :limit - w.taken)
            OFFSET 0) AS x(ids)
        WHERE w.taken < :limit AND w.n < o.total
    )
    SELECT i.id, i.version, l.id, l.key, l.queue, l.lease_epoch, i.gate, i.attempts, i.data, l.weight,
           i.deliveries, i.lost, i.collect
    FROM walk AS w
    CROSS JOIN LATERAL unnest(w.ids) WITH ORDINALITY AS t(id, ord)
    JOIN leased AS l ON l.n = w.n
    JOIN feedproc_items AS i ON i.id = t.id
    ORDER BY w.n, t.ord
    """
)


def _find_ready_pg(
    conn: Connection, watcher_id: str, limit: int, excluded: list[int], closed: list[int]
) -> list[ReadyItem]:
    params = {"watcher": watcher_id, "excluded": pg_bigint_array(excluded), "limit": limit}
    params["closed"] = pg_bigint_array(closed)
    # fetchall and positional rows: the columns are ReadyItem's fields, in order.
    return [ReadyItem(*row) for row in PG_FETCH_READY.rows(conn, params)]


# SQLite's twin: the leased partitions in dispatch order, then each one's due items.
_LEASED_FOR_DISPATCH = (
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


def _find_ready_sqlite(
    conn: Connection, watcher_id: str, limit: int, excluded: list[int], closed: list[int]
) -> list[ReadyItem]:
    found: list[ReadyItem] = []
    for p in conn.execute(_LEASED_FOR_DISPATCH, {"watcher": watcher_id}).all():
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


def _find_ready_mysql(
    conn: Connection, watcher_id: str, limit: int, excluded: list[int], closed: list[int]
) -> list[ReadyItem]:
    leased = [p for p in conn.execute(_LEASED_FOR_DISPATCH, {"watcher": watcher_id}).all() if p.id not in closed]
    if not leased:
        return []
    # One index walk per partition (feedproc_items_by_gate, in due order, stopping at the limit: the
    # ids only), the runs joined to their rows for the data once the first `limit` in dispatch order
    # are chosen. Two round trips, whatever the number of partitions leased.
    skip = f" AND c.id NOT IN ({','.join(map(str, map(int, excluded)))})" if excluded else ""
    runs = " UNION ALL ".join(
        f"(SELECT c.id, {n} AS n, c.next_attempt_at AS due FROM feedproc_items AS c"
        f" WHERE c.partition_id = {int(p.id)} AND c.gate = {int(p.gate)} AND c.status = 'available'"
        f" AND c.next_attempt_at <= UTC_TIMESTAMP(6){skip} ORDER BY c.next_attempt_at, c.id LIMIT {int(limit)})"
        for n, p in enumerate(leased)
    )
    rows = conn.exec_driver_sql(
        "SELECT i.id, i.version, t.n, i.gate, i.attempts, i.data, i.deliveries, i.lost, i.collect"
        f" FROM (SELECT u.id, u.n, u.due FROM ({runs}) AS u ORDER BY u.n, u.due, u.id LIMIT {int(limit)}) AS t"
        " JOIN feedproc_items AS i ON i.id = t.id ORDER BY t.n, t.due, t.id"
    ).all()
    return [
        ReadyItem(
            r[0],
            r[1],
            (p := leased[r[2]]).id,
            p.key,
            p.queue,
            p.lease_epoch,
            r[3],
            r[4],
            r[5],
            p.weight,
            r[6],
            r[7],
            r[8],
        )
        for r in rows
    ]


# What a fetch took, recorded as in flight before anything of it is delivered: one row per
# partition (what is still in flight there from earlier fetches, plus these), unless a newer lease
# wrote that row meanwhile; only the partitions returned may be delivered. A row per partition and
# fetch, not per item: marking each item row cost as much as completing it (28 against 25 us per
# item, measured on 30,000 items in batches of 200); and a statement of its own, with the entries
# encoded here as runs of ids: built inside the fetch statement (a CTE and an aggregate), the
# record cost 8 us of database CPU per item. It commits without waiting for its WAL flush: a record
# lost in a database crash means a delivery not charged, nothing worse.
# A fetch appends its runs to the partition's record, so what is still in flight from earlier fetches
# is not sent again; now and then a watcher rewrites the record whole (entries starting with "="),
# leaving out what was answered meanwhile. A record of an older lease is always replaced. (A first
# record keeps its "=", which decoding ignores.)
_APPEND_OR_REPLACE = """CASE
            WHEN f.epoch = excluded.epoch AND substr(excluded.entries, 1, 1) <> '='
                THEN f.entries || ',' || excluded.entries
            ELSE ltrim(excluded.entries, '=') END"""
_PG_MARK_INFLIGHT = DriverStatement(
    f"""
    INSERT INTO feedproc_inflight AS f (partition_id, watcher, epoch, entries)
    SELECT m.pid, :watcher, m.epoch, m.entries
    FROM (SELECT set_config('synchronous_commit', 'off', true)) AS durability,
         unnest(CAST(:pids AS bigint[]), CAST(:epochs AS bigint[]), CAST(:entries AS text[])) AS m(pid, epoch, entries)
    ORDER BY m.pid
    ON CONFLICT (partition_id) DO UPDATE
        SET watcher = excluded.watcher, epoch = excluded.epoch, entries = {_APPEND_OR_REPLACE}
        WHERE f.epoch <= excluded.epoch
    RETURNING f.partition_id
    """
)
# One partition's record, in standard SQL: SQLite's twin of the above (run with executemany; the
# fetch runs in a write transaction there), and `isolate` uses it on both databases.
MARK_INFLIGHT = text(
    f"""
    INSERT INTO feedproc_inflight AS f (partition_id, watcher, epoch, entries)
    VALUES (:pid, :watcher, :epoch, :entries)
    ON CONFLICT (partition_id) DO UPDATE
        SET watcher = excluded.watcher, epoch = excluded.epoch, entries = {_APPEND_OR_REPLACE}
        WHERE f.epoch <= excluded.epoch
    """
)


# MariaDB/MySQL's twin: one multi-row upsert (ON DUPLICATE KEY UPDATE has no WHERE: each assignment
# keeps the old value unless the record is of this lease or an older one; `epoch` is assigned last,
# since assignments see the values assigned before them). Which records are this lease's is read
# back: the upsert's row count cannot tell a record kept from one written.
_MYSQL_NEWER_OR_SAME = "feedproc_inflight.epoch <= VALUES(epoch)"
_MYSQL_MARK_INFLIGHT = f"""
    INSERT INTO feedproc_inflight (partition_id, watcher, epoch, entries) VALUES {{rows}}
    ON DUPLICATE KEY UPDATE
        entries = CASE
            WHEN NOT ({_MYSQL_NEWER_OR_SAME}) THEN feedproc_inflight.entries
            WHEN feedproc_inflight.epoch = VALUES(epoch) AND LEFT(VALUES(entries), 1) <> '='
                THEN CONCAT(feedproc_inflight.entries, ',', VALUES(entries))
            ELSE TRIM(LEADING '=' FROM VALUES(entries)) END,
        watcher = IF({_MYSQL_NEWER_OR_SAME}, VALUES(watcher), feedproc_inflight.watcher),
        epoch = IF({_MYSQL_NEWER_OR_SAME}, VALUES(epoch), feedproc_inflight.epoch)
"""


def _mark_inflight_mysql(
    conn: Connection, watcher_id: str, pids: list[int], epochs: list[int], entries: list[str]
) -> set[int]:
    rows = ",".join(["(%s, %s, %s, %s)"] * len(pids))
    params = [v for pid, epoch, e in zip(pids, epochs, entries, strict=True) for v in (pid, watcher_id, epoch, e)]
    conn.exec_driver_sql(_MYSQL_MARK_INFLIGHT.format(rows=rows), tuple(params))
    ours = dict(zip(pids, epochs, strict=True))
    held = conn.exec_driver_sql(
        f"SELECT partition_id, epoch FROM feedproc_inflight WHERE partition_id IN ({','.join(map(str, ours))})"
    ).all()
    return {pid for pid, epoch in held if ours.get(pid) == epoch}


def _mark_inflight_pg(
    conn: Connection, watcher_id: str, pids: list[int], epochs: list[int], entries: list[str]
) -> set[int]:
    params = {
        "watcher": watcher_id,
        "pids": pg_bigint_array(pids),
        "epochs": pg_bigint_array(epochs),
        "entries": entries,
    }
    return {row[0] for row in _PG_MARK_INFLIGHT.rows(conn, params)}


def _mark_inflight_sqlite(
    conn: Connection, watcher_id: str, pids: list[int], epochs: list[int], entries: list[str]
) -> set[int]:
    rows = [
        {"pid": pid, "watcher": watcher_id, "epoch": epoch, "entries": e}
        for pid, epoch, e in zip(pids, epochs, entries, strict=True)
    ]
    conn.execute(MARK_INFLIGHT, rows)
    return set(pids)  # SQLite's write lock rules out a newer lease holder's record


class Dispatch(Queues):
    """Fetching ready items, recording them in flight, within a queue's concurrency limit and its
    pipeline's gate limits."""

    def fetch_ready(
        self,
        watcher_id: str,
        limit: int,
        exclude: Iterable[int] = (),
        *,
        slots: SlotClaim | None = None,
        closed: Iterable[int] = (),
        closed_gates: Iterable[int] = (),
        kept: InFlight | None = None,
    ) -> list[ReadyItem]:
        """Items at the current gate of this watcher's partitions (not wanted by a thief) that are due,
        skipping `exclude` (items already in flight here): partitions by priority then age, items in
        the order they became ready. Partitions in `closed` (outside their time windows), and those
        whose current gate is in `closed_gates` (a pipeline gate outside its windows), are skipped.

        With `slots` (the watcher's queue has a concurrency limit, or its pipeline gate limits) the
        fetch is also the slot claim: see `_fetch_within_limit`.

        The items returned are recorded as in flight (`feedproc_inflight`) before they are returned,
        appended to what the partition's record holds, or, for the partitions in `kept` (partition id
        -> (item id, version) of the items still in flight from earlier fetches), replacing it with
        those and these: a watcher that takes a partition over charges whatever is still there."""
        excluded, shut, kept = sorted(set(exclude)), sorted(set(closed)), kept or {}
        gates = sorted(set(closed_gates))
        if slots is not None:
            return self._fetch_within_limit(watcher_id, limit, excluded, slots, shut, kept, gates)
        if limit <= 0:
            return []
        with self.single() as conn:  # PostgreSQL: autocommit; SQLite: a write transaction
            shut = self._at_gates(conn, watcher_id, gates, shut)
            return self._fetch(conn, watcher_id, limit, excluded, shut, kept)

    def _at_gates(self, conn: Connection, watcher_id: str, gates: list[int], closed: list[int]) -> list[int]:
        """`closed` and the partitions leased to `watcher_id` whose current gate is one of `gates`."""
        if not gates:
            return closed
        at = select(P.id).where(P.lease_owner == watcher_id, P.status == IS_AVAILABLE, P.gate.in_(gates))
        return sorted(set(closed) | set(conn.execute(at).scalars()))

    def _fetch(
        self,
        conn: Connection,
        watcher_id: str,
        limit: int,
        excluded: list[int],
        closed: list[int],
        kept: InFlight,
        keep: Callable[[list[ReadyItem]], list[ReadyItem]] | None = None,
    ) -> list[ReadyItem]:
        """Find the ready items, keep those `keep` takes (all without it), and record them in flight
        (with `kept`), per partition; the items of partitions whose record a newer lease holds are
        dropped."""
        find = self._twin(_find_ready_pg, _find_ready_sqlite, mysql=_find_ready_mysql)
        found = find(conn, watcher_id, limit, excluded, closed)
        if keep is not None:
            found = keep(found)
        if not found:
            return found
        taken: InFlight = {}
        epochs: dict[int, int] = {}
        for item in found:
            taken.setdefault(item.partition_id, []).append((item.id, item.version))
            epochs[item.partition_id] = item.epoch
        pids = sorted(taken)
        entries = [
            "=" + encode_inflight([*kept[pid], *taken[pid]]) if pid in kept else encode_inflight(taken[pid])
            for pid in pids
        ]
        mark = self._twin(_mark_inflight_pg, _mark_inflight_sqlite, mysql=_mark_inflight_mysql)
        marked = mark(conn, watcher_id, pids, [epochs[pid] for pid in pids], entries)
        return found if len(marked) == len(pids) else [item for item in found if item.partition_id in marked]

    def _fetch_within_limit(
        self,
        watcher_id: str,
        want: int,
        excluded: list[int],
        claim: SlotClaim,
        closed: list[int],
        kept: InFlight,
        closed_gates: list[int],
    ) -> list[ReadyItem]:
        """Fetch ready items only as far as the queue's concurrency limit and its gates' limits
        allow, and take their slots, in one write transaction under the queue row's lock (SQLite:
        BEGIN IMMEDIATE).

        Free = limit - slots of the queue's other live watchers - `claim.held` (the weight this
        watcher still has in flight, which it knows exactly); likewise per limited gate, with the
        watchers' per-gate slots and the claims at that gate. Partitions whose current gate has no
        slot free are not read. Items are taken in dispatch order while their weights fit (a weight
        above a limit counts as the limit, so such an item runs alone); a heavy item that does not
        fit stops the queue's fetch, and its gate's (it is not overtaken by lighter ones). The
        watcher's row is then set to what it holds. A dead watcher's slots stop counting when its
        registration expires."""
        with self.write() as conn:
            settings = self._queue(conn, claim.queue, lock=True)
            limits = dict(claim.gate_limits)
            if not settings.limited and not limits:  # the limits were lifted meanwhile
                self._set_slots(conn, watcher_id, 0)
                if want <= 0:
                    return []
                return self._fetch(
                    conn, watcher_id, want, excluded, self._at_gates(conn, watcher_id, closed_gates, closed), kept
                )
            queue_free: int | None = None
            if settings.limited:
                queue_free = settings.limit - self._slots_in_use(conn, claim.queue, besides=watcher_id) - claim.held
            gate_free: dict[int, int] = {}
            if limits:
                used = self._gate_slots_in_use(conn, claim.queue, besides=watcher_id)
                gate_free = {g: n - used.get(g, 0) - claim.gate_held.get(g, 0) for g, n in limits.items()}
            full = [g for g, free in gate_free.items() if free <= 0]
            budget = want if queue_free is None else min(want, queue_free)
            taken: list[ReadyItem] = []
            if budget > 0:

                def keep(found: list[ReadyItem]) -> list[ReadyItem]:
                    nonlocal queue_free
                    out: list[ReadyItem] = []
                    for item in found:
                        weight = min(item.weight, settings.limit) if settings.limited else item.weight
                        if item.gate in limits:
                            weight = min(weight, limits[item.gate])
                        if queue_free is not None and weight > queue_free:
                            break  # strict dispatch order: a heavy item is not overtaken by lighter ones
                        if item.gate in gate_free:
                            if weight > gate_free[item.gate]:
                                gate_free[item.gate] = 0  # nor within its gate
                                continue
                            gate_free[item.gate] -= weight
                        if queue_free is not None:
                            queue_free -= weight
                        out.append(replace(item, weight=weight))
                    return out

                shut = self._at_gates(conn, watcher_id, sorted({*closed_gates, *full}), closed)
                taken = self._fetch(conn, watcher_id, budget, excluded, shut, kept, keep)
            held_at = dict(claim.gate_held)
            for item in taken:
                if item.gate in limits:
                    held_at[item.gate] = held_at.get(item.gate, 0) + item.weight
            self._set_slots(
                conn,
                watcher_id,
                claim.held + sum(item.weight for item in taken),
                gate_slots=held_at if limits else None,
            )
            return taken
