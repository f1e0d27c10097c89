"""Scheduling controls: queue settings (concurrency limit, time windows), the slots a limited queue's
watchers hold, deferring partitions whose time window is closed, and items' progress reports.

Queue settings live in feedproc_queues; a queue without a row has neither a limit nor windows. The
limit is arbitrated with slots: the weights of the items each live watcher has in flight
(feedproc_watchers.slots, and per limited gate of the queue's pipeline, gate_slots), set under the
queue row's lock in the transaction that fetches the items (`dispatch.py`), so answered items' slots
come back with the watcher's next fetch and a dead watcher's stop counting when its registration
expires. Pull workers' unexpired claims count too, taken under the same lock (`pulling.py`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import Row, case, delete, func, insert, literal, select, update
from sqlalchemy.engine import Connection

from ..core import windows as timewindows
from ..core.errors import DatabaseRefused, InvalidInput, WatcherGone
from ..core.fanin import check_operations
from ..core.flow import check_group_limit, encode_group_slots, parse_rate, parse_rate_setting
from ..core.hooks import check_hooks
from ..core.models import MAX_INT32, check_priority, check_queue, check_weight, shown
from ..core.records import Lease, ProgressReport, QueueSettings
from . import flow
from .base import (
    ACTIVE_CLAIM,
    CANCELLED,
    COMPLETE,
    IS_AVAILABLE,
    NO_LEASE,
    C,
    F,
    I,
    P,
    Q,
    W,
    iso,
    utcnow,
)
from .escaping import storable
from .foundations import db_now
from .hook_settings import stored_hooks, write_hooks
from .schema import inflight, partitions, queues, watchers

QUEUE_MODES = ("push", "pull")
T = TypeVar("T")


#: A queue's aging at most, in seconds (a year): past it, aging is as good as none.
MAX_AGING = 366 * 86400.0


def once_more_if_created(write: Callable[[], T]) -> T:
    """Run `write` (a transaction that reads a row, then inserts it if it was missing) once more
    when another writer inserted that row meanwhile: the second run reads and updates it."""
    try:
        return write()
    except DatabaseRefused as error:
        if not error.unique:
            raise
        return write()


class Queues(flow.SharedRates, flow.AdaptiveWindows):
    """Queue settings, slots, deferral and progress."""

    def set_queue(
        self,
        name: str,
        *,
        limit: int | None = None,
        windows: str | Sequence[str] | None = None,
        window_tz: str | None = None,
        clear_windows: bool = False,
        mode: str | None = None,
        paused: bool | None = None,
        accumulate: Mapping[str, str] | None = None,
        hooks: Mapping[str, str | None] | None = None,
        priority: int | None = None,
        weight: int | None = None,
        clear_defaults: bool = False,
        partition_limit: int | None = None,
        aging: float | None = None,
        group_limit: int | None = None,
        rate: str | float | None = None,
        group_rate: str | float | None = None,
        by: str = "python",
    ) -> QueueSettings:
        """Create or change a queue's settings; arguments left None keep their current value.
        A limit < 1 means no limit; `mode` is "push" or "pull"; `paused` stops all new dispatch
        and claims fleet-wide (recorded with `by`); `accumulate` declares how answers' accumulate
        numbers merge ({"pages": "sum"}; {} removes the declaration); `hooks` sets completion hooks
        ({"on_complete": URL or "python"}; an empty value removes one, others keep theirs);
        `priority` and `weight` are what a partition added without its own gets (`clear_defaults`
        removes both first: 0 and 1 again); `partition_limit` bounds the items of any one of its
        partitions in flight at once (< 1: none); `aging` (seconds) raises a waiting partition's
        priority by one per `aging` seconds of its age, for leasing and dispatch (0: none);
        `group_limit` bounds the items of any one concurrency group in flight (< 1: none); `rate`
        and `group_rate` ("600/min", or items per second; 0: none) bound the items started per
        second, the queue's and each group's (`rate` may instead name a shared rate, `set_rate`).
        Returns the settings now stored."""
        check_queue(name)
        if priority is not None:
            check_priority(priority, "default priority")
        if weight is not None:
            check_weight(weight, "default weight")
        given_hooks = check_hooks(hooks) if hooks is not None else None
        declared = None
        if accumulate is not None:
            try:
                declared = check_operations(accumulate)
            except ValueError as error:
                raise InvalidInput(str(error)) from None
        if mode is not None and mode not in QUEUE_MODES:
            raise InvalidInput(f"mode must be push or pull, got {mode!r}")
        for what, value in (("limit", limit), ("partition limit", partition_limit)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value > MAX_INT32):
                raise InvalidInput(f"{what} must be an integer up to {MAX_INT32}, got {shown(value)}")
        if aging is not None and (
            isinstance(aging, bool) or not isinstance(aging, int | float) or not 0 <= aging <= MAX_AGING
        ):
            raise InvalidInput(f"aging must be a number of seconds from 0 to {MAX_AGING:g}, got {shown(aging)}")
        if group_limit is not None:
            check_group_limit(group_limit)
        rates: dict[str, Any] = {}
        if rate is not None:
            own = None if rate in (0, "0") else parse_rate_setting(rate)
            rates["rate"], rates["rate_name"] = (None, own) if isinstance(own, str) else (own, None)
        if group_rate is not None:
            rates["group_rate"] = None if group_rate in (0, "0") else parse_rate(group_rate, "group rate")
        parsed = timewindows.parse_windows(windows) if windows is not None else None
        if window_tz is not None:
            timewindows.zone(window_tz)

        def write() -> QueueSettings:
            with self.write() as conn:
                current = self._queue(conn, name, lock=True)
                values: dict[str, Any] = {
                    "concurrency_limit": current.limit if limit is None else max(limit, 0),
                    "windows": current.windows,
                    "window_tz": current.window_tz,
                    "mode": current.mode if mode is None else mode,
                }
                if paused is not None and paused != current.paused:  # who paused it, and when, is kept
                    who = storable(by, 120)
                    values.update(
                        paused=paused, paused_at=db_now() if paused else None, paused_by=who if paused else None
                    )
                if declared is not None:
                    values["accumulate"] = json.dumps(dict(sorted(declared.items()))) if declared else None
                if clear_windows:
                    values.update(windows=None, window_tz=None)
                if clear_defaults:
                    values.update(default_priority=None, default_weight=None)
                if priority is not None:
                    values["default_priority"] = priority
                if weight is not None:
                    values["default_weight"] = weight
                if partition_limit is not None:
                    values["partition_limit"] = partition_limit if partition_limit >= 1 else None
                if aging is not None:
                    values["aging"] = float(aging) if aging > 0 else None
                if group_limit is not None:
                    values["group_limit"] = group_limit if group_limit >= 1 else None
                if rates.get("rate_name") is not None:
                    self._shared_rate(conn, rates["rate_name"])  # refused unless declared
                values.update(rates)
                if parsed is not None:
                    values["windows"] = timewindows.format_windows(parsed)
                if window_tz is not None:
                    if values["windows"] is None:
                        raise InvalidInput("a time zone applies to windows: give --window too")
                    values["window_tz"] = None if window_tz.upper() in ("UTC", "Z") else window_tz
                exists_already = conn.execute(select(Q.name).where(Q.name == name)).first() is not None
                if exists_already:
                    conn.execute(update(queues).where(Q.name == name).values(updated_at=db_now(), **values))
                else:
                    conn.execute(insert(queues).values(name=name, updated_at=db_now(), **values))
                if hooks is not None and given_hooks is not None:
                    write_hooks(conn, name, given_hooks, removed=[hook for hook, target in hooks.items() if not target])
                self.dialect.notify_ready(conn, name)  # a raised limit or an opened window: watchers look again
                return self._queue(conn, name)

        return once_more_if_created(write)  # two watchers starting at once may both create the row

    def queue_settings(self, name: str) -> QueueSettings:
        """A queue's settings (defaults when it has no row): read by watchers once per poll interval."""
        with self.single() as conn:
            return self._queue(conn, name)

    def queues(self) -> list[dict[str, Any]]:
        """Every queue with settings or partitions: its limit, slots in use, windows and whether open."""
        now = utcnow()
        with self.read() as conn:
            names = set(conn.execute(select(Q.name)).scalars()) | set(
                conn.execute(select(P.queue).where(P.status == IS_AVAILABLE).distinct()).scalars()
            )
            return [self._described(conn, name, now) for name in sorted(names)]

    def queue(self, name: str) -> dict[str, Any]:
        """One queue's settings and state (as in `queues`)."""
        check_queue(name)
        with self.read() as conn:
            return self._described(conn, name, utcnow())

    def _described(self, conn: Connection, name: str, now: datetime) -> dict[str, Any]:
        """A queue's settings and state, with the weight each concurrency group has in flight and the
        adaptive concurrency window of each gate that has one."""
        described = self._queue(conn, name).describe(now, self._slots_in_use(conn, name))
        per_group: dict[str, int] = {}
        for (group, _), weight in flow.group_use(conn, name).items():
            per_group[group] = per_group.get(group, 0) + weight
        if per_group:
            described["groups"] = dict(sorted(per_group.items()))
        if widths := flow.gate_widths(conn, name):  # gates whose handler pushed back
            described["adaptive"] = {str(gate): round(width, 2) for gate, width in sorted(widths.items())}
        return described

    def _queue(self, conn: Connection, name: str, *, lock: bool = False) -> QueueSettings:
        query = select(
            Q.concurrency_limit,
            Q.windows,
            Q.window_tz,
            Q.mode,
            Q.paused,
            Q.paused_at,
            Q.paused_by,
            Q.accumulate,
            Q.hooks,
            Q.default_priority,
            Q.default_weight,
            Q.partition_limit,
            Q.aging,
            Q.group_limit,
            Q.rate,
            Q.rate_name,
            Q.group_rate,
        ).where(Q.name == name)
        if lock:  # SQLite renders no FOR UPDATE: its write transaction holds the database's lock
            query = query.with_for_update()
        row = conn.execute(query).one_or_none()
        if row is None:
            return QueueSettings(name)
        return QueueSettings(
            name,
            row.concurrency_limit,
            row.windows,
            row.window_tz,
            row.mode,
            row.paused,
            row.paused_at,
            row.paused_by,
            stored_operations(row.accumulate),
            tuple(sorted(stored_hooks(row.hooks).items())),
            row.default_priority,
            row.default_weight,
            row.partition_limit,
            row.aging,
            row.group_limit,
            row.rate_name if row.rate_name is not None else row.rate,
            row.group_rate,
        )

    def _slots_in_use(self, conn: Connection, queue: str, *, besides: str | None = None) -> int:
        """Weights in flight for `queue`: the slots of its live watchers (other than `besides`) and
        the weights of the unexpired claims of pull workers and callback handlers."""
        held = select(func.coalesce(func.sum(W.slots), 0)).where(W.queue == queue, W.expires_at > db_now())
        if besides is not None:
            held = held.where(W.id != besides)
        claimed = select(func.coalesce(func.sum(C.weight), 0)).where(
            C.queue == queue, C.state == ACTIVE_CLAIM, C.expires_at > db_now()
        )
        row = conn.execute(select(held.scalar_subquery(), claimed.scalar_subquery())).one()
        return int(row[0]) + int(row[1])

    def _gate_slots_in_use(self, conn: Connection, queue: str, *, besides: str | None = None) -> dict[int, int]:
        """Weights in flight per gate for `queue`: the per-gate slots of its live watchers (other
        than `besides`) and the weights of the unexpired claims at each gate. (A handful of rows:
        one per watcher of the queue, its gates' slots as JSON summed here.)"""
        held = select(W.gate_slots).where(W.queue == queue, W.expires_at > db_now(), W.gate_slots.is_not(None))
        if besides is not None:
            held = held.where(W.id != besides)
        used: dict[int, int] = {}
        for text in conn.execute(held).scalars():
            for gate, weight in json.loads(text).items():
                used[int(gate)] = used.get(int(gate), 0) + int(weight)
        claimed = (
            select(C.gate, func.sum(C.weight))
            .where(C.queue == queue, C.state == ACTIVE_CLAIM, C.expires_at > db_now())
            .group_by(C.gate)
        )
        for gate, weight in conn.execute(claimed).all():
            used[int(gate)] = used.get(int(gate), 0) + int(weight)
        return used

    def _set_slots(
        self,
        conn: Connection,
        watcher_id: str,
        slots: int,
        *,
        gate_slots: Mapping[int, int] | None = None,
        group_slots: Mapping[tuple[str, int], int] | None = None,
    ) -> None:
        """Set the weight this watcher has in flight (and per limited gate, and per group and gate:
        None clears them)."""
        per_gate = None if gate_slots is None else json.dumps({str(g): n for g, n in gate_slots.items() if n > 0})
        per_group = None if group_slots is None else encode_group_slots(group_slots)
        done = conn.execute(
            update(watchers)
            .where(W.id == watcher_id)
            .values(slots=max(slots, 0), gate_slots=per_gate, group_slots=per_group)
        )
        if done.rowcount == 0:  # reaped: its slots would go uncounted; claim none until it registers again
            raise WatcherGone(watcher_id)

    def defer(self, watcher_id: str, deferred: Sequence[tuple[Lease, datetime]]) -> int:
        """Give up leased partitions whose time window is closed until it opens: the lease is
        released (fenced by epoch) and `ready_at` moved to the opening, so no watcher leases them
        before then. Returns how many were deferred."""
        if not deferred:
            return 0
        with self.write() as conn:
            opens = {lease.partition_id: (lease.epoch, when) for lease, when in deferred}
            held = conn.execute(
                select(P.id, P.lease_epoch)
                .where(P.id.in_(sorted(opens)), P.lease_owner == watcher_id, P.status == IS_AVAILABLE)
                .order_by(P.id)
                .with_for_update()
            ).all()
            done = 0
            for row in held:
                epoch, when = opens[row.id]
                if row.lease_epoch != epoch:
                    continue
                opening = literal(when, partitions.c.ready_at.type)
                later = case((P.ready_at.is_(None), None), (P.ready_at > opening, P.ready_at), else_=opening)
                self._touch(conn, row.id, ready_at=later, **NO_LEASE)
                detail = {"reason": "window closed", "opens_at": iso(when)}
                self._event(conn, row.id, "deferred", watcher=watcher_id, detail=detail)
                conn.execute(delete(inflight).where(F.partition_id == row.id))  # nothing was in flight
                done += 1
            return done

    def _store_progress(self, conn: Connection, leases: list[Lease], reports: Sequence[ProgressReport]) -> None:
        """Write progress reports of items still available at the gate they were dispatched at, in
        partitions still leased under the epoch they were dispatched with (others are dropped)."""
        epochs = {lease.partition_id: lease.epoch for lease in leases}
        kept = [r for r in reports if epochs.get(r.partition_id) == r.epoch]
        if not kept:
            return
        # A report without a fraction (or a start) keeps the stored one. A start is written for a
        # delivery still running at a heartbeat: the running view's "elapsed" (the answer overwrites it).
        self.dialect.store_progress(conn, kept)

    def _schedule_status(self, conn: Connection, row: Row[Any], counts: dict[str, dict[str, int]]) -> dict[str, Any]:
        """The `status KEY` keys on scheduling: `schedule` (weight, item timeout, windows and when the
        next one opens, the queue's limit) and `progress` (per gate done / total and the mean progress
        of items in flight)."""
        now = utcnow()
        queue = self._queue(conn, row.queue)
        own = timewindows.parse_windows(row.windows)
        own_tz = timewindows.zone(row.window_tz)
        schedule: dict[str, Any] = {
            "weight": row.weight,
            "item_timeout": row.item_timeout,
            "windows": row.windows,
            "timezone": row.window_tz or "UTC",
            "queue": queue.describe(now, self._slots_in_use(conn, row.queue)),
        }
        opens = timewindows.next_dispatch(((own, own_tz), (queue.parsed, queue.zone)), now)
        schedule["window_open"] = opens == now
        schedule["next_window_opens_at"] = None if opens in (now, None) else iso(opens)
        if opens is None:
            schedule["windows_never_overlap"] = True  # the partition's and the queue's
        if row.deadline is not None:
            schedule["deadline"] = iso(row.deadline)
        if row.partition_limit is not None:
            schedule["partition_limit"] = row.partition_limit
        reported = conn.execute(
            select(I.gate, func.count(I.progress), func.avg(I.progress))
            .where(I.partition_id == row.id, I.status == IS_AVAILABLE, I.progress.is_not(None))
            .group_by(I.gate)
        ).all()
        in_flight = {gate: (n, float(mean)) for gate, n, mean in reported}
        per_gate, done_all, total_all = {}, 0, 0
        for gate, by_status in counts.items():  # the per-gate counts `status` read already
            total = sum(by_status.values())
            done = by_status.get(COMPLETE, 0) + by_status.get(CANCELLED, 0)  # a failed item is not done
            n, mean = in_flight.get(int(gate), (0, None))
            per_gate[gate] = {"done": done, "total": total, "in_flight": n, "mean_progress": mean}
            done_all, total_all = done_all + done, total_all + total
        return {"schedule": schedule, "progress": {"done": done_all, "total": total_all, "gates": per_gate}}


def stored_operations(text: str | None) -> tuple[tuple[str, str], ...]:
    """A queue's stored accumulate declaration (JSON) as sorted pairs; () when there is none, or
    when it cannot be read (written by hand): answers carrying accumulate numbers are then refused
    as undeclared, which says what to declare."""
    if not text:
        return ()
    try:
        return tuple(sorted(check_operations(json.loads(text)).items()))
    except ValueError:
        return ()


def started_of(report: ProgressReport, *, naive: bool = False) -> datetime | None:
    """When a report's delivery started (UTC), if it says."""
    if report.started_us is None:
        return None
    started = datetime.fromtimestamp(report.started_us / 1e6, UTC)
    return started.replace(tzinfo=None) if naive else started
