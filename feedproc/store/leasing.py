"""Watchers' membership and leases: register and heartbeat, acquire, steal (request and hand over),
release (charging what is abandoned: `lost.py`).

Every write a watcher makes is fenced: it locks the partition rows it writes and keeps only those
still leased to it under the same lease epoch, in the same transaction as the write.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import (
    Float,
    Row,
    Select,
    and_,
    bindparam,
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
from sqlalchemy.engine import Connection

from ..core.errors import WatcherGone
from ..core.records import Lease, ProgressReport, Unanswered
from .base import IS_AVAILABLE, NO_LEASE, PULL, F, P, Q, W, event
from .dialects import db_now, seconds_from_now, seconds_until
from .lost import LostDeliveries
from .notify import notify_ready, notify_wanted
from .queues import Queues
from .schema import inflight, partitions, watchers

_LEASE_SCHEDULE = (P.weight, P.item_timeout, P.windows, P.window_tz)
_REMAINING = seconds_until(P.lease_expires_at).label("remaining")


def _lease(row: Row[Any], wanted_by: str | None) -> Lease:
    entries = getattr(row, "pending_entries", None)
    return Lease(
        row.id,
        row.key,
        row.lease_epoch,
        wanted_by,
        float(row.remaining or 0.0),
        row.weight,
        row.item_timeout,
        row.windows,
        row.window_tz,
        (row.pending_watcher, entries) if entries else None,
    )


# `acquire` on PostgreSQL: pick, lease and log in one statement (data-modifying CTEs share one
# snapshot and commit together), one round trip: the path from a notification to dispatch.
# RETURNING sees the new epoch; `c.lease_owner` is the previous owner. Never in a queue in pull mode.
_PG_ACQUIRE = text(
    """
    WITH candidates AS (
        SELECT id, lease_owner FROM feedproc_partitions
        WHERE queue = :queue AND status = 'available' AND ready_at IS NOT NULL AND ready_at <= now()
          AND (not_before IS NULL OR not_before <= now())
          AND (lease_owner IS NULL OR lease_expires_at < now())
          AND NOT EXISTS (SELECT 1 FROM feedproc_queues WHERE name = :queue AND mode = 'pull')
        ORDER BY priority DESC, created_at, id
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    ), leased AS (
        UPDATE feedproc_partitions AS p SET
            lease_owner = :watcher,
            lease_epoch = p.lease_epoch + 1,
            lease_expires_at = now() + CAST(:seconds AS double precision) * interval '1 second',
            wanted_by = NULL,
            version = p.version + 1,
            updated_at = now()
        FROM candidates AS c
        WHERE p.id = c.id
        RETURNING p.id, p.key, p.lease_epoch, p.weight, p.item_timeout, p.windows, p.window_tz,
                  EXTRACT(EPOCH FROM (p.lease_expires_at - now())) AS remaining, c.lease_owner AS previous
    ), logged AS (
        INSERT INTO feedproc_events (partition_id, item_id, kind, watcher, detail, at)
        SELECT id, NULL, CASE WHEN previous IS NULL THEN 'leased' ELSE 'expired' END, :watcher,
               CASE WHEN previous IS NULL THEN NULL ELSE '{"previous": ' || to_json(previous)::text || '}' END, now()
        FROM leased
    )
    SELECT l.id, l.key, l.lease_epoch, l.weight, l.item_timeout, l.windows, l.window_tz, l.remaining,
           f.watcher AS pending_watcher, f.entries AS pending_entries
    FROM leased AS l LEFT JOIN feedproc_inflight AS f ON f.partition_id = l.id AND f.epoch < l.lease_epoch
    ORDER BY l.id
    """
)


def by_id(statement: Select[Any]) -> Select[Any]:
    """`statement`, a locking read of partitions by id, reading them by primary key on MariaDB/MySQL
    whatever the optimizer thinks of a small table: a locking read that scans waits for (or, with
    SKIP LOCKED, skips) the lock of every row it reads, whether it matches or not."""
    return statement.with_hint(partitions, "FORCE INDEX (PRIMARY)", "mysql").with_hint(
        partitions, "FORCE INDEX (PRIMARY)", "mariadb"
    )


# A partition of `:queue` a watcher may lease now.
_LEASABLE = (
    P.queue == bindparam("queue"),
    P.status == IS_AVAILABLE,
    P.ready_at.is_not(None),
    P.ready_at <= db_now(),
    or_(P.not_before.is_(None), P.not_before <= db_now()),
    or_(P.lease_owner.is_(None), P.lease_expires_at < db_now()),
    ~exists().where(Q.name == bindparam("queue"), Q.mode == PULL),  # workers claim its items
)
# SQLite's twin, in three statements of one write transaction: the candidates, their leasing (and
# history, `Leasing._acquire_sqlite`), the leases with what their previous holder left in flight.
_ACQUIRE_CANDIDATES = (
    select(P.id, P.lease_owner)
    .where(*_LEASABLE)
    .order_by(P.priority.desc(), P.created_at, P.id)
    .limit(bindparam("limit"))
)
# MariaDB/MySQL's twin takes the candidates in two steps (`lock_picked`): InnoDB locks every row a
# locking read reads, before its sort and LIMIT, so `FOR UPDATE SKIP LOCKED` on the ordered query
# above could lock all of a queue's ready partitions, and concurrent acquirers would skip them all.
# A plain read picks them in lease order; a locking read by id takes those no one else has locked,
# their conditions checked again on the locked rows (the previous owner read there, under the lock).
_MYSQL_ACQUIRE_PICK = _ACQUIRE_CANDIDATES.with_only_columns(P.id).where(P.id.not_in(bindparam("seen", expanding=True)))
_MYSQL_ACQUIRE_LOCK = by_id(
    select(P.id, P.lease_owner).where(P.id.in_(bindparam("ids", expanding=True)), *_LEASABLE)
).with_for_update(skip_locked=True)
_ACQUIRED = (
    select(
        P.id,
        P.key,
        P.lease_epoch,
        *_LEASE_SCHEDULE,
        _REMAINING,
        F.watcher.label("pending_watcher"),
        F.entries.label("pending_entries"),
    )
    .select_from(partitions.outerjoin(inflight, and_(F.partition_id == P.id, F.epoch < P.lease_epoch)))
    .where(P.id.in_(bindparam("ids", expanding=True)))
    .order_by(P.id)
)
# `request_steals` on MariaDB/MySQL: the victim's partitions to mark, picked, then locked (as above).
_STEAL_CANDIDATE = (
    P.lease_owner == bindparam("victim"),
    P.status == IS_AVAILABLE,
    P.wanted_by.is_(None),
    P.ready_at.is_not(None),
)
_MYSQL_STEAL_PICK = (
    select(P.id)
    .where(*_STEAL_CANDIDATE, P.id.not_in(bindparam("seen", expanding=True)))
    .order_by(P.priority, P.created_at.desc())
    .limit(bindparam("limit"))
)
_MYSQL_STEAL_LOCK = by_id(
    select(P.id).where(P.id.in_(bindparam("ids", expanding=True)), *_STEAL_CANDIDATE)
).with_for_update(skip_locked=True)
# Watchers dead for a while, on MariaDB/MySQL: read first, then deleted by id. A DELETE that scans
# waits for the lock of every row it reads, matching or not (InnoDB reads an UPDATE's rows
# semi-consistently, not a DELETE's): two watchers beating at once, each holding its own row, would
# deadlock on each other's.
_DEAD_WATCHERS = select(W.id).where(W.expires_at < seconds_from_now(-10 * bindparam("lease_seconds")))
_FORGET_WATCHERS = delete(watchers).where(
    W.id.in_(bindparam("ids", expanding=True)), W.expires_at < seconds_from_now(-10 * bindparam("lease_seconds"))
)
# A heartbeat's renewal of its watcher's leases. On MariaDB/MySQL the partitions are read first,
# then renewed by primary key: the UPDATE by owner went through a secondary index (status, updated_at)
# and held its record while it waited for a partition a group commit had locked; that commit then
# released the partition, which changes that index's record: a deadlock, the heartbeat its victim
# (a 100,000-child fan-out with a 1.5 s lease, once in a few runs).
_RENEW = (
    update(partitions)
    .where(P.lease_owner == bindparam("watcher"), P.status == IS_AVAILABLE)
    .values(lease_expires_at=seconds_from_now(bindparam("seconds", type_=Float())))
)
_MYSQL_OWNED = select(P.id).where(P.lease_owner == bindparam("watcher"), P.status == IS_AVAILABLE)
_MYSQL_RENEW = (
    _RENEW.where(P.id.in_(bindparam("ids", expanding=True)))
    .with_hint("FORCE INDEX (PRIMARY)", dialect_name="mysql")
    .with_hint("FORCE INDEX (PRIMARY)", dialect_name="mariadb")
)
#: Rounds of picking and locking on MariaDB/MySQL (`lock_picked`) before settling for fewer rows than
#: asked: each round past rows that concurrent transactions locked meanwhile looks twice as far.
LOCK_ROUNDS = 3


def lock_picked(conn: Connection, pick: Any, lock: Any, params: dict[str, Any], limit: int) -> list[Any]:
    """MariaDB/MySQL's `SELECT ... ORDER BY ... LIMIT :limit FOR UPDATE SKIP LOCKED`, in two steps:
    up to `limit` rows picked by `pick` (a plain read, bound `:limit` and `:seen`, the ids picked in
    earlier rounds) and locked by `lock` (bound `:ids`; SKIP LOCKED, its conditions checked again on
    the locked rows), the first of them in the pick's order taken. Only picked rows are ever locked,
    whatever the plan of the ordered read (a later round's extra ones until the commit, untouched)."""
    taken: list[Any] = []
    seen: list[int] = []
    for n in range(LOCK_ROUNDS):
        want = limit - len(taken)
        walk = want << n
        ids = list(conn.execute(pick, {**params, "limit": walk, "seen": seen}).scalars())
        if not ids:
            break
        order = {pid: i for i, pid in enumerate(ids)}
        locked = sorted(conn.execute(lock, {**params, "ids": ids}), key=lambda r: order[r.id])
        taken += locked[:want]
        if len(ids) < walk or len(taken) >= limit:  # no more to pick, or enough
            break
        seen += ids
    return taken


class Leasing(LostDeliveries, Queues):
    """A watcher's registration and its leases."""

    # ------------------------------------------------------------ membership

    def register_watcher(
        self,
        watcher_id: str,
        *,
        host: str,
        pid: int,
        queue: str,
        concurrency: int,
        capacity: int,
        lease_seconds: float,
        slots: int = 0,
    ) -> None:
        """Record a watcher as alive for `lease_seconds`. Idempotent: a registration whose commit
        was lost to a dropped connection may be sent again (the row is replaced)."""
        with self.write() as conn:
            conn.execute(delete(watchers).where(W.id == watcher_id))
            conn.execute(
                insert(watchers).values(
                    id=watcher_id,
                    host=host[:255],
                    pid=pid,
                    queue=queue,
                    concurrency=concurrency,
                    capacity=capacity,
                    started_at=db_now(),
                    heartbeat_at=db_now(),
                    expires_at=seconds_from_now(lease_seconds),
                    slots=slots,
                )
            )

    def unregister_watcher(self, watcher_id: str) -> None:
        with self.write() as conn:
            conn.execute(delete(watchers).where(W.id == watcher_id))

    def heartbeat(
        self,
        watcher_id: str,
        lease_seconds: float,
        progress: Sequence[ProgressReport] = (),
        *,
        tally: Mapping[str, int] | None = None,
        queue: str = "",
    ) -> list[Lease]:
        """Renew the watcher and all its leases; returns the leases it still holds. `progress`
        reports of items in flight are stored in the same transaction, fenced by lease epoch, and
        so is the watcher's throughput since its last beat (`tally`, counted for `queue`)."""
        with self.write() as conn:
            alive = conn.execute(
                update(watchers)
                .where(W.id == watcher_id)
                .values(heartbeat_at=db_now(), expires_at=seconds_from_now(lease_seconds))
            ).rowcount
            if not alive:  # reaped while we were stalled: come back
                raise WatcherGone(watcher_id)
            if self.mysql:  # by primary key: see _MYSQL_OWNED
                owned = list(conn.execute(_MYSQL_OWNED, {"watcher": watcher_id}).scalars())
                if owned:
                    conn.execute(_MYSQL_RENEW, {"ids": owned, "watcher": watcher_id, "seconds": float(lease_seconds)})
            else:
                conn.execute(_RENEW, {"watcher": watcher_id, "seconds": float(lease_seconds)})
            # Forget watchers that have been dead for a while (their leases expire on their own).
            if self.mysql:
                dead = list(conn.execute(_DEAD_WATCHERS, {"lease_seconds": float(lease_seconds)}).scalars())
                if dead:
                    conn.execute(_FORGET_WATCHERS, {"ids": dead, "lease_seconds": float(lease_seconds)})
            else:
                conn.execute(delete(watchers).where(W.expires_at < seconds_from_now(-10 * lease_seconds)))
            leases = self._owned(conn, watcher_id)
            if progress:  # the renewal above locked this watcher's partition rows: the fence holds
                self._store_progress(conn, leases, progress)
            if tally:
                self._tally(conn, queue, watcher_id, tally)
            return leases

    def partition_statuses(self, pids: Sequence[int]) -> dict[int, str]:
        """The status of each of these partitions (a watcher telling why a lease went), "released"
        for an available one that no watcher holds: let go by its own watcher (a group commit that
        committed as the heartbeat read), not taken over."""
        if not pids:
            return {}
        with self.read() as conn:
            rows = conn.execute(select(P.id, P.status, P.lease_owner).where(P.id.in_(sorted(pids))))
            return {r.id: "released" if r.status == "available" and r.lease_owner is None else r.status for r in rows}

    def owned(self, watcher_id: str) -> list[Lease]:
        """The partitions currently leased to a watcher (with any steal request on them)."""
        with self.single() as conn:
            return self._owned(conn, watcher_id)

    def _owned(self, conn: Connection, watcher_id: str) -> list[Lease]:
        rows = conn.execute(
            select(P.id, P.key, P.lease_epoch, P.wanted_by, *_LEASE_SCHEDULE, _REMAINING)
            .where(P.lease_owner == watcher_id, P.status == IS_AVAILABLE)
            .order_by(P.id)
        )
        return [_lease(r, r.wanted_by) for r in rows]

    # ------------------------------------------------------------ leases

    def acquire(self, watcher_id: str, queue: str, limit: int, lease_seconds: float) -> list[Lease]:
        """Lease up to `limit` partitions of `queue` that have work ready: highest priority, then
        oldest, first; unleased ones and ones whose lease expired (a takeover)."""
        if limit <= 0:
            return []
        acquire = self._twin(self._acquire_pg, self._acquire_sqlite, mysql=self._acquire_mysql)
        return acquire(watcher_id, queue, limit, lease_seconds)

    def _acquire_pg(self, watcher_id: str, queue: str, limit: int, lease_seconds: float) -> list[Lease]:
        with self.single() as conn:
            params = {"queue": queue, "limit": limit, "watcher": watcher_id, "seconds": float(lease_seconds)}
            return [_lease(r, None) for r in conn.execute(_PG_ACQUIRE, params)]

    def _acquire_sqlite(self, watcher_id: str, queue: str, limit: int, lease_seconds: float) -> list[Lease]:
        return self._acquire_locked(watcher_id, queue, limit, lease_seconds)

    def _acquire_mysql(self, watcher_id: str, queue: str, limit: int, lease_seconds: float) -> list[Lease]:
        return self._acquire_locked(watcher_id, queue, limit, lease_seconds, mysql=True)

    def _acquire_locked(
        self, watcher_id: str, queue: str, limit: int, lease_seconds: float, *, mysql: bool = False
    ) -> list[Lease]:
        """`acquire` in one write transaction, the candidates locked: by SQLite's database lock, or
        row by row on MariaDB/MySQL (`lock_picked`)."""
        with self.write() as conn:
            candidates: Sequence[Any]
            if mysql:
                candidates = lock_picked(conn, _MYSQL_ACQUIRE_PICK, _MYSQL_ACQUIRE_LOCK, {"queue": queue}, limit)
            else:
                candidates = conn.execute(_ACQUIRE_CANDIDATES, {"queue": queue, "limit": limit}).all()
            if not candidates:
                return []
            ids = [c.id for c in candidates]
            self._touch(
                conn,
                ids,
                lease_owner=watcher_id,
                lease_epoch=P.lease_epoch + 1,
                lease_expires_at=seconds_from_now(lease_seconds),
                wanted_by=None,
            )
            self._events(
                conn,
                [
                    event(
                        c.id,
                        "expired" if c.lease_owner else "leased",
                        watcher=watcher_id,
                        detail={"previous": c.lease_owner} if c.lease_owner else None,
                    )
                    for c in candidates
                ],
            )
            return [_lease(r, None) for r in conn.execute(_ACQUIRED, {"ids": ids})]

    def fair_share(self, queue: str) -> int | None:
        """Partitions with work in `queue` per live watcher of it, rounded up (what `request_steals`
        balances toward); None when fewer than two watchers are alive (no one to share with)."""
        with self.single() as conn:  # one statement, one round trip (it is read on the poll loop)
            live, active = self._share_counts(conn, queue)
        return math.ceil(active / live) if live >= 2 else None

    def _share_counts(self, conn: Connection, queue: str) -> tuple[int, int]:
        """(live watchers of `queue`, its partitions with work): what a fair share is made of, in
        one statement."""
        live = select(func.count()).where(W.queue == queue, W.expires_at > db_now()).scalar_subquery()
        active = (
            select(func.count())
            .where(P.queue == queue, P.status == IS_AVAILABLE, P.ready_at.is_not(None))
            .scalar_subquery()
        )
        row = conn.execute(select(live, active)).one()
        return int(row[0]), int(row[1])

    def request_steals(self, watcher_id: str, queue: str, *, capacity: int, most: int) -> int:
        """Ask overloaded watchers to hand over partitions, toward a fair share for this one.

        Fair share = ceil(partitions with work in the queue / live watchers of the queue). A
        watcher below it marks at most `most` partitions of the busiest watcher above it as wanted;
        the owner hands them over once their in-flight items have finished. Returns how many
        partitions were marked.
        """
        with self.write() as conn:
            now = db_now()
            live, active = self._share_counts(conn, queue)
            if live < 2 or active == 0:
                return 0
            share = math.ceil(active / live)
            held: dict[str, int] = dict(
                conn.execute(
                    select(P.lease_owner, func.count())
                    .where(
                        P.queue == queue, P.status == IS_AVAILABLE, P.lease_owner.is_not(None), P.lease_expires_at > now
                    )
                    .group_by(P.lease_owner)
                ).all()
            )
            pending = conn.execute(
                select(func.count()).where(P.wanted_by == watcher_id, P.status == IS_AVAILABLE)
            ).scalar_one()
            mine = held.pop(watcher_id, 0) + pending
            room = min(share, capacity) - mine
            if room <= 0 or not held:
                return 0
            victim, victim_count = max(held.items(), key=lambda kv: kv[1])
            # Only from a watcher above the share rounded down, and never so far that the two would
            # swap roles. Rounded down: when the partitions do not divide evenly, watchers at the
            # rounded-up share may each give one to a newcomer (1,000 over 9: eight at 112 left it
            # 104, seven short of a fair 111).
            take = min(most, room, victim_count - active // live, (victim_count - mine) // 2)
            if take <= 0:
                return 0
            if self.mysql:
                ids = [r.id for r in lock_picked(conn, _MYSQL_STEAL_PICK, _MYSQL_STEAL_LOCK, {"victim": victim}, take)]
            else:
                chosen = (
                    select(P.id)
                    .where(*_STEAL_CANDIDATE)
                    .order_by(P.priority, P.created_at.desc())
                    .limit(take)
                    .with_for_update(skip_locked=True)  # SQLite renders none: its write transaction holds the lock
                )
                ids = list(conn.execute(chosen, {"victim": victim}).scalars())
            if not ids:
                return 0
            marked = conn.execute(
                update(partitions)
                .where(P.id.in_(ids), P.wanted_by.is_(None), P.lease_owner == victim)
                .values(wanted_by=watcher_id, version=P.version + 1)
            ).rowcount
            if marked:
                notify_wanted(conn, victim)
            return marked

    def hand_over(self, watcher_id: str, lease: Lease, lease_seconds: float) -> str | None:
        """Give a wanted partition to the watcher that asked for it (if still alive).

        Returns the new owner, or None when the request was void (the thief is gone: the request is
        cleared and the partition stays with this watcher) or the lease was no longer ours.
        """
        with self.write() as conn:
            row = conn.execute(
                select(P.wanted_by, P.lease_epoch)
                .where(P.id == lease.partition_id, P.lease_owner == watcher_id)
                .with_for_update()
            ).one_or_none()
            if row is None or row.lease_epoch != lease.epoch or row.wanted_by is None:
                return None
            thief_alive = conn.execute(
                select(func.count()).where(W.id == row.wanted_by, W.expires_at > db_now())
            ).scalar_one()
            if not thief_alive:
                conn.execute(update(partitions).where(P.id == lease.partition_id).values(wanted_by=None))
                return None
            self._touch(
                conn,
                lease.partition_id,
                lease_owner=row.wanted_by,
                lease_epoch=P.lease_epoch + 1,
                wanted_by=None,
                lease_expires_at=seconds_from_now(lease_seconds),
            )
            self._event(conn, lease.partition_id, "stolen", watcher=row.wanted_by, detail={"from": watcher_id})
            conn.execute(delete(inflight).where(F.partition_id == lease.partition_id))  # nothing was in flight
            notify_ready(conn, conn.execute(select(P.queue).where(P.id == lease.partition_id)).scalar_one())
            thief: str | None = row.wanted_by
            return thief

    def release(
        self,
        watcher_id: str,
        leases: Sequence[Lease],
        *,
        kind: str = "yielded",
        abandoned: Mapping[int, Sequence[Unanswered | tuple[int, int]]] | None = None,
        max_attempts: int = 5,
        gate_attempts: Mapping[int, int] | None = None,
        reason: str = "watcher {watcher} stopped during delivery {attempt}: still running after the shutdown grace",
    ) -> int:
        """Give up leases at once (shutdown: `yielded`), so others need not wait for expiry.

        `abandoned`: per partition, the deliveries the watcher lets go of unanswered (`Unanswered`,
        or (item id, version): abandoned, times unknown): still running, or answered but
        unwritable. Each is charged now, against its gate's attempts (`gate_attempts`, else
        `max_attempts`), and recorded with its outcome, start and duration, and `reason` (or its
        own) as its error (`{watcher}` and `{attempt}` in it are filled in). An in-flight record of
        an earlier lease of the partition, taken over and not charged yet, is charged as lost: a
        release never drops a delivery from the record."""
        if not leases:
            return 0
        with self.write() as conn:
            pairs = [(lease.partition_id, lease.epoch) for lease in leases]
            if self.mysql:
                # By id, the epochs compared here: a row-value IN may scan the table (see `by_id`).
                held = conn.execute(
                    by_id(select(P.id, P.lease_epoch))
                    .where(P.id.in_(sorted({pid for pid, _ in pairs})), P.lease_owner == watcher_id)
                    .order_by(P.id)
                    .with_for_update()
                ).all()
                ours = set(pairs)
                ids = [r.id for r in held if (r.id, r.lease_epoch) in ours]
            else:
                ids = list(
                    conn.execute(
                        select(P.id)
                        .where(tuple_(P.id, P.lease_epoch).in_(pairs), P.lease_owner == watcher_id)
                        .with_for_update()
                    ).scalars()
                )
            if not ids:
                return 0
            epochs = dict(pairs)
            earlier = conn.execute(
                select(F.partition_id, F.watcher, F.entries, F.epoch).where(F.partition_id.in_(ids)).with_for_update()
            ).all()
            for row in earlier:
                if row.epoch < epochs[row.partition_id]:
                    self._charge_record(conn, row.partition_id, row.watcher, row.entries, max_attempts, gate_attempts)
            for pid in ids:
                if abandoned and abandoned.get(pid):
                    given = [d if isinstance(d, Unanswered) else Unanswered(*d) for d in abandoned[pid]]
                    self._charge(conn, pid, watcher_id, given, max_attempts, reason, gate_attempts)
            conn.execute(delete(inflight).where(F.partition_id.in_(ids)))
            self._touch(conn, ids, P.lease_owner == watcher_id, **NO_LEASE)
            self._events(conn, [event(pid, kind, watcher=watcher_id) for pid in ids])
            for queue in set(conn.execute(select(P.queue).where(P.id.in_(ids))).scalars()):
                notify_ready(conn, queue)  # another watcher can take them at once
            return len(ids)
