"""Lost deliveries: those a watcher left unanswered (it died or stalled: `lost`; it stopped while they
ran: `abandoned`; it let them go while it ran on: `given back`), charged to their items as failed
attempts, each with its delivery record; and the isolation of a suspect item, delivered alone so
that a delivery lost with it counts fully.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import delete, exists, select, tuple_
from sqlalchemy.engine import Connection

from ..core.records import LOST, Lease, ReadyItem, Unanswered, decode_inflight, encode_inflight
from .answers import RECORDS_KEPT, from_micros
from .base import AVAILABLE, FAILED, IS_AVAILABLE, A, F, I, P, event
from .escaping import storable
from .gating import GateWriter
from .schema import attempts, inflight


class LostDeliveries(GateWriter):
    """Charging lost deliveries; isolating suspects."""

    def charge_lost(
        self, watcher_id: str, lease: Lease, *, max_attempts: int, gate_attempts: Mapping[int, int] | None = None
    ) -> list[dict[str, Any]]:
        """Count the deliveries a partition's previous lease holder left unanswered (`lease.pending`,
        read when `watcher_id` took the partition over) as failed attempts, before anything of it is
        fetched again. Returns what was charged (item, gate, attempt, error, failed) for the logs.

        A delivery lost while the item was delivered alone (isolated) counts fully: an item whose
        processing kills its watcher fails after `max_attempts`. One lost among others counts too,
        but never fails the item (it stops at max_attempts - 1): the item that killed the watcher
        may have been another one; the watcher delivers such suspects alone (see `isolate`).
        `gate_attempts` overrides `max_attempts` for the gates named in it (a pipeline's gate settings)."""
        if lease.pending is None:
            return []
        with self.write() as conn:
            held = conn.execute(
                select(P.id)
                .where(
                    P.id == lease.partition_id,
                    P.lease_owner == watcher_id,
                    P.lease_epoch == lease.epoch,
                    P.status == IS_AVAILABLE,
                )
                .with_for_update()
            ).first()
            if held is None:
                return []
            row = conn.execute(
                select(F.watcher, F.entries)
                .where(F.partition_id == lease.partition_id, F.epoch < lease.epoch)
                .with_for_update()
            ).first()
            conn.execute(delete(inflight).where(F.partition_id == lease.partition_id, F.epoch < lease.epoch))
            if row is None:
                return []
            charged = self._charge_record(
                conn, lease.partition_id, row.watcher, row.entries, max_attempts, gate_attempts
            )
            if charged:
                failed_now = any(c["failed"] for c in charged)
                self._settle(conn, lease.partition_id, watcher=watcher_id, failed_now=failed_now)
            return charged

    def _charge_record(
        self,
        conn: Connection,
        pid: int,
        watcher: str,
        entries: str,
        max_attempts: int,
        gate_attempts: Mapping[int, int] | None = None,
    ) -> list[dict[str, Any]]:
        """Charge the deliveries of an in-flight record (`entries`) that `watcher` left unanswered
        as lost."""
        wanted = decode_inflight(entries)
        deliveries = [Unanswered(item_id, version, LOST) for item_id, (version, _) in wanted.items()]
        alone = {item_id for item_id, (_, isolated) in wanted.items() if isolated}
        reason = "watcher {watcher} died or stalled during delivery {attempt}"
        return self._charge(conn, pid, watcher, deliveries, max_attempts, reason, gate_attempts, alone=alone)

    def _charge(
        self,
        conn: Connection,
        pid: int,
        watcher: str,
        deliveries: Sequence[Unanswered],
        max_attempts: int,
        reason: str,
        gate_attempts: Mapping[int, int] | None = None,
        *,
        alone: set[int] | None = None,
    ) -> list[dict[str, Any]]:
        """Charge the unanswered `deliveries` (of items still available, same version) against their
        gate's attempts (`gate_attempts`, else `max_attempts`), each with its delivery record: its
        outcome, start and duration, and `reason` (or its own) as its error. Those in `alone` were
        delivered alone (see `charge_lost`)."""
        wanted = {d.item_id: d for d in deliveries}
        if not wanted:
            return []
        rows = conn.execute(
            select(I.id, I.version, I.gate, I.attempts, I.deliveries)
            .where(I.id.in_(sorted(wanted)), I.partition_id == pid, I.status == IS_AVAILABLE)
            .order_by(I.id)
        ).all()
        charged, updates, records, history, trimmed = [], [], [], [], []
        for r in rows:
            delivery = wanted[r.id]
            if r.version != delivery.version:
                continue  # answered since it was taken
            isolated = alone is not None and r.id in alone
            attempt = r.attempts + 1
            most = (gate_attempts or {}).get(r.gate, max_attempts)
            counted = attempt if isolated else max(r.attempts, min(attempt, most - 1))
            failed = isolated and attempt >= most
            # Placeholders replaced, not str.format: the rest of a reason may quote an error with braces.
            said = (delivery.reason or reason).replace("{watcher}", watcher).replace("{attempt}", str(attempt))
            error = storable(said + (" (delivered alone)" if isolated else ""))  # a reason may quote any error
            charged.append({"item": r.id, "gate": r.gate, "attempt": attempt, "error": error, "failed": failed})
            updates.append(
                {
                    "b_id": r.id,
                    "b_version": r.version,
                    "b_attempts": counted,
                    "b_status": FAILED if failed else AVAILABLE,
                    "b_error": error,
                }
            )
            records.append(
                {
                    "partition_id": pid,
                    "item_id": r.id,
                    "n": r.deliveries + 1,
                    "attempt": attempt,
                    "gate": r.gate,
                    "watcher": watcher,
                    "started_at": from_micros(delivery.started_us),
                    "duration": None if delivery.duration_us is None else delivery.duration_us / 1e6,
                    "outcome": delivery.outcome,
                    "error": error,
                }
            )
            if r.deliveries + 1 > 2 * RECORDS_KEPT:  # the first and the last RECORDS_KEPT, as answers keep
                trimmed.append((r.id, r.deliveries + 1 - RECORDS_KEPT))
            detail = {"gate": r.gate, "attempts": attempt, "error": error}
            if delivery.outcome != LOST:
                detail["outcome"] = delivery.outcome
            history.append(
                event(pid, "item_failed" if failed else "item_lost", item_id=r.id, watcher=watcher, detail=detail)
            )
        if not updates:
            return charged
        self.dialect.charge_lost(conn, updates, records)  # version-guarded: an item answered meanwhile is left alone
        if trimmed:
            conn.execute(delete(attempts).where(tuple_(A.item_id, A.n).in_([tuple_(i, n) for i, n in trimmed])))
        self._events(conn, history)
        return charged

    def isolate(self, watcher_id: str, item: ReadyItem) -> bool:
        """Record that `item` alone is in flight at `watcher_id` (which has nothing else in flight):
        if the watcher dies now, the item is charged a full attempt. False when the lease is gone."""
        with self.write() as conn:
            # Its records of the partitions it holds list nothing in flight now; those of leases it
            # has lost are left to whoever took them over, who charges what they list.
            ours = exists().where(P.id == F.partition_id, P.lease_owner == watcher_id, P.lease_epoch == F.epoch)
            conn.execute(delete(inflight).where(F.watcher == watcher_id, ours))
            held = conn.execute(
                select(P.id).where(
                    P.id == item.partition_id,
                    P.lease_owner == watcher_id,
                    P.lease_epoch == item.epoch,
                    P.status == IS_AVAILABLE,
                )
            ).first()
            if held is None:
                return False
            entries = "=" + encode_inflight([(item.id, item.version)], alone=True)
            params = {"pid": item.partition_id, "watcher": watcher_id, "epoch": item.epoch, "entries": entries}
            self.dialect.mark_isolated(conn, params)
            return True
