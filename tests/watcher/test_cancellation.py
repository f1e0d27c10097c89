"""Cancelling a partition reaches the work in progress (every database): an `async def` processor's
call is cancelled, an HTTP request is aborted, a plain `def` processor sees `item.cancelled`; the
watcher goes on with other partitions."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from feedproc import Feed, HTTPProcessor, Item, Processor, Response

from ..support import wait_status, wait_until, watching


class Hangs(Processor):
    """Gate 0 of partition "stuck" hangs until cancelled (and says so); any other item completes at once."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.cancelled = threading.Event()
        self.done: list[str] = []

    async def process(self, item: Item) -> Response:
        if item.partition == "stuck" and item.gate == 0:
            self.started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        self.done.append(item.partition)
        return Response(done=True)


def test_cancelling_a_partition_cancels_its_async_call_and_the_watcher_goes_on(db_url: str, feed: Feed) -> None:
    processor = Hangs()
    feed.add_partition("stuck", [(0, b"{}")])
    with watching(db_url, processor, concurrency=1, lease_seconds=3) as running:
        assert processor.started.wait(30)
        feed.cancel("stuck")
        assert processor.cancelled.wait(10), "the call was not cancelled"
        feed.add_partition("next", [(0, b"{}")])  # the only worker must be free again
        wait_status(feed, "next", "complete")
        assert running.watcher.fatal is None
    assert feed.status("stuck").status == "cancelled"
    assert processor.done == ["next"]


def test_a_plain_def_processor_sees_item_cancelled(db_url: str, feed: Feed) -> None:
    seen = threading.Event()
    started = threading.Event()

    class Polls(Processor):
        def process(self, item: Item) -> Response:
            started.set()
            deadline = time.monotonic() + 60
            while not item.cancelled and time.monotonic() < deadline:
                time.sleep(0.02)
            if item.cancelled:
                seen.set()
            return Response(done=True)

    feed.add_partition("stuck", [(0, b"{}")])
    with watching(db_url, Polls(), concurrency=1, lease_seconds=3):
        assert started.wait(30)
        feed.cancel("stuck")
        assert seen.wait(10), "item.cancelled never became true"


class SilentHandler:
    """An HTTP server that reads a request and never answers; `aborted` is set when the client closes
    the connection (the request was abandoned)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/"
        self.received = threading.Event()
        self.aborted = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            conn, _ = self.sock.accept()
            with conn:
                conn.recv(65536)
                self.received.set()
                while conn.recv(65536):  # b"": the client closed its side
                    pass
                self.aborted.set()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def silent() -> Iterator[SilentHandler]:
    server = SilentHandler()
    yield server
    server.close()


def test_cancelling_a_partition_aborts_its_http_request(db_url: str, feed: Feed, silent: SilentHandler) -> None:
    feed.add_partition("stuck", [(0, b"{}")])
    with watching(db_url, HTTPProcessor(silent.url, timeout=120), concurrency=1, lease_seconds=3):
        assert silent.received.wait(30)
        feed.cancel("stuck")
        wait_until(silent.aborted.is_set, timeout=10, what="the request to be aborted")


def test_skipping_an_item_in_progress_cancels_its_call_and_its_partition_goes_on(db_url: str, feed: Feed) -> None:
    processor = Hangs()
    feed.add_partition("stuck", [(0, b"{}"), (1, b"{}")])
    with watching(db_url, processor, concurrency=1, lease_seconds=3) as running:
        assert processor.started.wait(30)
        (item,) = feed.items("stuck", gate=0)
        feed.act_on_items("skip", ids=[item.id], by="test")
        assert processor.cancelled.wait(10), "the call was not cancelled"
        wait_status(feed, "stuck", "complete")  # gate 1's item ran: the worker was free again
        assert running.watcher.fatal is None
    assert [h.outcome for h in feed.item(item.id).history] == ["skipped"]
