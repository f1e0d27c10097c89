"""HTTPProcessor through a real in-process watcher against a real HTTP handler on loopback (§3).

The `handler` fixture is a scripted HTTP server; each test sets `handler.behavior(body)` to answer
`(status, body[, headers[, sleep seconds]])` and reads `handler.deliveries` (request bodies, headers
and the server-side start/end time of each request).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import itertools
import json
import socket
import threading
import time
import tracemalloc
import zlib
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sqlalchemy import select

from feedproc import Feed, HTTPProcessor, Item, Processor, Response
from feedproc.core.views import FailedItem
from feedproc.health import handler_base, handler_reason
from feedproc.store import Store
from feedproc.store.schema import items

from ..support import Delivery, HandlerService, history_of, wait_status, wait_until, watching


def js(value: Any) -> bytes:
    return json.dumps(value).encode()


def error_events(feed: Feed, key: str) -> list[str]:
    return [e.detail["error"] for e in history_of(feed, key, "item_retried")]


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
        "deliveries": 1,
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

    assert final.items["complete"] == 4
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
    assert final.gate == 3


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
    assert [d.body["deliveries"] for d in deliveries] == [1, 2, 3]  # but it is a delivery
    assert [d.body["data"]["polls"] for d in deliveries] == [0, 1, 2]
    assert all(gap >= 0.4 - 0.01 for gap in gaps(deliveries)), gaps(deliveries)
    assert final.failed_items == ()


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

    assert final.items == {"total": 5, "available": 0, "complete": 5, "failed": 0, "cancelled": 0}
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
    [failed] = final.failed_items
    assert failed.attempts == 1
    assert (failed.last_error or "").startswith("HTTP 422")
    assert "unprocessable: field 'file' is missing" in (failed.last_error or "")


def test_go_feed_error_with_no_retry_fails_the_item_at_once(db_url: str, feed: Feed, handler: HandlerService) -> None:
    handler.behavior = lambda body: (200, {"complete": True, "error": {"message": "cannot parse", "no_retry": True}})
    feed.add_partition("go-bad", items=[(0, js({}))])
    with watching(db_url, HTTPProcessor(handler.url), max_attempts=5):
        final = wait_status(feed, "go-bad", "failed")

    assert len(handler.of("go-bad")) == 1
    assert [(f.attempts, f.last_error) for f in final.failed_items] == [(1, "cannot parse")]


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
    assert final.failed_items == ()
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

    assert final.items["total"] == 4  # the root and the children of one answer, once
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

    [failed] = final.failed_items
    assert failed.attempts == 2
    assert (failed.last_error or "").startswith("HTTP 500")
    assert "upstream exploded: xxx" in (failed.last_error or "")


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

    assert final.items == {"total": 1, "available": 0, "complete": 1, "failed": 0, "cancelled": 0}
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


# ---------------------------------------------------------------- hostile answers are contained (issue 14)
#
# Each answer a probe found to stop a watcher's writes for good: the hostile item must fail as a
# transient failure with a clear last_error (its attempts counted: it fails after --max-attempts 2),
# while the other items of its partition and a second partition complete.

HOSTILE = {"max_attempts": 2}


def hostile_partitions(feed: Feed) -> None:
    feed.add_partition("hostile", items=[(0, js({"hostile": True}))] + [(0, js({"n": n})) for n in range(3)])
    feed.add_partition("calm", items=[(0, js({"n": n})) for n in range(3)])


def is_hostile(body: dict[str, Any]) -> bool:
    return isinstance(body.get("data"), dict) and body["data"].get("hostile") is True


def contained(feed: Feed, *, attempts: int = 2) -> FailedItem:
    """Wait until the calm partition completed and the hostile one failed on its hostile item only;
    the failed item's record (its last_error and attempts)."""
    calm = wait_status(feed, "calm", "complete")
    assert calm.items["complete"] == 3
    hostile = wait_status(feed, "hostile", "failed")
    assert hostile.items == {"total": 4, "available": 0, "complete": 3, "failed": 1, "cancelled": 0}
    [failed] = hostile.failed_items
    assert failed.attempts == attempts
    return failed


