"""Schedules' ticks and keys (feedproc/core/schedules.py) and a pipeline's [[schedule]] tables
(feedproc/core/pipelines.py): which tick is due, the next ones, daylight saving time, six-field
crons with seconds last, and the errors an operator gets for a bad cron or key template. Pure
functions, checked with fixed moments."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from feedproc.core.errors import InvalidInput
from feedproc.core.models import NewItem
from feedproc.core.pipelines import parse_toml
from feedproc.core.schedules import check_cron, due_tick, next_ticks, render_key

BERLIN = "Europe/Berlin"
HOURLY = "0 * * * *"


def at(text: str) -> datetime:
    """A moment in UTC from `YYYY-MM-DD HH:MM[:SS[.ffffff]]`."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def pipeline(schedule: str) -> str:
    """A pipeline's TOML with two gates (list, ocr) and one [[schedule]] table of `schedule`'s lines."""
    return f"""
queue = "uploads"

[[gate]]
name = "list"
number = 0

[[gate]]
name = "ocr"
number = 1

[[schedule]]
name = "nightly"
{schedule}
"""


# ---------------------------------------------------------------- due_tick


def test_due_tick_is_the_tick_between_the_last_one_and_now() -> None:
    assert due_tick(HOURLY, "UTC", at("2026-05-01 09:00"), at("2026-05-01 10:20")) == at("2026-05-01 10:00")


def test_due_tick_after_missed_ticks_is_only_the_latest() -> None:
    assert due_tick(HOURLY, "UTC", at("2026-05-01 04:00"), at("2026-05-01 10:20")) == at("2026-05-01 10:00")


def test_no_tick_is_due_before_the_next_one_comes() -> None:
    assert due_tick(HOURLY, "UTC", at("2026-05-01 10:00"), at("2026-05-01 10:59:59.999999")) is None


def test_the_tick_already_fired_is_not_due_again() -> None:
    assert due_tick(HOURLY, "UTC", at("2026-05-01 10:00"), at("2026-05-01 10:00")) is None


def test_a_tick_is_due_at_its_exact_moment() -> None:
    assert due_tick(HOURLY, "UTC", at("2026-05-01 09:00"), at("2026-05-01 10:00")) == at("2026-05-01 10:00")


def test_due_tick_is_in_utc_whatever_the_schedules_zone() -> None:
    tick = due_tick("0 2 * * *", BERLIN, at("2026-01-10 00:00"), at("2026-01-10 12:00"))
    assert tick == at("2026-01-10 01:00") and tick.tzinfo is UTC  # 02:00 in Berlin in winter (UTC+1)


# ---------------------------------------------------------------- next_ticks


def test_next_ticks_are_the_coming_ticks_in_order_strictly_after() -> None:
    assert next_ticks(HOURLY, "UTC", at("2026-05-01 10:00"), 3) == [
        at("2026-05-01 11:00"),
        at("2026-05-01 12:00"),
        at("2026-05-01 13:00"),
    ]


def test_a_local_time_follows_the_zones_offset_through_the_year() -> None:
    assert next_ticks("0 2 * * *", BERLIN, at("2026-01-10 12:00"))[0] == at("2026-01-11 01:00")  # CET, UTC+1
    assert next_ticks("0 2 * * *", BERLIN, at("2026-07-10 12:00"))[0] == at("2026-07-11 00:00")  # CEST, UTC+2


# ---------------------------------------------------------------- daylight saving time


def test_a_tick_in_the_hour_skipped_in_spring_comes_once_when_the_clock_jumps() -> None:
    # 2026-03-29 in Berlin: 02:00 CET becomes 03:00 CEST (01:00 UTC); 02:30 does not exist that day
    ticks = next_ticks("30 2 * * *", BERLIN, at("2026-03-28 12:00"), 3)
    assert ticks == [at("2026-03-29 01:00"), at("2026-03-30 00:30"), at("2026-03-31 00:30")]


def test_the_skipped_tick_is_due_once_on_the_spring_forward_day() -> None:
    assert due_tick("30 2 * * *", BERLIN, at("2026-03-28 01:30"), at("2026-03-29 05:00")) == at("2026-03-29 01:00")
    assert due_tick("30 2 * * *", BERLIN, at("2026-03-29 01:00"), at("2026-03-29 23:00")) is None


def test_a_daily_tick_in_the_hour_repeated_in_autumn_comes_once() -> None:
    # 2026-10-25 in Berlin: 03:00 CEST becomes 02:00 CET; 02:30 happens twice
    ticks = next_ticks("30 2 * * *", BERLIN, at("2026-10-24 12:00"), 2)
    assert ticks == [at("2026-10-25 00:30"), at("2026-10-26 01:30")]


def test_the_repeated_hour_does_not_make_a_fired_tick_due_again() -> None:
    first = at("2026-10-25 00:30")  # 02:30 CEST, fired
    assert due_tick("30 2 * * *", BERLIN, first, at("2026-10-25 01:45")) is None  # 02:30 CET came and went


def test_a_cron_that_never_ticks_is_refused() -> None:
    with pytest.raises(ValueError, match="never ticks"):
        check_cron("0 0 30 2 *")


