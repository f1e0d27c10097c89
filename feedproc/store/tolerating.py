"""Tolerated failures (`core.fanin.Tolerance`) in the store: where a gate's tolerance comes from, the
counts the gate rules then need, and the tolerated failures shown beside a partition's counts.

A gate's tolerance is the partition's own `tolerate` (given when it was added), else its gate's
`tolerate` in the queue's pipeline (read at most once a second, `pipelines.cached_pipeline`), else none.
It is looked up only for a gate with a failed item: the common case reads nothing more.

The items that reached a gate, against which "5%" is judged, are those at it now, whatever their
status, and those that moved on from it to a later gate (each left a delivery record "moved" at
this gate): a file that went on from OCR to classification was one of OCR's items.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.engine import Connection

from ..core.fanin import Tolerance
from ..core.records import RECORD_OUTCOMES
from .base import FAILED, IS_FAILED, A, I, StoreBase
from .pipelines import cached_pipeline

_MOVED = RECORD_OUTCOMES["move"]


class Tolerating(StoreBase):
    """Gates' tolerances and the counts they are judged by."""

    def _tolerance(self, conn: Connection, tolerate: str | None, queue: str, gate: int) -> Tolerance | None:
        """The failures `gate` of a partition (its own `tolerate`, its `queue`) lets pass, or None."""
        if tolerate is not None:
            try:
                return Tolerance.parse(tolerate)
            except ValueError:
                pass  # written by hand (a SQL producer): as if not given
        spec = cached_pipeline(self, conn, queue)
        settings = spec.gate(gate) if spec is not None else None
        return settings.tolerance if settings is not None else None

    def _gate_label(self, conn: Connection, queue: str, gate: int) -> str:
        """`gate 2 (classify)`, or `gate 2` where the queue's pipeline does not name it."""
        spec = cached_pipeline(self, conn, queue)
        settings = spec.gate(gate) if spec is not None else None
        return f"gate {gate} ({settings.name})" if settings is not None else f"gate {gate}"

    def _gate_counts(self, conn: Connection, pid: int, gate: int, tolerance: Tolerance) -> tuple[int, int]:
        """(failed items, items that reached the gate), as far as `tolerance` needs to be judged:
        within a count, only the failed items are counted (the failed-items index), and the total
        is theirs; within a percentage of the items still at the gate, those (one read of the
        gate's own index range: the items that moved on could only raise what it allows). Past
        the tolerance, the total is exact."""
        if tolerance.count is not None:
            failed = conn.execute(
                select(func.count()).where(I.partition_id == pid, I.gate == gate, I.status == IS_FAILED)
            ).scalar_one()
            if not tolerance.exceeded(int(failed), 0):
                return int(failed), int(failed)
        here, failed = conn.execute(
            select(func.count(), func.coalesce(func.sum(case((I.status == IS_FAILED, 1), else_=0)), 0)).where(
                I.partition_id == pid, I.gate == gate
            )
        ).one()
        if tolerance.count is None and not tolerance.exceeded(int(failed), int(here)):
            return int(failed), int(here)
        return int(failed), int(here) + self._moved_on(conn, pid, gate)

    def _moved_on(self, conn: Connection, pid: int, gate: int) -> int:
        """Items of partition `pid` that moved on from `gate` to a later one."""
        moved = select(func.count()).where(A.partition_id == pid, A.gate == gate, A.outcome == _MOVED)
        return int(conn.execute(moved).scalar_one())

    def _tolerated(
        self,
        conn: Connection,
        partition: Any,
        gates: Mapping[str, Mapping[str, int]],
        *,
        exact: bool,
    ) -> dict[str, dict[str, Any]]:
        """Per gate with failed items and a tolerance (`partition`: its id, queue, tolerate, status
        and gate; `gates`: its counts per gate): `failed`, `allowed` (the tolerance, "5%" or a count)
        and `exceeded`. With `exact` (one partition's status), also `items` (those that reached the
        gate, which needs a read of its delivery records) and `limit` (how many of them may fail)."""
        shown: dict[str, dict[str, Any]] = {}
        for gate, counts in gates.items():
            if not counts.get(FAILED):
                continue
            tolerance = self._tolerance(conn, partition.tolerate, partition.queue, int(gate))
            if tolerance is None:
                continue
            entry: dict[str, Any] = {"failed": counts[FAILED], "allowed": str(tolerance)}
            if exact:
                total = sum(counts.values()) + self._moved_on(conn, partition.id, int(gate))
                entry.update(items=total, limit=tolerance.allowed(total))
                entry["exceeded"] = tolerance.exceeded(counts[FAILED], total)
            else:  # where the partition failed, with a tolerance: only by exceeding it
                entry["exceeded"] = partition.status == FAILED and int(gate) == partition.gate
            shown[gate] = entry
        return shown
