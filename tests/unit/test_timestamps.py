"""How a moment is shown (no database): ISO 8601 in UTC, milliseconds, `Z`, by one formatter that
every read uses, queues' included."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from feedproc.core.records import QueueSettings
from feedproc.core.timestamps import iso


def test_a_utc_moment_is_shown_to_the_millisecond_with_z() -> None:
    assert iso(datetime(2026, 11, 27, 22, 0, 0, 123456, tzinfo=UTC)) == "2026-11-27T22:00:00.123Z"


def test_a_moment_in_another_zone_is_shown_in_utc() -> None:
    paris = timezone(timedelta(hours=1))
    assert iso(datetime(2026, 11, 27, 23, 0, tzinfo=paris)) == "2026-11-27T22:00:00.000Z"


def test_a_queues_pause_and_next_window_are_shown_with_z() -> None:
    now = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
    queue = QueueSettings("q", windows="22:00-06:00", paused=True, paused_at=now - timedelta(minutes=5))
    shown = queue.describe(now)
    assert shown["paused_at"] == "2026-11-27T11:55:00.000Z"
    assert shown["next_window_opens_at"] == "2026-11-27T22:00:00.000Z"
