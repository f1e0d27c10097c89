"""Item actions at the doors (every database): `feedproc item retry|skip|cancel` and
`POST /api/v1/items/...`, with their refusals (exit codes, JSON errors) and who is recorded."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from feedproc import Feed

from ..api_support import TOKEN, ApiServer
from ..support import run_cli


@pytest.fixture
def api(db_url: str) -> Iterator[ApiServer]:
    server = ApiServer(db_url)
    yield server
    server.close()


def ids_of(feed: Feed, key: str) -> list[int]:
    return [i.id for i in feed.items(key)]


def test_the_cli_skips_an_item_and_records_that_the_cli_did(db_url: str, feed: Feed) -> None:
    feed.add_partition("p", [(0, b"1"), (1, b"2")])
    first, _ = ids_of(feed, "p")
    result = run_cli(db_url, "item", "skip", str(first), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"action": "skip", "items": 1, "partitions": ["p"]}
    history = feed.item(first).history
    assert [(h.outcome, h.watcher) for h in history] == [("skipped", "cli")]
    assert feed.status("p").gate == 1


def test_the_cli_cancels_a_gate_of_a_partition(db_url: str, feed: Feed) -> None:
    feed.add_partition("p", [(0, b"1"), (0, b"2"), (1, b"3")])
    result = run_cli(db_url, "item", "cancel", "--partition", "p", "--gate", "0")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "cancel: 2 item(s) in p"


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["item", "retry", "x1"], 2, "not an item id"),
        (["item"], 2, "usage: feedproc item ID (show one item), or feedproc item retry|skip|cancel ID..."),
        (["item", "retry"], 2, "name the items"),
        (["item", "skip", "1", "--partition", "p"], 2, "not both"),
        (["item", "cancel", "--gate", "0"], 2, "name the items"),
        (["item", "1", "2"], 2, "show one item"),
        (["item", "skip", "999"], 1, "no item 999"),
    ],
)
def test_the_cli_refuses_bad_item_actions_in_one_line(
    db_url: str, feed: Feed, args: list[str], code: int, says: str
) -> None:
    feed.add_partition("p", [(0, b"1")])
    result = run_cli(db_url, *args)
    assert result.returncode == code, result.stderr
    assert says in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert feed.items("p")[0].status == "available"


def test_the_api_retries_one_item_and_bulk_cancels_a_partitions_items(api: ApiServer, feed: Feed) -> None:
    feed.add_partition("p", [(0, b"1"), (0, b"2")])
    first, second = ids_of(feed, "p")
    one = api.post(f"/api/v1/items/{first}/retry")
    assert one.status_code == 200, one.text
    assert one.json()["items"] == 1
    bulk = api.post("/api/v1/items/cancel", {"partition": "p", "gate": 0})
    assert bulk.status_code == 200 and bulk.json()["items"] == 2
    assert [(h.outcome, h.watcher) for h in feed.item(second).history] == [("cancelled", "api")]


def test_the_api_refuses_an_action_on_a_finished_item_with_a_json_409(api: ApiServer, feed: Feed) -> None:
    feed.add_partition("p", [(0, b"1")])
    (item,) = ids_of(feed, "p")
    api.post(f"/api/v1/items/{item}/skip")
    again = api.post("/api/v1/items/skip", {"ids": [item]})
    assert again.status_code == 409 and "is complete" in again.json()["error"]
    assert api.post("/api/v1/items/skip", {"ids": [item], "partition": "p"}).status_code == 400
    assert api.post("/api/v1/items/delete", {"ids": [item]}).status_code == 422
    assert api.post(f"/api/v1/items/{item}/retry", auth=False).status_code == 401


def test_the_api_reads_changes_pauses_and_resumes_queues(api: ApiServer, feed: Feed) -> None:
    changed = api.client.put(
        "/api/v1/queues/imports",
        json={"limit": 5, "windows": ["22:00-06:00"], "timezone": "Europe/Paris", "mode": "pull"},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert changed.status_code == 200, changed.text
    assert (changed.json()["limit"], changed.json()["windows"], changed.json()["mode"]) == (5, "22:00-06:00", "pull")
    paused = api.post("/api/v1/queues/imports/pause")
    assert paused.status_code == 200 and paused.json()["paused"] and paused.json()["paused_by"] == "api"
    assert feed.queue("imports").paused
    listed = api.get("/api/v1/queues").json()["queues"]
    assert [q["name"] for q in listed if q["paused"]] == ["imports"]
    assert not api.post("/api/v1/queues/imports/resume").json()["paused"]
    cleared = api.client.put(
        "/api/v1/queues/imports", json={"windows": []}, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert cleared.json()["windows"] is None and cleared.json()["limit"] == 5
    bad = api.client.put("/api/v1/queues/imports", json={"limit": -1}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert bad.status_code == 422 and "error" in bad.json()


def test_the_api_creates_a_partition_with_every_scheduling_control(api: ApiServer, feed: Feed) -> None:
    response = api.post(
        "/api/v1/partitions",
        {
            "key": "nightly",
            "items": [{"data": 1}],
            "weight": 3,
            "item_timeout": 12.5,
            "windows": ["22:00-06:00", "12:00-13:00"],
            "timezone": "Europe/Paris",
        },
    )
    assert response.status_code == 201, response.text
    schedule = feed.status("nightly").schedule
    assert (schedule.weight, schedule.item_timeout) == (3, 12.5)
    assert (schedule.windows, schedule.timezone) == ("22:00-06:00,12:00-13:00", "Europe/Paris")
    bad = api.post("/api/v1/partitions", {"key": "bad", "windows": ["25:00-06:00"]})
    assert bad.status_code == 400 and "window" in bad.json()["error"]
