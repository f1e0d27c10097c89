"""Scheduling controls (issue 7): per-item timeouts, the global concurrency limit per queue with weights,
progress reports, and time windows, on SQLite and PostgreSQL.

In-process watchers (`watching`, from test_watcher) check the behaviour of one watcher; the
concurrency limit across several watchers is checked with real `feedproc watch` processes.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from feedproc import Feed, Item, Processor, Response

from .support import HandlerService, run_cli
from .test_watcher import history_of, wait_status, watching


def js(value: Any) -> bytes:
    return json.dumps(value).encode()


# ---------------------------------------------------------------- per-item timeout


class SlowFirstAttempt(Processor):
    """Sleeps `seconds` on an item's first attempt, answers at once afterwards."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.attempts: list[int] = []

    async def process(self, item: Item) -> Response:
        self.attempts.append(item.attempt)
        if item.attempt == 1:
            await asyncio.sleep(self.seconds)
        return Response(done=True)


def retried_errors(feed: Feed, key: str) -> list[str]:
    return [e["detail"]["error"] for e in history_of(feed, key, "item_retried")]


def test_a_call_running_past_the_watchers_item_timeout_is_abandoned_and_retried(db_url: str, feed: Feed) -> None:
    feed.add_partition("slow", [(0, b"{}")])
    processor = SlowFirstAttempt(30)
    started = time.monotonic()
    with watching(db_url, processor, item_timeout=0.3):
        wait_status(feed, "slow", "complete")
    assert time.monotonic() - started < 15  # not the 30 s the first call would have taken
    assert processor.attempts == [1, 2]
    assert retried_errors(feed, "slow") == ["item timed out after 0.3s"]


def test_a_partitions_item_timeout_overrides_the_watchers(db_url: str, feed: Feed) -> None:
    feed.add_partition("strict", [(0, b"{}")], item_timeout=0.2)
    feed.add_partition("lenient", [(0, b"{}")], item_timeout=5)
    with watching(db_url, SlowFirstAttempt(0.6), item_timeout=2):
        wait_status(feed, "strict", "complete")
        wait_status(feed, "lenient", "complete")
    assert retried_errors(feed, "strict") == ["item timed out after 0.2s"]
    assert retried_errors(feed, "lenient") == []


def test_an_item_timing_out_on_every_attempt_fails_with_the_timeout_as_its_error(db_url: str, feed: Feed) -> None:
    feed.add_partition("hopeless", [(0, b"{}")], item_timeout=0.1)

    class Forever(Processor):
        async def process(self, item: Item) -> Response:
            await asyncio.sleep(60)
            return Response(done=True)

    with watching(db_url, Forever(), max_attempts=2):
        final = wait_status(feed, "hopeless", "failed")
    assert final["failed_items"][0]["attempts"] == 2
    assert final["failed_items"][0]["last_error"] == "item timed out after 0.1s"


def test_an_http_call_running_past_the_item_timeout_is_a_transient_failure(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    from feedproc import HTTPProcessor

    handler.behavior = lambda body: (200, {"done": True}, {}, 5 if body["attempt"] == 1 else 0)
    feed.add_partition("web", [(0, b"{}")])
    with watching(db_url, HTTPProcessor(handler.url, timeout=30), item_timeout=0.3):
        wait_status(feed, "web", "complete")
    assert [d.body["attempt"] for d in handler.of("web")][-1] == 2
    assert retried_errors(feed, "web") == ["item timed out after 0.3s"]


def test_add_item_timeout_option_is_stored_and_shown_in_status(db_url: str) -> None:
    result = run_cli(db_url, "add", "job", "--item-timeout", "90s", "--weight", "3")
    assert result.returncode == 0, result.stderr
    status = json.loads(run_cli(db_url, "status", "job", "--json").stdout)
    assert status["schedule"]["item_timeout"] == 90
    assert status["schedule"]["weight"] == 3


def test_a_non_positive_item_timeout_is_malformed_input(db_url: str) -> None:
    result = run_cli(db_url, "add", "job", "--item-timeout", "0")
    assert result.returncode == 2
    assert "--item-timeout" in result.stderr
    watch = run_cli(db_url, "watch", "--handler", "http://127.0.0.1:9/x", "--item-timeout", "-1")
    assert watch.returncode == 2
