"""Waiting for completion: `Feed.wait(key, timeout=None)` and `feedproc wait KEY [--timeout S]`.

A waiter returns the final status once the partition is complete, failed or cancelled; on PostgreSQL
it is woken by a notification sent in the finishing transaction, not by polling.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import pytest

from feedproc import Feed, NotFound
from feedproc.store import Store
from feedproc.wait import wait_final

from ..support import run_cli


def later(seconds: float, action: Callable[[], object]) -> threading.Thread:
    """Run `action` on a thread after `seconds` (the change a waiter is blocked on)."""

    def act() -> None:
        time.sleep(seconds)
        action()

    thread = threading.Thread(target=act, daemon=True)
    thread.start()
    return thread


def test_wait_returns_the_final_status_of_a_partition_that_completes_meanwhile(feed: Feed) -> None:
    feed.add_partition("job", [], sealed=False)
    later(0.3, lambda: feed.seal("job"))  # sealed with nothing left: complete
    final = feed.wait("job", timeout=20)
    assert final.status == "complete"
    assert final.key == "job"


def test_wait_on_a_finished_partition_returns_at_once(feed: Feed) -> None:
    feed.add_partition("done-already", [])
    started = time.monotonic()
    assert feed.wait("done-already", timeout=5).status == "complete"
    assert time.monotonic() - started < 2


def test_wait_returns_when_the_partition_is_cancelled(feed: Feed) -> None:
    feed.add_partition("job", [(0, b"{}")])
    later(0.3, lambda: feed.cancel("job"))
    assert feed.wait("job", timeout=20).status == "cancelled"


def test_wait_raises_timeout_error_when_the_partition_does_not_finish_in_time(feed: Feed) -> None:
    feed.add_partition("slow", [(0, b"{}")])
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="still available"):
        feed.wait("slow", timeout=0.5)
    assert 0.4 < time.monotonic() - started < 5


def test_wait_on_an_unknown_key_raises_key_error(feed: Feed) -> None:
    with pytest.raises(KeyError):
        feed.wait("nope", timeout=1)
    with pytest.raises(NotFound):
        feed.wait("nope")


@pytest.mark.postgres_only
def test_on_postgresql_wait_is_woken_by_notification_not_by_polling(db_url: str, feed: Feed) -> None:
    feed.add_partition("job", [(0, b"{}")])
    store = Store(db_url)
    try:
        later(0.5, lambda: feed.cancel("job"))
        started = time.monotonic()
        # Polling alone would first look again after 60 s; only the notification can wake it sooner.
        final = wait_final(store, "job", timeout=30, poll_interval=60)
        waited = time.monotonic() - started
    finally:
        store.close()
    assert final["status"] == "cancelled"
    assert waited < 5, f"woke after {waited:.1f}s: not by notification"


# ---------------------------------------------------------------- the command


def test_wait_command_exits_0_and_prints_the_status_when_complete(db_url: str, feed: Feed) -> None:
    feed.add_partition("job", [], sealed=False)
    later(1.0, lambda: feed.seal("job"))
    result = run_cli(db_url, "wait", "job", "--timeout", "30", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "complete"


def test_wait_command_exits_1_when_the_partition_is_cancelled(db_url: str, feed: Feed) -> None:
    feed.add_partition("job", [(0, b"{}")])
    feed.cancel("job")
    result = run_cli(db_url, "wait", "job")
    assert result.returncode == 1
    assert "cancelled" in result.stdout


def test_wait_command_exits_1_when_the_partition_failed(db_url: str, feed: Feed, store: Store) -> None:
    feed.add_partition("job", [(0, b"{}")])
    from sqlalchemy import update

    from feedproc.store.schema import partitions

    with store.write() as conn:  # as a watcher's permanent failure would leave it
        conn.execute(update(partitions).where(partitions.c.key == "job").values(status="failed"))
    result = run_cli(db_url, "wait", "job", "--json")
    assert result.returncode == 1
    assert json.loads(result.stdout)["status"] == "failed"


def test_wait_command_exits_124_on_timeout_printing_the_current_status(db_url: str, feed: Feed) -> None:
    feed.add_partition("job", [(0, b"{}")])
    result = run_cli(db_url, "wait", "job", "--timeout", "0.5", "--json")
    assert result.returncode == 124
    assert json.loads(result.stdout)["status"] == "available"
    assert "still available" in result.stderr


def test_wait_command_on_an_unknown_key_exits_1_with_one_line_naming_it(db_url: str) -> None:
    result = run_cli(db_url, "wait", "missing-key", "--timeout", "1")
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0
    assert "missing-key" in result.stderr


def test_wait_command_on_a_malformed_key_exits_2_without_waiting(db_url: str) -> None:
    result = run_cli(db_url, "wait", "bad key!")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "invalid partition key" in result.stderr
