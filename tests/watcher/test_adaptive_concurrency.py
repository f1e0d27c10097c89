"""Adaptive concurrency with real watchers and a real HTTP handler (issue 34), every database: a
handler that allows 20 requests in flight and answers 429 beyond gets, from three watchers that
could send 48 at once, a fleet that converges near 20 and partitions that complete with no item
near its last attempt; the window is a gauge per gate; a gate whose handler never pushes back gets no
window (nothing is written for it)."""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack
from typing import Any

from feedproc import Feed, HTTPProcessor

from ..support import HandlerService, metric, wait_status, wait_until, watching


class Crowded:
    """A handler's behaviour: 20 requests in flight at most, each 50 ms; 429 beyond. Keeps, per
    request, when it came and how many were in flight then (itself included)."""

    def __init__(self, allowed: int = 20, pause: float = 0.05) -> None:
        self.allowed, self.pause = allowed, pause
        self.lock = threading.Lock()
        self.now = 0
        self.seen: list[tuple[float, int, bool]] = []  # (time, in flight, refused)

    def __call__(self, body: dict[str, Any]) -> tuple[Any, ...]:
        with self.lock:
            self.now += 1
            refused = self.now > self.allowed
            self.seen.append((time.monotonic(), self.now, refused))
            if refused:
                self.now -= 1
        if refused:
            return (429, {"error": {"message": "too many requests"}})
        time.sleep(self.pause)
        with self.lock:
            self.now -= 1
        return (200, {"done": True})


def test_the_fleet_converges_near_what_the_handler_allows_and_no_item_runs_out_of_attempts(
    db_url: str, feed: Feed
) -> None:
    crowded = Crowded()
    handler = HandlerService(crowded)
    for n in range(6):  # a partition is one watcher's: six, so that each of the three has work
        feed.add_partition(f"upload-{n}", [(0, b"{}")] * 250)
    windows: list[tuple[float, float | None]] = []  # (time, the window as a watcher's /metrics shows it)
    try:
        with ExitStack() as running:
            watchers = [
                running.enter_context(watching(db_url, HTTPProcessor(handler.url), concurrency=16, retry_delay=0.05))
                for _ in range(3)
            ]

            def window() -> float | None:
                texts = [w.watcher.metrics.render().decode() for w in watchers]
                found = [metric(t, "feedproc_concurrency_window", queue="default", gate="0") for t in texts]
                windows.append((time.monotonic(), next((g for g in found if g is not None), None)))
                return all(feed.status(f"upload-{n}").status == "complete" for n in range(6))

            wait_until(window, timeout=120, every=0.05, what="the partitions complete")
    finally:
        handler.close()
    retried = []
    for n in range(6):
        assert feed.status(f"upload-{n}").items.get("failed", 0) == 0
        retried += [item.attempts for item in feed.items(f"upload-{n}", limit=500) if item.attempts]
    measured: dict[str, float] = {"retried": len(retried), "most": max(retried, default=0)}
    with crowded.lock:
        seen = list(crowded.seen)
    start, end = seen[0][0], seen[-1][0]
    half = start + (end - start) / 2
    settled = [refused for at, _, refused in seen if at >= half]
    refused_share = sum(settled) / len(settled)
    shown = [width for at, width in windows if at >= half and width is not None]
    mean_window = sum(shown) / len(shown)
    measured |= {"window": round(mean_window, 1), "refused": round(refused_share, 3), "requests": len(seen)}
    assert measured["most"] <= 3, measured  # of the 5 attempts each item has
    assert 12 <= mean_window <= 28, measured  # near the 20 the handler allows, not the 48 sent at first
    assert refused_share < 0.15, measured  # before: 28 of every 48 sent were refused, all along


def test_a_handler_that_never_pushes_back_gets_no_window(db_url: str, feed: Feed) -> None:
    handler = HandlerService()
    feed.add_partition("upload", [(0, b"{}")] * 200)
    try:
        with watching(db_url, HTTPProcessor(handler.url), concurrency=16) as running:
            wait_status(feed, "upload", "complete")
            assert running.watcher._fetcher._adaptive.widths == {}
            text = running.watcher.metrics.render().decode()
    finally:
        handler.close()
    assert feed.store.gate_windows("default") == {}
    assert metric(text, "feedproc_concurrency_window", queue="default", gate="0") is None


def test_a_window_grows_back_and_goes_once_the_handler_has_room_again(db_url: str, feed: Feed) -> None:
    crowded = Crowded(allowed=4)
    handler = HandlerService(crowded)
    feed.add_partition("first", [(0, b"{}")] * 200)
    try:
        with watching(db_url, HTTPProcessor(handler.url), concurrency=16, retry_delay=0.05):
            wait_until(lambda: feed.store.gate_windows("default"), what="a window opened by the 429s")
            crowded.allowed = 1000  # room again: answers succeed, the window grows past 16 and goes
            wait_status(feed, "first", "complete", timeout=90)
            feed.add_partition("second", [(0, b"{}")] * 400)
            wait_until(lambda: feed.store.gate_windows("default") == {}, timeout=60, what="the window removed")
            wait_status(feed, "second", "complete", timeout=60)
    finally:
        handler.close()