# ---------------------------------------------------------------- six fields: seconds last


def test_a_sixth_field_is_the_seconds() -> None:
    assert next_ticks("* * * * * */2", "UTC", at("2026-05-01 10:00:00"), 3) == [
        at("2026-05-01 10:00:02"),
        at("2026-05-01 10:00:04"),
        at("2026-05-01 10:00:06"),
    ]


def test_a_seconds_cron_is_due_at_the_latest_second_that_matches() -> None:
    tick = due_tick("* * * * * */2", "UTC", at("2026-05-01 10:00:00"), at("2026-05-01 10:00:05.500"))
    assert tick == at("2026-05-01 10:00:04")


# ---------------------------------------------------------------- check_cron


@pytest.mark.parametrize("expression", ["0 2 * * *", "@daily", "*/15 9-17 * * mon-fri", "* * * * * */2"])
def test_check_cron_returns_an_expression_it_reads(expression: str) -> None:
    assert check_cron(expression) == expression


@pytest.mark.parametrize("expression", ["0 2 * *", "61 * * * *", "0 25 * * *", "", "every day", None, 5])
def test_check_cron_refuses_what_is_not_a_cron_expression(expression: object) -> None:
    with pytest.raises(ValueError, match="is not a cron expression"):
        check_cron(expression)


# ---------------------------------------------------------------- render_key


def test_a_key_is_the_template_formatted_with_the_tick_in_the_schedules_zone() -> None:
    # 23:30 UTC on January 31st is already February 1st in Berlin
    assert render_key("nightly-{date:%Y%m%d}", timezone_name=BERLIN, at=at("2026-01-31 23:30")) == "nightly-20260201"
    assert render_key("nightly-{date:%Y%m%d}", at=at("2026-01-31 23:30")) == "nightly-20260131"


def test_a_template_with_an_unknown_field_cannot_be_formatted() -> None:
    with pytest.raises(ValueError, match="cannot be formatted"):
        render_key("nightly-{date:%Y}-{shift}")


def test_a_template_that_makes_an_invalid_key_is_refused() -> None:
    with pytest.raises(ValueError, match="makes invalid partition key"):
        render_key("nightly {date:%Y%m%d}")


# ---------------------------------------------------------------- [[schedule]] in a pipeline


def test_a_schedule_is_read_with_its_items_gates_resolved_by_name() -> None:
    spec = parse_toml(
        pipeline(
            'cron = "0 2 * * *"\ntimezone = "Europe/Berlin"\nkey = "nightly-{date:%Y%m%d}"\n'
            'priority = 5\nitems = [{gate = "ocr", data = {folder = "/in"}}]'
        )
    )
    (schedule,) = spec.schedules
    assert (schedule.name, schedule.cron, schedule.timezone, schedule.key, schedule.priority) == (
        "nightly",
        "0 2 * * *",
        BERLIN,
        "nightly-{date:%Y%m%d}",
        5,
    )
    assert schedule.items == (NewItem(1, b'{"folder":"/in"}'),)


def test_a_schedules_zone_is_utc_unless_it_names_one() -> None:
    (schedule,) = parse_toml(pipeline('cron = "0 2 * * *"\nkey = "n-{date:%Y%m%d}"')).schedules
    assert schedule.timezone == "UTC"


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        ('cron = "0 2 * *"\nkey = "n-{date:%Y%m%d}"', "is not a cron expression"),
        ('key = "n-{date:%Y%m%d}"', "is not a cron expression"),
        ('cron = "0 2 * * *"\nkey = "nightly"', "key must be a template with {date"),
        ('cron = "0 2 * * *"\nkey = "n-{date:%Y}-{shift}"', "cannot be formatted"),
        ('cron = "0 2 * * *"\nkey = "n {date:%Y%m%d}"', "makes invalid partition key"),
        ('cron = "0 2 * * *"\nkey = "n-{date:%Y%m%d}"\ntimezone = "Mars/Base"', "unknown time zone"),
        ('cron = "0 2 * * *"\nkey = "n-{date:%Y%m%d}"\nitems = [{gate = "nope"}]', "unknown gate 'nope'"),
    ],
)
def test_a_bad_schedule_is_refused_naming_the_schedule(lines: str, problem: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_toml(pipeline(lines))
    assert str(refused.value).startswith("pipeline: schedule 'nightly': ")
    assert problem in str(refused.value)


def test_a_schedule_with_an_unknown_key_is_refused_naming_its_place() -> None:
    with pytest.raises(InvalidInput, match=r"^pipeline: schedule 1: unknown key\(s\) every$"):
        parse_toml(pipeline('cron = "0 2 * * *"\nkey = "n-{date:%Y%m%d}"\nevery = "day"'))


def test_two_schedules_of_one_name_are_refused() -> None:
    text = pipeline('cron = "0 2 * * *"\nkey = "a-{date:%Y%m%d}"')
    text += '\n[[schedule]]\nname = "nightly"\ncron = "0 3 * * *"\nkey = "b-{date:%Y%m%d}"\n'
    with pytest.raises(InvalidInput, match="two schedules have the same name"):
        parse_toml(text)
