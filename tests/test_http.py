"""HTTPProcessor through a real in-process watcher against a real HTTP handler on loopback (§3).

The `handler` fixture is a scripted HTTP server; each test sets `handler.behavior(body)` to answer
`(status, body[, headers[, sleep seconds]])` and reads `handler.deliveries` (request bodies, headers
and the server-side start/end time of each request).
"""

from __future__ import annotations

import base64
import itertools
import json
import socket
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sqlalchemy import select

from feedproc import Feed, HTTPProcessor
from feedproc.schema import items
from feedproc.store import Store

from .support import Delivery, HandlerService, wait_until
from .test_watcher import history_of, wait_status, watching


def js(value: Any) -> bytes:
    return json.dumps(value).encode()


def error_events(feed: Feed, key: str) -> list[str]:
    return [e["detail"]["error"] for e in history_of(feed, key, "item_retried")]


class PerItem:
    """Thread-safe count of requests per item id (the handler serves requests on many threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: Counter[tuple[int, int]] = Counter()

    def next(self, body: dict[str, Any]) -> int:
        """1 on the first request for this item at this gate, 2 on the second..."""
        with self.lock:
            self.counts[body["id"], body["gate"]] += 1
            return self.counts[body["id"], body["gate"]]


def gaps(deliveries: list[Delivery]) -> list[float]:
    return [after.start - before.end for before, after in itertools.pairwise(deliveries)]


# ---------------------------------------------------------------- the request


def test_request_body_carries_the_item_and_json_headers(
    db_url: str, feed: Feed, store: Store, handler: HandlerService
) -> None:
    feed.add_partition("req", items=[(0, js({"file": "a.pdf", "pages": [1, 2]}))], queue="scan")
    with watching(db_url, HTTPProcessor(handler.url), queue="scan"):
        wait_status(feed, "req", "complete")

    with store.read() as conn:
        item_id = conn.execute(select(items.c.id)).scalar_one()
    [delivery] = handler.of("req")
    assert delivery.body == {
        "id": item_id,
        "partition": "req",
        "queue": "scan",
        "gate": 0,
        "attempt": 1,
        "data": {"file": "a.pdf", "pages": [1, 2]},
    }
    assert delivery.headers["content-type"].startswith("application/json")
    assert delivery.headers["user-agent"].startswith("feedproc/")


def test_extra_headers_are_sent_with_every_request(db_url: str, feed: Feed, handler: HandlerService) -> None:
    feed.add_partition("auth", items=[(0, js({"n": n})) for n in range(3)])
    processor = HTTPProcessor(handler.url, headers={"Authorization": "Bearer x", "X-Tenant": "t1"})
    with watching(db_url, processor):
        wait_status(feed, "auth", "complete")

    deliveries = handler.of("auth")
    assert len(deliveries) == 3
    for delivery in deliveries:
        assert delivery.headers["authorization"] == "Bearer x"
        assert delivery.headers["x-tenant"] == "t1"
        assert delivery.headers["user-agent"].startswith("feedproc/")
        assert delivery.headers["content-type"].startswith("application/json")


def test_data_that_is_not_json_is_sent_as_data_base64(db_url: str, feed: Feed, handler: HandlerService) -> None:
    raw = [b"\x00\xff\xfebinary", b"plain text, not JSON"]
    feed.add_partition("bytes", items=[(0, data) for data in raw])
    with watching(db_url, HTTPProcessor(handler.url)):
        wait_status(feed, "bytes", "complete")

    bodies = [d.body for d in handler.of("bytes")]
    assert sorted(base64.b64decode(b["data_base64"]) for b in bodies) == sorted(raw)
    assert all("data" not in b for b in bodies)


# ---------------------------------------------------------------- answers


def test_done_answer_completes_the_item(db_url: str, feed: Feed, handler: HandlerService) -> None:
    handler.behavior = lambda body: (200, {"done": True})
    feed.add_partition("done", items=[(0, js({"n": n})) for n in range(4)])
    with watching(db_url, HTTPProcessor(handler.url)):
        final = wait_status(feed, "done", "complete")

    assert final["items"]["complete"] == 4
    assert len(handler.of("done")) == 4


def test_gate_answer_moves_the_item_and_stores_its_data(db_url: str, feed: Feed, handler: HandlerService) -> None:
    def behavior(body: dict[str, Any]) -> tuple[Any, ...]:
        if body["gate"] == 0:
            return 200, {"gate": 3, "data": {"step": "classified", "was": body["data"]}}
        return 200, {"done": True}

    handler.behavior = behavior
    feed.add_partition("move", items=[(0, js({"file": "x"}))])
    with watching(db_url, HTTPProcessor(handler.url)):
        final = wait_status(feed, "move", "complete")

    first, second = handler.of("move")
    assert (first.gate, second.gate) == (0, 3)
    assert second.body["data"] == {"step": "classified", "was": {"file": "x"}}
    assert second.body["attempt"] == 1
    assert second.body["id"] == first.body["id"]
    assert final["gate"] == 3


def test_not_yet_answer_is_asked_again_after_retry_after(db_url: str, feed: Feed, handler: HandlerService) -> None:
    seen = PerItem()

    def behavior(body: dict[str, Any]) -> tuple[Any, ...]:
        if seen.next(body) < 3:
            return 200, {"gate": body["gate"], "retry_after": 0.4, "data": {"polls": body["data"]["polls"] + 1}}
        return 200, {"done": True}

    handler.behavior = behavior
    feed.add_partition("poll", items=[(0, js({"polls": 0}))])
    with watching(db_url, HTTPProcessor(handler.url), retry_delay=5.0, max_attempts=2):
        final = wait_status(feed, "poll", "complete")

    deliveries = handler.of("poll")
    assert [d.body["attempt"] for d in deliveries] == [1, 1, 1]  # "not yet" is not a failure
    assert [d.body["data"]["polls"] for d in deliveries] == [0, 1, 2]
    assert all(gap >= 0.4 - 0.01 for gap in gaps(deliveries)), gaps(deliveries)
    assert final["failed_items"] == []


def test_children_are_added_and_delivered_at_their_gates(db_url: str, feed: Feed, handler: HandlerService) -> None:
    def behavior(body: dict[str, Any]) -> tuple[Any, ...]:
        if body["data"].get("root") and body["gate"] == 0:
            children = [{"gate": 0, "data": {"child": "same-gate"}}] + [
                {"gate": 2, "data": {"child": n}} for n in range(3)
            ]
            return 200, {"gate": 5, "items": children}
        return 200, {"done": True}

    handler.behavior = behavior
    feed.add_partition("kids", items=[(0, js({"root": True}))])
    with watching(db_url, HTTPProcessor(handler.url)):
        final = wait_status(feed, "kids", "complete")

    assert final["items"] == {"total": 5, "available": 0, "complete": 5, "failed": 0, "cancelled": 0}
    deliveries = handler.of("kids")
    children = sorted((d.gate, json.dumps(d.body["data"])) for d in deliveries if not d.body["data"].get("root"))
    assert children == [(0, '{"child": "same-gate"}')] + [(2, json.dumps({"child": n})) for n in range(3)]
    assert [d.gate for d in deliveries if d.body["data"].get("root")] == [0, 5]
    # Fan-in: the parent at gate 5 is asked only after every child finished.
    parent_last = next(d for d in deliveries if d.gate == 5)
    assert parent_last.start >= max(d.end for d in deliveries if d.gate < 5)


def test_go_feed_complete_and_response_are_understood(db_url: str, feed: Feed, handler: HandlerService) -> None:
    def behavior(body: dict[str, Any]) -> tuple[Any, ...]:
        if body["gate"] == 0:
            return 200, {"gate": 1, "response": {"from": "go"}}
        return 200, {"complete": True}

    handler.behavior = behavior
    feed.add_partition("go", items=[(0, js({}))])
    with watching(db_url, HTTPProcessor(handler.url)):
        wait_status(feed, "go", "complete")

    assert [d.body["data"] for d in handler.of("go")] == [{}, {"from": "go"}]


# ---------------------------------------------------------------- failures


def test_4xx_fails_the_item_at_once_naming_status_and_body(db_url: str, feed: Feed, handler: HandlerService) -> None:
    handler.behavior = lambda body: (422, "unprocessable: field 'file' is missing")
    feed.add_partition("bad", items=[(0, js({}))])
    with watching(db_url, HTTPProcessor(handler.url), max_attempts=5):
        final = wait_status(feed, "bad", "failed")

    assert len(handler.of("bad")) == 1
    [failed] = final["failed_items"]
    assert failed["attempts"] == 1
    assert failed["last_error"].startswith("HTTP 422")
    assert "unprocessable: field 'file' is missing" in failed["last_error"]


def test_go_feed_error_with_no_retry_fails_the_item_at_once(db_url: str, feed: Feed, handler: HandlerService) -> None:
    handler.behavior = lambda body: (200, {"complete": True, "error": {"message": "cannot parse", "no_retry": True}})
    feed.add_partition("go-bad", items=[(0, js({}))])
    with watching(db_url, HTTPProcessor(handler.url), max_attempts=5):
        final = wait_status(feed, "go-bad", "failed")

    assert len(handler.of("go-bad")) == 1
    assert [(f["attempts"], f["last_error"]) for f in final["failed_items"]] == [(1, "cannot parse")]


def test_go_feed_error_without_no_retry_is_retried(db_url: str, feed: Feed, handler: HandlerService) -> None:
    seen = PerItem()
    handler.behavior = lambda body: (
        (200, {"done": True, "error": {"message": "index busy", "no_retry": False}})
        if seen.next(body) == 1
        else (200, {"done": True})
    )
    feed.add_partition("go-retry", items=[(0, js({}))])
    with watching(db_url, HTTPProcessor(handler.url)):
        wait_status(feed, "go-retry", "complete")

    assert [d.body["attempt"] for d in handler.of("go-retry")] == [1, 2]
    assert error_events(feed, "go-retry") == ["index busy"]


def test_503_is_transient_then_success(db_url: str, feed: Feed, handler: HandlerService) -> None:
    seen = PerItem()
    handler.behavior = lambda body: (503, "overloaded") if seen.next(body) == 1 else (200, {"done": True})
    feed.add_partition("blip", items=[(0, js({}))])
    with watching(db_url, HTTPProcessor(handler.url)):
        final = wait_status(feed, "blip", "complete")

    assert [d.body["attempt"] for d in handler.of("blip")] == [1, 2]
    assert final["failed_items"] == []
    [error] = error_events(feed, "blip")
    assert error.startswith("HTTP 503") and "overloaded" in error


def test_429_retry_after_header_is_honoured(db_url: str, feed: Feed, handler: HandlerService) -> None:
    seen = PerItem()
    handler.behavior = lambda body: (
        (429, "slow down", {"Retry-After": "1"}) if seen.next(body) == 1 else (200, {"done": True})
    )
    feed.add_partition("throttled", items=[(0, js({}))])
    with watching(db_url, HTTPProcessor(handler.url), retry_delay=0.05):
        wait_status(feed, "throttled", "complete")

    deliveries = handler.of("throttled")
    assert [d.body["attempt"] for d in deliveries] == [1, 2]
    assert gaps(deliveries)[0] >= 1.0 - 0.01


def test_timeout_is_transient_and_children_of_the_successful_attempt_are_written_once(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    seen = PerItem()

    def behavior(body: dict[str, Any]) -> tuple[Any, ...]:
        if body["data"].get("root"):
            answer = {"done": True, "items": [{"gate": 1, "data": {"child": n}} for n in range(3)]}
            if seen.next(body) == 1:
                return 200, answer, {}, 1.5  # answered after the client gave up
            return 200, answer
        return 200, {"done": True}

    handler.behavior = behavior
    feed.add_partition("slowpoke", items=[(0, js({"root": True}))])
    with watching(db_url, HTTPProcessor(handler.url, timeout=0.5), retry_delay=0.1):
        final = wait_status(feed, "slowpoke", "complete")

    assert final["items"]["total"] == 4  # the root and the children of one answer, once
    [error] = error_events(feed, "slowpoke")
    assert "timed out" in error
    children = [d.body["data"]["child"] for d in handler.of("slowpoke") if d.gate == 1]
    assert sorted(children) == [0, 1, 2]


def test_backoff_between_transient_failures_doubles(db_url: str, feed: Feed, handler: HandlerService) -> None:
    retry_delay = 0.2
    seen = PerItem()
    handler.behavior = lambda body: (500, "boom") if seen.next(body) <= 3 else (200, {"done": True})
    feed.add_partition("backoff", items=[(0, js({}))])
    with watching(db_url, HTTPProcessor(handler.url), retry_delay=retry_delay, max_attempts=5):
        wait_status(feed, "backoff", "complete")

    deliveries = handler.of("backoff")
    assert [d.body["attempt"] for d in deliveries] == [1, 2, 3, 4]
    for n, gap in enumerate(gaps(deliveries), start=1):
        expected = retry_delay * 2 ** (n - 1)
        assert gap >= expected - 0.01, f"retry {n} came after {gap:.3f}s, before its backoff of {expected:.2f}s"
        assert gap <= expected * 1.25 + 1.0, f"retry {n} came after {gap:.3f}s; backoff was {expected:.2f}s"


def test_last_error_of_a_non_2xx_names_the_status_and_keeps_the_start_of_the_body(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    handler.behavior = lambda body: (500, "upstream exploded: " + "x" * 5000)
    feed.add_partition("boom", items=[(0, js({}))])
    with watching(db_url, HTTPProcessor(handler.url), max_attempts=2):
        final = wait_status(feed, "boom", "failed")

    [failed] = final["failed_items"]
    assert failed["attempts"] == 2
    assert failed["last_error"].startswith("HTTP 500")
    assert "upstream exploded: xxx" in failed["last_error"]


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ({"gate": 0}, "invalid answer: gate 0 is lower than the item's gate 1"),
        ({}, "invalid answer"),
        ("OK", "invalid answer"),
        ([{"done": True}], "invalid answer"),
        ({"done": True, "items": [{"gate": 0, "data": 1}]}, "invalid answer"),
    ],
    ids=["gate-lower", "empty-object", "not-json", "not-an-object", "child-below-gate"],
)
def test_invalid_2xx_answer_is_a_transient_failure(
    db_url: str, feed: Feed, handler: HandlerService, answer: Any, reason: str
) -> None:
    seen = PerItem()
    handler.behavior = lambda body: (200, answer) if seen.next(body) == 1 else (200, {"done": True})
    feed.add_partition("invalid", items=[(1, js({}))])  # the partition starts at gate 1
    with watching(db_url, HTTPProcessor(handler.url)):
        final = wait_status(feed, "invalid", "complete")

    assert final["items"] == {"total": 1, "available": 0, "complete": 1, "failed": 0, "cancelled": 0}
    assert [d.body["attempt"] for d in handler.of("invalid")] == [1, 2]
    [error] = error_events(feed, "invalid")
    assert error.startswith(reason)


# ---------------------------------------------------------------- the handler unreachable for a while


class LateHandler:
    """A handler that starts listening on `port` only when `start()` is called."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.bodies: list[dict[str, Any]] = []
        self.server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        bodies = self.bodies

        class _Request(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                out = b'{"done": true}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), _Request)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_handler_down_for_a_while_then_back_counts_attempts_and_completes(db_url: str, feed: Feed) -> None:
    late = LateHandler(unused_port())
    feed.add_partition("outage", items=[(0, js({"n": 1}))])
    try:
        with watching(db_url, HTTPProcessor(f"http://127.0.0.1:{late.port}/handle"), retry_delay=0.1, max_attempts=20):
            wait_until(lambda: len(error_events(feed, "outage")) >= 2, what="two refused attempts")
            late.start()
            wait_status(feed, "outage", "complete")
    finally:
        late.close()

    errors = error_events(feed, "outage")
    assert len(errors) >= 2
    assert all("unreachable" in e for e in errors), errors
    [body] = late.bodies
    assert body["attempt"] == len(errors) + 1  # every refused connection counted as an attempt
