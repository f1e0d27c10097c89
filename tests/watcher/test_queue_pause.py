"""Pausing a queue (every database): fleet-wide, in-flight items finish and nothing new starts,
for watchers and pull workers alike, until it is resumed; who paused it is kept."""

from __future__ import annotations

import asyncio
import threading
import time

from feedproc import Feed, Item, Processor, Response

from ..support import wait_status, wait_until, watching


class Gated(Processor):
    """Each call waits for `release`; `started` counts calls."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = 0
        self.lock = threading.Lock()

    async def process(self, item: Item) -> Response:
        with self.lock:
            self.started += 1
        while not self.release.is_set():
            await asyncio.sleep(0.01)
        return Response(done=True)


def test_a_paused_queue_finishes_what_is_in_flight_and_starts_nothing_until_resumed(db_url: str, feed: Feed) -> None:
    processor = Gated()
    feed.add_partition("p", [(0, b"{}")] * 10)
    with watching(db_url, processor, concurrency=2) as running:
        wait_until(lambda: processor.started == 2, what="two calls in flight")
        feed.set_queue("default", paused=True, by="ops")
        wait_until(lambda: running.watcher.queue_settings.paused, what="the watcher to read the pause")
        processor.release.set()
        wait_until(lambda: feed.summary().items["complete"] == 2, what="the two in flight to finish")
        # Nothing can announce that nothing started: watch for ten poll intervals (0.05 s each).
        time.sleep(0.5)
        assert processor.started == 2
        assert feed.queue("default").paused_by == "ops"
        feed.set_queue("default", paused=False)
        wait_status(feed, "p", "complete")
    assert processor.started == 10


def test_a_paused_pull_queue_hands_out_no_claims(feed: Feed) -> None:
    feed.set_queue("gpu", mode="pull", paused=True)
    feed.add_partition("p", [(0, b"{}")], queue="gpu")
    assert feed.claim("gpu", "w") == []
    feed.set_queue("gpu", paused=False)
    assert len(feed.claim("gpu", "w")) == 1
