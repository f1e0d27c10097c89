"""`feedproc schedule list` run as a real `python -m feedproc` process: every stored pipeline's
schedules (or one queue's) with their next ticks and the key of the next, as text or JSON; a
malformed queue or count is exit 2 with one line on stderr. Pipelines are applied in-process
through `Feed`; the command under test always runs as its own process."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime

import pytest

from feedproc import Feed
from feedproc.core.pipelines import PipelineSpec, parse_toml
from feedproc.core.schedules import next_ticks, render_key

from ..support import run_cli

# Input refused before any database access behaves the same on every database: SQLite only.
before_any_database_access = pytest.mark.sqlite_only


def spec(queue: str, *schedule_tables: str) -> PipelineSpec:
    text = f'queue = "{queue}"\n[[gate]]\nname = "fetch"\nnumber = 0\n'
    return parse_toml(text + "".join(f"\n[[schedule]]\n{table}\n" for table in schedule_tables))


NIGHTLY = 'name = "nightly"\ncron = "0 2 * * *"\ntimezone = "Europe/Berlin"\nkey = "nightly-{date:%Y%m%d}"'
HOURLY = 'name = "hourly"\ncron = "0 * * * *"\nkey = "hourly-{date:%Y%m%d%H}"\nitems = [{gate = "fetch"}]'


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    return result.stdout


def assert_error(result: subprocess.CompletedProcess[str], code: int, fragment: str) -> None:
    assert result.returncode == code, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment.lower() in lines[0].lower(), result.stderr
    assert not result.stdout.strip()


def moment(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def test_list_json_shows_each_schedules_next_ticks_and_next_key(db_url: str, feed: Feed) -> None:
    feed.apply_pipeline(spec("reports", NIGHTLY))
    before = datetime.now(UTC)
    (row,) = json.loads(ok(run_cli(db_url, "schedule", "list", "reports", "--json")))
    assert {k: row[k] for k in ("queue", "name", "cron", "timezone", "key", "items", "last_key")} == {
        "queue": "reports",
        "name": "nightly",
        "cron": "0 2 * * *",
        "timezone": "Europe/Berlin",
        "key": "nightly-{date:%Y%m%d}",
        "items": 0,
        "last_key": None,
    }
    ticks = [moment(tick) for tick in row["next_ticks"]]
    assert len(ticks) == 3 and before < ticks[0] < ticks[1] < ticks[2]
    assert ticks[1:] == next_ticks("0 2 * * *", "Europe/Berlin", ticks[0], 2)  # consecutive ticks of the cron
    assert row["next_key"] == render_key("nightly-{date:%Y%m%d}", timezone_name="Europe/Berlin", at=ticks[0])


def test_list_text_is_one_line_per_schedule_with_its_next_ticks_and_key(db_url: str, feed: Feed) -> None:
    feed.apply_pipeline(spec("reports", NIGHTLY, HOURLY))
    rows = feed.schedules("reports")
    lines = ok(run_cli(db_url, "schedule", "list", "reports")).splitlines()
    assert len(lines) == 2
    for line, row in zip(lines, rows, strict=True):
        assert line.startswith(f"reports {row.name}: cron '{row.cron}' {row.timezone}, next ")
        assert line.endswith(f"(key {row.next_key})")
        assert line.count("Z") == 3  # three ticks, in UTC


@pytest.mark.sqlite_only
def test_list_without_a_queue_shows_every_pipelines_schedules(db_url: str, feed: Feed) -> None:
    feed.apply_pipeline(spec("reports", HOURLY))
    feed.apply_pipeline(spec("archive", NIGHTLY))
    rows = json.loads(ok(run_cli(db_url, "schedule", "list", "--json")))
    assert [(row["queue"], row["name"]) for row in rows] == [("archive", "nightly"), ("reports", "hourly")]


@pytest.mark.sqlite_only
def test_count_sets_how_many_next_ticks_are_shown(db_url: str, feed: Feed) -> None:
    feed.apply_pipeline(spec("reports", HOURLY))
    (row,) = json.loads(ok(run_cli(db_url, "schedule", "list", "reports", "--count", "5", "--json")))
    assert len(row["next_ticks"]) == 5


@pytest.mark.sqlite_only
def test_a_queue_without_schedules_lists_none(db_url: str, feed: Feed) -> None:
    assert ok(run_cli(db_url, "schedule", "list", "reports")).strip() == "queue reports: no schedules"
    assert json.loads(ok(run_cli(db_url, "schedule", "list", "--json"))) == []


@before_any_database_access
def test_a_malformed_queue_is_refused_with_exit_2(db_url: str) -> None:
    assert_error(run_cli(db_url, "schedule", "list", "no spaces"), 2, "invalid queue name")


@before_any_database_access
@pytest.mark.parametrize("count", ["0", "101", "many"])
def test_a_count_out_of_range_is_refused_with_exit_2(db_url: str, count: str) -> None:
    assert_error(run_cli(db_url, "schedule", "list", "--count", count), 2, "--count")
