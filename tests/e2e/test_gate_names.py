"""Gate names at the operators' front doors (issue 22): with a pipeline naming a queue's gates, the
HTTP API, the command line and the dashboard take a gate's name wherever they take its number, and
show the name beside the number. Numbers keep working; a name the queue's pipeline does not have is
a clear error (400 / exit 2) that writes nothing; a queue without a pipeline shows what it always did.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from feedproc import Feed
from feedproc.core.pipelines import parse_toml

from ..api_support import ApiServer
from ..support import db_state, run_cli

PIPELINE = """
queue = "docs"

[[gate]]
name = "ocr"
number = 0

[[gate]]
name = "rank"
number = 2
handler = "http://robot:s3cret@ranker.internal:8080/rank"
headers = {X-Api-Key = "very-secret-token"}  # (an Authorization header would conflict with the URL's credentials)
"""


@pytest.fixture
def named(feed: Feed) -> Feed:
    """`feed` with a pipeline naming queue docs' gates 0 (ocr) and 2 (rank)."""
    feed.apply_pipeline(parse_toml(PIPELINE))
    return feed


@pytest.fixture
def api(db_url: str, named: Feed) -> Iterator[ApiServer]:
    server = ApiServer(db_url)
    yield server
    server.close()


def error_of(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, f"expected {status}, got {response.status_code}: {response.text}"
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"} and body["error"], body
    return body["error"]


def gates_of(feed: Feed, key: str) -> list[int]:
    return [item.gate for item in feed.items(key)]


def one_line_error(result: subprocess.CompletedProcess[str], code: int, *fragments: str) -> None:
    assert result.returncode == code, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert not result.stdout.strip()


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    return result.stdout


def fail_one_item(feed: Feed, key: str) -> int:
    """Fail `key`'s first ready item for good, through the pull workers' API."""
    feed.set_queue("docs", mode="pull")
    (claimed, *_) = feed.claim("docs", "w1", max_items=1)
    feed.answer(claimed["id"], claimed["token"], {"error": {"message": "unreadable scan", "no_retry": True}})
    return int(claimed["id"])


# ---------------------------------------------------------------- the HTTP API


def test_the_api_creates_a_partition_with_named_gates_and_shows_the_names(api: ApiServer, named: Feed) -> None:
    items: list[dict[str, Any]] = [{"gate": "ocr", "data": {"f": 1}}, {"gate": "rank", "data": 2}, {"gate": 1}]
    response = api.post("/api/v1/partitions", {"key": "up-1", "queue": "docs", "open": True, "items": items})
    assert response.status_code == 201, response.text
    assert gates_of(named, "up-1") == [0, 2, 1]  # numbers keep working beside names
    partition = response.json()["partition"]
    assert (partition["gate"], partition["gate_name"]) == (0, "ocr")
    assert partition["gate_names"] == {"0": "ocr", "2": "rank"}
    assert set(partition["gates"]) == {"0", "1", "2"}  # the counts themselves as they were

    added = api.post("/api/v1/partitions/up-1/items", {"items": [{"gate": "rank", "data": 3}]})
    assert added.status_code == 200, added.text
    assert added.json()["partition"]["gate_names"]["2"] == "rank"
    assert gates_of(named, "up-1") == [0, 2, 1, 2]


def test_an_unknown_gate_name_is_a_400_naming_it_and_writes_nothing(api: ApiServer, named: Feed) -> None:
    before = db_state(named)
    items = [{"gate": "ocr"}, {"gate": "scan"}]
    message = error_of(api.post("/api/v1/partitions", {"key": "up-2", "queue": "docs", "items": items}), 400)
    assert "item 2" in message and "'scan'" in message and "ocr, rank" in message
    # a name in a queue without a pipeline
    message = error_of(api.post("/api/v1/partitions", {"key": "up-2", "items": [{"gate": "ocr"}]}), 400)
    assert "'ocr'" in message and "no pipeline" in message
    assert db_state(named) == before

    named.add_partition("open-1", [(0, b"1")], queue="docs", sealed=False)
    before = db_state(named)
    message = error_of(api.post("/api/v1/partitions/open-1/items", {"items": [{"gate": "sort"}]}), 400)
    assert "'sort'" in message and "ocr, rank" in message
    assert db_state(named) == before


def test_the_api_shows_gate_names_beside_numbers_and_filters_by_name(api: ApiServer, named: Feed) -> None:
    named.add_partition("up-3", [{"gate": "ocr", "data": 1}, {"gate": "rank", "data": 2}], queue="docs")
    named.add_partition("plain", [(0, b"1")])  # queue default: no pipeline, nothing added
    status = api.get("/api/v1/partitions/up-3").json()
    assert (status["gate_name"], status["gate_names"]) == ("ocr", {"0": "ocr", "2": "rank"})
    plain = api.get("/api/v1/partitions/plain").json()
    assert plain == named.status("plain").to_json() and "gate_name" not in plain

    listed = {p["key"]: p for p in api.get("/api/v1/partitions").json()["items"]}
    assert listed["up-3"]["gate_name"] == "ocr" and "gate_name" not in listed["plain"]

    rows = api.get("/api/v1/items", params={"key": "up-3"}).json()["items"]
    assert [(r["gate"], r["gate_name"]) for r in rows] == [(0, "ocr"), (2, "rank")]
    for gate in ("rank", "2"):
        rows = api.get("/api/v1/items", params={"key": "up-3", "gate": gate}).json()["items"]
        assert [(r["gate"], r["gate_name"], r["data"]) for r in rows] == [(2, "rank", 2)]
    assert "'scan'" in error_of(api.get("/api/v1/items", params={"key": "up-3", "gate": "scan"}), 400)
    assert "gate_name" not in api.get("/api/v1/items", params={"key": "plain"}).json()["items"][0]

    item = api.get(f"/api/v1/items/{rows[0]['id']}").json()
    assert (item["gate"], item["gate_name"]) == (2, "rank")

    failed = fail_one_item(named, "up-3")
    status = api.get("/api/v1/partitions/up-3").json()
    assert [(f["id"], f["gate_name"]) for f in status["failed_items"]] == [(failed, "ocr")]
    assert [(f["key"], f["gate_name"]) for f in api.get("/api/v1/failures").json()["items"]] == [("up-3", "ocr")]


def test_an_item_action_takes_a_gate_by_name(api: ApiServer, named: Feed) -> None:
    named.add_partition("up-4", [(0, b"1"), (2, b"2"), (2, b"3")], queue="docs")
    before = db_state(named)
    refused = api.post("/api/v1/items/cancel", {"partition": "up-4", "gate": "sort"})
    assert "'sort'" in error_of(refused, 400)
    assert db_state(named) == before
    done = api.post("/api/v1/items/cancel", {"partition": "up-4", "gate": "rank"})
    assert done.status_code == 200, done.text
    assert [(i.gate, i.status) for i in named.items("up-4")] == [
        (0, "available"),
        (2, "cancelled"),
        (2, "cancelled"),
    ]


def test_the_pipelines_routes_show_stored_pipelines_without_their_credentials(api: ApiServer, named: Feed) -> None:
    pipeline = api.get("/api/v1/pipelines/docs")
    assert pipeline.status_code == 200, pipeline.text
    body = pipeline.json()
    spec = named.pipeline("docs")
    assert spec is not None and body["queue"] == "docs" and body["version"] == spec.version == 1
    assert [(g["name"], g["number"]) for g in body["gate"]] == [("ocr", 0), ("rank", 2)]
    rank = body["gate"][1]
    assert rank["handler"] == "http://***@ranker.internal:8080/rank"
    assert rank["headers"] == {"X-Api-Key": "***"}
    assert "s3cret" not in pipeline.text and "very-secret-token" not in pipeline.text
    assert api.get("/api/v1/pipelines").json() == {"pipelines": [body]}
    assert "'nope'" in error_of(api.get("/api/v1/pipelines/nope"), 404)


# ---------------------------------------------------------------- the dashboard


def test_the_dashboard_shows_gate_names_beside_numbers(api: ApiServer, named: Feed) -> None:
    named.add_partition("up-5", [{"gate": "ocr", "data": 1}, {"gate": "rank", "data": 2}], queue="docs")
    page = api.get("/partitions/up-5")
    assert page.status_code == 200
    assert '0 <span class="gate-name muted">(ocr)</span>' in page.text
    assert '2 <span class="gate-name muted">(rank)</span>' in page.text
    second = named.items("up-5")[1].id
    assert '2 <span class="gate-name muted">(rank)</span>' in api.get(f"/items/{second}").text
    overview = api.get("/").text
    assert "g0 ocr" in overview and "g2 rank" in overview
    assert '<td>0 <span class="gate-name muted">(ocr)</span></td>' in api.get("/queues/docs").text


# ---------------------------------------------------------------- the command line


def test_the_cli_adds_items_by_gate_name_and_refuses_an_unknown_one(db_url: str, named: Feed) -> None:
    lines = '{"gate": "ocr", "data": 1}\n{"gate": "rank", "data": 2}\n{"gate": 3}\n'
    ok(run_cli(db_url, "add", "cli-1", "--queue", "docs", "--items", "-", input=lines))
    assert gates_of(named, "cli-1") == [0, 2, 3]
    before = db_state(named)
    bad = '{"gate": "ocr", "data": 1}\n{"gate": "scan", "data": 2}\n'
    one_line_error(run_cli(db_url, "add", "cli-2", "--queue", "docs", "--items", "-", input=bad), 2, "'scan'")
    assert db_state(named) == before


def test_the_cli_shows_gate_names_and_takes_them_as_filters(db_url: str, named: Feed) -> None:
    named.add_partition("cli-3", [{"gate": "ocr", "data": 1}, {"gate": "rank", "data": 2}], queue="docs")
    shown = ok(run_cli(db_url, "status", "cli-3"))
    assert "gate 0 (ocr)" in shown.splitlines()[0]
    assert any(line.startswith("2 (rank)") for line in shown.splitlines())
    status = json.loads(ok(run_cli(db_url, "status", "cli-3", "--json")))
    assert (status["gate"], status["gate_name"], status["gate_names"]) == (0, "ocr", {"0": "ocr", "2": "rank"})
    assert "0 (ocr)" in ok(run_cli(db_url, "status"))  # the summary's recent partitions

    table = ok(run_cli(db_url, "items", "cli-3", "--gate", "rank"))
    assert "2 (rank)" in table and "(ocr)" not in table
    rows = [json.loads(line) for line in ok(run_cli(db_url, "items", "cli-3", "--json")).splitlines()]
    assert [(r["gate"], r["gate_name"]) for r in rows] == [(0, "ocr"), (2, "rank")]
    one_line_error(run_cli(db_url, "items", "cli-3", "--gate", "scan"), 2, "'scan'", "ocr, rank")

    before = db_state(named)
    one_line_error(run_cli(db_url, "item", "skip", "--partition", "cli-3", "--gate", "sort"), 2, "'sort'")
    assert db_state(named) == before
    ok(run_cli(db_url, "item", "cancel", "--partition", "cli-3", "--gate", "rank"))
    assert [i.status for i in named.items("cli-3")] == ["available", "cancelled"]
