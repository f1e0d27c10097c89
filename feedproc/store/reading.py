"""Reads of one partition: its status (`status KEY`), its items a page at a time, one item with its
deliveries, its history; and the per-status counting every read of counts shares.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Row, Select, func, select
from sqlalchemy.engine import Connection

from ..core.errors import InvalidInput, NotFound
from ..core.fanin import shown_number
from ..core.models import MAX_PAGE, Status, shown
from .accumulating import accumulated_of
from .base import COMPLETE, IS_FAILED, A, E, I, P, iso
from .queues import Queues
from .schema import items, partitions
from .tolerating import Tolerating

FAILED_ITEMS_SHOWN = 100


class Reading(Tolerating, Queues):
    """What a producer or an operator asks about one partition."""

    def status(self, key: str, *, history: int = 0) -> dict[str, Any]:
        """One partition as the `status KEY --json` object (with its last `history` events, at most
        MAX_PAGE); NotFound if unknown."""
        if isinstance(history, bool) or not isinstance(history, int) or history < 0:
            raise InvalidInput(f"history must be a non-negative integer, got {shown(history)}")
        history = min(history, MAX_PAGE)
        with self.read() as conn:
            row = conn.execute(select(partitions).where(P.key == key)).one_or_none()
            if row is None:
                raise NotFound(f"no partition {key!r}")
            counts = count_items(conn, [row.id])[row.id]
            failed = conn.execute(
                select(I.id, I.gate, I.attempts, I.last_error)
                .where(I.partition_id == row.id, I.status == IS_FAILED)
                .order_by(I.id)
                .limit(FAILED_ITEMS_SHOWN)
            ).all()
            result = {
                "key": row.key,
                "queue": row.queue,
                "status": row.status,
                "gate": row.gate,
                "priority": row.priority,
                "sealed": bool(row.sealed),
                "manual_checkpoint": bool(row.manual_checkpoint),
                "not_before": iso(row.not_before),
                "created_at": iso(row.created_at),
                "updated_at": iso(row.updated_at),
                "lease": {
                    "owner": row.lease_owner,
                    "expires_at": iso(row.lease_expires_at),
                    "wanted_by": row.wanted_by,
                }
                if row.lease_owner
                else None,
                "items": counts["items"],
                "gates": counts["gates"],
                "failed_items": [
                    {"id": f.id, "gate": f.gate, "attempts": f.attempts, "last_error": f.last_error} for f in failed
                ],
                # Its own tolerance (None: its pipeline gates', if any), and per gate the failures tolerated.
                "tolerate": row.tolerate,
                "tolerated": self._tolerated(conn, row, counts["gates"], exact=True),
                # What its answers' accumulate numbers came to (an int where the value is one).
                "accumulated": {name: shown_number(v) for name, v in accumulated_of(conn, row.id).items()},
            }
            if row.concurrency_group is not None:
                result["group"] = row.concurrency_group
            result.update(self._schedule_status(conn, row, counts["gates"]))
            if history:
                rows = conn.execute(_history_of(row.id).order_by(E.id.desc()).limit(history)).all()
                result["history"] = [_history_entry(r) for r in reversed(rows)]
            return result

    def items(
        self, key: str, *, gate: int | None = None, status: str | None = None, after_id: int = 0, limit: int = 1000
    ) -> list[dict[str, Any]]:
        """Items of one partition in id order, a page at a time (keyset: pass the last id as `after_id`):
        id, gate, status, attempts, deliveries, last_error, data and result (bytes; None: none)."""
        limit = max(1, min(limit, 10_000))
        with self.read() as conn:
            pid = _partition_id(conn, key)
            query = select(I.id, I.gate, I.status, I.attempts, I.deliveries, I.last_error, I.data, I.result).where(
                I.partition_id == pid, I.id > after_id
            )
            if gate is not None:
                query = query.where(I.gate == gate)
            if status is not None:
                query = query.where(I.status == status)
            rows = conn.execute(query.order_by(I.id).limit(limit)).all()
            return [
                {
                    "id": r.id,
                    "gate": r.gate,
                    "status": r.status,
                    "attempts": r.attempts,
                    "deliveries": r.deliveries,
                    "last_error": r.last_error,
                    "data": r.data,
                    "result": r.result,
                }
                for r in rows
            ]

    def item(self, item_id: int) -> dict[str, Any]:
        """One item with its data and its result (bytes; None: none), the gate it collects (`collect`,
        None: none given when it was added) and its deliveries, oldest first (`history`); NotFound if unknown.

        Each delivery: `n` (the item's delivery number), `attempt` (as its processor saw it), `gate`,
        `watcher`, `started_at`, `ended_at`, `duration` (seconds), `outcome` (done, moved, not yet,
        retry, failed, lost, abandoned, given back) and `error` (with a traceback for a Python
        processor's exception). Per item the first and the last few deliveries are kept
        (`answers.RECORDS_KEPT` each)."""
        if isinstance(item_id, bool) or not isinstance(item_id, int) or not 0 < item_id < 2**63:
            raise InvalidInput(f"item id must be a positive integer, got {item_id!r}")
        with self.read() as conn:
            row = conn.execute(
                select(
                    I.id,
                    P.key,
                    P.queue,
                    I.gate,
                    I.status,
                    I.attempts,
                    I.deliveries,
                    I.last_error,
                    I.data,
                    I.result,
                    I.collect,
                    I.parent_id,
                    I.progress,
                    I.started_at,
                    I.duration,
                    I.delivered_by,
                    I.created_at,
                    I.updated_at,
                )
                .select_from(items.join(partitions, P.id == I.partition_id))
                .where(I.id == item_id)
            ).one_or_none()
            if row is None:
                raise NotFound(f"no item {item_id}")
            records = conn.execute(
                select(A.n, A.attempt, A.gate, A.watcher, A.started_at, A.ended_at, A.duration, A.outcome, A.error)
                .where(A.item_id == item_id)
                .order_by(A.n, A.id)
            ).all()
        history = [
            {
                "n": r.n,
                "attempt": r.attempt,
                "gate": r.gate,
                "watcher": r.watcher,
                "started_at": iso(r.started_at),
                "ended_at": iso(r.ended_at),
                "duration": r.duration,
                "outcome": r.outcome,
                "error": r.error,
            }
            for r in records
        ]
        if row.status == COMPLETE and row.delivered_by is not None:  # the completing delivery: on the item row
            history.append(
                {
                    "n": row.deliveries,
                    "attempt": row.attempts + 1,
                    "gate": row.gate,
                    "watcher": row.delivered_by,
                    "started_at": iso(row.started_at),
                    "ended_at": iso(row.updated_at),
                    "duration": row.duration,
                    "outcome": "done",
                    "error": None,
                }
            )
        return {
            "id": row.id,
            "partition": row.key,
            "queue": row.queue,
            "gate": row.gate,
            "status": row.status,
            "attempts": row.attempts,
            "deliveries": row.deliveries,
            "last_error": row.last_error,
            "parent": row.parent_id,
            "progress": row.progress,
            "created_at": iso(row.created_at),
            "updated_at": iso(row.updated_at),
            "data": row.data,
            "result": row.result,
            "collect": row.collect,
            "history": history,
        }

    def history(self, key: str, *, after: int = 0, limit: int = 100) -> list[dict[str, Any]]:
        """A partition's history, oldest first, a page at a time (keyset: pass the last `id` as `after`)."""
        limit = max(1, min(limit, MAX_PAGE))
        with self.read() as conn:
            pid = _partition_id(conn, key)
            rows = conn.execute(_history_of(pid).where(E.id > after).order_by(E.id).limit(limit)).all()
        return [{"id": r.id, **_history_entry(r)} for r in rows]


def _partition_id(conn: Connection, key: str) -> int:
    pid = conn.execute(select(P.id).where(P.key == key)).scalar_one_or_none()
    if pid is None:
        raise NotFound(f"no partition {key!r}")
    return int(pid)


def _history_of(pid: int) -> Select[Any]:
    return select(E.id, E.kind, E.item_id, E.watcher, E.detail, E.at).where(E.partition_id == pid)


def _history_entry(r: Row[Any]) -> dict[str, Any]:
    """One entry of a partition's history, as `status KEY --history` and the operators' reads show it."""
    return {
        "at": iso(r.at),
        "kind": r.kind,
        "item": r.item_id,
        "watcher": r.watcher,
        "detail": json.loads(r.detail) if r.detail else None,
    }


# ---------------------------------------------------------------- counting by status


def zero_counts(*, total: bool = False) -> dict[str, int]:
    """A count of every status, all zero; with `total`, led by a "total" of them (items' counts)."""
    return {"total": 0, **{s.value: 0 for s in Status}} if total else {s.value: 0 for s in Status}


def add_count(counts: dict[str, int], status: str, n: int) -> None:
    counts[status] += n
    if "total" in counts:
        counts["total"] += n


def count_items(conn: Connection, pids: list[int]) -> dict[int, dict[str, Any]]:
    """{partition id: {"items": totals, "gates": {gate: counts}}} for some partitions (a page, or one)."""
    result: dict[int, dict[str, Any]] = {pid: {"items": zero_counts(total=True), "gates": {}} for pid in pids}
    if pids:
        rows = conn.execute(
            select(I.partition_id, I.gate, I.status, func.count())
            .where(I.partition_id.in_(pids))
            .group_by(I.partition_id, I.gate, I.status)
            .order_by(I.partition_id, I.gate)
        )
        for pid, gate, status, n in rows:
            entry = result[pid]
            add_count(entry["gates"].setdefault(str(gate), zero_counts()), status, n)
            add_count(entry["items"], status, n)
    return result


def count_partitions(conn: Connection) -> dict[str, int]:
    """Partitions by status (reads the partitions' status index only: cheap enough to poll)."""
    counts = zero_counts()
    for status, n in conn.execute(select(P.status, func.count()).group_by(P.status)):
        add_count(counts, status, n)
    return counts
