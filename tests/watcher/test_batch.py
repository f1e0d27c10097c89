"""Batch delivery (`feedproc watch --batch N`): up to N items of one partition and gate in one call,
one answer per item; retries, failures and children stay per item. Both databases."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from feedproc import Feed, HTTPProcessor, Item, Processor, Response
from feedproc.core.views import Delivery

from ..support import HandlerService, wait_status, watching

BATCH = {"batch": 10, "batch_wait": 0.3, "concurrency": 1}


def js(value: Any) -> bytes:
    return json.dumps(value).encode()


def batches(handler: HandlerService) -> list[list[dict[str, Any]]]:
    """The item bodies of each batch request the handler received, in arrival order."""
    with handler.lock:
        return [d.body["items"] for d in handler.deliveries if "items" in d.body]


def each(answer: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[dict[str, Any]], tuple[int, Any]]:
    """A batch handler answering each item of a batch with `answer(item)`, in order."""
    return lambda body: (200, {"answers": [answer(item) for item in body["items"]]})


answer_all = each(lambda item: {"done": True})


def first_then_all(first: Callable[[dict[str, Any]], tuple[int, Any]]) -> Callable[[dict[str, Any]], tuple[int, Any]]:
    """A batch handler answering its first request with `first(body)`, every later one with done."""
    answered = threading.Event()

    def behave(body: dict[str, Any]) -> tuple[int, Any]:
        if answered.is_set():
            return answer_all(body)
        answered.set()
        return first(body)

    return behave


def history(feed: Feed, key: str) -> dict[int, tuple[Delivery, ...]]:
    """Each item's data["n"] -> its delivery records."""
    return {json.loads(i.data)["n"]: feed.item(i.id).history for i in feed.items(key)}


def test_a_partitions_items_at_one_gate_arrive_in_one_request(db_url: str, feed: Feed, handler: HandlerService) -> None:
    handler.behavior = answer_all
    feed.add_partition("scan", items=[(0, js({"n": n})) for n in range(10)])
    with watching(db_url, HTTPProcessor(handler.url), **BATCH):
        wait_status(feed, "scan", "complete")
    [batch] = batches(handler)
    assert sorted(body["data"]["n"] for body in batch) == list(range(10))
    assert {(body["partition"], body["gate"], body["attempt"]) for body in batch} == {("scan", 0, 1)}


