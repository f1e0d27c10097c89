"""A finished partition's lifecycle at the doors (every database): `feedproc resubmit|remove` and
`POST /api/v1/partitions/KEY/resubmit`, `DELETE /api/v1/partitions/KEY`, with their refusals (one
line and exit 1; a JSON 409), and a partition added without a key through the CLI and the API."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from feedproc import Feed

from ..api_support import AUTH, ApiServer
from ..support import run_cli


@pytest.fixture
def api(db_url: str) -> Iterator[ApiServer]:
    server = ApiServer(db_url)
    yield server
    server.close()


def test_the_cli_resubmits_a_cancelled_partition(db_url: str, feed: Feed) -> None:
    feed.add_partition("p", [(0, b"1"), (0, b"2")])
    feed.cancel("p")

    result = run_cli(db_url, "resubmit", "p")

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "resubmitted p: 2 items are available again"
    assert feed.status("p").status == "available"
    assert feed.history("p")[-1].kind == "resubmitted"


def test_the_cli_removes_a_finished_partition(db_url: str, feed: Feed) -> None:
    feed.add_partition("p", [(0, b"1")])
    feed.cancel("p")

    result = run_cli(db_url, "remove", "p")

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("removed p: 1 items")
    with pytest.raises(KeyError):
        feed.status("p")


@pytest.mark.parametrize(("command", "says"), [("resubmit", "cannot be resubmitted"), ("remove", "cancel it first")])
def test_the_cli_refuses_an_active_partition_in_one_line(db_url: str, feed: Feed, command: str, says: str) -> None:
    feed.add_partition("p", [(0, b"1")])

    result = run_cli(db_url, command, "p")

    assert result.returncode == 1
    assert says in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert feed.status("p").status == "available"


def test_the_cli_adds_a_partition_without_a_key_and_prints_the_generated_one(
    db_url: str, feed: Feed, tmp_path: Path
) -> None:
    items = tmp_path / "items.jsonl"
    items.write_text('{"gate": 0, "data": 1}\n')

    result = run_cli(db_url, "add", "--items", str(items))

    assert result.returncode == 0, result.stderr
    key = result.stdout.split()[2]
    assert uuid.UUID(key).version == 7
    assert feed.status(key).status == "available"


def test_the_api_resubmits_a_finished_partition(api: ApiServer, feed: Feed) -> None:
    feed.add_partition("p", [(0, b"1")])
    feed.cancel("p")

    response = api.post("/api/v1/partitions/p/resubmit")

    assert response.status_code == 200, response.text
    assert response.json()["resubmitted"] == 1 and response.json()["partition"]["status"] == "available"
    assert feed.history("p")[-1].detail["by"] == "api"


def test_the_api_removes_a_finished_partition(api: ApiServer, feed: Feed) -> None:
    feed.add_partition("p", [(0, b"1")])
    feed.cancel("p")

    response = api.client.delete("/api/v1/partitions/p", headers=AUTH)

    assert response.status_code == 200, response.text
    assert response.json()["removed"]["items"] == 1
    assert api.get("/api/v1/partitions/p").status_code == 404


def test_the_api_refuses_an_active_partition_with_a_json_409(api: ApiServer, feed: Feed) -> None:
    feed.add_partition("p", [(0, b"1")])

    resubmitted = api.post("/api/v1/partitions/p/resubmit")
    removed = api.client.delete("/api/v1/partitions/p", headers=AUTH)

    assert resubmitted.status_code == 409 and "cannot be resubmitted" in resubmitted.json()["error"]
    assert removed.status_code == 409 and "cancel it first" in removed.json()["error"]
    assert feed.status("p").status == "available"


def test_the_api_needs_an_operate_token_for_both(api: ApiServer, feed: Feed) -> None:
    feed.add_partition("p", [(0, b"1")])
    feed.cancel("p")

    assert api.post("/api/v1/partitions/p/resubmit", auth=False).status_code == 401
    assert api.client.delete("/api/v1/partitions/p").status_code == 401
    assert feed.status("p").status == "cancelled"


def test_the_api_generates_a_key_for_a_partition_posted_without_one(api: ApiServer, feed: Feed) -> None:
    response = api.post("/api/v1/partitions", {"items": [{"data": 1}]})

    assert response.status_code == 201, response.text
    key = response.json()["key"]
    assert uuid.UUID(key).version == 7
    assert response.json()["partition"]["key"] == key
    assert feed.status(key).status == "available"
