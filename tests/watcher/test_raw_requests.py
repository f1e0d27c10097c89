"""Raw requests (`HTTPProcessor(request="raw")`, `feedproc watch --request raw`): the body of each
handler request is the item's data exactly as stored, as Go Feed's HTTP processor sends it, and the
item's metadata travels in `Feedproc-*` headers. Real watchers, real HTTP over loopback, both
databases; the handler here keeps every request body as the bytes it received.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from feedproc import Feed, HTTPProcessor, Item
from feedproc.store import Store
from feedproc.watcher import Watcher, WatcherConfig

from ..api_support import ApiServer
from ..support import feedproc_env, run_cli, wait_status, wait_until, watching

# ---------------------------------------------------------------- a handler that keeps raw bodies


@dataclass
class RawRequest:
    """One request as the handler received it: the body's bytes, the headers (lower-case names)."""

    body: bytes
    headers: dict[str, str]

    @property
    def item_id(self) -> int:
        return int(self.headers["feedproc-item-id"])


RawAnswer = tuple[int, Any]  # (status, a JSON value, or bytes sent as they are)


class RawHandler:
    """A real HTTP handler on 127.0.0.1: `answer(request) -> (status, body)`; `requests` in arrival order."""

    def __init__(self) -> None:
        self.answer: Callable[[RawRequest], RawAnswer] = lambda request: (200, {"done": True})
        self.requests: list[RawRequest] = []
        self.lock = threading.Lock()
        service = self

        class _Request(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                request = RawRequest(
                    self.rfile.read(int(self.headers.get("Content-Length", 0))),
                    {name.lower(): value for name, value in self.headers.items()},
                )
                status, payload = service.answer(request)
                out = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                with service.lock:
                    service.requests.append(request)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Request)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/handle"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def of(self, partition: str) -> list[RawRequest]:
        with self.lock:
            return [r for r in self.requests if r.headers.get("feedproc-partition") == partition]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def raw() -> Iterator[RawHandler]:
    service = RawHandler()
    yield service
    service.close()


def feedproc_headers(request: RawRequest) -> dict[str, str]:
    return {name: value for name, value in request.headers.items() if name.startswith("feedproc-")}


def item_ids(feed: Feed, key: str) -> dict[bytes, int]:
    return {item.data: item.id for item in feed.items(key)}


# ---------------------------------------------------------------- the body


def test_the_body_is_the_stored_data_byte_for_byte(db_url: str, feed: Feed, raw: RawHandler) -> None:
    """Not JSON, JSON with its own spacing, a byte-order mark, nothing at all: sent as stored."""
    stored = [b'{ "a" :1 }', b"\x00\xff", b"not json at all", b'\xef\xbb\xbf{"bom": true}', b"[1,2]\n", b""]
    feed.add_partition("bytes", items=[(0, data) for data in stored])
    with watching(db_url, HTTPProcessor(raw.url, request="raw")):
        wait_status(feed, "bytes", "complete")

    ids = item_ids(feed, "bytes")
    assert {r.item_id: r.body for r in raw.of("bytes")} == {ids[data]: data for data in stored}
    assert len(raw.of("bytes")) == len(stored)


def test_the_answers_data_is_the_next_raw_body(db_url: str, feed: Feed, raw: RawHandler) -> None:
    """The data an answer stores (here in Go Feed's `response`) is what the next request carries, as stored."""
    raw.answer = lambda r: (
        (200, {"gate": 1, "complete": False, "response": {"step": 2}})
        if r.headers["feedproc-gate"] == "0"
        else (200, {"complete": True})
    )
    feed.add_partition("next", items=[(0, b'{"step": 1}')])
    with watching(db_url, HTTPProcessor(raw.url, request="raw")):
        wait_status(feed, "next", "complete")

    assert [r.body for r in raw.of("next")] == [b'{"step": 1}', b'{"step":2}']


# ---------------------------------------------------------------- the headers


