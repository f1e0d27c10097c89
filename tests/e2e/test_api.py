"""The HTTP API of `feedproc serve` (issue 6), through real HTTP on a real socket, on SQLite and
PostgreSQL: the same rules and errors as the command line, JSON errors that change nothing,
bearer-token auth on every mutation, keyset pagination and a body size limit."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from feedproc import Feed
from feedproc.core.records import Kind

from ..api_support import AUTH, TOKEN, ApiServer, ServeProcess
from ..support import db_state, metric, register, run_cli, work_off

# Requests rejected before any database access (schema, auth, size) behave the same on every database:
# those tests run on SQLite only, to keep the suite fast.
before_any_database_access = pytest.mark.sqlite_only


@pytest.fixture
def api(db_url: str) -> Iterator[ApiServer]:
    server = ApiServer(db_url)
    yield server
    server.close()


def create(api: ApiServer, key: str, items: list[dict[str, Any]] | None = None, **fields: Any) -> httpx.Response:
    return api.post("/api/v1/partitions", {"key": key, "items": items or [], **fields})


def error_of(response: httpx.Response, status: int) -> str:
    """The `error` of a JSON error answer with `status`."""
    assert response.status_code == status, f"expected {status}, got {response.status_code}: {response.text}"
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"} and body["error"], body
    return body["error"]


# ---------------------------------------------------------------- creating and adding


def test_create_answers_201_with_the_partitions_status_object(api: ApiServer, feed: Feed) -> None:
    response = create(api, "upload-1", [{"gate": 0, "data": {"f": "a.pdf"}}, {"gate": 2, "data": [1, 2]}], priority=5)
    assert response.status_code == 201, response.text
    assert response.json() == {"key": "upload-1", "added": 2, "partition": feed.status("upload-1").to_json()}
    assert [i.data for i in feed.items("upload-1")] == [b'{"f":"a.pdf"}', b"[1,2]"]


def test_an_item_without_a_gate_is_added_at_gate_0(api: ApiServer, feed: Feed) -> None:
    assert create(api, "no-gate", [{"data": {"f": "a.pdf"}}]).status_code == 201
    assert [(i.gate, i.data) for i in feed.items("no-gate")] == [(0, b'{"f":"a.pdf"}')]


def test_get_partition_is_the_status_json_of_the_command_line(api: ApiServer, db_url: str) -> None:
    create(api, "a/b:c", [{"gate": 1, "data": None}], queue="ocr")
    cli = run_cli(db_url, "status", "a/b:c", "--json")
    assert cli.returncode == 0, cli.stderr
    response = api.get("/api/v1/partitions/a/b:c")
    assert response.status_code == 200
    assert response.json() == json.loads(cli.stdout)


def test_get_partition_with_history_includes_its_events(api: ApiServer) -> None:
    create(api, "p", [{"gate": 0}])
    body = api.get("/api/v1/partitions/p", params={"history": 10}).json()
    assert [event["kind"] for event in body["history"]] == ["created"]


def test_summary_is_the_status_json_without_a_key(api: ApiServer, feed: Feed) -> None:
    create(api, "p", [{"gate": 0}, {"gate": 0}])
    assert api.get("/api/v1/status").json() == feed.summary().to_json()


def test_create_with_an_existing_key_is_409_and_writes_nothing(api: ApiServer, feed: Feed) -> None:
    create(api, "p", [{"gate": 0}])
    before = db_state(feed)
    assert "exists already" in error_of(create(api, "p", [{"gate": 1}]), 409)
    assert db_state(feed) == before


def test_create_with_an_invalid_key_is_400_naming_the_rule(api: ApiServer, feed: Feed) -> None:
    message = error_of(create(api, "bad key!", [{"gate": 0}]), 400)
    assert "invalid partition key" in message and "A-Z a-z 0-9" in message
    assert feed.summary().partitions["available"] == 0


@before_any_database_access
@pytest.mark.parametrize(
    "items",
    [[{"gate": -1}], [{"gate": "1"}], [{"gate": 1.5}], [{"gate": True}], [{"gate": 0, "colour": "red"}], ["x"]],
    ids=["negative gate", "gate as text", "fractional gate", "gate as bool", "unknown field", "not an object"],
)
def test_malformed_items_are_422_and_write_nothing(api: ApiServer, feed: Feed, items: list[Any]) -> None:
    before = db_state(feed)
    error_of(create(api, "p", items), 422)
    assert db_state(feed) == before


@before_any_database_access
@pytest.mark.parametrize(
    ("item", "says"),
    [
        ({"gate": -1}, "items[1].gate must be an integer >= 0 or a gate name, got -1"),
        ({"gate": "1"}, 'items[1].gate must be an integer >= 0 or a gate name, got "1"'),
        ({"gate": True}, "items[1].gate must be an integer >= 0 or a gate name, got true"),
        ({"gate": 2**31}, "items[1].gate must be at most 2147483647, got 2147483648"),
        ({"gate": 2, "collect": -1}, "items[1].collect must be an integer >= 0 or a gate name, got -1"),
    ],
)
def test_a_malformed_gate_is_422_in_the_command_lines_words_naming_its_place(
    api: ApiServer, item: dict[str, Any], says: str
) -> None:
    assert error_of(create(api, "p", [{"gate": 0}, item]), 422) == says


@before_any_database_access
def test_a_malformed_gate_of_an_item_action_is_422_in_the_command_lines_words(api: ApiServer) -> None:
    response = api.post("/api/v1/items/retry", {"partition": "p", "gate": -1})
    assert error_of(response, 422) == "gate must be an integer >= 0 or a gate name, got -1"


@before_any_database_access
def test_a_tolerance_neither_count_nor_percentage_is_422_in_the_command_lines_words(api: ApiServer) -> None:
    says = 'tolerate must be a count (an integer >= 0) or a percentage like "5%", got 1.5'
    assert error_of(create(api, "p", tolerate=1.5), 422) == says


@before_any_database_access
def test_a_body_that_is_not_json_is_400(api: ApiServer) -> None:
    response = api.post("/api/v1/partitions", content=b"{not json", headers={"Content-Type": "application/json"})
    assert "JSON" in error_of(response, 400)


@before_any_database_access
def test_an_unknown_field_in_the_partition_is_422(api: ApiServer) -> None:
    assert "colour" in error_of(create(api, "p", colour="red"), 422)


def test_a_bad_not_before_is_400(api: ApiServer, feed: Feed) -> None:
    assert "not_before" in error_of(create(api, "p", not_before="next tuesday"), 400)
    assert feed.summary().partitions["available"] == 0


def test_not_before_without_a_zone_is_utc(api: ApiServer) -> None:
    body = create(api, "p", [{"gate": 0}], not_before="2030-01-02T03:04:05").json()
    assert body["partition"]["not_before"] == "2030-01-02T03:04:05.000Z"


def test_add_items_to_an_open_partition(api: ApiServer, feed: Feed) -> None:
    create(api, "p", [{"gate": 0}], open=True)
    response = api.post("/api/v1/partitions/p/items", {"items": [{"gate": 0, "data": 1}, {"gate": 3, "data": 2}]})
    assert response.status_code == 200, response.text
    assert response.json()["added"] == 2
    assert feed.status("p").items["total"] == 3


def test_add_items_to_a_sealed_partition_is_409_and_writes_nothing(api: ApiServer, feed: Feed) -> None:
    create(api, "p", [{"gate": 0}])
    before = db_state(feed)
    assert "sealed" in error_of(api.post("/api/v1/partitions/p/items", {"items": [{"gate": 0}]}), 409)
    assert db_state(feed) == before


def test_add_items_below_the_partitions_gate_is_409_and_writes_nothing(api: ApiServer, feed: Feed) -> None:
    create(api, "p", [{"gate": 2}], open=True)
    before = db_state(feed)
    response = api.post("/api/v1/partitions/p/items", {"items": [{"gate": 2}, {"gate": 1}]})
    assert "item 2: gate 1 is below the partition's current gate 2" in error_of(response, 409)
    assert db_state(feed) == before


def test_add_items_to_an_unknown_partition_is_404(api: ApiServer) -> None:
    assert "no partition" in error_of(api.post("/api/v1/partitions/nope/items", {"items": [{"gate": 0}]}), 404)


# ---------------------------------------------------------------- actions


def test_seal_completes_a_drained_open_partition(api: ApiServer) -> None:
    create(api, "p", open=True)
    response = api.post("/api/v1/partitions/p/seal")
    assert response.status_code == 200, response.text
    assert response.json()["partition"]["status"] == "complete"


def test_retry_puts_a_failed_partition_back_to_work(api: ApiServer, store: Any) -> None:
    create(api, "p", [{"gate": 0}, {"gate": 0}])
    register(store, "watcher-a")
    work_off(store, "p", Kind.FAIL, watcher="watcher-a")
    response = api.post("/api/v1/partitions/p/retry")
    assert response.status_code == 200, response.text
    assert response.json()["retried"] == 2
    assert response.json()["partition"]["status"] == "available"
    assert response.json()["partition"]["items"]["available"] == 2


def test_retry_of_a_partition_that_did_not_fail_is_409(api: ApiServer, feed: Feed) -> None:
    create(api, "p", [{"gate": 0}])
    before = db_state(feed)
    assert "not failed" in error_of(api.post("/api/v1/partitions/p/retry"), 409)
    assert db_state(feed) == before


def test_cancel_cancels_the_partition_and_its_available_items(api: ApiServer) -> None:
    create(api, "a/b", [{"gate": 0}, {"gate": 1}])
    body = api.post("/api/v1/partitions/a/b/cancel").json()
    assert body["partition"]["status"] == "cancelled"
    assert body["partition"]["items"]["cancelled"] == 2


def test_cancel_of_a_complete_partition_is_409(api: ApiServer) -> None:
    create(api, "p")
    assert "complete" in error_of(api.post("/api/v1/partitions/p/cancel"), 409)


def test_checkpoint_advances_a_drained_manual_checkpoint_partition(api: ApiServer, store: Any) -> None:
    create(api, "p", [{"gate": 0}, {"gate": 2}], manual_checkpoint=True)
    register(store, "watcher-a")
    work_off(store, "p", Kind.DONE, watcher="watcher-a")
    response = api.post("/api/v1/partitions/p/checkpoint")
    assert response.status_code == 200, response.text
    assert response.json()["gate"] == 2 and response.json()["partition"]["gate"] == 2


def test_checkpoint_while_the_gate_has_work_is_409(api: ApiServer) -> None:
    create(api, "p", [{"gate": 0}, {"gate": 2}], manual_checkpoint=True)
    assert "still has available items" in error_of(api.post("/api/v1/partitions/p/checkpoint"), 409)


def test_unknown_partition_is_404_for_reads_and_actions(api: ApiServer) -> None:
    assert "no partition 'nope'" in error_of(api.get("/api/v1/partitions/nope"), 404)
    for action in ("seal", "retry", "cancel", "checkpoint"):
        error_of(api.post(f"/api/v1/partitions/nope/{action}"), 404)


# ---------------------------------------------------------------- reading lists


def test_list_filters_by_queue_status_and_key_prefix(api: ApiServer) -> None:
    create(api, "up/1", [{"gate": 0}], queue="ocr")
    create(api, "up/2", queue="ocr")  # empty and sealed: complete at once
    create(api, "Up/3", [{"gate": 0}], queue="ocr")
    create(api, "down/1", [{"gate": 0}])

    def keys(**params: Any) -> list[str]:
        response = api.get("/api/v1/partitions", params=params)
        assert response.status_code == 200, response.text
        return [p["key"] for p in response.json()["items"]]

    assert keys(queue="ocr") == ["Up/3", "up/1", "up/2"]
    assert keys(prefix="up/") == ["up/1", "up/2"]  # case-sensitive
    assert keys(queue="ocr", status="available", prefix="up") == ["up/1"]
    assert keys(status="complete") == ["up/2"]


def test_list_pages_through_every_partition_once_by_key(api: ApiServer) -> None:
    for n in range(7):
        create(api, f"p{n}", [{"gate": 0}])
    seen, after, pages = [], None, 0
    while True:
        params = {"limit": 3, **({"after": after} if after else {})}
        page = api.get("/api/v1/partitions", params=params).json()
        seen += [p["key"] for p in page["items"]]
        pages += 1
        after = page["next"]
        if after is None:
            break
    assert seen == [f"p{n}" for n in range(7)] and pages == 3


def test_list_rows_carry_per_gate_counts(api: ApiServer) -> None:
    create(api, "p", [{"gate": 0}, {"gate": 0}, {"gate": 1}])
    [row] = api.get("/api/v1/partitions").json()["items"]
    assert row["items"]["total"] == 3
    assert row["gates"]["0"]["available"] == 2 and row["gates"]["1"]["available"] == 1


@before_any_database_access
def test_list_limit_above_the_cap_is_422(api: ApiServer) -> None:
    assert "limit" in error_of(api.get("/api/v1/partitions", params={"limit": 100_000}), 422)


@before_any_database_access
def test_list_with_a_bad_status_filter_is_422(api: ApiServer) -> None:
    error_of(api.get("/api/v1/partitions", params={"status": "lost"}), 422)


def test_history_pages_through_a_partitions_events(api: ApiServer) -> None:
    create(api, "p", [{"gate": 0}], open=True)
    api.post("/api/v1/partitions/p/items", {"items": [{"gate": 0}]})
    api.post("/api/v1/partitions/p/cancel")
    first = api.get("/api/v1/history", params={"key": "p", "limit": 2}).json()
    assert [e["kind"] for e in first["items"]] == ["created", "items_added"]
    rest = api.get("/api/v1/history", params={"key": "p", "after": first["next"]}).json()
    assert [e["kind"] for e in rest["items"]] == ["cancelled"] and rest["next"] is None


def test_items_lists_a_partitions_items_with_their_json_data(api: ApiServer) -> None:
    create(api, "p", [{"gate": 0, "data": {"x": "<b>"}}, {"gate": 1, "data": 7}])
    body = api.get("/api/v1/items", params={"key": "p", "gate": 1}).json()
    assert [(i["gate"], i["data"], i["status"]) for i in body["items"]] == [(1, 7, "available")]


def test_watchers_lists_watchers_with_heartbeats_and_their_leases(api: ApiServer, store: Any) -> None:
    create(api, "p", [{"gate": 0}])
    register(store, "watcher-a")
    store.acquire("watcher-a", "default", 10, 30)
    body = api.get("/api/v1/watchers").json()
    [watcher] = body["watchers"]
    assert watcher["id"] == "watcher-a" and watcher["alive"] and watcher["leases"] == 1 and watcher["heartbeat_at"]
    assert [(lease["key"], lease["owner"]) for lease in body["leases"]] == [("p", "watcher-a")]


def test_failures_lists_recently_failed_partitions_with_an_error(api: ApiServer, store: Any) -> None:
    create(api, "p", [{"gate": 0}])
    register(store, "watcher-a")
    work_off(store, "p", Kind.FAIL, watcher="watcher-a")
    [failure] = api.get("/api/v1/failures").json()["items"]
    assert failure["key"] == "p" and failure["error"] == "boom"


# ---------------------------------------------------------------- auth and limits


@before_any_database_access
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}])
def test_mutations_without_the_right_bearer_token_are_401_and_change_nothing(
    api: ApiServer, feed: Feed, headers: dict[str, str]
) -> None:
    create(api, "p", [{"gate": 0}], open=True)
    before = db_state(feed)
    for path, body in [
        ("/api/v1/partitions", {"key": "q"}),
        ("/api/v1/partitions/p/items", {"items": [{"gate": 0}]}),
        ("/api/v1/partitions/p/seal", None),
        ("/api/v1/partitions/p/cancel", None),
    ]:
        response = api.post(path, body, auth=False, headers=headers)
        assert "bearer token" in error_of(response, 401)
        assert response.headers["www-authenticate"] == "Bearer"
    assert db_state(feed) == before


@before_any_database_access
def test_reads_need_no_token(api: ApiServer) -> None:
    create(api, "p")
    for path in ("/api/v1/partitions", "/api/v1/partitions/p", "/api/v1/watchers", "/api/v1/status"):
        assert api.get(path).status_code == 200, path


@before_any_database_access
def test_a_server_without_a_token_is_read_only(db_url: str, feed: Feed) -> None:
    server = ApiServer(db_url, token=None)
    try:
        assert "read-only" in error_of(server.post("/api/v1/partitions", {"key": "p"}), 403)
        assert server.get("/api/v1/partitions").status_code == 200
    finally:
        server.close()
    assert feed.summary().partitions["complete"] == 0


@before_any_database_access
def test_a_body_over_the_limit_is_413_and_writes_nothing(db_url: str, feed: Feed) -> None:
    server = ApiServer(db_url, max_body=1000)
    try:
        big = [{"gate": 0, "data": "x" * 100} for _ in range(20)]
        assert "larger than 1000 bytes" in error_of(server.post("/api/v1/partitions", {"key": "p", "items": big}), 413)
        chunked = server.client.post(  # no Content-Length: counted as it streams in
            "/api/v1/partitions",
            content=iter([b'{"key": "p", "items": [', b'{"gate": 0},' * 200, b"{}]}"]),
            headers={**AUTH, "Content-Type": "application/json"},
        )
        error_of(chunked, 413)
        assert server.post("/api/v1/partitions", {"key": "small"}).status_code == 201
    finally:
        server.close()
    assert [p["key"] for p in feed.store.list_partitions()] == ["small"]


def test_more_items_in_one_request_than_the_limit_is_413_naming_it_and_writes_nothing(db_url: str, feed: Feed) -> None:
    server = ApiServer(db_url, max_items=3)
    try:
        assert server.post("/api/v1/partitions", {"key": "open", "open": True}).status_code == 201
        before = db_state(feed)
        four = [{"data": n} for n in range(4)]
        for path, body in (
            ("/api/v1/partitions", {"key": "p", "items": four}),
            ("/api/v1/partitions/open/items", {"items": four}),
        ):
            assert error_of(server.post(path, body), 413) == (
                "4 items in one request; the limit is 3 (feedproc serve --max-items): send them in several requests"
            )
        assert db_state(feed) == before
        assert server.post("/api/v1/partitions/open/items", {"items": four[:3]}).json()["added"] == 3
    finally:
        server.close()


@before_any_database_access
def test_the_default_limit_is_100_000_items_a_request(api: ApiServer, feed: Feed) -> None:
    over = api.post("/api/v1/partitions", {"key": "p", "items": [{}] * 100_001})
    assert "100001 items in one request; the limit is 100000" in error_of(over, 413)
    assert feed.store.list_partitions() == []


# ---------------------------------------------------------------- the document, unknown routes, health


@before_any_database_access
def test_the_openapi_document_describes_the_api(api: ApiServer) -> None:
    document = api.get("/api/v1/openapi.json").json()
    assert document["openapi"].startswith("3.")
    for path in (
        "/api/v1/partitions",
        "/api/v1/partitions/{key}",
        "/api/v1/partitions/{key}/retry",
        "/api/v1/watchers",
    ):
        assert path in document["paths"], path
    assert "HTTPBearer" in document["components"]["securitySchemes"]


@before_any_database_access
def test_unknown_routes_are_json_404(api: ApiServer) -> None:
    error_of(api.get("/api/v1/nothing-here"), 404)


def test_healthz_is_200_when_the_database_answers(api: ApiServer) -> None:
    response = api.get("/healthz")
    assert response.status_code == 200 and response.json()["status"] == "ok"


def test_healthz_is_503_with_a_reason_without_the_schema(unmigrated_url: str) -> None:
    server = ApiServer(unmigrated_url)
    try:
        response = server.get("/healthz")
        assert response.status_code == 503
        assert "feedproc migrate" in response.json()["reasons"][0]
        assert "feedproc migrate" in error_of(server.get("/api/v1/partitions"), 503)
    finally:
        server.close()


def test_metrics_show_backlog_and_partitions_by_queue(api: ApiServer) -> None:
    create(api, "p", [{"gate": 0}, {"gate": 0}], queue="ocr")
    response = api.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert metric(response.text, "feedproc_backlog_items", queue="ocr") == 2
    assert metric(response.text, "feedproc_partitions", queue="ocr", status="available") == 1


# ---------------------------------------------------------------- the `feedproc serve` command


@before_any_database_access
def test_serve_refuses_to_listen_beyond_loopback_without_a_token(db_url: str) -> None:
    result = run_cli(db_url, "serve", "--host", "0.0.0.0", "--port", "0")
    assert result.returncode == 1
    assert "FEEDPROC_API_TOKEN" in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.every_database
def test_serve_process_answers_the_api_with_its_token(db_url: str, tmp_path: Path) -> None:
    serve = ServeProcess(db_url, tmp_path, FEEDPROC_API_TOKEN=TOKEN)
    try:
        created = httpx.post(f"{serve.url}/api/v1/partitions", json={"key": "p", "items": [{}]}, headers=AUTH)
        assert created.status_code == 201, created.text
        denied = httpx.post(f"{serve.url}/api/v1/partitions/p/cancel")
        assert denied.status_code == 401
        assert httpx.get(f"{serve.url}/api/v1/partitions/p").json()["status"] == "available"
        assert httpx.get(f"{serve.url}/healthz").json()["status"] == "ok"
    finally:
        serve.stop()
    assert serve.process.returncode == 0, serve.log()


def test_partitions_list_by_activity_pages_by_offset(api: ApiServer, feed: Feed) -> None:
    for key in ("a", "b", "c"):
        feed.add_partition(key, [(0, b"1")])
    first = api.get("/api/v1/partitions", params={"sort": "age", "limit": 2}).json()
    assert [p["key"] for p in first["items"]] == ["a", "b"] and first["next_offset"] == 2
    rest = api.get("/api/v1/partitions", params={"sort": "age", "limit": 2, "offset": 2}).json()
    assert [p["key"] for p in rest["items"]] == ["c"] and rest["next_offset"] is None


@before_any_database_access
def test_after_with_another_sort_than_key_is_400(api: ApiServer) -> None:
    assert "offset" in error_of(api.get("/api/v1/partitions", params={"sort": "age", "after": "a"}), 400)
