"""Reads for the dashboard: what runs now, throughput and backlog over time, a queue's backlog by
gate, and how long a partition's gates take. Each is bounded (a page, a sample, a time range of
per-minute rows), so its cost does not grow with the items table.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from ..core.errors import NotFound
from ..core.records import decode_inflight
from .base import ACTIVE_CLAIM, AVAILABLE, COMPLETE, IS_AVAILABLE, A, C, E, F, I, P, StoreBase, iso
from .foundations import db_now
from .schema import claims, items, partitions, stats

RUNNING_SHOWN = 200  # items in the running view
_RECORDS_READ = 500  # in-flight records (one per leased partition) read for it
DURATIONS_SAMPLED = 2000  # most recent deliveries per gate and source behind a partition's p50/p95


class Insight(StoreBase):
    """What the dashboard shows beyond the counts: running items, charts, timings."""

    def tally(self, queue: str, source: str, counts: Mapping[str, int]) -> None:
        """Add throughput counts (`added`, `processed`, `completed`, `failed`) to `source`'s row of
        `queue` for this minute of the database clock."""
        with self.write() as conn:
            self._tally(conn, queue, source, counts)

    def running(self, *, queue: str | None = None, limit: int = RUNNING_SHOWN) -> list[dict[str, Any]]:
        """Items in flight now, longest running first: those watchers took (their in-flight
        records, at the version they took them) and those pull workers or callback handlers claim.
        Each: item, partition, queue, gate, attempt, `by` (watcher or worker), `via` (watcher, worker
        or callback), `started_at` and `elapsed` (None until the watcher's next heartbeat reports a
        delivery still running) and `progress` (0..1, when the processor reports it)."""
        limit = max(1, min(limit, 1000))
        with self.read() as conn:
            now: datetime = conn.execute(select(db_now())).scalar_one()
            taken: dict[int, tuple[int, str, int]] = {}  # item -> (version, watcher, epoch)
            records = select(F.partition_id, F.watcher, F.epoch, F.entries).order_by(F.partition_id)
            for record in conn.execute(records.limit(_RECORDS_READ)):
                for item_id, (version, _alone) in decode_inflight(record.entries).items():
                    taken[item_id] = (version, record.watcher, record.epoch)
                if len(taken) >= 10 * limit:
                    break
            rows: list[dict[str, Any]] = []
            if taken:
                query = _running_items().where(I.id.in_(sorted(taken)), I.status == IS_AVAILABLE)
                if queue is not None:
                    query = query.where(P.queue == queue)
                for r in conn.execute(query.add_columns(I.version, P.lease_owner, P.lease_epoch)):
                    version, watcher, epoch = taken[r.id]
                    if r.version != version or r.lease_owner != watcher or r.lease_epoch != epoch:
                        continue  # answered since, or the lease moved on
                    # A start older than the item's last write belongs to an earlier delivery.
                    started = r.started_at if r.started_at and r.started_at >= r.updated_at else None
                    rows.append(_running(r, now, watcher, "watcher", started))
            claimed = (
                _running_items()
                .add_columns(C.worker, C.callback, C.claimed_at)
                .join_from(items, claims, C.item_id == I.id)
                .where(C.state == ACTIVE_CLAIM, C.expires_at > db_now())
                .order_by(C.claimed_at)
                .limit(limit)
            )
            if queue is not None:
                claimed = claimed.where(P.queue == queue)
            for r in conn.execute(claimed):
                rows.append(_running(r, now, r.worker, "callback" if r.callback else "worker", r.claimed_at))
        rows.sort(key=lambda row: (row["elapsed"] is None, -(row["elapsed"] or 0), row["item"]))
        return rows[:limit]

    def throughput(self, *, seconds: int = 3600, step: int = 60, queue: str | None = None) -> dict[str, Any]:
        """Items added, processed, completed and failed per `step` seconds over the last `seconds`,
        and the backlog (available items of available partitions) at the end of each step: today's,
        walked back through what was added and finished since (items cancelled or retried by an
        operator are not in it). `{"step", "buckets": [{"at", "added", "processed", "completed",
        "failed", "backlog"}...], "backlog": now}`, oldest first, every step present."""
        seconds = max(60, min(seconds, 7 * 86400))
        step = max(60, min(step, seconds))
        with self.read() as conn:
            now: datetime = conn.execute(select(db_now())).scalar_one()
            since = now - timedelta(seconds=seconds)
            query = (
                select(
                    stats.c.bucket,
                    func.sum(stats.c.added),
                    func.sum(stats.c.processed),
                    func.sum(stats.c.completed),
                    func.sum(stats.c.failed),
                )
                .where(stats.c.bucket >= since)
                .group_by(stats.c.bucket)
            )
            if queue is not None:
                query = query.where(stats.c.queue == queue)
            per_minute = conn.execute(query).all()
            backlog_now = self._backlog(conn, queue)
        start = _floor(since, step)
        count = int((now - start).total_seconds() // step) + 1
        buckets: list[dict[str, Any]] = [
            {"at": start + timedelta(seconds=i * step), "added": 0, "processed": 0, "completed": 0, "failed": 0}
            for i in range(count)
        ]
        for bucket, added, processed, completed, failed in per_minute:
            index = int((bucket - start).total_seconds() // step)
            if 0 <= index < count:
                b = buckets[index]
                b["added"] += int(added or 0)
                b["processed"] += int(processed or 0)
                b["completed"] += int(completed or 0)
                b["failed"] += int(failed or 0)
        backlog = backlog_now
        for b in reversed(buckets):  # the backlog at the end of each step, from now backwards
            b["backlog"] = max(backlog, 0)
            backlog -= b["added"] - b["completed"] - b["failed"]
        return {
            "step": step,
            "backlog": backlog_now,
            "buckets": [{**b, "at": iso(b["at"])} for b in buckets],
        }

    def backlog_by_gate(self, queue: str) -> dict[int, int]:
        """Available items of a queue's available partitions, by gate."""
        with self.read() as conn:
            rows = conn.execute(
                select(I.gate, func.count())
                .select_from(items.join(partitions, I.partition_id == P.id))
                .where(P.queue == queue, P.status == IS_AVAILABLE, I.status == IS_AVAILABLE)
                .group_by(I.gate)
                .order_by(I.gate)
            ).all()
        return {int(gate): int(n) for gate, n in rows}

    def timings(self, key: str) -> dict[str, Any]:
        """How long one partition's gates take: per gate, the p50 and p95 of its deliveries' durations
        (a sample of the most recent) and the time the partition spent there (between its gate
        advances); for a running partition, the current gate's pace and an ETA for its remaining items
        at that pace. `{"gates": {gate: {...}}, "current": {...} | None}`."""
        with self.read() as conn:
            row = conn.execute(
                select(P.id, P.gate, P.status, P.created_at, P.updated_at).where(P.key == key)
            ).one_or_none()
            if row is None:
                raise NotFound(f"no partition {key!r}")
            now: datetime = conn.execute(select(db_now())).scalar_one()
            durations = _durations(conn, row.id)
            arrivals = _arrivals(conn, row.id, row.created_at)
            remaining, done_here = _current_gate_counts(conn, row.id, row.gate)
        gates: dict[int, dict[str, Any]] = {}
        for gate, values in sorted(durations.items()):
            gates[gate] = {"deliveries": len(values), "p50": _quantile(values, 0.5), "p95": _quantile(values, 0.95)}
        ordered = sorted(arrivals.items(), key=lambda kv: kv[1])
        for index, (gate, arrived) in enumerate(ordered):
            left = ordered[index + 1][1] if index + 1 < len(ordered) else None
            entry = gates.setdefault(gate, {"deliveries": 0, "p50": None, "p95": None})
            entry["arrived_at"] = iso(arrived)
            end = left
            if end is None and gate == row.gate:  # the gate it is at: until now, or until it finished
                end = now if row.status == AVAILABLE else row.updated_at
            entry["time_at_gate"] = (end - arrived).total_seconds() if end is not None else None
        current = None
        if row.status == AVAILABLE:
            arrived = arrivals.get(row.gate, row.created_at)
            spent = max((now - arrived).total_seconds(), 0.0)
            rate = done_here / spent if spent > 0 and done_here else None
            current = {
                "gate": row.gate,
                "remaining": remaining,
                "finished": done_here,
                "per_second": rate,
                "eta_seconds": remaining / rate if rate else None,
            }
        return {"gates": {str(g): v for g, v in sorted(gates.items())}, "current": current}

    def _backlog(self, conn: Connection, queue: str | None) -> int:
        # Counted per unfinished partition (a subquery on each one's items), not by joining the
        # items table: its cost follows the work left, not the history kept. 10,000 partitions and
        # 1M items of which 133,000 available, PostgreSQL: 28 ms against 34 for the join, which
        # reads every item.
        per_partition = select(func.count()).where(I.partition_id == P.id, I.status == IS_AVAILABLE).scalar_subquery()
        query = select(func.coalesce(func.sum(per_partition), 0)).where(P.status == IS_AVAILABLE)
        if queue is not None:
            query = query.where(P.queue == queue)
        return int(conn.execute(query).scalar_one())