def test_metadata_travels_in_feedproc_headers_and_the_content_type_is_json(
    db_url: str, feed: Feed, raw: RawHandler
) -> None:
    feed.add_partition("meta-7", items=[(0, b'{"file": "a.pdf"}')], queue="scan")
    with watching(db_url, HTTPProcessor(raw.url, request="raw"), queue="scan"):
        wait_status(feed, "meta-7", "complete")

    [request] = raw.of("meta-7")
    [item] = feed.items("meta-7")
    assert feedproc_headers(request) == {
        "feedproc-item-id": str(item.id),
        "feedproc-partition": "meta-7",
        "feedproc-queue": "scan",
        "feedproc-gate": "0",
        "feedproc-attempt": "1",
        "feedproc-deliveries": "1",
    }
    assert request.headers["content-type"] == "application/json"
    assert request.headers["user-agent"].startswith("feedproc/")


def test_the_attempt_header_counts_failed_deliveries_and_the_gate_header_follows_the_item(
    db_url: str, feed: Feed, raw: RawHandler
) -> None:
    """A 503 is a failed delivery (attempt 2 next); at a new gate the attempts start again at 1."""

    def answer(request: RawRequest) -> RawAnswer:
        gate, attempt = request.headers["feedproc-gate"], request.headers["feedproc-attempt"]
        if gate == "0" and attempt == "1":
            return 503, b"busy"
        return (200, {"gate": 4}) if gate == "0" else (200, {"done": True})

    raw.answer = answer
    feed.add_partition("retried", items=[(0, b"{}")])
    with watching(db_url, HTTPProcessor(raw.url, request="raw")):
        wait_status(feed, "retried", "complete")

    sent = [(r.headers["feedproc-gate"], r.headers["feedproc-attempt"]) for r in raw.of("retried")]
    assert sent == [("0", "1"), ("0", "2"), ("4", "1")]


def test_configured_and_overridden_request_headers_are_merged_with_the_feedproc_headers(
    db_url: str, feed: Feed, raw: RawHandler
) -> None:
    """`headers=` and a `request_headers()` override (how tests stamp dispatch times) both still apply."""

    class Stamped(HTTPProcessor):
        def request_headers(self) -> Mapping[str, str]:
            return {**super().request_headers(), "X-Dispatched-At": "12.5"}

    feed.add_partition("merged", items=[(0, b"{}")])
    with watching(db_url, Stamped(raw.url, request="raw", headers={"Authorization": "Bearer t"})):
        wait_status(feed, "merged", "complete")

    # Every delivery carries them: on a loaded machine a slow answer may have been timed out and sent again.
    request = raw.of("merged")[-1]
    assert request.headers["x-dispatched-at"] == "12.5"
    assert request.headers["authorization"] == "Bearer t"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["feedproc-partition"] == "merged"


def test_with_tracing_a_raw_request_carries_its_traceparent(db_url: str, feed: Feed, raw: RawHandler) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider

    from feedproc import tracing

    provider = TracerProvider()
    tracing.enable(provider)
    try:
        feed.add_partition("traced", items=[(0, b"{}")])
        with watching(db_url, HTTPProcessor(raw.url, request="raw")):
            wait_status(feed, "traced", "complete")
    finally:
        tracing.reset()
        provider.shutdown()

    [request] = raw.of("traced")
    assert re.fullmatch(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}", request.headers["traceparent"])
    assert request.body == b"{}"


# ---------------------------------------------------------------- callback answers


WORKER_TOKEN = "raw-callback-worker-token"


def test_with_a_callback_url_the_token_and_answer_url_travel_in_headers(
    db_url: str, feed: Feed, raw: RawHandler
) -> None:
    """The handler answers 202, then posts its answer to the Feedproc-Answer-Url with the Feedproc-Token."""
    accepted: list[RawRequest] = []

    def answer(request: RawRequest) -> RawAnswer:
        accepted.append(request)
        return 202, {"accepted": True, "lease_seconds": 60}

    raw.answer = answer
    feed.add_partition("later", items=[(0, b'{ "job" : 1 }')])
    api = ApiServer(db_url, worker_token=WORKER_TOKEN)
    try:
        with watching(db_url, HTTPProcessor(raw.url, callback_url=api.url, request="raw")):
            [request] = wait_until(lambda: list(accepted), what="the request to be accepted")
            answer_url, token = request.headers["feedproc-answer-url"], request.headers["feedproc-token"]
            assert answer_url == f"{api.url}/api/v1/items/{request.item_id}/answer"
            sent = httpx.post(
                answer_url,
                json={"token": token, "complete": True, "response": {"job": 1, "ok": True}},
                headers={"Authorization": f"Bearer {WORKER_TOKEN}"},
            )
            assert sent.status_code == 200, sent.text
            wait_status(feed, "later", "complete")
    finally:
        api.close()

    assert request.body == b'{ "job" : 1 }'  # nothing was added to the handler's own data
    assert [item.data for item in feed.items("later")] == [b'{"job":1,"ok":true}']


