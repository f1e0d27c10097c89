"""Retention: `feedproc cleanup` deletes old finished partitions in bounded batches; history stays readable."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from sqlalchemy import func, select, update

from feedproc import Feed, Item, Processor, Response, Watcher, WatcherConfig
from feedproc.store import Store
from feedproc.store.foundations import seconds_from_now
from feedproc.store.schema import events, items, partitions

from ..support import run_cli, wait_until


def age(store: Store, key: str, seconds: float) -> None:
    """Pretend partition `key` last changed `seconds` ago (on the database clock)."""
    with store.write() as conn:
        conn.execute(update(partitions).where(partitions.c.key == key).values(updated_at=seconds_from_now(-seconds)))


def counts(store: Store) -> tuple[int, int, int]:
    with store.read() as conn:
        n_partitions, n_items, n_events = (
            conn.execute(select(func.count()).select_from(t)).scalar_one() for t in (partitions, items, events)
        )
    return n_partitions, n_items, n_events


def test_cleanup_deletes_old_finished_partitions_with_their_items_and_history(feed: Feed) -> None:
    feed.add_partition("old-done", [(0, b"{}")] * 3, sealed=False)
    feed.cancel("old-done")
    feed.add_partition("recent-done", [(0, b"{}")])
    feed.cancel("recent-done")
    feed.add_partition("old-open", [(0, b"{}")])
    age(feed.store, "old-done", 8 * 86400)
    age(feed.store, "old-open", 8 * 86400)

    deleted = feed.cleanup(7 * 86400)

    assert deleted["partitions"] == 1 and deleted["items"] == 3 and deleted["events"] >= 2
    with pytest.raises(KeyError):
        feed.status("old-done")
    assert feed.status("recent-done").status == "cancelled"
    assert feed.status("old-open").status == "available"


def test_cleanup_keeps_failed_partitions_unless_asked(feed: Feed, store: Store) -> None:
    feed.add_partition("broken", [(0, b"{}")])
    with store.write() as conn:
        conn.execute(update(partitions).where(partitions.c.key == "broken").values(status="failed"))
    age(store, "broken", 3600)

    assert feed.cleanup(60)["partitions"] == 0
    assert feed.cleanup(60, include_failed=True)["partitions"] == 1


def test_cleanup_works_in_bounded_batches(feed: Feed, store: Store) -> None:
    for n in range(3):
        feed.add_partition(f"p{n}", [(0, b"{}")] * 7)
        feed.cancel(f"p{n}")
        age(store, f"p{n}", 120)
    statements: list[str] = []

    from sqlalchemy import event

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if statement.lstrip().upper().startswith("DELETE"):
            statements.append(statement)

    event.listen(store.engine, "before_cursor_execute", record)
    deleted = store.cleanup(60, batch=5, partitions_per_batch=2)

    assert deleted == {"partitions": 3, "items": 21, "events": 6, "attempts": 0, "claims": 0, "hooks": 0}
    assert counts(store) == (0, 0, 0)
    # 2 rounds of partitions; items 5 at a time (14 -> 3 deletes, 7 -> 2), events likewise, partitions once per round
    assert len(statements) >= 8


def test_cleanup_command_names_what_it_deleted_and_refuses_a_bad_duration(db_url: str, feed: Feed) -> None:
    feed.add_partition("gone", [(0, b"{}")])
    feed.cancel("gone")
    age(feed.store, "gone", 3 * 3600)

    refused = run_cli(db_url, "cleanup", "--older-than", "soon")
    assert refused.returncode == 2 and "--older-than" in refused.stderr
    assert feed.status("gone").status == "cancelled"

    done = run_cli(db_url, "cleanup", "--older-than", "2h")
    assert done.returncode == 0 and "deleted 1 partitions" in done.stdout


class Done(Processor):
    async def process(self, item: Item) -> Response:
        return Response(done=True)


def test_watch_with_retention_deletes_old_finished_partitions_periodically(db_url: str, feed: Feed) -> None:
    feed.add_partition("stale", [(0, b"{}")])
    feed.cancel("stale")
    age(feed.store, "stale", 3600)
    feed.add_partition("fresh", [(0, b"{}")])
    store = Store(db_url)
    config = WatcherConfig(poll_interval=0.1, lease_seconds=3, retention=600, retention_every=0.2)
    watcher = Watcher(store, Done(), config)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(watcher.run(),), daemon=True)
    thread.start()
    try:
        wait_until(lambda: feed.status("fresh").status == "complete", what="fresh to complete")
        wait_until(lambda: feed.summary().partitions["cancelled"] == 0, what="stale to be deleted")
        assert feed.status("fresh").status == "complete"  # finished just now: kept
    finally:
        loop.call_soon_threadsafe(watcher.stop)
        thread.join(30)
        store.close()
