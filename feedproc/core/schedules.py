"""Schedules' ticks: which tick of a cron expression is due, the next ones, and a tick's partition key.

croniter reads the expressions (five fields, or six with seconds last; `@daily` and the like) and
walks them in the schedule's time zone, so `0 2 * * *` in Europe/Berlin is 02:00 there in summer
and winter. Every moment here is an aware datetime; what is due is decided against a `now` the
caller gives (the database's clock in the watcher, any clock in a test).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

from croniter import CroniterError, croniter

from . import windows as timewindows
from .models import check_key


def check_cron(expression: Any) -> str:
    """Return `expression` if croniter reads it and it ever ticks (not `0 0 30 2 *`), else raise ValueError."""
    if not isinstance(expression, str) or not croniter.is_valid(expression):
        raise ValueError(
            f"cron {expression!r} is not a cron expression (five fields like '0 2 * * *', or six with seconds last)"
        )
    try:
        croniter(expression, datetime(2026, 1, 1, tzinfo=UTC)).get_next(datetime)
    except CroniterError:
        raise ValueError(f"cron {expression!r} never ticks") from None
    return expression


def due_tick(expression: str, timezone_name: str, after: datetime, now: datetime) -> datetime | None:
    """The latest tick in (after, now], in UTC, or None: ticks missed while no watcher ran come due
    as one (the latest), never one per tick missed. As cron does, a tick whose time of day comes
    again when the clocks go back (02:30 twice in Berlin's last October night) comes due once."""
    zone = timewindows.zone(timezone_name)
    latest = croniter(expression, (now + timedelta(microseconds=1)).astimezone(zone)).get_prev(datetime)
    if latest.astimezone(UTC) <= after or _wall(latest, zone) <= _wall(after, zone):
        return None
    return latest.astimezone(UTC)


def next_ticks(expression: str, timezone_name: str, after: datetime, count: int = 1) -> list[datetime]:
    """The next `count` ticks after `after`, in UTC (a time of day repeated when the clocks go back, once)."""
    zone = timewindows.zone(timezone_name)
    walk = croniter(expression, after.astimezone(zone))
    ticks: list[datetime] = []
    last = _wall(after, zone)
    while len(ticks) < count:
        tick = walk.get_next(datetime)
        if _wall(tick, zone) > last:
            ticks.append(tick.astimezone(UTC))
            last = _wall(tick, zone)
    return ticks


def _wall(moment: datetime, zone: tzinfo) -> datetime:
    """`moment` as the time on a wall clock in `zone` (naive)."""
    return moment.astimezone(zone).replace(tzinfo=None)


def render_key(template: str, *, timezone_name: str = "UTC", at: datetime | None = None) -> str:
    """The partition key of the tick `at` (a sample moment when None): the template formatted with
    `date` (the tick in the schedule's zone); ValueError when the result is not a valid key."""
    when = (at or datetime(2026, 1, 31, 23, 59, 58, tzinfo=UTC)).astimezone(timewindows.zone(timezone_name))
    try:
        key = template.format(date=when)
    except (KeyError, IndexError, ValueError, AttributeError) as error:
        raise ValueError(f"key template {template!r} cannot be formatted: {error!r}") from None
    try:
        return check_key(key)
    except ValueError as error:
        raise ValueError(f"key template {template!r} makes {error}") from None