def test_answers_carrying_ids_are_matched_by_id_in_any_order(db_url: str, feed: Feed, handler: HandlerService) -> None:
    def reversed_by_id(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        answers = [
            {"id": item["id"], "done": True, "data": {"n": item["data"]["n"], "seen": True}} for item in body["items"]
        ]
        return 200, {"answers": answers[::-1]}

    handler.behavior = reversed_by_id
    feed.add_partition("ids", items=[(0, js({"n": n})) for n in range(6)])
    with watching(db_url, HTTPProcessor(handler.url), **BATCH):
        wait_status(feed, "ids", "complete")
    for item in feed.items("ids"):
        data = json.loads(item.data)
        assert data["seen"] is True  # each item got its own answer's data, not its neighbour's
    assert len(batches(handler)) == 1


def test_a_short_answer_list_retries_only_the_items_left_unanswered(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    handler.behavior = first_then_all(lambda body: (200, {"answers": [{"done": True}] * 3}))
    feed.add_partition("short", items=[(0, js({"n": n})) for n in range(5)])
    with watching(db_url, HTTPProcessor(handler.url), retry_delay=0.05, **BATCH):
        wait_status(feed, "short", "complete")
    records = history(feed, "short")
    outcomes = sorted([r.outcome for r in h] for h in records.values())
    assert outcomes == [["done"]] * 3 + [["retry", "done"]] * 2
    retried = [h[0] for h in records.values() if len(h) == 2]
    assert all("no answer for item" in str(r.error) and "(3 answers for 5 items)" in str(r.error) for r in retried)


def test_a_failure_in_one_answer_fails_only_its_item(db_url: str, feed: Feed, handler: HandlerService) -> None:
    rejected = {"error": {"message": "unreadable scan", "no_retry": True}}
    handler.behavior = each(lambda item: rejected if item["data"]["n"] == 2 else {"done": True})
    feed.add_partition("one-bad", items=[(0, js({"n": n})) for n in range(4)])
    with watching(db_url, HTTPProcessor(handler.url), **BATCH):
        final = wait_status(feed, "one-bad", "failed")
    assert final.items["complete"] == 3
    [failed] = feed.items("one-bad", status="failed")
    assert json.loads(failed.data) == {"n": 2} and failed.last_error == "unreadable scan"


def test_a_failed_batch_request_retries_every_item_of_it(db_url: str, feed: Feed, handler: HandlerService) -> None:
    handler.behavior = first_then_all(lambda body: (503, "busy"))
    feed.add_partition("busy", items=[(0, js({"n": n})) for n in range(4)])
    with watching(db_url, HTTPProcessor(handler.url), retry_delay=0.05, **BATCH):
        wait_status(feed, "busy", "complete")
    records = history(feed, "busy")
    assert all([r.outcome for r in h] == ["retry", "done"] for h in records.values())
    assert all((h[0].error or "").startswith("HTTP 503 from http://127.0.0.1:") for h in records.values())


def test_children_of_a_batch_answer_are_added_once_and_the_gate_advances(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    handler.behavior = each(
        lambda item: (
            {"done": True, "items": [{"gate": 1, "data": {"page": item["data"]["n"]}}]}
            if item["gate"] == 0
            else {"done": True}
        )
    )
    feed.add_partition("fan", items=[(0, js({"n": n})) for n in range(5)])
    with watching(db_url, HTTPProcessor(handler.url), **BATCH):
        final = wait_status(feed, "fan", "complete")
    assert final.items["complete"] == 10
    pages = sorted(json.loads(i.data)["page"] for i in feed.items("fan", gate=1))
    assert pages == list(range(5))
    assert [{body["gate"] for body in batch} for batch in batches(handler)] == [{0}, {1}]


class Bulk(Processor):
    """Classifies in bulk: records each batch's size; fails the whole batch holding n == 13."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    async def process(self, item: Item) -> Response:
        raise AssertionError("process_batch is overridden: process is not called")

    async def process_batch(self, items: list[Item]) -> list[Response]:
        self.sizes.append(len(items))
        return [Response(done=True, data={"label": "invoice", "n": json.loads(i.data)["n"]}) for i in items]


def test_a_python_processor_with_process_batch_gets_batches(db_url: str, feed: Feed) -> None:
    processor = Bulk()
    feed.add_partition("bulk", items=[(0, js({"n": n})) for n in range(8)])
    with watching(db_url, processor, **BATCH):
        wait_status(feed, "bulk", "complete")
    assert processor.sizes == [8]
    assert all(json.loads(i.data)["label"] == "invoice" for i in feed.items("bulk"))


class Picky(Processor):
    """Only `process`: the default batch path calls it per item; n == 1 fails the first time."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    async def process(self, item: Item) -> Response:
        n = json.loads(item.data)["n"]
        self.calls.append(n)
        if n == 1 and item.attempt == 1:
            raise RuntimeError("not this one")
        return Response(done=True)


def test_without_process_batch_each_item_of_a_batch_fails_on_its_own(db_url: str, feed: Feed) -> None:
    processor = Picky()
    feed.add_partition("picky", items=[(0, js({"n": n})) for n in range(4)])
    with watching(db_url, processor, retry_delay=0.05, **BATCH):
        wait_status(feed, "picky", "complete")
    records = history(feed, "picky")
    assert [r.outcome for r in records[1]] == ["retry", "done"]
    assert "RuntimeError: not this one" in (records[1][0].error or "")
    assert all([r.outcome for r in records[n]] == ["done"] for n in (0, 2, 3))
