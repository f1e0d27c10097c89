"""Priorities at the doors (issue 34): `feedproc priority KEY N` (exit 0, 1 for an unknown key, 2 for
a malformed or out-of-range N, one line), `queue set --priority/--weight`, the API's
`POST /partitions/KEY/priority`, a queue's defaults over `PUT /queues/NAME`, 64-bit priorities added
over the API, pull claims with `min_priority`/`max_priority`, and the partition page's control.

The commands run in this process (the `cli` fixture: `feedproc.cli.main`, what the console script
calls): a process each took 5 s on a loaded machine, and parsing, exit codes and output are the same."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from feedproc import Feed
from feedproc.core.models import MAX_PRIORITY, MIN_PRIORITY

from ..api_support import AUTH, ApiServer
from ..support import db_state

WORKER_TOKEN = "worker-token-priorities"


@pytest.fixture
def api(db_url: str) -> Iterator[ApiServer]:
    server = ApiServer(db_url, worker_token=WORKER_TOKEN)
    yield server
    server.close()


def one_line(result: tuple[int, str, str], code: int, says: str) -> None:
    returncode, stdout, stderr = result
    assert (returncode, stdout) == (code, ""), stderr
    assert says in stderr and stderr.count("\n") == 1, stderr


def test_the_cli_changes_a_priority_to_either_64_bit_end(cli: Callable[..., tuple[int, str, str]], feed: Feed) -> None:
    feed.add_partition("p", [(0, b"1")], priority=3)

    assert cli("priority", "p", str(MIN_PRIORITY)) == (0, f"p: priority {MIN_PRIORITY} (was 3)\n", "")  # not an option
    assert cli("priority", "p", str(MAX_PRIORITY))[0] == 0

    assert feed.status("p").priority == MAX_PRIORITY
    one_line(cli("priority", "nope", "1"), 1, "no partition 'nope'")


@pytest.mark.sqlite_only  # refused before the database is written: the same on every database
@pytest.mark.parametrize("n", [str(MAX_PRIORITY + 1), str(MIN_PRIORITY - 1), "high", "1.5", "9" * 40])
def test_the_cli_refuses_a_priority_outside_64_bits_in_one_line(
    cli: Callable[..., tuple[int, str, str]], feed: Feed, n: str
) -> None:
    feed.add_partition("p", [(0, b"1")])
    before = db_state(feed)
    one_line(cli("priority", "p", n), 2, "priority must be an integer from -9223372036854775808")
    assert db_state(feed) == before


def test_queue_set_gives_a_queue_a_default_priority_and_weight(
    cli: Callable[..., tuple[int, str, str]], feed: Feed
) -> None:
    code, out, err = cli("queue", "set", "q", "--priority", "-4", "--weight", "2")
    assert code == 0 and out.rstrip().endswith("default priority -4, default weight 2"), err
    feed.add_partition("p", [(0, b"1")], queue="q")
    assert feed.status("p").priority == -4
    one_line(cli("queue", "set", "q", "--priority", str(MAX_PRIORITY + 1)), 2, "default priority must be")


def test_the_api_changes_a_priority_and_answers_404_and_422_changing_nothing(api: ApiServer, feed: Feed) -> None:
    feed.add_partition("a/b", [(0, b"1")])

    changed = api.post("/api/v1/partitions/a/b/priority", {"priority": MAX_PRIORITY})
    assert changed.status_code == 200, changed.text
    assert (changed.json()["was"], changed.json()["partition"]["priority"]) == (0, MAX_PRIORITY)
    assert feed.history("a/b")[-1].detail == {"priority": MAX_PRIORITY, "was": 0, "by": "api"}

    assert api.post("/api/v1/partitions/nope/priority", {"priority": 1}).status_code == 404
    for bad in (MAX_PRIORITY + 1, MIN_PRIORITY - 1, "1", None):
        refused = api.post("/api/v1/partitions/a/b/priority", {"priority": bad})
        assert refused.status_code == 422 and "priority" in refused.json()["error"], refused.text
    assert api.post("/api/v1/partitions/a/b/priority", {"priority": 1}, auth=False).status_code == 401
    assert feed.status("a/b").priority == MAX_PRIORITY


def test_the_api_adds_64_bit_priorities_and_a_queues_defaults(api: ApiServer, feed: Feed) -> None:
    settings = api.client.put("/api/v1/queues/q", json={"priority": MIN_PRIORITY, "weight": 5}, headers=AUTH)
    assert settings.status_code == 200, settings.text
    assert (settings.json()["priority"], settings.json()["weight"]) == (MIN_PRIORITY, 5)
    for body in ({"key": "own", "priority": MAX_PRIORITY}, {"key": "defaulted"}):
        added = api.post("/api/v1/partitions", {**body, "queue": "q", "items": [{"data": 1}]})
        assert added.status_code == 201, added.text
    assert (feed.status("own").priority, feed.status("defaulted").priority) == (MAX_PRIORITY, MIN_PRIORITY)
    assert feed.status("defaulted").schedule.weight == 5
    cleared = api.client.put("/api/v1/queues/q", json={"clear_defaults": True}, headers=AUTH)
    assert (cleared.json()["priority"], cleared.json()["weight"]) == (None, None), cleared.text
    too_big = api.post("/api/v1/partitions", {"key": "big", "priority": MAX_PRIORITY + 1, "items": [{"data": 1}]})
    assert too_big.status_code == 422, too_big.text


def test_an_api_claim_takes_only_partitions_within_its_priority_range(api: ApiServer, feed: Feed) -> None:
    feed.set_queue("gpu", mode="pull")
    for key, priority in (("low", MIN_PRIORITY), ("mid", 0), ("high", MAX_PRIORITY)):
        feed.add_partition(key, [(0, b"1")], queue="gpu", priority=priority)
    worker = {"Authorization": f"Bearer {WORKER_TOKEN}"}

    def claim(**bounds: int) -> list[str]:
        response = api.client.post("/api/v1/queues/gpu/claim", json={"worker": "w", **bounds}, headers=worker)
        assert response.status_code == 200, response.text
        return [item["partition"] for item in response.json()["items"]]

    assert claim(min_priority=MIN_PRIORITY, max_priority=-1) == ["low"]
    assert claim(min_priority=1) == ["high"]
    refused = api.client.post("/api/v1/queues/gpu/claim", json={"worker": "w", "max_priority": 2**63}, headers=worker)
    assert refused.status_code == 422, refused.text
    assert claim() == ["mid"]


@pytest.mark.sqlite_only
def test_the_partition_page_has_a_priority_control(api: ApiServer, feed: Feed) -> None:
    feed.add_partition("p", [(0, b"1")], priority=MAX_PRIORITY)
    page = api.get("/partitions/p").text
    assert 'data-priority-key="p"' in page and f'value="{MAX_PRIORITY}"' in page
