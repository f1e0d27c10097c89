"""Schedules: the partitions a queue's pipeline starts at its schedules' ticks (`core.schedules`).

Any number of watchers call `fire_schedules` every poll interval; each tick's partition is made
once. A schedule's row (`feedproc_schedules`, kept by `pipelines.py`) is locked while its tick is
fired (`FOR UPDATE`; SQLite's write transaction serialises anyway), and the partition is created
and the row's `last_tick` moved in that one transaction, so a second watcher that waited for the
lock finds the tick taken. Only the latest tick since `last_tick` is due: a queue nobody watched
for three ticks gets one partition when a watcher comes back, not three. The clock is the
database's (one clock for every host), unless a caller gives one (tests, `schedule list`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.engine import Connection

from ..core.errors import DatabaseRefused, InvalidInput
from ..core.models import check_queue
from ..core.pipelines import PipelineSpec, ScheduleSpec
from .base import P, iso
from .foundations import db_now
from .pipelines import Pipelines
from .producing import Producing
from .schema import pipelines, schedules

SC, PL = schedules.c, pipelines.c

#: Next ticks `schedule_list` shows per schedule at most.
MAX_TICKS_SHOWN = 1000


class Scheduling(Producing, Pipelines):
    """Firing schedules' ticks, and showing what they will do next."""

    def fire_schedules(self, queue: str, now: datetime | None = None) -> list[str]:
        """Create the partition of every schedule of `queue`'s pipeline whose tick is due at `now`
        (an aware time; naive is read as UTC; None: the database's clock): each schedule in its own
        transaction, its row locked, the partition created (unless its key exists already) and the
        tick recorded together. Returns the keys created."""
        from ..core.schedules import due_tick

        check_queue(queue)
        now = _aware(now)
        with self.read() as conn:  # which schedules look due: a write transaction only for those
            spec = self._pipeline(conn, queue)
            if spec is None or not spec.schedules:
                return []
            seen = now if now is not None else _db_clock(conn)
            rows = conn.execute(select(SC.name, SC.last_tick).where(SC.queue == queue)).all()
        last = {row.name: row.last_tick for row in rows}
        created = []
        for schedule in spec.schedules:
            after = last.get(schedule.name)
            if after is None or due_tick(schedule.cron, schedule.timezone, after, seen) is None:
                continue
            try:
                key = self._fire(queue, schedule.name, now)
            except DatabaseRefused as error:
                if not error.unique:
                    raise
                key = self._fire(queue, schedule.name, now)  # a producer made that key as we did: skipped now
            if key is not None:
                created.append(key)
        return created

    def _fire(self, queue: str, name: str, now: datetime | None) -> str | None:
        """Fire schedule `name` of `queue` if its tick is due, in one transaction; the key created."""
        from ..core.schedules import due_tick

        with self.write() as conn:
            row = conn.execute(
                select(SC.last_tick).where(SC.queue == queue, SC.name == name).with_for_update()
            ).one_or_none()
            if row is None:  # the schedule was removed meanwhile
                return None
            spec = self._pipeline(conn, queue)  # as it is now, under the lock
            schedule = _schedule_of(spec, name)
            if schedule is None:
                return None
            tick = due_tick(schedule.cron, schedule.timezone, row.last_tick, now or _db_clock(conn))
            if tick is None:  # another watcher fired it first
                return None
            key = _key(queue, schedule, tick)
            exists = conn.execute(select(P.id).where(P.key == key)).first() is not None
            if not exists:
                self._create_partition(
                    conn,
                    key,
                    schedule.items,
                    queue=queue,
                    priority=schedule.priority,
                    source="schedule",
                    detail={"schedule": name, "tick": iso(tick)},
                )
            conn.execute(
                update(schedules).where(SC.queue == queue, SC.name == name).values(last_tick=tick, last_key=key)
            )
            return None if exists else key

    def schedule_list(
        self, queue: str | None = None, now: datetime | None = None, count: int = 3
    ) -> list[dict[str, Any]]:
        """Every schedule of every stored pipeline (or of `queue`'s), by queue and then as the
        pipeline lists them: its cron, zone, key template, priority, number of items, last tick and
        key, the next `count` ticks after `now` (None: the database's clock) and the key of the next."""
        from ..core.schedules import next_ticks

        if queue is not None:
            check_queue(queue)
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_TICKS_SHOWN:
            raise InvalidInput(f"count must be an integer from 0 to {MAX_TICKS_SHOWN}, got {count!r}")
        now = _aware(now)
        with self.read() as conn:
            queues = [queue] if queue is not None else list(conn.execute(select(PL.queue).order_by(PL.queue)).scalars())
            specs = [spec for spec in (self._pipeline(conn, q) for q in queues) if spec is not None]
            rows = conn.execute(select(SC.queue, SC.name, SC.last_tick, SC.last_key)).all()
            seen = now if now is not None else _db_clock(conn)
        state = {(row.queue, row.name): row for row in rows}
        out = []
        for spec in specs:
            for schedule in spec.schedules:
                row = state.get((spec.queue, schedule.name))
                last_tick = row.last_tick if row is not None else None
                ticks = next_ticks(schedule.cron, schedule.timezone, max(seen, last_tick or seen), max(count, 1))
                out.append(
                    {
                        "queue": spec.queue,
                        "name": schedule.name,
                        "cron": schedule.cron,
                        "timezone": schedule.timezone,
                        "key": schedule.key,
                        "priority": schedule.priority,
                        "items": len(schedule.items),
                        "last_tick": iso(last_tick),
                        "last_key": row.last_key if row is not None else None,
                        "next_ticks": [iso(tick) for tick in ticks[:count]],
                        "next_key": _key(spec.queue, schedule, ticks[0]),
                    }
                )
        return out


def _aware(now: datetime | None) -> datetime | None:
    if now is None or now.tzinfo is not None:
        return now
    return now.replace(tzinfo=UTC)


def _db_clock(conn: Connection) -> datetime:
    """The database server's current time (UTC)."""
    now: datetime = conn.execute(select(db_now())).scalar_one()
    return now


def _schedule_of(spec: PipelineSpec | None, name: str) -> ScheduleSpec | None:
    if spec is None:
        return None
    return next((schedule for schedule in spec.schedules if schedule.name == name), None)


def _key(queue: str, schedule: ScheduleSpec, tick: datetime) -> str:
    """The partition key of `schedule`'s `tick`; InvalidInput naming the schedule when its template
    makes no valid key at that moment (it was checked at one moment only, when it was applied)."""
    from ..core.schedules import render_key

    try:
        return render_key(schedule.key, timezone_name=schedule.timezone, at=tick)
    except ValueError as error:
        raise InvalidInput(f"queue {queue!r}: schedule {schedule.name!r}: {error}") from None


__all__ = ["MAX_TICKS_SHOWN", "Scheduling"]
