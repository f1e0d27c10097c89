"""Partition limits and aging at the doors (issue 34): `feedproc add --partition-limit`, `queue set
--partition-limit/--aging/--no-aging` (exit 2 and one line for a malformed value, nothing written),
and the API's `partition_limit` on POST /partitions and PUT /queues, `aging` on PUT /queues (422
for a malformed value).

The commands run in this process (the `cli` fixture, tests/e2e/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from feedproc import Feed

from ..api_support import AUTH, ApiServer
from ..support import db_state


@pytest.fixture
def api(db_url: str) -> Iterator[ApiServer]:
    server = ApiServer(db_url)
    yield server
    server.close()


def test_the_cli_sets_a_partitions_and_a_queues_partition_limit(
    cli: Callable[..., tuple[int, str, str]], feed: Feed
) -> None:
    assert cli("add", "p", "--open", "--partition-limit", "3")[0] == 0
    assert feed.status("p").schedule.partition_limit == 3
    code, out, _ = cli("queue", "set", "ocr", "--partition-limit", "5")
    assert code == 0 and "partition limit 5" in out
    assert feed.queue("ocr").partition_limit == 5
    code, out, _ = cli("queue", "show", "ocr")
    assert "partition limit 5" in out


@pytest.mark.parametrize("bad", ["0", "-2", "x", "2147483648"])
def test_a_malformed_partition_limit_at_add_is_exit_2_and_writes_nothing(
    cli: Callable[..., tuple[int, str, str]], feed: Feed, bad: str
) -> None:
    before = db_state(feed)
    code, out, err = cli("add", "p", "--open", "--partition-limit", bad)
    assert (code, out) == (2, "") and "--partition-limit" in err
    assert db_state(feed) == before


def test_the_cli_sets_and_removes_a_queues_aging(cli: Callable[..., tuple[int, str, str]], feed: Feed) -> None:
    code, out, _ = cli("queue", "set", "ocr", "--aging", "1 per 10s")
    assert code == 0 and "aging 1 per 10s" in out
    assert feed.queue("ocr").aging == 10.0
    assert cli("queue", "set", "ocr", "--aging", "2m")[0] == 0
    assert feed.queue("ocr").aging == 120.0
    assert cli("queue", "set", "ocr", "--no-aging")[0] == 0
    assert feed.queue("ocr").aging is None


@pytest.mark.parametrize("bad", ["0", "soon", "0 per 10s", "x per 10s", "1 per -3s"])
def test_a_malformed_aging_is_exit_2_in_one_line_and_changes_nothing(
    cli: Callable[..., tuple[int, str, str]], feed: Feed, bad: str
) -> None:
    feed.set_queue("ocr", aging=30)
    code, out, err = cli("queue", "set", "ocr", "--aging", bad, "--limit", "4")
    assert (code, out) == (2, "") and "--aging" in err and err.count("\n") == 1, err
    assert (feed.queue("ocr").aging, feed.queue("ocr").limit) == (30.0, None)


def test_the_api_takes_partition_limits_and_aging(api: ApiServer, feed: Feed) -> None:
    added = api.post("/api/v1/partitions", {"key": "p", "partition_limit": 2, "items": [{"data": 1}]})
    assert added.status_code == 201, added.text
    assert feed.status("p").schedule.partition_limit == 2
    changed = api.client.put("/api/v1/queues/ocr", json={"partition_limit": 7, "aging": 15}, headers=AUTH)
    assert changed.status_code == 200, changed.text
    assert (changed.json()["partition_limit"], changed.json()["aging"]) == (7, 15.0)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/v1/partitions", {"key": "q", "partition_limit": 0, "items": [{"data": 1}]}),
        ("/api/v1/partitions", {"key": "q", "partition_limit": "2", "items": [{"data": 1}]}),
        ("/api/v1/queues/ocr", {"partition_limit": -1}),
        ("/api/v1/queues/ocr", {"aging": -5}),
    ],
)
def test_a_malformed_value_over_the_api_is_a_422_and_changes_nothing(
    api: ApiServer, feed: Feed, path: str, body: dict[str, object]
) -> None:
    before = db_state(feed)
    put = api.client.put
    refused = api.post(path, body) if path.endswith("partitions") else put(path, json=body, headers=AUTH)
    assert refused.status_code == 422, refused.text
    assert "error" in refused.json() or "detail" in refused.json()
    assert db_state(feed) == before
