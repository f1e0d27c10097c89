"""How feedproc shows a moment, everywhere (the command line, the API, the dashboard's data):
ISO 8601 in UTC, to the millisecond, with `Z` — `2026-11-27T22:00:00.000Z`."""

from __future__ import annotations

from datetime import UTC, datetime


def iso(value: datetime | None) -> str | None:
    """`value` as feedproc shows it: ISO 8601, milliseconds, UTC as `Z` (None stays None)."""
    if value is None:
        return None
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    return value.isoformat(timespec="milliseconds").replace("+00:00", "Z")
