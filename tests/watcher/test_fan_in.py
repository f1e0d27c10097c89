"""Fan-in that joins, at delivery (every database): answers' results kept apart from the items'
data on every way an answer comes (HTTP, a batch, a Python processor, a 202's callback), and the
item at a collecting gate receiving what the collected gate's items produced, with the partition's
accumulator: inline in its request, by a paged `results_url` on `feedproc serve`, in raw requests'
headers, or as `item.collected` for a Python processor. Real watchers, real HTTP over loopback."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import insert, update

from feedproc import Feed, HTTPProcessor, Item, Processor, Response
from feedproc.core.pipelines import parse_toml
from feedproc.store.schema import accumulators, items, partitions

from ..api_support import ApiServer
from ..support import Answer, HandlerService, callback_claims, json_of, wait_status, wait_until, watching

WORKER_TOKEN = "fan-in-worker-token-42"


@pytest.fixture
def api(db_url: str) -> Iterator[ApiServer]:
    server = ApiServer(db_url, worker_token=WORKER_TOKEN)
    yield server
    server.close()


def pipeline(feed: Feed, settings: str = "") -> None:
    """Queue "default": gate 0 `classify`, gate 1 `rank` collecting classify (with `settings`)."""
    gates = '[[gate]]\nname = "classify"\nnumber = 0\n[[gate]]\nname = "rank"\nnumber = 1\ncollect = "classify"\n'
    feed.apply_pipeline(parse_toml(gates + settings))


def files_then_rank(count: int) -> list[dict[str, Any]]:
    return [*({"gate": 0, "data": {"file": f"f{n}"}} for n in range(count)), {"gate": 1, "data": {"top": 1}}]


def labels(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Gate 0: a result per file (its data left alone); any later gate: done."""
    if body["gate"] == 0:
        return 200, {"done": True, "result": {"label": body["data"]["file"].upper()}}
    return 200, {"done": True, "result": "ranked"}


def fan_in_bodies(handler: HandlerService, gate: int = 1) -> list[dict[str, Any]]:
    with handler.lock:
        return [d.body for d in handler.deliveries if d.body.get("gate") == gate]


def stored(feed: Feed, key: str) -> list[tuple[Any, Any]]:
    return [(json_of(i.data), json_of(i.result) if i.result else None) for i in feed.items(key)]


# ---------------------------------------------------------------- results apart from inputs