def answering(hostile_answer: tuple[Any, ...]) -> Any:
    return lambda body: hostile_answer if is_hostile(body) else (200, {"done": True})


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (
            (200, {"gate": 18446744073709551616}),
            "invalid answer: gate 18446744073709551616 is out of range (0..2147483647)",
        ),
        (
            (200, {"done": True, "items": [{"gate": 2**63, "data": {"child": 1}}]}),
            "invalid answer: child 1: gate 9223372036854775808 is out of range (0..2147483647)",
        ),
        (
            (200, b'{"gate": 0, "retry_after": Infinity}'),
            "invalid answer: non-standard JSON: Infinity is not allowed",
        ),
        ((200, b'{"gate": 0, "retry_after": NaN}'), "invalid answer: non-standard JSON: NaN is not allowed"),
        ((200, b'{"done": true, "data": {"score": NaN}}'), "invalid answer: non-standard JSON: NaN is not allowed"),
        ((200, b'{"gate": 0, "retry_after": 1e400}'), "invalid answer: non-standard JSON: the number 1e400"),
    ],
    ids=["gate-2**64", "child-gate-2**63", "retry-after-infinity", "retry-after-nan", "nan-in-data", "1e400"],
)
def test_hostile_answer_is_an_invalid_answer_and_others_complete(
    db_url: str, feed: Feed, handler: HandlerService, answer: tuple[Any, ...], reason: str
) -> None:
    handler.behavior = answering(answer)
    hostile_partitions(feed)
    with watching(db_url, HTTPProcessor(handler.url), **HOSTILE):
        failed = contained(feed)

    assert (failed.last_error or "").startswith(reason), failed.last_error
    # Attempts counted, no tight loop: the hostile item was asked exactly twice.
    assert len([d for d in handler.of("hostile") if is_hostile(d.body)]) == 2


@pytest.mark.parametrize("retry_after", ["inf", "1e400", "nan"])
def test_503_with_a_non_finite_retry_after_header_is_retried_after_the_backoff(
    db_url: str, feed: Feed, handler: HandlerService, retry_after: str
) -> None:
    handler.behavior = answering((503, "busy", {"Retry-After": retry_after}))
    hostile_partitions(feed)
    with watching(db_url, HTTPProcessor(handler.url), **HOSTILE):
        failed = contained(feed)

    assert failed.last_error == f"HTTP 503 from {handler.url}: busy"
    first, second = [d for d in handler.of("hostile") if is_hostile(d.body)]
    assert second.start - first.end < 10.0  # the backoff (0.05 s), the header taken as absent (not 600 s)


def test_503_with_a_huge_retry_after_header_is_capped_at_max_retry_delay(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    handler.behavior = answering((503, "busy", {"Retry-After": "300000000000"}))
    hostile_partitions(feed)
    with watching(db_url, HTTPProcessor(handler.url), max_retry_delay=0.5, **HOSTILE):
        failed = contained(feed)

    assert failed.last_error == f"HTTP 503 from {handler.url}: busy"
    first, second = [d for d in handler.of("hostile") if is_hostile(d.body)]
    # The longer delay wins, capped at 0.5 s (the upper bound only tells a cap from 300,000,000,000 s:
    # a loaded machine has taken 2 s to ask again).
    assert 0.5 - 0.01 <= second.start - first.end < 10.0


def test_not_yet_with_a_huge_retry_after_is_asked_again_after_max_retry_delay(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    seen = PerItem()

    def behavior(body: dict[str, Any]) -> tuple[Any, ...]:
        if is_hostile(body) and seen.next(body) <= 2:
            return 200, {"gate": body["gate"], "retry_after": 1e308}
        return 200, {"done": True}

    handler.behavior = behavior
    hostile_partitions(feed)
    with watching(db_url, HTTPProcessor(handler.url), max_retry_delay=0.5, **HOSTILE):
        wait_status(feed, "calm", "complete")
        final = wait_status(feed, "hostile", "complete")

    assert final.failed_items == ()
    deliveries = [d for d in handler.of("hostile") if is_hostile(d.body)]
    assert [d.body["attempt"] for d in deliveries] == [1, 1, 1]  # "not yet" is not a failure
    assert all(0.5 - 0.01 <= gap < 10.0 for gap in gaps(deliveries)), gaps(deliveries)  # capped, not 1e308 s


# ---------------------------------------------------------------- hostile Python processors


class Hostile(Processor):
    """Answers `make()` for the hostile item, done for the others."""

    def __init__(self, make: Any) -> None:
        self.make = make

    async def process(self, item: Item) -> Response:
        if item.json().get("hostile") is True:
            return self.make()
        return Response(done=True)


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda: Response(gate=2**63), "ValueError: Response gate 9223372036854775808 is out of range (0..2147483647)"),
        (
            lambda: Response(done=True, items=[(2**63, {"child": 1})]),
            "ValueError: Response child 1: gate 9223372036854775808 is out of range (0..2147483647)",
        ),
        (lambda: Response(done=True, data={"at": {1, 2}}), "TypeError: Response data is not JSON-serialisable"),
        (lambda: Response(gate=0, retry_after=float("nan")), "ValueError: Response retry_after must be a finite"),
        (lambda: {"done": True}, "invalid answer: process() returned dict"),
    ],
    ids=["gate-2**63", "child-gate-2**63", "data-set", "retry-after-nan", "not-a-response"],
)
def test_a_python_processors_bad_response_fails_its_item_and_others_complete(
    db_url: str, feed: Feed, make: Any, reason: str
) -> None:
    hostile_partitions(feed)
    with watching(db_url, Hostile(make), **HOSTILE):
        failed = contained(feed)

    assert (failed.last_error or "").startswith(reason), failed.last_error


