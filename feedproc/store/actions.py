"""Operators' actions on single items: retry one now, skip one (complete it without processing),
cancel one; by id, or every eligible item of a partition (at one gate).

Each action is one transaction holding the locks of the partitions it touches: the items change
(their versions bump, so an answer on its way from a watcher or a worker is dropped as superseded),
each one gets a delivery record saying what was done and by whom, the partition's history one
event, and the gate rules run again (a skipped or cancelled item may drain its gate; a failed
partition whose failed items are retried, skipped or cancelled is at work again).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, and_, select
from sqlalchemy.engine import Connection

from ..core.errors import InvalidInput, NotFound, Refused
from .base import AVAILABLE, CANCELLED, COMPLETE, FAILED, I, P, event
from .escaping import storable
from .foundations import db_now
from .gating import GateWriter, change_items

ITEM_ACTIONS = ("retry", "skip", "cancel")
_ELIGIBLE = {"retry": (FAILED, AVAILABLE), "skip": (FAILED, AVAILABLE), "cancel": (FAILED, AVAILABLE)}
_NEW_STATUS = {"retry": AVAILABLE, "skip": COMPLETE, "cancel": CANCELLED}
_RECORDED = {"retry": "retried", "skip": "skipped", "cancel": "cancelled"}
MAX_IDS = 1000  # ids named in one action


class ItemActions(GateWriter):
    """`act_on_items`: retry, skip or cancel items, as an operator."""

    def act_on_items(
        self,
        action: str,
        *,
        ids: Sequence[int] | None = None,
        key: str | None = None,
        gate: int | None = None,
        by: str = "python",
    ) -> dict[str, Any]:
        """Retry (due now, attempts reset), skip (complete, unprocessed) or cancel items: those
        named by `ids`, or every failed or available item of partition `key` (at `gate`). Named
        items must all be failed or available, in partitions not finished: otherwise Refused and
        nothing changes. `by` (who did it) goes into the records and the history. Returns the
        action, how many items it changed and the partitions' keys."""
        if action not in ITEM_ACTIONS:
            raise InvalidInput(f"action must be one of {', '.join(ITEM_ACTIONS)}, got {action!r}")
        if (ids is None) == (key is None):
            raise InvalidInput("name the items (ids) or their partition (key), not both")
        by = storable(by, 120)  # the records' `watcher` column
        if ids is not None:
            ids = sorted(set(ids))
            if not ids or len(ids) > MAX_IDS or not all(_is_id(i) for i in ids):
                raise InvalidInput(f"ids must be 1 to {MAX_IDS} positive integers")
        with self.write() as conn:
            if ids is not None:
                found = conn.execute(select(I.id, I.partition_id, I.status, I.gate).where(I.id.in_(ids))).all()
                missing = sorted(set(ids) - {r.id for r in found})
                if missing:
                    raise NotFound(f"no item {', '.join(map(str, missing[:10]))}")
                wrong = [r for r in found if r.status not in _ELIGIBLE[action]]
                if wrong:
                    listed = ", ".join(f"item {r.id} is {r.status}" for r in wrong[:5])
                    raise Refused(f"cannot {action}: {listed} (only failed or available items)")
                pids = sorted({r.partition_id for r in found})
                which: ColumnElement[bool] = I.id.in_(ids)
            else:
                assert key is not None
                locked = self._lock(conn, key)
                pids = [locked.id]
                which = and_(I.partition_id == pids[0], I.status.in_(_ELIGIBLE[action]))
                if gate is not None:
                    which = and_(which, I.gate == gate)
                if action == "retry":  # not the failures a gate tolerated, left behind as the partition went on
                    which = and_(which, I.gate >= locked.gate)
            partitions = {
                r.id: r
                for r in conn.execute(
                    select(P.id, P.key, P.status, P.lease_owner, P.gate)
                    .where(P.id.in_(pids))
                    .order_by(P.id)
                    .with_for_update()
                )
            }
            finished = [p for p in partitions.values() if p.status in (COMPLETE, CANCELLED)]
            if finished:
                raise Refused(f"partition {finished[0].key!r} is {finished[0].status}: its items cannot change")
            if ids is not None and action == "retry":
                behind = [r for r in found if r.gate < partitions[r.partition_id].gate]
                if behind:
                    listed = ", ".join(
                        f"item {r.id} is at gate {r.gate}, behind its partition's {partitions[r.partition_id].gate}"
                        for r in behind[:5]
                    )
                    raise Refused(f"cannot retry: {listed} (a failure its gate tolerated)")
            changed = self._change(conn, action, which, by)
            for pid, partition in partitions.items():
                count = changed.get(pid, 0)
                if not count:
                    continue
                detail = {"action": action, "items": count, "by": by, **({"gate": gate} if gate is not None else {})}
                self._events(conn, [event(pid, f"items_{_RECORDED[action]}", watcher=None, detail=detail)])
                if partition.status == FAILED:  # its failed items were dealt with: back at work
                    self._touch(conn, pid, status=AVAILABLE)
                self._settle(conn, pid, failed_now=False)
                if partition.lease_owner is not None:  # its watcher cancels a call of a skipped or cancelled item
                    self.dialect.notify_wanted(conn, partition.lease_owner)
            return {
                "action": action,
                "items": sum(changed.values()),
                "partitions": sorted(partitions[p].key for p in changed if changed[p]),
            }

    def finished_items(self, ids: Sequence[int]) -> list[int]:
        """Which of `ids` are no longer available (skipped, cancelled or otherwise finished): a
        watcher cancels their calls."""
        with self.read() as conn:
            return list(conn.execute(select(I.id).where(I.id.in_(list(ids)), I.status != AVAILABLE)).scalars())

    def _change(self, conn: Connection, action: str, which: ColumnElement[bool], by: str) -> dict[int, int]:
        """Record and change the items `which` selects; how many per partition."""
        values: dict[str, Any] = {}
        if action == "retry":
            values.update(attempts=0, not_yet=0, next_attempt_at=db_now())
        if action == "skip":  # no delivery completed it: its record says so, not the item row
            values.update(delivered_by=None, started_at=None, duration=None)
        return change_items(
            conn,
            which,
            status=_NEW_STATUS[action],
            by=by,
            outcome=_RECORDED[action],
            error=f"{_RECORDED[action]} by {by}",
            claim_state="cancelled" if action == "cancel" else "superseded",
            **values,
        )


def _is_id(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and 0 < value < 2**63
