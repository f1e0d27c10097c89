"""A finished partition's lifecycle: resubmitted (run again from its first gate with the items its
producer added) or removed now (with everything that refers to it).

Each is one transaction under the partition's lock, and only for a finished partition (complete,
failed or cancelled): a finished partition has no lease (every finish clears it), so no watcher can
be writing its items. Resubmitting also bumps the items' versions and the lease epoch, so an answer
still on its way from an earlier delivery is dropped as superseded, as after `retry`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.engine import Connection

from ..core.errors import Refused
from .base import ACTIVE_CLAIM, AVAILABLE, NO_LEASE, A, C, E, F, I, P, this_thread
from .escaping import storable
from .foundations import db_now
from .gating import GateWriter
from .schema import accumulators, attempts, claims, events, inflight, items, partitions

#: What a resubmitted item forgets of its last run (its delivery records stay, as history).
_FRESH_ITEM: dict[str, Any] = {
    "status": AVAILABLE,
    "attempts": 0,
    "not_yet": 0,
    "last_error": None,
    "progress": None,
    "lost": 0,
    "started_at": None,
    "duration": None,
    "delivered_by": None,
    "claimed_until": None,
    "result": None,
}


def keep_origins(conn: Connection, ids: list[int]) -> None:
    """Copy the gate and data of the producer's items among `ids` into their `origin_*` columns,
    unless an earlier answer did: called, in the answer's transaction, before answers replace them.
    An item whose origin is still NULL was never moved or rewritten, so its gate and data now are
    the ones it was added with, whether or not the answer's version matches. Only answers that move
    or rewrite items pay for it; the common one, "done", does not."""
    conn.execute(
        update(items)
        .where(I.id.in_(ids), I.origin_gate.is_(None), I.parent_id.is_(None))
        .values(origin_gate=I.gate, origin_data=I.data)
    )


class Lifecycle(GateWriter):
    """`resubmit` and `remove`: a finished partition run again, or deleted now."""

    def resubmit(self, key: str, *, by: str = "python") -> int:
        """Put finished partition `key` back to work from its first gate with its producer's items:
        the children its answers added are deleted, the items it was given are available again
        (attempts, errors and results reset), its accumulators are emptied; its history and the
        items' delivery records are kept, with a `resubmitted` event. Refused while it is available
        (at work or waiting). Returns the number of items it runs again."""
        by = storable(by, 120)  # as the other actions record who did them
        with self.write() as conn:
            row = self._lock(conn, key)
            if row.status == AVAILABLE:
                raise Refused(f"partition {key!r} is available (not finished): it cannot be resubmitted")
            ours = I.partition_id == row.id
            children = I.parent_id.is_not(None)
            conn.execute(
                update(claims)
                .where(C.partition_id == row.id, C.state == ACTIVE_CLAIM)
                .values(state="superseded", ended_at=db_now())
            )
            removed = conn.execute(delete(items).where(ours, children)).rowcount
            moved_back = ours & I.origin_gate.is_not(None)
            conn.execute(update(items).where(moved_back).values(gate=I.origin_gate, data=I.origin_data))
            # A statement of its own: MariaDB/MySQL assign left to right, each seeing the last.
            conn.execute(update(items).where(moved_back).values(origin_gate=None, origin_data=None))
            count = conn.execute(
                update(items)
                .where(ours)
                .values(
                    next_attempt_at=db_now(),
                    version=I.version + 1,
                    updated_at=db_now(),
                    **_FRESH_ITEM,
                )
            ).rowcount
            conn.execute(delete(accumulators).where(accumulators.c.partition_id == row.id))
            conn.execute(delete(inflight).where(F.partition_id == row.id))
            first = conn.execute(select(func.min(I.gate)).where(ours)).scalar()
            self._touch(
                conn,
                row.id,
                status=AVAILABLE,
                gate=first if first is not None else 0,
                gate_since=db_now(),
                ready_at=None,
                lease_epoch=P.lease_epoch + 1,
                **NO_LEASE,
            )
            detail = {"items": count, "children_removed": removed, "was": row.status, "by": by}
            self._event(conn, row.id, "resubmitted", detail=detail)
            self._tally(conn, row.queue, this_thread("producer"), {"added": count})
            self._settle(conn, row.id, failed_now=False)
            return int(count)

    def remove(self, key: str) -> dict[str, int]:
        """Delete finished partition `key` now, in one transaction, with its items, history,
        delivery records, claims and accumulators. Refused while it is available: cancel it first.
        Returns how many rows of each went."""
        with self.write() as conn:
            row = self._lock(conn, key)
            if row.status == AVAILABLE:
                raise Refused(f"partition {key!r} is available (not finished): cancel it first")
            removed = {
                name: int(conn.execute(delete(table).where(column == row.id)).rowcount)
                for name, table, column in (
                    ("items", items, I.partition_id),
                    ("events", events, E.partition_id),
                    ("attempts", attempts, A.partition_id),
                    ("claims", claims, C.partition_id),
                    ("accumulators", accumulators, accumulators.c.partition_id),
                )
            }
            conn.execute(delete(inflight).where(F.partition_id == row.id))
            conn.execute(delete(partitions).where(P.id == row.id))
            return {"partitions": 1, **removed}