def _running_items() -> Any:
    return select(I.id, P.key, P.queue, I.gate, I.attempts, I.progress, I.started_at, I.updated_at).select_from(
        items.join(partitions, P.id == I.partition_id)
    )


def _running(r: Any, now: datetime, by: str, via: str, started: datetime | None) -> dict[str, Any]:
    return {
        "item": r.id,
        "partition": r.key,
        "queue": r.queue,
        "gate": r.gate,
        "attempt": r.attempts + 1,
        "by": by,
        "via": via,
        "started_at": iso(started),
        "elapsed": max((now - started).total_seconds(), 0.0) if started else None,
        "progress": r.progress,
    }


def _durations(conn: Connection, pid: int) -> dict[int, list[float]]:
    """Delivery durations by gate: completing deliveries (on the item rows) and the others (records)."""
    found: dict[int, list[float]] = {}
    done = (
        select(I.gate, I.duration)
        .where(I.partition_id == pid, I.status == COMPLETE, I.duration.is_not(None))
        .order_by(I.id.desc())
        .limit(DURATIONS_SAMPLED)
    )
    others = (
        select(A.gate, A.duration)
        .where(A.partition_id == pid, A.duration.is_not(None))
        .order_by(A.id.desc())
        .limit(DURATIONS_SAMPLED)
    )
    for query in (done, others):
        for gate, duration in conn.execute(query):
            found.setdefault(int(gate), []).append(float(duration))
    return found


