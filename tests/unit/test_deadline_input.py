"""How a deadline is given at the command line (no database): a duration from now or a time."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from feedproc.cli.app import parse_deadline
from feedproc.core.errors import InvalidInput


@pytest.mark.parametrize(("given", "seconds"), [("10m", 600.0), ("90", 90.0), ("1.5h", 5400.0)])
def test_a_deadline_duration_is_seconds_from_now(given: str, seconds: float) -> None:
    assert parse_deadline(given) == seconds


def test_a_deadline_time_without_a_zone_is_utc() -> None:
    assert parse_deadline("2030-01-02T03:04:05") == datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize("given", ["soon", "0", "-5m", "2030-13-01"])
def test_a_deadline_that_is_neither_is_refused(given: str) -> None:
    with pytest.raises(InvalidInput, match="--deadline"):
        parse_deadline(given)
