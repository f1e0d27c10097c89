"""Callback answers (every database): a handler answers `202 {"accepted": true}`, the watcher frees
its worker at once, and the handler sends the answer later to the worker API with the token and
answer_url its request carried; heartbeats extend the wait, expiry retries it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from feedproc import Feed, HTTPProcessor

from ..api_support import ApiServer
from ..support import HandlerService, callback_claims, wait_status, wait_until, watching

WORKER_TOKEN = "callback-worker-token-42"
AUTH = {"Authorization": f"Bearer {WORKER_TOKEN}"}


@pytest.fixture
def api(db_url: str) -> Iterator[ApiServer]:
    server = ApiServer(db_url, worker_token=WORKER_TOKEN)
    yield server
    server.close()


class Accepting:
    """Answers every first request 202 (keeping its token and answer_url), later ones 200 done."""

    def __init__(self, lease_seconds: float) -> None:
        self.lease_seconds = lease_seconds
        self.accepted: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def __call__(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self.lock:
            if any(b["id"] == body["id"] for b in self.accepted):
                return 200, {"done": True, "data": {"second": True}}
            self.accepted.append(body)
        return 202, {"accepted": True, "lease_seconds": self.lease_seconds}


def test_a_202_frees_the_worker_and_the_later_answer_completes_the_item(
    db_url: str, feed: Feed, api: ApiServer, handler: HandlerService
) -> None:
    accepting = Accepting(lease_seconds=60)
    handler.behavior = accepting
    feed.add_partition("long", [(0, b'{"n": 1}'), (0, b'{"n": 2}')])
    with watching(db_url, HTTPProcessor(handler.url, callback_url=api.url), concurrency=1):
        wait_until(
            lambda: len(accepting.accepted) == 2 and len(callback_claims(feed)) == 2,
            what="both items accepted by one worker, their 202s written",
        )
        first = accepting.accepted[0]
        assert first["answer_url"] == f"{api.url}/api/v1/items/{first['id']}/answer" and first["token"]
        beat = httpx.post(
            f"{api.url}/api/v1/items/{first['id']}/heartbeat", json={"token": first["token"]}, headers=AUTH
        )
        assert beat.status_code == 200, beat.text
        for body in accepting.accepted:
            answer = httpx.post(
                body["answer_url"], json={"token": body["token"], "done": True, "data": {"later": True}}, headers=AUTH
            )
            assert answer.status_code == 200, answer.text
        wait_status(feed, "long", "complete")
    assert [i.data for i in feed.items("long")] == [b'{"later":true}', b'{"later":true}']
    assert len(handler.deliveries) == 2  # nothing was delivered twice


def test_a_202_whose_answer_never_comes_is_retried_and_the_late_answer_refused(
    db_url: str, feed: Feed, api: ApiServer, handler: HandlerService
) -> None:
    accepting = Accepting(lease_seconds=1)
    handler.behavior = accepting
    feed.add_partition("late", [(0, b"{}")])
    with watching(db_url, HTTPProcessor(handler.url, callback_url=api.url)):
        wait_status(feed, "late", "complete", timeout=30)  # the retry was answered 200
    (body,) = accepting.accepted
    item = feed.item(body["id"])
    assert item.attempts == 1 and item.data == b'{"second":true}'
    assert any("expired" in (h.error or "") for h in item.history), item.history
    late = httpx.post(body["answer_url"], json={"token": body["token"], "done": True}, headers=AUTH)
    assert late.status_code == 409 and late.json()["reason"] in ("expired", "superseded")


def test_a_202_without_a_callback_url_is_an_invalid_answer(db_url: str, feed: Feed, handler: HandlerService) -> None:
    handler.behavior = lambda body: (202, {"accepted": True})
    feed.add_partition("p", [(0, b"{}")])
    with watching(db_url, HTTPProcessor(handler.url), max_attempts=1):
        status = wait_status(feed, "p", "failed")
    assert status.status == "failed"


def test_a_callback_handler_answers_with_a_worker_token_limited_to_its_queue(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    from feedproc.auth import Access, load_tokens

    ocr_token = "ocr-callback-token-0123"
    api = ApiServer(db_url, access=Access(load_tokens({"FEEDPROC_WORKER_TOKENS": f"ocr:{ocr_token}"})))
    accepting = Accepting(lease_seconds=60)
    handler.behavior = accepting
    feed.add_partition("scan", [(0, b"{}")], queue="ocr")
    feed.add_partition("payroll", [(0, b"{}")], queue="hr")
    try:
        with (
            watching(db_url, HTTPProcessor(handler.url, callback_url=api.url), queue="ocr"),
            watching(db_url, HTTPProcessor(handler.url, callback_url=api.url), queue="hr"),
        ):
            wait_until(
                lambda: len(accepting.accepted) == 2 and len(callback_claims(feed)) == 2,
                what="both items accepted, their 202s written",
            )
            scoped = {"Authorization": f"Bearer {ocr_token}"}
            for body in accepting.accepted:
                answer = httpx.post(body["answer_url"], json={"token": body["token"], "done": True}, headers=scoped)
                assert answer.status_code == (200 if feed.item(body["id"]).partition == "scan" else 403), answer.text
            wait_status(feed, "scan", "complete")
        assert feed.status("payroll").status == "available"  # its answer was refused: still waiting
    finally:
        api.close()