# ---------------------------------------------------------------- the JSON body stays the default


@pytest.mark.parametrize("options", [{}, {"request": "json"}], ids=["default", "explicit"])
def test_json_requests_are_unchanged(db_url: str, feed: Feed, raw: RawHandler, options: dict[str, Any]) -> None:
    """Without `request="raw"` the body is the contract's JSON and no Feedproc-* header is sent."""
    feed.add_partition("wrapped", items=[(0, b'{ "a" :1 }')], queue="q")
    with watching(db_url, HTTPProcessor(raw.url, **options), queue="q"):
        wait_status(feed, "wrapped", "complete")

    [request] = raw.requests
    [item] = feed.items("wrapped")
    fields = b'"partition":"wrapped","queue":"q","gate":0,"attempt":1,"deliveries":1'
    expected = b'{"id":%d,%s,"data":{ "a" :1 }}' % (item.id, fields)
    assert request.body == expected
    assert feedproc_headers(request) == {}
    assert request.headers["content-type"] == "application/json"


# ---------------------------------------------------------------- what raw requests refuse


def test_an_unknown_request_format_is_a_value_error_naming_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="request must be one of 'json', 'raw', got 'xml'"):
        HTTPProcessor("http://127.0.0.1:9/", request="xml")


def test_a_raw_processor_refuses_to_deliver_a_batch() -> None:
    """A batch's body is the contract's `{"items": [...]}`: there is no raw form of it."""
    processor = HTTPProcessor("http://127.0.0.1:9/", request="raw")
    item = Item(1, "p", "default", 0, 1, b"{}")
    with pytest.raises(ValueError, match="cannot deliver batches"):
        asyncio.run(processor.deliver_batch([item, item]))


def test_a_watcher_refuses_a_raw_processor_with_batches(store: Store) -> None:
    """Refused when the watcher is made, not item by item once it runs."""
    with pytest.raises(ValueError, match="batch must be 1"):
        Watcher(store, HTTPProcessor("http://127.0.0.1:9/", request="raw"), WatcherConfig(batch=10))


def one_line_error(result: Any, code: int, fragment: str) -> None:
    assert result.returncode == code, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert fragment in result.stderr, result.stderr


@pytest.mark.sqlite_only  # refused before any database access
@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["--request", "raw", "--batch", "10"], {}, "--request raw sends one item per request"),
        ([], {"FEEDPROC_REQUEST": "raw", "FEEDPROC_BATCH": "2"}, "cannot be used with --batch 2"),
    ],
    ids=["options", "environment"],
)
def test_watch_refuses_raw_requests_with_batches(db_url: str, args: list[str], env: dict[str, str], says: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "feedproc", "watch", "--handler", "http://127.0.0.1:9/", *args],
        env=feedproc_env(db_url, **env),
        capture_output=True,
        text=True,
        timeout=30,
    )
    one_line_error(result, 2, says)


@pytest.mark.sqlite_only  # refused before any database access
def test_watch_refuses_an_unknown_request_format(db_url: str) -> None:
    result = run_cli(db_url, "watch", "--handler", "http://127.0.0.1:9/", "--request", "xml", timeout=30)
    one_line_error(result, 2, "--request 'xml': use json or raw")


@pytest.mark.sqlite_only  # refused before any database access
def test_watch_refuses_request_with_a_python_processor(db_url: str) -> None:
    result = run_cli(db_url, "watch", "--processor", "cli_processors:LoggedSlow", "--request", "raw", timeout=30)
    one_line_error(result, 2, "--request applies to --handler only")