def test_a_python_processors_json_data_and_children_are_encoded(db_url: str, feed: Feed, store: Store) -> None:
    class Classify(Processor):
        def process(self, item: Item) -> Response:
            if item.gate == 0:
                return Response(done=True, data={"label": "invoice"}, items=[(1, {"file": "a.pdf"})])
            return Response(done=True, data=["é", 1])

    feed.add_partition("encoded", items=[(0, js({"file": "folder"}))])
    with watching(db_url, Classify()):
        wait_status(feed, "encoded", "complete")

    with store.read() as conn:
        stored = sorted((row.gate, bytes(row.data)) for row in conn.execute(select(items.c.gate, items.c.data)))
    assert stored == [(0, b'{"label":"invoice"}'), (1, '["é",1]'.encode())]


# ---------------------------------------------------------------- answers bounded in size and time


class RawHandler:
    """An HTTP handler whose answers a test writes on the socket itself: `script(body, send)`, where
    `send(bytes)` writes at once and raises OSError once the client has gone."""

    def __init__(self, script: Any) -> None:
        self.deliveries: list[Delivery] = []
        self.lock = threading.Lock()
        self.closing = threading.Event()
        service = self

        class _Request(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                start = time.time()
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                delivery = Delivery(body, dict(self.headers.items()), start, start)
                with service.lock:
                    service.deliveries.append(delivery)

                def send(data: bytes) -> None:
                    if service.closing.is_set():
                        raise OSError("closing")
                    self.wfile.write(data)
                    self.wfile.flush()

                try:
                    script(body, send)
                except OSError:  # the client gave up (what these tests are about)
                    self.close_connection = True
                delivery.end = time.time()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Request)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/handle"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def of(self, partition: str) -> list[Delivery]:
        with self.lock:
            return sorted((d for d in self.deliveries if d.body["partition"] == partition), key=lambda d: d.start)

    def close(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()


def head(status: int = 200, **headers: str) -> bytes:
    lines = [f"HTTP/1.1 {status} X", "Content-Type: application/json"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def done(send: Any) -> None:
    send(head(Content_Length="14") + b'{"done": true}')


@contextlib.contextmanager
def raw_handler(script: Any) -> Iterator[RawHandler]:
    service = RawHandler(script)
    try:
        yield service
    finally:
        service.close()


@functools.cache
def gzip_bomb() -> bytes:
    """About 200 KB of gzip that inflates to 200 MB of zeros (built a megabyte at a time)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    bomb = b"".join(compressor.compress(zeros) for _ in range(200)) + compressor.flush()
    assert len(bomb) < 250_000
    return bomb


def test_a_gzip_bomb_is_cut_at_max_answer_bytes_with_flat_memory(db_url: str, feed: Feed) -> None:
    bomb = gzip_bomb()

    def script(body: dict[str, Any], send: Any) -> None:
        if is_hostile(body):
            send(head(Content_Encoding="gzip", Content_Length=str(len(bomb))) + bomb)
        else:
            done(send)

    limit = 1 << 20
    hostile_partitions(feed)
    tracemalloc.start()
    try:
        with (
            raw_handler(script) as service,
            watching(db_url, HTTPProcessor(service.url, max_answer_bytes=limit), **HOSTILE),
        ):
            failed = contained(feed)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert failed.last_error == f"answer larger than {limit} bytes from {service.url}"
    # Inflated a chunk at a time, one 64 KiB chunk of the bomb alone would be 64 MiB.
    assert peak < 16 * (1 << 20), f"peak of traced memory {peak / (1 << 20):.1f} MiB"


def test_a_huge_content_length_is_refused_before_reading(db_url: str, feed: Feed) -> None:
    def script(body: dict[str, Any], send: Any) -> None:
        if is_hostile(body):
            send(head(Content_Length=str(10**12)) + b"{")  # and nothing more: reading would wait
        else:
            done(send)

    hostile_partitions(feed)
    with raw_handler(script) as service, watching(db_url, HTTPProcessor(service.url, timeout=30), **HOSTILE):
        failed = contained(feed)

    assert failed.last_error == (
        f"answer larger than {10 * 1024 * 1024} bytes (Content-Length: 1000000000000) from {service.url}"
    )


def test_timeout_bounds_the_whole_request_not_each_read(db_url: str, feed: Feed) -> None:
    def script(body: dict[str, Any], send: Any) -> None:
        if not is_hostile(body):
            return done(send)
        send(head(Content_Length="100"))
        for _ in range(100):  # a byte every 0.5 s: each read is well within --timeout 1, the answer never
            time.sleep(0.5)
            send(b" ")

    hostile_partitions(feed)
    started = time.monotonic()
    with raw_handler(script) as service, watching(db_url, HTTPProcessor(service.url, timeout=1), **HOSTILE):
        failed = contained(feed)
        first, second = [d for d in service.of("hostile") if is_hostile(d.body)][:2]

    assert failed.last_error == f"handler timed out after 1s (whole request, {service.url})"
    # The first delivery was cut at ~1 s: the second (after a 0.05 s backoff) began soon after, not
    # after the 50 s the dribble would last (the bound leaves room for a loaded 2-core machine).
    assert 1.0 - 0.01 <= second.start - first.start < 5, second.start - first.start
    assert time.monotonic() - started < 30


# ---------------------------------------------------------------- credentials are never shown


def test_an_unreachable_handler_is_named_without_its_credentials(db_url: str, feed: Feed) -> None:
    url = f"http://feeder:s3cr%40t@127.0.0.1:{unused_port()}/handle"
    feed.add_partition("secret", items=[(0, js({}))])
    with watching(db_url, HTTPProcessor(url), max_attempts=2):
        final = wait_status(feed, "secret", "failed")

    [failed] = final.failed_items
    error = failed.last_error or ""
    assert error.startswith("handler unreachable: ClientConnectorError: Cannot connect to host 127.0.0.1:"), error
    assert error.endswith(f"(http://***@127.0.0.1:{url.rsplit(':', 1)[1].split('/')[0]}/handle)"), error
    every_error = [error, *error_events(feed, "secret"), repr(HTTPProcessor(url))]
    assert not [e for e in every_error if "s3cr" in e or "feeder" in e], every_error


def test_a_handler_with_credentials_gets_them_but_errors_do_not_show_them(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    handler.behavior = lambda body: (500, "boom: " + "x" * 600)
    url = handler.url.replace("http://", "http://feeder:s3cret@")
    feed.add_partition("auth-fail", items=[(0, js({}))])
    with watching(db_url, HTTPProcessor(url), max_attempts=2):
        final = wait_status(feed, "auth-fail", "failed")

    [failed] = final.failed_items
    shown_url = handler.url.replace("http://", "http://***@")
    assert failed.last_error == f"HTTP 500 from {shown_url}: boom: " + "x" * 494  # the body's first 500 bytes
    expected = "Basic " + base64.b64encode(b"feeder:s3cret").decode()
    assert all(d.headers["authorization"] == expected for d in handler.of("auth-fail"))


def test_a_handlers_secret_query_values_are_never_shown(db_url: str, feed: Feed, handler: HandlerService) -> None:
    handler.behavior = lambda body: (500, "boom")
    feed.add_partition("keyed", items=[(0, js({}))])
    with watching(db_url, HTTPProcessor(handler.url + "?api_key=K3Y-s3cret&mode=fast"), max_attempts=2):
        final = wait_status(feed, "keyed", "failed")

    [failed] = final.failed_items
    assert failed.last_error == f"HTTP 500 from {handler.url}?api_key=***&mode=fast: boom"
    assert handler.of("keyed")  # the handler was called with its key
    shown = [failed.last_error, *error_events(feed, "keyed"), str(feed.recent_failures())]
    assert len(shown) == 3 and not [text for text in shown if "K3Y" in text], shown


def test_credentials_in_the_url_and_an_authorization_header_are_refused_together() -> None:
    with pytest.raises(ValueError, match=r"handler http://\*\*\*@ocr/ has credentials in its URL and an Authorization"):
        HTTPProcessor("http://u:p@ocr/", headers={"authorization": "Bearer x"})
    HTTPProcessor("http://u:p@ocr/", headers={"X-Trace": "1"})  # any other header goes with them


def test_healthz_reason_never_shows_the_handlers_credentials() -> None:
    port = unused_port()
    reason = handler_reason(f"http://feeder:s3cret@127.0.0.1:{port}/handle")
    assert reason is not None and reason.startswith(f"handler http://127.0.0.1:{port}/: ")
    assert "s3cret" not in reason and "feeder" not in reason
    assert handler_base("https://u:p@ocr:8443/classify") == "https://ocr:8443/"
