"""Accumulate at the front doors (issue 31): `feedproc queue set --accumulate NAME=OP` and
`--no-accumulate`, the API's PUT /queues accumulate (bad declarations refused in one line or a 4xx
JSON error, nothing changed), and the partition's accumulator shown by `feedproc status` (text and
JSON), the API's partition view and the dashboard's partition page. Real processes and real HTTP,
on every database."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from feedproc import Feed
from feedproc.core.records import Kind

from ..api_support import TOKEN, ApiServer
from ..support import A, answer, lease_and_fetch, register, run_cli


@pytest.fixture
def api(db_url: str) -> Iterator[ApiServer]:
    server = ApiServer(db_url)
    yield server
    server.close()


def one_line_error(result: object, code: int, says: str) -> None:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)  # type: ignore[attr-defined]
    lines = result.stderr.strip().splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1 and says in lines[0], result.stderr  # type: ignore[attr-defined]


def test_queue_set_declares_shows_and_removes_accumulate(db_url: str, feed: Feed) -> None:
    result = run_cli(db_url, "queue", "set", "docs", "--accumulate", "pages=sum", "--accumulate", "max_score=max")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "queue docs: push, no limit, no windows, accumulate max_score=max, pages=sum"
    assert feed.queue("docs").accumulate == {"max_score": "max", "pages": "sum"}
    shown = run_cli(db_url, "queue", "show", "docs")
    assert "accumulate max_score=max, pages=sum" in shown.stdout
    assert json.loads(run_cli(db_url, "queue", "show", "docs", "--json").stdout)["accumulate"] == {
        "max_score": "max",
        "pages": "sum",
    }
    removed = run_cli(db_url, "queue", "set", "docs", "--no-accumulate")
    assert removed.returncode == 0 and "accumulate" not in removed.stdout
    assert feed.queue("docs").accumulate == {}


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--accumulate", "pages"], "'pages' is not NAME=OPERATION (like pages=sum)"),
        (["--accumulate", "pages=avg"], "pages: the operation must be one of sum, min, max, count, got 'avg'"),
        (["--accumulate", "2pages=sum"], "'2pages' is not a name"),
        (["--accumulate", "pages=sum", "--no-accumulate"], "--accumulate and --no-accumulate: give one"),
    ],
)
def test_queue_set_refuses_a_bad_declaration_in_one_line(db_url: str, feed: Feed, args: list[str], says: str) -> None:
    feed.set_queue("docs", accumulate={"bytes": "sum"})
    one_line_error(run_cli(db_url, "queue", "set", "docs", "--limit", "4", *args), 2, says)
    assert (feed.queue("docs").limit, feed.queue("docs").accumulate) == (None, {"bytes": "sum"})


def test_the_api_sets_and_removes_a_queues_accumulate(api: ApiServer, feed: Feed) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    changed = api.client.put("/api/v1/queues/docs", json={"accumulate": {"pages": "sum"}}, headers=auth)
    assert changed.status_code == 200, changed.text
    assert changed.json()["accumulate"] == {"pages": "sum"}
    for bad, says in (({"pages": "avg"}, "operation must be one of"), ({"pages": 1}, "operation must be one of")):
        refused = api.client.put("/api/v1/queues/docs", json={"limit": 3, "accumulate": bad}, headers=auth)
        assert refused.status_code == 400 and says in refused.json()["error"], refused.text
    wrong_type = api.client.put("/api/v1/queues/docs", json={"accumulate": ["pages"]}, headers=auth)
    assert wrong_type.status_code == 422 and "error" in wrong_type.json()
    assert (feed.queue("docs").limit, feed.queue("docs").accumulate) == (None, {"pages": "sum"})
    cleared = api.client.put("/api/v1/queues/docs", json={"accumulate": {}}, headers=auth)
    assert cleared.json()["accumulate"] == {}


def accumulate_some(feed: Feed) -> None:
    """Partition "p": two answers accumulated (pages 12, best 0.97), one item left."""
    feed.add_partition("p", [(0, b"{}"), (0, b"{}"), (1, b"{}")])
    register(feed.store, A)
    first, second = [r for r in lease_and_fetch(feed.store) if r.partition == "p"]
    operations = {"pages": "sum", "best": "max"}
    feed.store.apply(
        A,
        [
            answer(first, Kind.DONE, accumulate={"pages": 5, "best": 0.5}, operations=operations),
            answer(second, Kind.DONE, accumulate={"pages": 7, "best": 0.97}, operations=operations),
        ],
    )


def test_status_shows_the_accumulator(db_url: str, feed: Feed) -> None:
    accumulate_some(feed)
    text = run_cli(db_url, "status", "p").stdout
    assert "accumulated: best 0.97, pages 12" in text
    assert json.loads(run_cli(db_url, "status", "p", "--json").stdout)["accumulated"] == {"best": 0.97, "pages": 12}


def test_the_api_and_the_dashboard_show_the_accumulator(api: ApiServer, feed: Feed) -> None:
    accumulate_some(feed)
    assert api.get("/api/v1/partitions/p").json()["accumulated"] == {"best": 0.97, "pages": 12}
    page = api.get("/partitions/p").text
    assert 'class="accumulated"' in page and '<b class="mono">best</b> 0.97' in page and "pages</b> 12" in page