def _arrivals(conn: Connection, pid: int, created: datetime) -> dict[int, datetime]:
    """When the partition reached each gate: its first gate at creation, the others at each advance."""
    first = conn.execute(
        select(E.detail).where(E.partition_id == pid, E.kind == "created").order_by(E.id).limit(1)
    ).scalar_one_or_none()
    arrivals = {int(json.loads(first).get("gate", 0)) if first else 0: created}
    advances = select(E.detail, E.at).where(E.partition_id == pid, E.kind == "gate_advanced").order_by(E.id)
    for detail, at in conn.execute(advances.limit(1000)):
        to = json.loads(detail).get("to") if detail else None
        if isinstance(to, int):
            arrivals[to] = at
    return arrivals


def _current_gate_counts(conn: Connection, pid: int, gate: int) -> tuple[int, int]:
    """(items still available at the gate, items finished there or moved on from it)."""
    rows = conn.execute(
        select(I.status, func.count()).where(I.partition_id == pid, I.gate == gate).group_by(I.status)
    ).all()
    counts = {status: int(n) for status, n in rows}
    moved = conn.execute(
        select(func.count()).where(A.partition_id == pid, A.gate == gate, A.outcome == "moved")
    ).scalar_one()
    finished = sum(n for status, n in counts.items() if status != AVAILABLE) + int(moved)
    return counts.get(AVAILABLE, 0), finished


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def _floor(moment: datetime, step: int) -> datetime:
    epoch = moment.timestamp()
    return datetime.fromtimestamp(epoch - epoch % step, moment.tzinfo)
