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
    Row,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Connection

from ..core.errors import WatcherGone
from ..core.records import Lease, ProgressReport, Unanswered
from .base import IS_AVAILABLE, NO_LEASE, F, P, W, event
from .foundations import db_now, seconds_from_now, seconds_until
from .lost import LostDeliveries
from .queues import Queues
from .schema import inflight, partitions, watchers

_LEASE_SCHEDULE = (P.weight, P.item_timeout, P.windows, P.window_tz, P.partition_limit)
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
        row.partition_limit,
    )


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
                    revision=self.code_revision(),
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
            self.dialect.renew_leases(conn, watcher_id, lease_seconds)
            # Forget watchers that have been dead for a while (their leases expire on their own).
            self.dialect.forget_dead_watchers(conn, lease_seconds)
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

    def acquire(
        self, watcher_id: str, queue: str, limit: int, lease_seconds: float, *, aging: float | None = None
    ) -> list[Lease]:
        """Lease up to `limit` partitions of `queue` that have work ready: highest priority, then
        oldest, first; unleased ones and ones whose lease expired (a takeover). With `aging` (the
        queue's: seconds per step) a partition's priority is raised by one per `aging` seconds of
        its age for the order."""
        if limit <= 0:
            return []
        with self.single() as conn:  # PostgreSQL: one statement, autocommit; elsewhere a write transaction
            rows = self.dialect.acquire_leases(conn, watcher_id, queue, limit, lease_seconds, aging)
            return [_lease(r, None) for r in rows]

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
            ids = self.dialect.pick_partitions_to_steal(conn, victim, take)
            if not ids:
                return 0
            marked = conn.execute(
                update(partitions)
                .where(P.id.in_(ids), P.wanted_by.is_(None), P.lease_owner == victim)
                .values(wanted_by=watcher_id, version=P.version + 1)
            ).rowcount
            if marked:
                self.dialect.notify_wanted(conn, victim)
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
            queue = conn.execute(select(P.queue).where(P.id == lease.partition_id)).scalar_one()
            self.dialect.notify_ready(conn, queue)
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
            ids = self.dialect.lock_leases(conn, watcher_id, pairs)
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
                self.dialect.notify_ready(conn, queue)  # another watcher can take them at once
            return len(ids)