def test_an_http_handlers_result_is_kept_apart_from_the_items_data(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    handler.behavior = labels
    feed.add_partition("p", [{"gate": 0, "data": {"file": "a"}}, {"gate": 0, "data": {"file": "b"}}])
    with watching(db_url, HTTPProcessor(handler.url)):
        wait_status(feed, "p", "complete")
    assert stored(feed, "p") == [({"file": "a"}, {"label": "A"}), ({"file": "b"}, {"label": "B"})]


def test_a_batch_answers_results_are_each_items_own(db_url: str, feed: Feed, handler: HandlerService) -> None:
    def each(body: dict[str, Any]) -> tuple[int, Any]:
        answers = [{"id": i["id"], "done": True, "result": i["data"]["file"]} for i in body["items"]]
        return 200, {"answers": answers}

    handler.behavior = each
    feed.add_partition("p", [{"gate": 0, "data": {"file": f"f{n}"}} for n in range(4)])
    with watching(db_url, HTTPProcessor(handler.url), batch=4, batch_wait=0.3, concurrency=1):
        wait_status(feed, "p", "complete")
    assert stored(feed, "p") == [({"file": f"f{n}"}, f"f{n}") for n in range(4)]
    assert any("items" in d.body and len(d.body["items"]) > 1 for d in handler.deliveries)


class Labels(Processor):
    """Gate 0: the file's label as the result, bytes that are not JSON for "raw"."""

    def process(self, item: Item) -> Response:
        name = item.json()["file"]
        return Response(done=True, result=b"\x00\xff" if name == "raw" else {"label": name.upper()})


def test_a_python_processors_result_is_kept_apart_from_the_items_data(db_url: str, feed: Feed) -> None:
    feed.add_partition("p", [{"gate": 0, "data": {"file": "a"}}, {"gate": 0, "data": {"file": "raw"}}])
    with watching(db_url, Labels()):
        wait_status(feed, "p", "complete")
    assert [(i.data, i.result) for i in feed.items("p")] == [
        (b'{"file":"a"}', b'{"label":"A"}'),
        (b'{"file":"raw"}', b"\x00\xff"),
    ]


def test_a_callback_answers_result_is_kept_apart(
    db_url: str, feed: Feed, api: ApiServer, handler: HandlerService
) -> None:
    accepted: list[dict[str, Any]] = []

    def behavior(body: dict[str, Any]) -> Answer:
        accepted.append(body)
        return 202, {"accepted": True}

    handler.behavior = behavior
    feed.add_partition("p", [{"gate": 0, "data": {"file": "a"}}])
    with watching(db_url, HTTPProcessor(handler.url, callback_url=api.url)):
        wait_until(lambda: accepted and callback_claims(feed), what="the 202 written")
        (body,) = accepted
        auth = {"Authorization": f"Bearer {WORKER_TOKEN}"}
        done = httpx.post(
            body["answer_url"], json={"token": body["token"], "done": True, "result": [1, 2]}, headers=auth
        )
        assert done.status_code == 200, done.text
        wait_status(feed, "p", "complete")
    assert stored(feed, "p") == [({"file": "a"}, [1, 2])]


# ---------------------------------------------------------------- collected inline


def test_a_pipeline_gate_that_collects_gets_the_results_inline_with_the_accumulator(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    handler.behavior = labels
    pipeline(feed)
    feed.add_partition("p", files_then_rank(3))
    ids = [i.id for i in feed.items("p")]
    with watching(db_url, HTTPProcessor(handler.url)):
        wait_status(feed, "p", "complete")
    (body,) = fan_in_bodies(handler)
    assert body["data"] == {"top": 1}
    assert body["collected"] == {
        "gate": "classify",
        "count": 3,
        "failed": 0,
        "results": [{"id": ids[n], "result": {"label": f"F{n}"}} for n in range(3)],
    }
    assert body["accumulated"] == {}
    assert all("collected" not in b for b in fan_in_bodies(handler, gate=0))  # only the fan-in item pays


def test_a_fan_out_may_add_its_own_fan_in_item_on_a_queue_without_a_pipeline(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    def behave(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if body["gate"] == 0:  # a folder: one child per file, and the item that joins them
            files = [{"gate": 1, "data": {"file": f}} for f in body["data"]["files"]]
            return 200, {"done": True, "items": [*files, {"gate": 2, "data": {"join": True}, "collect": 1}]}
        if body["gate"] == 1:
            return 200, {"done": True, "result": body["data"]["file"]}
        return 200, {"done": True, "result": sorted(r["result"] for r in body["collected"]["results"])}

    handler.behavior = behave
    feed.add_partition("p", [{"gate": 0, "data": {"files": ["b", "a", "c"]}}])
    with watching(db_url, HTTPProcessor(handler.url)):
        wait_status(feed, "p", "complete")
    (body,) = fan_in_bodies(handler, gate=2)
    assert body["collected"]["gate"] == 1 and body["collected"]["count"] == 3
    assert stored(feed, "p")[-1] == ({"join": True}, ["a", "b", "c"])


def test_the_fan_in_item_gets_the_partitions_accumulator(db_url: str, feed: Feed, handler: HandlerService) -> None:
    # The accumulator is the accumulate part's to write; here it is written directly.
    handler.behavior = labels
    pipeline(feed)
    feed.add_partition("p", files_then_rank(1))
    with feed.store.write() as conn:
        pid = conn.execute(partitions.select().where(partitions.c.key == "p")).one().id
        conn.execute(
            insert(accumulators),
            [
                {"partition_id": pid, "name": "pages", "value": 12.0},
                {"partition_id": pid, "name": "best", "value": 0.5},
            ],
        )
    with watching(db_url, HTTPProcessor(handler.url)):
        wait_status(feed, "p", "complete")
    (body,) = fan_in_bodies(handler)
    assert body["accumulated"] == {"best": 0.5, "pages": 12}


def fail_at_collected_gate(feed: Feed, key: str, errors: dict[int, str]) -> list[int]:
    """Items n of `errors` at gate 0 failed with that error, the others complete with a result; the
    partition at gate 1, where its fan-in item waits (as tolerated failures leave it)."""
    ids = [i.id for i in feed.items(key)]
    with feed.store.write() as conn:
        for n, item_id in enumerate(ids[:-1]):
            values = (
                {"status": "failed", "last_error": errors[n]}
                if n in errors
                else {"status": "complete", "result": b'"ok"'}
            )
            conn.execute(update(items).where(items.c.id == item_id).values(**values))
        conn.execute(update(partitions).where(partitions.c.key == key).values(gate=1))
    return ids


def test_tolerated_failures_appear_with_their_errors(db_url: str, feed: Feed, handler: HandlerService) -> None:
    handler.behavior = labels
    pipeline(feed)
    feed.add_partition("p", files_then_rank(3))
    ids = fail_at_collected_gate(feed, "p", {1: "unreadable scan"})
    with watching(db_url, HTTPProcessor(handler.url)):
        wait_status(feed, "p", "complete")
    (body,) = fan_in_bodies(handler)
    assert body["collected"] == {
        "gate": "classify",
        "count": 2,
        "failed": 1,
        "results": [
            {"id": ids[0], "result": "ok"},
            {"id": ids[1], "error": "unreadable scan"},
            {"id": ids[2], "result": "ok"},
        ],
    }


# ---------------------------------------------------------------- collected past the inline bound


def test_past_the_inline_bound_without_a_callback_url_the_delivery_fails_saying_so(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    handler.behavior = labels
    pipeline(feed, "collect_inline = 2\nmax_attempts = 1")
    feed.add_partition("p", files_then_rank(3))
    with watching(db_url, HTTPProcessor(handler.url)):
        status = wait_status(feed, "p", "failed")
    assert "--callback-url" in (status.failed_items[0].last_error or "")
    assert fan_in_bodies(handler) == []  # never sent


def read_all(url: str) -> list[dict[str, Any]]:
    """Every page from `url` on, following `next`."""
    results: list[dict[str, Any]] = []
    while url:
        page = httpx.get(url, timeout=30)
        assert page.status_code == 200, page.text
        results += page.json()["results"]
        url = page.json()["next"]
    return results


def test_past_the_inline_bound_the_handler_reads_its_results_by_pages_once_each(
    db_url: str, feed: Feed, handler: HandlerService, api: ApiServer
) -> None:
    read: list[list[dict[str, Any]]] = []
    urls: list[str] = []

    def behave(body: dict[str, Any]) -> tuple[int, Any]:
        if body["gate"] == 0:
            return labels(body)
        urls.append(body["collected"]["results_url"])
        read.append(read_all(urls[0] + "&limit=2"))  # pages of 2
        return 200, {"done": True}

    handler.behavior = behave
    pipeline(feed, "collect_inline = 4")
    feed.add_partition("p", files_then_rank(5))
    ids = [i.id for i in feed.items("p")]
    with watching(db_url, HTTPProcessor(handler.url, callback_url=api.url)):
        wait_status(feed, "p", "complete")
    (body,) = fan_in_bodies(handler)
    assert {k: v for k, v in body["collected"].items() if k != "results_url"} == {
        "gate": "classify",
        "count": 5,
        "failed": 0,
    }
    assert urls[0].startswith(f"{api.url}/api/v1/items/{ids[-1]}/collected?token=")
    assert read == [[{"id": ids[n], "result": {"label": f"F{n}"}} for n in range(5)]]
    gone = httpx.get(urls[0])  # the delivery ended with its answer: so did its URL
    assert gone.status_code == 409 and gone.json()["reason"] == "superseded"


def test_a_raw_request_carries_the_collection_in_headers(
    db_url: str, feed: Feed, handler: HandlerService, api: ApiServer
) -> None:
    # The body is the item's data as stored: a file at gate 0, the fan-in item's {} at gate 1.
    handler.behavior = lambda data: (200, {"done": True, "result": data["file"]} if "file" in data else {"done": True})
    pipeline(feed)
    feed.add_partition(
        "p", [{"gate": 0, "data": {"file": "a"}}, {"gate": 0, "data": {"file": "b"}}, {"gate": 1, "data": {}}]
    )
    ids = [i.id for i in feed.items("p")]
    with watching(db_url, HTTPProcessor(handler.url, callback_url=api.url, request="raw")):
        wait_status(feed, "p", "complete")
    (fan_in,) = [d for d in handler.deliveries if d.headers["feedproc-item-id"] == str(ids[-1])]
    assert fan_in.body == {}  # the data, as stored
    assert fan_in.headers["feedproc-collected-gate"] == "classify"
    assert (fan_in.headers["feedproc-collected-count"], fan_in.headers["feedproc-collected-failed"]) == ("2", "0")
    assert fan_in.headers["feedproc-accumulated"] == "{}"
    url = fan_in.headers["feedproc-results-url"]
    assert url.startswith(f"{api.url}/api/v1/items/{ids[-1]}/collected?token=")
    first = next(d for d in handler.deliveries if d.headers["feedproc-item-id"] == str(ids[0]))
    assert "feedproc-results-url" not in first.headers and "feedproc-accumulated" not in first.headers


def test_after_a_202_the_handler_reads_its_results_until_it_answers(
    db_url: str, feed: Feed, handler: HandlerService, api: ApiServer
) -> None:
    accepted: list[dict[str, Any]] = []

    def behave(body: dict[str, Any]) -> tuple[int, Any]:
        if body["gate"] == 0:
            return labels(body)
        accepted.append(body)
        return 202, {"accepted": True, "lease_seconds": 60}

    handler.behavior = behave
    pipeline(feed, "collect_inline = 1")
    feed.add_partition("p", files_then_rank(3))
    with watching(db_url, HTTPProcessor(handler.url, callback_url=api.url)):
        wait_until(lambda: accepted, what="the fan-in item accepted")
        (body,) = accepted
        url = body["collected"]["results_url"]
        assert url.split("token=")[1].split("&")[0] == body["token"]  # one token: its results and its answer
        wait_until(lambda: [r for r in feed.running() if r.via == "callback"], what="the 202 written")
        assert [r["result"] for r in read_all(url)] == [{"label": f"F{n}"} for n in range(3)]
        auth = {"Authorization": f"Bearer {WORKER_TOKEN}"}
        done = httpx.post(body["answer_url"], json={"token": body["token"], "done": True}, headers=auth)
        assert done.status_code == 200, done.text
        wait_status(feed, "p", "complete")
    assert httpx.get(url).status_code == 409


# ---------------------------------------------------------------- Python processors


class Joins(Processor):
    """Gate 0: the file's label as its result. Gate 1: every collected result, iterated (sync), and
    the accumulator, as its result."""

    def process(self, item: Item) -> Response:
        if item.gate == 0:
            return Response(done=True, result={"label": item.json()["file"]})
        rows = [(r.id, json_of(r.result) if r.result else None, r.error) for r in item.collected]
        acc = dict(item.accumulated or {})
        return Response(done=True, result={"rows": rows, "len": len(item.collected), "acc": acc})


class JoinsAsync(Processor):
    async def process(self, item: Item) -> Response:
        if item.gate == 0:
            return Response(done=True, result={"label": item.json()["file"]})
        rows = [(r.id, json_of(r.result) if r.result else None, r.error) async for r in item.collected]
        acc = dict(item.accumulated or {})
        return Response(done=True, result={"rows": rows, "len": len(item.collected), "acc": acc})


@pytest.mark.parametrize("processor", [Joins, JoinsAsync])
def test_a_python_processor_iterates_item_collected(db_url: str, feed: Feed, processor: type) -> None:
    pipeline(feed)
    feed.add_partition("p", files_then_rank(3))
    ids = fail_at_collected_gate(feed, "p", {2: "timed out"})
    with watching(db_url, processor()):
        wait_status(feed, "p", "complete")
    assert stored(feed, "p")[-1][1] == {
        "rows": [[ids[0], "ok", None], [ids[1], "ok", None], [ids[2], None, "timed out"]],
        "len": 3,
        "acc": {},
    }


def test_items_elsewhere_have_nothing_collected(db_url: str, feed: Feed) -> None:
    seen: list[Any] = []

    class Looks(Processor):
        def process(self, item: Item) -> Response:
            seen.append((item.collected, item.accumulated))
            return Response(done=True)

    feed.add_partition("p", [(0, b"{}"), (1, b"{}")])
    with watching(db_url, Looks()):
        wait_status(feed, "p", "complete")
    assert seen == [(None, None), (None, None)]


def test_a_python_pipelines_gate_collects_by_its_decorator(db_url: str, feed: Feed) -> None:
    from feedproc import Pipeline

    flow = Pipeline("default")

    @flow.gate("classify", 0)
    def classify(item: Item) -> Response:
        return Response(done=True, result=item.json()["file"])

    @flow.gate("rank", 1, collect="classify")
    async def rank(item: Item) -> Response:
        assert item.collected.gate_name == "classify"
        return Response(done=True, result=sorted([r.result.decode() async for r in item.collected]))  # str: as UTF-8

    feed.add_partition("p", [*({"gate": 0, "data": {"file": f}} for f in "cab"), {"gate": 1}])
    with watching(db_url, flow):
        wait_status(feed, "p", "complete")
    assert json_of(feed.items("p", gate=1)[0].result) == ["a", "b", "c"]
