"""Tolerated failures at the front doors (issue 31): `feedproc add --tolerate` and the API's
`tolerate` (bad values refused, nothing written), and the failures a gate tolerated shown by
`feedproc status` (text and JSON), the API and the dashboard, where such a gate does not read
as failed. Real processes and real HTTP, on every database."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from feedproc import Feed
from feedproc.core.records import Kind

from ..api_support import ApiServer
from ..support import A, answer, db_state, fail, lease_and_fetch, register, run_cli

ITEMS = "".join(json.dumps({"gate": 0, "data": n}) + "\n" for n in range(40)) + '{"gate": 1, "data": "rank"}\n'


@pytest.fixture
def api(db_url: str) -> Iterator[ApiServer]:
    server = ApiServer(db_url)
    yield server
    server.close()


def fail_two_then_finish(feed: Feed, key: str) -> None:
    """As a watcher: fail 2 of `key`'s 40 items at gate 0 for good, complete the others."""
    register(feed.store, A)
    ready = [r for r in lease_and_fetch(feed.store) if r.partition == key]
    feed.store.apply(A, [fail(r, attempts=5, error="unreadable") for r in ready[:2]])
    feed.store.apply(A, [answer(r, Kind.DONE) for r in ready[2:]])


def cli_error(result: Any, code: int) -> str:
    assert result.returncode == code, f"exit {result.returncode}: {result.stdout} {result.stderr}"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return str(lines[0])


# ---------------------------------------------------------------- the command line


def test_add_with_tolerate_lets_the_gate_advance_past_failures_and_status_shows_them(db_url: str, feed: Feed) -> None:
    added = run_cli(db_url, "add", "scan", "--tolerate", "5%", "--items", "-", input=ITEMS)
    assert added.returncode == 0, added.stderr
    fail_two_then_finish(feed, "scan")
    status = json.loads(run_cli(db_url, "status", "scan", "--json").stdout)
    assert (status["status"], status["gate"], status["tolerate"]) == ("available", 1, "5%")
    assert status["tolerated"] == {"0": {"failed": 2, "allowed": "5%", "items": 40, "limit": 2, "exceeded": False}}
    text = run_cli(db_url, "status", "scan").stdout
    assert "tolerate 5%" in text.splitlines()[0]
    assert "gate 0: 2 failed, tolerated: 5% allowed (at most 2 of 40)" in text


@pytest.mark.parametrize("bad", ["lots", "5.5", "101%", "-1"])
def test_add_with_a_bad_tolerate_exits_2_with_one_line_and_writes_nothing(db_url: str, feed: Feed, bad: str) -> None:
    before = db_state(feed)
    line = cli_error(run_cli(db_url, "add", "p", f"--tolerate={bad}", "--items", "-", input=ITEMS), 2)
    assert "tolerate must be" in line and bad in line
    assert db_state(feed) == before


# ---------------------------------------------------------------- the API


def test_the_api_creates_a_partition_with_tolerate_and_shows_its_tolerated_failures(
    api: ApiServer, feed: Feed, db_url: str
) -> None:
    items = [{"gate": 0, "data": n} for n in range(40)] + [{"gate": 1, "data": "rank"}]
    created = api.post("/api/v1/partitions", {"key": "scan", "items": items, "tolerate": 2})
    assert created.status_code == 201, created.text
    assert created.json()["partition"]["tolerate"] == "2"
    fail_two_then_finish(feed, "scan")
    view = api.get("/api/v1/partitions/scan").json()
    assert view == json.loads(run_cli(db_url, "status", "scan", "--json").stdout)
    assert view["tolerated"]["0"] == {"failed": 2, "allowed": "2", "items": 40, "limit": 2, "exceeded": False}
    (row,) = api.get("/api/v1/partitions").json()["items"]
    assert row["tolerate"] == "2" and row["tolerated"] == {"0": {"failed": 2, "allowed": "2", "exceeded": False}}


@pytest.mark.parametrize(
    ("bad", "status", "said"),
    [
        ("lots", 400, "must be"),
        ("200%", 400, "must be"),
        (-1, 400, "must be"),
        (True, 422, "must be a count (an integer >= 0) or a percentage"),  # the CLI's words, not pydantic's
        ([5], 422, "must be a count (an integer >= 0) or a percentage"),
    ],
)
def test_the_api_refuses_a_bad_tolerate_and_writes_nothing(
    api: ApiServer, feed: Feed, bad: Any, status: int, said: str
) -> None:
    before = db_state(feed)
    response = api.post("/api/v1/partitions", {"key": "p", "items": [{"gate": 0}], "tolerate": bad})
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and "tolerate" in body["error"] and said in body["error"], body
    assert db_state(feed) == before


# ---------------------------------------------------------------- the dashboard


def test_the_dashboard_shows_a_tolerated_gate_as_tolerated_not_failed(api: ApiServer, feed: Feed) -> None:
    feed.add_partition("scan", [(0, b"%d" % n) for n in range(40)] + [(1, b'"rank"')], tolerate="5%")
    fail_two_then_finish(feed, "scan")
    row = api.get("/").text.split('data-key="scan"', 1)[1].split("</tr>", 1)[0]
    bar = row.split('data-gate="0"', 1)[0].rsplit("<div", 1)[1]
    assert "has-failed" not in bar and "has-tolerated" in bar
    assert "2 failed, tolerated: 5% allowed" in row
    page = api.get("/partitions/scan").text
    assert "2 failed, tolerated: 5% allowed (at most 2 of 40)" in page
    assert "tolerates 5% failed per gate" in page
    failed = page.split('class="failed-items"', 1)[1].split("</table>", 1)[0]
    assert 'data-item-action="retry"' not in failed, "a failure behind the gate cannot be retried"


def test_the_dashboard_shows_a_crossed_tolerance_as_failed(api: ApiServer, feed: Feed) -> None:
    feed.add_partition("scan", [(0, b"%d" % n) for n in range(40)], tolerate="1")
    register(feed.store, A)
    ready = lease_and_fetch(feed.store)
    feed.store.apply(A, [fail(r, attempts=5) for r in ready[:2]])
    row = api.get("/").text.split('data-key="scan"', 1)[1].split("</tr>", 1)[0]
    assert "has-failed" in row and "2 failed, more than the 1 allowed" in row
