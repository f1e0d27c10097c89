"""The in-process Watcher keeps every delivery on record when the database gets in the way: a
takeover's charge that fails (here, the in-flight record locked past the database's lock timeout)
is written at a later maintenance, before anything of the partition is delivered again, not
forgotten; a lease the watcher gave up as lost (its heartbeats failed for a lease length) but still
held in the database is released with its running delivery given back, on record."""

from __future__ import annotations

import logging
import threading

import pytest
from sqlalchemy import make_url, select, text, update

from feedproc import Feed, Item, Processor, Response
from feedproc.store import Store
from feedproc.store.foundations import seconds_from_now
from feedproc.store.schema import inflight, partitions, watchers

from ..support import A, register, wait_status, wait_until, watching


class Attempts(Processor):
    """Completes every item, noting the attempt number each delivery carried."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    async def process(self, item: Item) -> Response:
        self.seen.append((item.id, item.attempt))
        return Response(done=True)


@pytest.mark.postgres_only  # a per-database lock_timeout makes the charge fail promptly
def test_a_takeover_charge_that_failed_is_written_before_the_item_is_delivered_again(
    db_url: str, feed: Feed, store: Store
) -> None:
    with store.write() as conn:  # new sessions (the watcher's) give up on a row lock after 200 ms
        conn.execute(text(f"ALTER DATABASE \"{make_url(db_url).database}\" SET lock_timeout = '200ms'"))
    feed.add_partition("p", [(0, b"{}")])
    register(store, A, lease_seconds=0.5)  # a watcher that took the item and died with it
    store.acquire(A, "default", 1, 30)
    (lost,) = store.fetch_ready(A, 10)
    with store.write() as conn:
        conn.execute(update(partitions).values(lease_expires_at=seconds_from_now(-1)))
    locker = store.engine.connect()
    lock = locker.begin()
    locker.execute(select(inflight).with_for_update())  # the takeover's charge waits on it, then fails

    class OnFailedPoll(logging.Handler):
        """At the first poll that failed (the charge): end the lock, so the next one can charge."""

        def emit(self, record: logging.LogRecord) -> None:
            if ("(poll)" in record.getMessage() or "poll failed" in record.getMessage()) and lock.is_active:
                lock.commit()

    processor = Attempts()
    watcher_log = logging.getLogger("feedproc.watcher")
    handler = OnFailedPoll(logging.WARNING)
    watcher_log.addHandler(handler)
    try:
        with watching(db_url, processor) as taker:
            wait_status(feed, "p", "complete", timeout=30)
            assert not lock.is_active, "the charge never failed: the scenario did not happen"
    finally:
        watcher_log.removeHandler(handler)
        if lock.is_active:
            lock.rollback()
        locker.close()
    assert processor.seen == [(lost.id, 2)]
    history = [(h.outcome, h.attempt, h.watcher) for h in feed.item(lost.id).history]
    assert history == [("lost", 1, A), ("done", 2, taker.id)]


class Held(Processor):
    """A plain-def processor: each delivery notes its attempt, then waits for `release`."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []
        self.release = threading.Event()

    def process(self, item: Item) -> Response:
        self.seen.append((item.id, item.attempt))
        self.release.wait(30)
        return Response(done=True)


@pytest.mark.postgres_only  # a per-database lock_timeout makes the heartbeats fail promptly
def test_a_lease_given_up_while_it_could_not_be_renewed_gives_its_running_delivery_back_on_record(
    db_url: str, feed: Feed, store: Store
) -> None:
    with store.write() as conn:
        conn.execute(text(f"ALTER DATABASE \"{make_url(db_url).database}\" SET lock_timeout = '200ms'"))
    feed.add_partition("p", [(0, b"{}")])
    processor = Held()
    locker = store.engine.connect()
    lock = locker.begin()
    # Capacity 1: holding "p", the watcher cannot lease its own expired lease again before giving it up.
    with watching(db_url, processor, concurrency=1, max_partitions=1) as running:
        try:
            wait_until(lambda: processor.seen, what="the delivery under way")
            # Its heartbeats fail from now on (they update this row first): past a lease length it
            # assumes the lease lost, while the database still gives it the partition.
            locker.execute(select(watchers).where(watchers.c.id == running.id).with_for_update())
            wait_until(
                lambda: any(e.kind == "released" for e in feed.status("p", history=50).history or ()),
                timeout=30,
                what="the lease given up and released",
            )
            lock.commit()
        finally:
            if lock.is_active:
                lock.rollback()
            locker.close()
        processor.release.set()  # its answer comes after the release: refused
        wait_status(feed, "p", "complete", timeout=30)
    ((item, _), again) = processor.seen
    assert again == (item, 2)
    history = [(h.outcome, h.attempt, h.watcher) for h in feed.item(item).history]
    assert history == [("given back", 1, running.id), ("done", 2, running.id)]
    assert "gave its lease up during delivery 1" in (feed.item(item).history[0].error or "")
