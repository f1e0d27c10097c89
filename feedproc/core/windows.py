"""Time windows of the day in which a queue's or a partition's items may be dispatched.

Pure functions. A window is `HH:MM-HH:MM` in a time zone (UTC unless named, e.g. `Europe/Paris`);
one that ends before it starts spans midnight (`22:00-06:00`), `24:00` is the end of the day, and a
spec may list several (`09:00-12:00,14:00-17:00`). A window includes its start and excludes its end.
Local wall-clock times are used, so a window keeps its hours across daylight-saving changes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .errors import InvalidInput

_WINDOW = re.compile(r"^(\d{1,2}):(\d{2})-(\d{1,2}):(\d{2})$")
DAY = 24 * 60


@dataclass(frozen=True, slots=True)
class Window:
    """Minutes of the day: open from `start` (inclusive) to `end` (exclusive); wraps midnight if end <= start."""

    start: int
    end: int

    def contains(self, minute: float) -> bool:
        if self.start < self.end:
            return self.start <= minute < self.end
        return minute >= self.start or minute < self.end

    def __str__(self) -> str:
        return f"{self.start // 60:02d}:{self.start % 60:02d}-{self.end // 60:02d}:{self.end % 60:02d}"


def parse_windows(spec: str | Iterable[str] | None) -> tuple[Window, ...]:
    """`"22:00-06:00"`, `"09:00-12:00,14:00-17:00"` or a list of such; empty / None: no windows."""
    if spec is None:
        return ()
    parts = spec.split(",") if isinstance(spec, str) else [p for s in spec for p in s.split(",")]
    windows = []
    for part in (p.strip() for p in parts):
        if not part:
            continue
        match = _WINDOW.match(part)
        if not match:
            raise InvalidInput(f"window {part!r}: expected HH:MM-HH:MM, e.g. 22:00-06:00")
        h1, m1, h2, m2 = map(int, match.groups())
        if h1 > 23 or m1 > 59 or m2 > 59 or h2 > 24 or (h2 == 24 and m2):
            raise InvalidInput(f"window {part!r}: not a time of day")
        start, end = h1 * 60 + m1, h2 * 60 + m2
        if start == end % DAY and end != DAY:
            raise InvalidInput(f"window {part!r} is empty: start and end are the same time")
        windows.append(Window(start, end))
    return tuple(windows)


def format_windows(windows: Iterable[Window]) -> str | None:
    """The stored form of windows (None when there are none)."""
    text = ",".join(str(w) for w in windows)
    return text or None


def zone(name: str | None) -> tzinfo:
    """The time zone called `name` (None or "UTC": UTC); InvalidInput if unknown."""
    if name is None or name.upper() in ("UTC", "Z"):
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput(f"unknown time zone {name!r}: use an IANA name like Europe/Paris") from None


def is_open(windows: Iterable[Window], tz: tzinfo, at: datetime) -> bool:
    """True when `at` falls in one of `windows` (local time in `tz`); no windows means always open."""
    windows = tuple(windows)
    if not windows:
        return True
    local = at.astimezone(tz)
    minute = local.hour * 60 + local.minute + local.second / 60 + local.microsecond / 60e6
    return any(w.contains(minute) for w in windows)


def next_opening(windows: Iterable[Window], tz: tzinfo, at: datetime) -> datetime:
    """When dispatch may next start: `at` itself if a window is open, else the next window start (UTC)."""
    windows = tuple(windows)
    if is_open(windows, tz, at):
        return at
    local = at.astimezone(tz)
    candidates = []
    for days in range(3):
        day = (local + timedelta(days=days)).date()
        for w in windows:
            start = datetime(day.year, day.month, day.day, w.start // 60, w.start % 60, tzinfo=tz)
            if start > at:
                candidates.append(start.astimezone(UTC))
    return min(candidates)


def next_closing(windows: Iterable[Window], tz: tzinfo, at: datetime) -> datetime | None:
    """When the window open at `at` closes (UTC); None when none is open or there are no windows."""
    windows = tuple(windows)
    if not windows or not is_open(windows, tz, at):
        return None
    step, probe = timedelta(minutes=1), at.replace(second=0, microsecond=0) + timedelta(minutes=1)
    for _ in range(2 * DAY):  # minute resolution: windows are whole minutes
        if not is_open(windows, tz, probe):
            return probe.astimezone(UTC)
        probe += step
    return None  # windows cover the whole day


def next_dispatch(schedules: Iterable[tuple[Iterable[Window], tzinfo]], at: datetime) -> datetime | None:
    """The first moment from `at` when every (windows, zone) schedule is open at once: `at` itself
    if they all are now; None when they do not overlap within a week. Schedules without windows are
    always open."""
    pairs = [(tuple(w), z) for w, z in schedules]
    pairs = [(w, z) for w, z in pairs if w]
    moment, horizon = at, at + timedelta(days=8)
    while moment <= horizon:
        later = max((next_opening(w, z, moment) for w, z in pairs), default=moment)
        if later == moment:
            return moment
        moment = later
    return None
