"""Reading items and their deliveries: `feedproc items`, `feedproc item`, `Feed.item`, and
`GET /api/v1/items/{id}` (a real watcher with a Python processor produces the history)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from feedproc import Feed, Item, PermanentError, Processor, Response

from ..api_support import ApiServer
from ..support import json_of, run_cli, wait_status, watching


class FailsOnceThenLabels(Processor):
    """The item with {"n": 2} raises KeyError on its first delivery; every item is labelled."""

    def __init__(self) -> None:
        self.seen: set[int] = set()

    def process(self, item: Item) -> Response:
        data = item.json()
        if data.get("n") == 2 and item.id not in self.seen:
            self.seen.add(item.id)
            responses: dict[str, Response] = {}
            return responses["missing"]  # a processor's own bug: KeyError with a traceback
        if data.get("n") == 3:
            raise PermanentError("unreadable scan")
        return Response(done=True, data=json.dumps({**data, "label": "invoice"}).encode())


@pytest.fixture
def finished(db_url: str, feed: Feed) -> Feed:
    """A partition of four items processed: 0, 1 and 2 complete (2 after a retry), 3 failed."""
    feed.add_partition("upload", [(0, json.dumps({"n": n}).encode()) for n in range(4)])
    with watching(db_url, FailsOnceThenLabels()):
        wait_status(feed, "upload", "failed")
    return feed


def item_of(feed: Feed, n: int) -> int:
    return next(i.id for i in feed.items("upload") if json_of(i.data).get("n") == n)


def test_feed_item_shows_a_python_processors_traceback_and_the_retry_that_followed(finished: Feed) -> None:
    item = finished.item(item_of(finished, 2))
    assert item.status == "complete" and json_of(item.data) == {"n": 2, "label": "invoice"}
    retry, done = item.history
    assert (retry.outcome, retry.attempt, done.outcome, done.attempt) == ("retry", 1, "done", 2)
    assert "Traceback (most recent call last)" in (retry.error or "") and "KeyError: 'missing'" in (retry.error or "")
    assert "FailsOnceThenLabels" not in (item.last_error or "")  # last_error stays one line: cleared on done
    assert retry.ended_at and done.ended_at and done.duration is not None


def test_items_json_lines_are_a_finished_partitions_results(db_url: str, finished: Feed) -> None:
    result = run_cli(db_url, "items", "upload", "--json")
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["data"] for r in rows if r["status"] == "complete"] == [{"n": n, "label": "invoice"} for n in (0, 1, 2)]
    (failed,) = [r for r in rows if r["status"] == "failed"]
    assert failed["last_error"] == "unreadable scan" and failed["attempts"] == 1


def test_items_filters_by_status_and_gate(db_url: str, finished: Feed) -> None:
    failed = run_cli(db_url, "items", "upload", "--status", "failed", "--json")
    assert [json.loads(line)["data"] for line in failed.stdout.splitlines()] == [{"n": 3}]
    none = run_cli(db_url, "items", "upload", "--gate", "7", "--json")
    assert none.returncode == 0 and none.stdout == ""
    table = run_cli(db_url, "items", "upload")
    assert table.returncode == 0 and "unreadable scan" in table.stdout and "last error" in table.stdout


def test_item_shows_its_data_and_every_delivery_with_its_traceback(db_url: str, finished: Feed) -> None:
    result = run_cli(db_url, "item", str(item_of(finished, 2)))
    assert result.returncode == 0, result.stderr
    assert '"label": "invoice"' in result.stdout
    assert "retry" in result.stdout and "done" in result.stdout
    assert "KeyError: 'missing'" in result.stdout and "Traceback" in result.stdout
    as_json = json.loads(run_cli(db_url, "item", str(item_of(finished, 3)), "--json").stdout)
    assert [h["outcome"] for h in as_json["history"]] == ["failed"]
    assert as_json["history"][0]["error"].endswith("unreadable scan")


@pytest.mark.sqlite_only
def test_item_and_items_refuse_bad_input_with_one_line(db_url: str, feed: Feed) -> None:
    unknown = run_cli(db_url, "item", "424242")
    assert unknown.returncode == 1 and unknown.stderr.strip().count("\n") == 0 and "no item" in unknown.stderr
    assert run_cli(db_url, "item", "-3").returncode == 2
    assert run_cli(db_url, "items", "nope").returncode == 1
    bad_status = run_cli(db_url, "items", "nope", "--status", "done")
    assert bad_status.returncode == 2 and "--status" in bad_status.stderr


@pytest.fixture
def api(db_url: str) -> Iterator[ApiServer]:
    server = ApiServer(db_url)
    yield server
    server.close()


def test_api_item_has_the_data_and_the_history(api: ApiServer, finished: Feed) -> None:
    answer = api.get(f"/api/v1/items/{item_of(finished, 2)}")
    assert answer.status_code == 200
    body = answer.json()
    assert body["data"] == {"n": 2, "label": "invoice"} and body["partition"] == "upload"
    assert [h["outcome"] for h in body["history"]] == ["retry", "done"]
    assert "KeyError: 'missing'" in body["history"][0]["error"]
    missing = api.get("/api/v1/items/999999")
    assert missing.status_code == 404 and "error" in missing.json()
