"""Time windows of the day (feedproc/windows.py): parsing, whether a moment is inside, when the next
window opens. Pure functions, checked with fixed datetimes and with hypothesis."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from feedproc.core.errors import InvalidInput
from feedproc.core.windows import (
    Window,
    format_windows,
    is_open,
    next_closing,
    next_dispatch,
    next_opening,
    parse_windows,
    zone,
)

PARIS = ZoneInfo("Europe/Paris")


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def test_parse_reads_several_windows_and_formats_them_back() -> None:
    windows = parse_windows("22:00-06:00, 9:30-12:00")
    assert windows == (Window(22 * 60, 6 * 60), Window(9 * 60 + 30, 12 * 60))
    assert format_windows(windows) == "22:00-06:00,09:30-12:00"


def test_parse_accepts_a_list_and_24_00_as_the_end_of_the_day() -> None:
    assert parse_windows(["08:00-24:00"]) == (Window(8 * 60, 24 * 60),)
    assert parse_windows(None) == () and format_windows(()) is None


@pytest.mark.parametrize("bad", ["22-06", "25:00-06:00", "10:60-11:00", "10:00-10:00", "nine-ten", "10:00-24:30"])
def test_parse_rejects_malformed_or_empty_windows(bad: str) -> None:
    with pytest.raises(InvalidInput, match="window"):
        parse_windows(bad)


def test_unknown_time_zone_is_invalid_input_and_utc_is_the_default() -> None:
    assert zone(None) is UTC and zone("UTC") is UTC
    with pytest.raises(InvalidInput, match="time zone"):
        zone("Mars/Olympus")


def test_a_window_includes_its_start_and_excludes_its_end() -> None:
    windows = parse_windows("09:00-17:00")
    assert is_open(windows, UTC, at("2026-03-02 09:00"))
    assert is_open(windows, UTC, at("2026-03-02 16:59:59"))
    assert not is_open(windows, UTC, at("2026-03-02 17:00"))
    assert not is_open(windows, UTC, at("2026-03-02 08:59"))


def test_a_window_ending_before_it_starts_spans_midnight() -> None:
    night = parse_windows("22:00-06:00")
    assert is_open(night, UTC, at("2026-03-02 23:30"))
    assert is_open(night, UTC, at("2026-03-03 05:59"))
    assert not is_open(night, UTC, at("2026-03-03 12:00"))


def test_no_windows_means_always_open() -> None:
    assert is_open((), UTC, at("2026-03-02 03:00"))
    assert next_opening((), UTC, at("2026-03-02 03:00")) == at("2026-03-02 03:00")


def test_windows_are_local_time_in_their_zone() -> None:
    office = parse_windows("09:00-17:00")
    assert is_open(office, PARIS, at("2026-01-15 08:30"))  # 09:30 in Paris (UTC+1)
    assert not is_open(office, PARIS, at("2026-07-15 15:30"))  # 17:30 in Paris (UTC+2)


def test_next_opening_is_later_today_or_tomorrow() -> None:
    night = parse_windows("22:00-06:00")
    assert next_opening(night, UTC, at("2026-03-02 12:00")) == at("2026-03-02 22:00")
    office = parse_windows("09:00-17:00")
    assert next_opening(office, UTC, at("2026-03-02 18:00")) == at("2026-03-03 09:00")


def test_next_opening_follows_daylight_saving_time_in_a_named_zone() -> None:
    office = parse_windows("09:00-17:00")
    # Paris moves to summer time on 2026-03-29: 09:00 local is 08:00 UTC the day before, 07:00 after.
    assert next_opening(office, PARIS, at("2026-03-28 18:00")) == at("2026-03-29 07:00")
    assert next_opening(office, PARIS, at("2026-03-27 18:00")) == at("2026-03-28 08:00")


def test_next_closing_of_an_open_window() -> None:
    office = parse_windows("09:00-17:00")
    assert next_closing(office, UTC, at("2026-03-02 10:15")) == at("2026-03-02 17:00")
    assert next_closing(office, UTC, at("2026-03-02 18:00")) is None


def test_next_dispatch_waits_for_the_queue_and_the_partition_windows_to_overlap() -> None:
    queue = (parse_windows("08:00-12:00"), UTC)
    partition = (parse_windows("11:00-20:00"), UTC)
    assert next_dispatch([queue, partition], at("2026-03-02 07:00")) == at("2026-03-02 11:00")
    assert next_dispatch([queue, partition], at("2026-03-02 11:30")) == at("2026-03-02 11:30")
    assert next_dispatch([queue, ((), UTC)], at("2026-03-02 13:00")) == at("2026-03-03 08:00")


def test_next_dispatch_is_none_when_the_windows_never_overlap() -> None:
    nights, days = (parse_windows("22:00-06:00"), UTC), (parse_windows("09:00-17:00"), PARIS)
    assert next_dispatch([nights, days], at("2026-03-02 12:00")) is None


minutes = st.integers(min_value=0, max_value=24 * 60 - 1)
moments = st.datetimes(min_value=datetime(2020, 1, 1), max_value=datetime(2035, 1, 1), timezones=st.just(UTC))


@st.composite
def window_sets(draw: st.DrawFn) -> tuple[Window, ...]:
    pairs = draw(st.lists(st.tuples(minutes, minutes).filter(lambda p: p[0] != p[1]), min_size=1, max_size=3))
    return tuple(Window(a, b) for a, b in pairs)


@given(window_sets(), moments, st.sampled_from([UTC, PARIS, ZoneInfo("America/New_York")]))
def test_next_opening_is_open_not_earlier_and_nothing_opens_in_between(
    windows: tuple[Window, ...], moment: datetime, tz: tzinfo
) -> None:
    opening = next_opening(windows, tz, moment)
    assert opening >= moment
    assert is_open(windows, tz, opening) or opening.astimezone(tz).utcoffset() != moment.astimezone(tz).utcoffset()
    if is_open(windows, tz, moment):
        assert opening == moment
    else:  # closed all the way to the opening (checked a minute at a time)
        probe = moment + timedelta(minutes=1)
        while probe < opening - timedelta(minutes=1):
            assert not is_open(windows, tz, probe) or probe.astimezone(tz).dst() != moment.astimezone(tz).dst()
            probe += timedelta(minutes=17)
