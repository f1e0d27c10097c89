"""Feed's reads return frozen, typed views whose to_json() is the object they returned as dicts:
the same keys, order and values as recorded on main before they were typed, and what the API and
the CLI's --json show (issue 32). Dict-style access still works for a release, with a warning."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from feedproc import Feed
from feedproc.cli import main
from feedproc.core.views import ItemView, PartitionStatus, ViewKeyAccess

from ..api_support import ApiServer
from ..support import lease_of
from ..views_scenario import build, reads

GOLDEN = Path(__file__).parent / "data" / "views_golden.json"


@pytest.fixture
def scenario(tmp_path: Path) -> Iterator[tuple[Feed, dict[str, Any]]]:
    with Feed(f"sqlite:///{tmp_path}/views.db") as feed:
        feed.migrate()
        yield feed, build(feed)


def test_every_reads_json_is_what_it_was_before_the_reads_were_typed(scenario: tuple[Feed, dict[str, Any]]) -> None:
    feed, ids = scenario
    assert reads(feed, ids, lambda view: view.to_json()) == json.loads(GOLDEN.read_text())


def test_views_are_typed_records_all_the_way_down(scenario: tuple[Feed, dict[str, Any]]) -> None:
    feed, ids = scenario
    status = feed.status("p1", history=20)
    assert isinstance(status, PartitionStatus)
    assert (status.gate, status.items["failed"], status.gates["1"]["complete"]) == (1, 1, 1)
    assert status.failed_items[0].last_error == "broken page"
    assert (status.tolerated["1"].limit, status.tolerated["1"].exceeded) == (1, False)
    assert status.schedule.queue.limit == 4 and status.progress.gates["1"].total == 4
    assert [event.kind for event in status.history or ()] == ["created", "gate_advanced", "item_failed"]
    assert lease_of(feed.status("p2")).owner == "watch-1"
    item = feed.item(ids["item"])
    assert isinstance(item, ItemView) and item.history[0].outcome == "failed"
    with pytest.raises(dataclasses.FrozenInstanceError):
        status.gate = 2  # type: ignore[misc]


def test_the_api_shows_each_view_as_its_to_json(
    scenario: tuple[Feed, dict[str, Any]], request: pytest.FixtureRequest
) -> None:
    feed, _ = scenario
    client = ApiServer(feed.store.url)
    request.addfinalizer(client.close)
    # A queue without a pipeline: nothing added to the object.
    assert client.get("/api/v1/partitions/p2").json() == feed.status("p2").to_json()
    assert client.get("/api/v1/queues/ocr").json() == feed.queue("ocr").to_json()
    assert client.get("/api/v1/history", params={"key": "p1"}).json()["items"] == [
        event.to_json() for event in feed.history("p1")
    ]
    # A queue with a pipeline: its gates' names beside the numbers, the rest as to_json().
    shown = client.get("/api/v1/partitions/p1", params={"history": 20}).json()
    assert without_names(shown) == feed.status("p1", history=20).to_json()
    assert shown["gate_name"] == "read" and shown["gate_names"] == {"0": "scan", "1": "read"}


def test_the_clis_json_is_each_views_to_json(
    scenario: tuple[Feed, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    feed, _ = scenario

    def cli(*args: str) -> Any:
        with pytest.raises(SystemExit) as exited:
            main([*args, "--json", "--db", feed.store.url])
        assert exited.value.code == 0
        return json.loads(capsys.readouterr().out)

    assert cli("status", "p2") == feed.status("p2").to_json()
    assert without_names(cli("status", "p1", "--history", "20")) == feed.status("p1", history=20).to_json()
    assert cli("queue", "show") == [queue.to_json() for queue in feed.queues()]


def test_reading_a_view_as_a_dict_still_works_with_a_deprecation_warning(
    scenario: tuple[Feed, dict[str, Any]],
) -> None:
    feed, ids = scenario
    status = feed.status("p1")
    with pytest.warns(ViewKeyAccess, match=r"PartitionStatus\['items'\] is deprecated: use the attribute \.items"):
        assert status["items"] == status.to_json()["items"]  # type: ignore[deprecated]
    with pytest.warns(DeprecationWarning):
        assert feed.item(ids["item"])["history"][0]["outcome"] == "failed"  # type: ignore[deprecated]
    with pytest.warns(ViewKeyAccess):
        assert status.get("history") is None  # type: ignore[deprecated]
    with pytest.warns(ViewKeyAccess):
        assert dict(status) == status.to_json()


def without_names(shown: Any) -> Any:
    """An object as the front doors show it, without the gate names they add for a pipeline's queue."""
    if isinstance(shown, dict):
        return {k: without_names(v) for k, v in shown.items() if k not in ("gate_name", "gate_names")}
    if isinstance(shown, list):
        return [without_names(v) for v in shown]
    return shown
