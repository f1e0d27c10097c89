"""Accumulate at delivery (every database): answers' accumulate numbers, from an HTTP handler, a
batch or a Python processor, merged by the operations their gate (or queue) declares, and the fan-in
item receiving the final accumulator (`"accumulated"` in its request, `item.accumulated`); an
answer naming a number nobody declared fails its item for good, saying which. Real watchers, real
HTTP over loopback."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from feedproc import Feed, HTTPProcessor, Item, Processor, Response
from feedproc.core.pipelines import parse_toml

from ..api_support import ApiServer
from ..support import HandlerService, callback_claims, json_of, wait_status, wait_until, watching

WORKER_TOKEN = "accumulate-worker-token-42"
AUTH = {"Authorization": f"Bearer {WORKER_TOKEN}"}


@pytest.fixture
def api(db_url: str) -> Iterator[ApiServer]:
    server = ApiServer(db_url, worker_token=WORKER_TOKEN)
    yield server
    server.close()


PIPELINE = """
queue = "default"
[[gate]]
name = "scan"
number = 0
accumulate = {pages = "sum", best = "max", scans = "count"}
[[gate]]
name = "rank"
number = 1
collect = "scan"
"""


def scans_then_rank(count: int) -> list[dict[str, Any]]:
    return [*({"gate": 0, "data": {"n": n}} for n in range(count)), {"gate": 1, "data": {}}]


def numbers(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Scan n: n + 1 pages, a score of n / 10; rank: done."""
    if body["gate"] == 0:
        n = body["data"]["n"]
        return 200, {"done": True, "accumulate": {"pages": n + 1, "best": n / 10, "scans": 1}}
    return 200, {"done": True}


def test_an_http_fan_in_item_receives_what_every_answer_accumulated(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    handler.behavior = numbers
    feed.apply_pipeline(parse_toml(PIPELINE))
    feed.add_partition("p", scans_then_rank(10))
    with watching(db_url, HTTPProcessor(handler.url), flush_batch=4):
        final = wait_status(feed, "p", "complete")
    with handler.lock:
        (body,) = [d.body for d in handler.deliveries if d.body["gate"] == 1]
    assert body["accumulated"] == {"best": 0.9, "pages": 55, "scans": 10}
    assert final.accumulated == {"best": 0.9, "pages": 55, "scans": 10}


def test_a_batch_handlers_answers_accumulate_each(db_url: str, feed: Feed, handler: HandlerService) -> None:
    def batch(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        answers = [{"done": True, "accumulate": {"pages": item["data"]["n"] + 1}} for item in body["items"]]
        return 200, {"answers": answers}

    handler.behavior = batch
    feed.set_queue("default", accumulate={"pages": "sum"})
    feed.add_partition("p", [{"gate": 0, "data": {"n": n}} for n in range(12)])
    with watching(db_url, HTTPProcessor(handler.url), batch=5):
        final = wait_status(feed, "p", "complete")
    assert final.accumulated == {"pages": 78}


class Pages(Processor):
    """Gate 0: its item's pages; gate 1: the accumulator it received, as its result."""

    def process(self, item: Item) -> Response:
        if item.gate == 0:
            return Response(done=True, accumulate={"pages": item.json()["n"] + 1, "best": item.json()["n"] / 10})
        return Response(done=True, result={"acc": dict(item.accumulated or {})})


def test_a_python_fan_in_item_receives_item_accumulated(db_url: str, feed: Feed) -> None:
    feed.set_queue("default", accumulate={"pages": "sum", "best": "max"})
    feed.add_partition("p", [*({"gate": 0, "data": {"n": n}} for n in range(5)), {"gate": 1, "data": {}, "collect": 0}])
    with watching(db_url, Pages()):
        wait_status(feed, "p", "complete")
    fan_in = feed.items("p")[-1]
    assert json_of(fan_in.result) == {"acc": {"best": 0.4, "pages": 15}}


def test_an_undeclared_name_fails_the_item_for_good_saying_which(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    def typo(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return 200, {"done": True, "accumulate": {"pages": 1, "pgaes": 1}}

    handler.behavior = typo
    feed.apply_pipeline(parse_toml(PIPELINE))
    feed.add_partition("p", [{"gate": 0, "data": {"n": 0}}])
    with watching(db_url, HTTPProcessor(handler.url)):
        final = wait_status(feed, "p", "failed")
    (failed,) = final.failed_items
    assert failed.attempts == 1  # not retried: the same answer would come again
    assert (failed.last_error or "").startswith(
        "accumulate: 'pgaes' has no operation declared at gate 0 (scan) of queue 'default'"
        " (declared: best=max, pages=sum, scans=count)"
    )
    assert final.accumulated == {}


def test_a_callbacks_answer_accumulates_once(db_url: str, feed: Feed, api: ApiServer, handler: HandlerService) -> None:
    """A handler answers 202, then its answer through the worker API carries the numbers: merged in
    that answer's transaction; the same answer sent again is refused and adds nothing."""
    accepted: list[dict[str, Any]] = []
    lock = threading.Lock()

    def accept(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with lock:
            accepted.append(body)
        return 202, {"accepted": True, "lease_seconds": 60}

    handler.behavior = accept
    feed.set_queue("default", accumulate={"pages": "sum"})
    feed.add_partition("p", [(0, b"{}"), (0, b"{}")])
    with watching(db_url, HTTPProcessor(handler.url, callback_url=api.url)):
        wait_until(lambda: len(accepted) == 2 and len(callback_claims(feed)) == 2, what="both 202s written")
        for n, body in enumerate(accepted):
            answer = {"token": body["token"], "done": True, "accumulate": {"pages": 10 + n}}
            assert httpx.post(body["answer_url"], json=answer, headers=AUTH).status_code == 200
        again = httpx.post(accepted[0]["answer_url"], json=answer | {"token": accepted[0]["token"]}, headers=AUTH)
        assert again.status_code == 409, again.text
        final = wait_status(feed, "p", "complete")
    assert final.accumulated == {"pages": 21}
