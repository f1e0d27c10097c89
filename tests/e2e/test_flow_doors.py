"""Concurrency groups and rate limits at the doors (issue 34): `feedproc add --group`, `queue set
--group-limit/--rate/--group-rate` (0 clears; exit 2 and one line naming the option for a malformed
value, nothing written), `status` and `queue show` printing them; the API's `group` on POST
/partitions and `group_limit`, `rate`, `group_rate` on PUT /queues (422 for a malformed value); and
the dashboard's queue page with each group's weight in flight.

The commands run in this process (the `cli` fixture, tests/e2e/conftest.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from feedproc import Feed

from ..api_support import AUTH, ApiServer
from ..support import db_state

Cli = Callable[..., tuple[int, str, str]]


@pytest.fixture
def api(db_url: str) -> Iterator[ApiServer]:
    server = ApiServer(db_url)
    yield server
    server.close()


def in_flight(feed: Feed) -> None:
    """Pull queue `pulled` (group limit 4) with acme's items (4 claimed: its limit) and globex's
    (its 2) in flight."""
    feed.set_queue("pulled", mode="pull", group_limit=4)
    feed.add_partition("acme-1", [(0, b"1")] * 6, queue="pulled", group="acme")
    feed.add_partition("globex-1", [(0, b"1")] * 2, queue="pulled", group="globex")
    feed.claim("pulled", "w1", max_items=20)


def flow_of(feed: Feed, name: str) -> tuple[object, ...]:
    queue = feed.queue(name)
    return queue.group_limit, queue.rate, queue.group_rate, queue.limit


# ---------------------------------------------------------------- the command line


def test_add_group_shows_in_status_json(cli: Cli) -> None:
    assert cli("add", "p", "--open", "--group", "acme")[0] == 0
    code, out, _ = cli("status", "p", "--json")
    assert code == 0 and json.loads(out)["group"] == "acme"


def test_status_prints_the_group_of_a_partition_that_has_one(cli: Cli) -> None:
    cli("add", "grouped", "--open", "--group", "acme")
    cli("add", "loose", "--open")
    assert "  group acme  " in cli("status", "grouped")[1]
    assert "group" not in cli("status", "loose")[1]


def test_queue_set_stores_a_group_limit_a_rate_and_a_group_rate(cli: Cli, feed: Feed) -> None:
    code, out, _ = cli("queue", "set", "ocr", "--group-limit", "3", "--rate", "600/min", "--group-rate", "10/min")
    assert code == 0 and "group limit 3, rate 10/s, group rate 10/min" in out, out
    assert flow_of(feed, "ocr") == (3, "10/s", "10/min", None)
    assert "group limit 3, rate 10/s, group rate 10/min" in cli("queue", "show", "ocr")[1]


def test_queue_set_reads_a_bare_number_as_a_rate_per_second(cli: Cli, feed: Feed) -> None:
    assert cli("queue", "set", "ocr", "--rate", "2.5")[0] == 0
    assert feed.queue("ocr").rate == "150/min"


def test_queue_set_0_clears_the_group_limit_and_the_rates(cli: Cli, feed: Feed) -> None:
    feed.set_queue("ocr", group_limit=3, rate="5/s", group_rate="1/s")
    code, out, _ = cli("queue", "set", "ocr", "--group-limit", "0", "--rate", "0", "--group-rate", "0")
    assert code == 0 and "group limit" not in out and "rate" not in out, out
    assert flow_of(feed, "ocr") == (None, None, None, None)


@pytest.mark.parametrize(
    ("option", "bad"),
    [
        ("--rate", "10/fortnight"),
        ("--rate", "1e3"),
        ("--rate", "-1/s"),
        ("--rate", "0.00001/s"),
        ("--group-rate", "2000000/s"),
        ("--group-rate", "inf"),
        ("--group-rate", "ocr-api"),  # a group's rate is its own: never a shared rate's name
        ("--group-limit", "x"),
        ("--group-limit", "2147483648"),
    ],
)
def test_a_malformed_flow_setting_is_exit_2_in_one_line_naming_it_and_changes_nothing(
    cli: Cli, feed: Feed, option: str, bad: str
) -> None:
    feed.set_queue("ocr", group_limit=2, rate="5/s", group_rate="1/s")
    code, out, err = cli("queue", "set", "ocr", option, bad, "--limit", "4")
    assert (code, out) == (2, "") and option in err and err.count("\n") == 1, err
    assert flow_of(feed, "ocr") == (2, "5/s", "1/s", None)


def test_queue_set_rate_may_name_a_declared_shared_rate(cli: Cli, feed: Feed) -> None:
    feed.set_rate("ocr-api", "600/min")
    code, out, _ = cli("queue", "set", "ocr", "--rate", "ocr-api")
    assert code == 0 and "rate ocr-api" in out, out
    assert feed.queue("ocr").rate == "ocr-api"


def test_queue_set_rate_naming_an_undeclared_shared_rate_is_refused_and_changes_nothing(cli: Cli, feed: Feed) -> None:
    feed.set_queue("ocr", rate="5/s")
    code, out, err = cli("queue", "set", "ocr", "--rate", "nowhere", "--limit", "4")
    assert (code, out) == (1, "") and "nowhere" in err, err
    assert flow_of(feed, "ocr") == (None, "5/s", None, None)


@pytest.mark.parametrize("bad", ["", "   ", "x" * 201])
def test_a_malformed_group_at_add_is_exit_2_in_one_line_and_writes_nothing(cli: Cli, feed: Feed, bad: str) -> None:
    before = db_state(feed)
    code, out, err = cli("add", "p", "--open", "--group", bad)
    assert (code, out) == (2, "") and "--group" in err and err.count("\n") == 1, err
    assert db_state(feed) == before


def test_queue_show_lists_each_groups_weight_in_flight(cli: Cli, feed: Feed) -> None:
    in_flight(feed)
    code, out, _ = cli("queue", "show", "pulled")
    assert code == 0 and "groups in flight acme 4, globex 2" in out, out


# ---------------------------------------------------------------- the HTTP API


def test_the_api_adds_a_partition_with_a_group(api: ApiServer, feed: Feed) -> None:
    added = api.post("/api/v1/partitions", {"key": "p", "group": "acme", "items": [{"data": 1}]})
    assert added.status_code == 201, added.text
    assert added.json()["partition"]["group"] == "acme"
    assert feed.status("p").group == "acme"


def test_the_api_sets_a_queues_group_limit_and_rates_and_0_clears_them(api: ApiServer, feed: Feed) -> None:
    body = {"group_limit": 5, "rate": "600/min", "group_rate": 0.5}
    changed = api.client.put("/api/v1/queues/ocr", json=body, headers=AUTH)
    assert changed.status_code == 200, changed.text
    shown = {key: changed.json().get(key) for key in body}
    assert shown == {"group_limit": 5, "rate": "10/s", "group_rate": "30/min"}
    assert {key: api.get("/api/v1/queues/ocr").json().get(key) for key in body} == shown
    cleared = api.client.put("/api/v1/queues/ocr", json={"group_limit": 0, "rate": 0, "group_rate": "0"}, headers=AUTH)
    assert cleared.status_code == 200, cleared.text
    assert flow_of(feed, "ocr") == (None, None, None, None)


def test_the_api_sets_a_queues_rate_to_a_declared_shared_rate(api: ApiServer, feed: Feed) -> None:
    feed.set_rate("ocr-api", "600/min")
    changed = api.client.put("/api/v1/queues/ocr", json={"rate": "ocr-api"}, headers=AUTH)
    assert changed.status_code == 200, changed.text
    assert changed.json()["rate"] == "ocr-api"


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/v1/queues/ocr", {"rate": "10/fortnight"}, "rate"),
        ("/api/v1/queues/ocr", {"rate": "0.00001/s"}, "rate"),
        ("/api/v1/queues/ocr", {"rate": True}, "rate"),
        ("/api/v1/queues/ocr", {"group_rate": -1}, "group_rate"),
        ("/api/v1/queues/ocr", {"group_rate": "ocr-api"}, "group_rate"),
        ("/api/v1/queues/ocr", {"group_limit": -1}, "group_limit"),
        ("/api/v1/queues/ocr", {"group_limit": "3"}, "group_limit"),
        ("/api/v1/partitions", {"key": "q", "group": "", "items": [{"data": 1}]}, "group"),
        ("/api/v1/partitions", {"key": "q", "group": "   ", "items": [{"data": 1}]}, "group"),
        ("/api/v1/partitions", {"key": "q", "group": 7, "items": [{"data": 1}]}, "group"),
        ("/api/v1/partitions", {"key": "q", "group": "a\u0000b", "items": [{"data": 1}]}, "group"),
    ],
)
def test_a_malformed_flow_value_over_the_api_is_a_422_naming_it_and_changes_nothing(
    api: ApiServer, feed: Feed, path: str, body: dict[str, object], field: str
) -> None:
    feed.set_queue("ocr", group_limit=2, rate="5/s")
    before = db_state(feed)
    put = api.client.put
    refused = api.post(path, body) if path.endswith("partitions") else put(path, json=body, headers=AUTH)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"].startswith(field), refused.text
    assert db_state(feed) == before and flow_of(feed, "ocr") == (2, "5/s", None, None)


# ---------------------------------------------------------------- the dashboard


def test_the_queue_page_shows_each_groups_slots_in_flight_beside_its_limit(api: ApiServer, feed: Feed) -> None:
    in_flight(feed)
    feed.set_queue("pulled", rate="600/min", group_rate="10/min")
    page = api.get("/queues/pulled")
    assert page.status_code == 200
    assert '<tr data-group="acme"><td>acme</td><td>4</td><td>4</td></tr>' in page.text
    assert '<tr data-group="globex"><td>globex</td><td>2</td><td>4</td></tr>' in page.text
    assert 'group limit <b class="group-limit">4</b>' in page.text
    assert 'rate <b class="rate">10/s</b>' in page.text and 'group rate <b class="group-rate">10/min</b>' in page.text


def test_the_queue_page_has_no_groups_table_while_no_group_is_in_flight(api: ApiServer, feed: Feed) -> None:
    feed.set_queue("ocr", group_limit=3)
    assert '<table class="groups">' not in api.get("/queues/ocr").text


# ---------------------------------------------------------------- shared rates


def test_rate_set_list_and_remove_a_shared_rate(cli: Cli, feed: Feed) -> None:
    assert cli("rate", "set", "ocr-api", "600/min")[1].strip() == "rate ocr-api: 10/s"
    code, out, _ = cli("rate", "list", "--json")
    assert code == 0 and [(r["name"], r["rate"]) for r in json.loads(out)] == [("ocr-api", "10/s")]
    assert "ocr-api: 10/s, 10 tokens now" in cli("rate", "list")[1]
    assert cli("rate", "remove", "ocr-api")[0] == 0
    assert feed.rates() == []


@pytest.mark.parametrize(("args", "named"), [(("9lives", "5/s"), "name"), (("api", "5/fortnight"), "rate")])
def test_a_malformed_shared_rate_is_exit_2_in_one_line_and_writes_nothing(
    cli: Cli, feed: Feed, args: tuple[str, str], named: str
) -> None:
    before = db_state(feed)
    code, _, err = cli("rate", "set", *args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and named in err
    assert db_state(feed) == before


def test_a_shared_rate_a_queue_names_is_not_removed(cli: Cli, feed: Feed) -> None:
    feed.set_rate("ocr-api", "5/s")
    feed.set_queue("ocr", rate="ocr-api")
    code, _, err = cli("rate", "remove", "ocr-api")
    assert code == 1 and "queue 'ocr'" in err
    assert [r.name for r in feed.rates()] == ["ocr-api"]


def test_the_api_declares_lists_and_removes_a_shared_rate(api: ApiServer, feed: Feed) -> None:
    put = api.client.put("/api/v1/rates/ocr-api", json={"rate": "600/min"}, headers=AUTH)
    assert put.status_code == 200 and put.json()["per_second"] == 10.0, put.text
    listed = api.client.get("/api/v1/rates", headers=AUTH)
    assert [r["name"] for r in listed.json()["rates"]] == ["ocr-api"]
    assert api.client.delete("/api/v1/rates/ocr-api", headers=AUTH).status_code == 200
    assert api.client.delete("/api/v1/rates/ocr-api", headers=AUTH).status_code == 404


@pytest.mark.parametrize("body", [{"rate": "fast/s"}, {"rate": 0}, {}, {"rate": "5/s", "burst": 3}])
def test_a_malformed_shared_rate_over_the_api_is_a_422_and_writes_nothing(
    api: ApiServer, feed: Feed, body: dict[str, object]
) -> None:
    before = db_state(feed)
    answer = api.client.put("/api/v1/rates/ocr-api", json=body, headers=AUTH)
    assert answer.status_code == 422 and "error" in answer.json(), answer.text
    assert db_state(feed) == before


def test_queue_show_and_the_queue_page_show_a_gates_adaptive_window(cli: Cli, api: ApiServer, feed: Feed) -> None:
    from feedproc.core.flow import GateReport

    feed.store.register_watcher("w", host="h", pid=1, queue="ocr", concurrency=40, capacity=8, lease_seconds=30)
    feed.store.adapt("w", "ocr", {1: GateReport(pushbacks=1, in_flight=20)})  # 20 x 3/4
    assert feed.queue("ocr").adaptive == {"1": 15.0}
    assert "adaptive window gate 1 15" in cli("queue", "show", "ocr")[1]
    page = api.client.get("/queues/ocr", headers=AUTH)
    assert page.status_code == 200 and "gate 1: 15.0" in page.text
