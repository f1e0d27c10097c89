"""Tolerated failures with a running watcher (issue 31, every database): a handler that fails some
items for good does not fail their partition within the gate's tolerance; crossing it stops the
partition promptly, its requests still in flight aborted and whatever answers come late dropped."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from feedproc import Feed, HTTPProcessor, Item, PermanentError, Processor, Response
from feedproc.core.pipelines import parse_toml
from feedproc.core.views import Tolerated

from ..support import HandlerService, json_of, wait_status, wait_until, watching

PIPELINE = """
queue = "default"
[[gate]]
name = "ocr"
number = 0
tolerate = "5%"
[[gate]]
name = "rank"
number = 1
"""


def numbered(count: int) -> list[tuple[int, bytes]]:
    return [(0, json.dumps({"n": n}).encode()) for n in range(count)]


def test_a_handler_failing_items_for_good_within_the_tolerance_lets_the_partition_complete(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    feed.apply_pipeline(parse_toml(PIPELINE))  # its gates go to the watcher's own handler
    handler.behavior = lambda body: (
        (400, "unreadable file") if body["data"].get("n") in (5, 11) else (200, {"done": True})
    )
    feed.add_partition("scan", [*numbered(40), (1, b'{"rank": true}')])
    with watching(db_url, HTTPProcessor(handler.url), concurrency=8):
        status = wait_status(feed, "scan", "complete")
    assert status.gates["0"] == {"available": 0, "complete": 38, "failed": 2, "cancelled": 0}
    assert status.tolerated == {"0": Tolerated(failed=2, allowed="5%", items=40, limit=2, exceeded=False)}
    assert [d.body["data"] for d in handler.of("scan") if d.gate == 1] == [{"rank": True}], "gate 1 never ran"
    assert {(f.last_error or "")[:8] for f in status.failed_items} == {"HTTP 400"}


class Holding:
    """An HTTP handler on loopback: items of partition "p" numbered below 3 fail for good (400), its
    other items are held (no answer) until the client gives up on them; other partitions' items
    are done at once. Counts the requests held and those the client aborted."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/"
        self.lock = threading.Lock()
        self.held: set[int] = set()
        self.aborted: set[int] = set()
        self.done: list[str] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.sock.accept()
                threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            reader = conn.makefile("rb")
            while True:  # one request after another on a kept-alive connection
                length = 0
                line = reader.readline()
                if not line:
                    return
                while line not in (b"\r\n", b"\n", b""):
                    name, _, value = line.decode().partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                    line = reader.readline()
                body = json.loads(reader.read(length))
                if body["partition"] == "p" and body["data"]["n"] >= 3:
                    with self.lock:
                        self.held.add(body["id"])
                    conn.settimeout(120)
                    while conn.recv(65536):  # b"": the client closed the connection
                        pass
                    with self.lock:
                        self.aborted.add(body["id"])
                    return
                failed = body["partition"] == "p"
                out = b"unreadable file" if failed else b'{"done": true}'
                status = b"400 Bad Request" if failed else b"200 OK"
                with self.lock:
                    self.done.append(body["partition"])
                conn.sendall(b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n%s" % (status, len(out), out))

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def holding() -> Iterator[Holding]:
    server = Holding()
    yield server
    server.close()


def test_crossing_the_tolerance_stops_the_partition_promptly_and_aborts_its_requests_in_flight(
    db_url: str, feed: Feed, holding: Holding
) -> None:
    feed.add_partition("p", numbered(20), tolerate="2")
    with watching(db_url, HTTPProcessor(holding.url, timeout=120), concurrency=6) as running:
        status = wait_status(feed, "p", "failed", timeout=30)
        assert status.items["failed"] == 3 and status.items["cancelled"] == 17
        wait_until(
            lambda: holding.held and holding.aborted == holding.held, timeout=10, what="the held requests aborted"
        )
        # The workers are free: a partition added now is done long before a held request would time out.
        began = time.monotonic()
        feed.add_partition("next", numbered(6))
        wait_status(feed, "next", "complete", timeout=30)
        assert time.monotonic() - began < 30
        wait_until(lambda: not running.watcher.inflight, timeout=10, what="the cancelled calls' outcomes handled")
        assert running.watcher.fatal is None
    after = feed.status("p")
    assert (after.status, after.items) == (status.status, status.items), "a late answer changed it"
    for item_id in holding.held:  # the cancellation is their last word: nothing of the aborted calls was written
        item = feed.item(item_id)
        assert item.status == "cancelled" and [h.outcome for h in item.history] == ["cancelled"]
        assert item.last_error == "cancelled: 3 of 20 items failed at gate 0, more than the 2 tolerated"


def test_a_late_answer_of_an_item_cancelled_by_a_crossing_is_dropped(db_url: str, feed: Feed) -> None:
    """A plain `def` processor that ignores `item.cancelled` and answers done after the crossing."""
    started, release, returned = threading.Event(), threading.Event(), threading.Event()

    class Stubborn(Processor):
        def process(self, item: Item) -> Response:
            n = json_of(item.data)["n"]
            if n == 0:
                started.set()
                release.wait(30)
                returned.set()
                return Response(done=True)
            started.wait(30)  # the slow one is in flight before any fails
            raise PermanentError(f"item {n} is unreadable")

    feed.add_partition("p", numbered(3), tolerate="1")
    with watching(db_url, Stubborn(), concurrency=3) as running:
        wait_status(feed, "p", "failed", timeout=30)
        (slow,) = feed.items("p", status="cancelled")
        release.set()
        assert returned.wait(30)
        wait_until(lambda: slow.id not in running.watcher.inflight, timeout=10, what="its outcome handled")
        assert running.watcher.fatal is None
    item = feed.item(slow.id)
    assert item.status == "cancelled" and [h.outcome for h in item.history] == ["cancelled"]
    assert feed.status("p").status == "failed"
