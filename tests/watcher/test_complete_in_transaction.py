"""Complete in your transaction (issue 33), as a watcher runs it: a transactional processor (or a
pipeline gate declared `transactional=True`) is given the Connection of the transaction its answer
is written in. Its rows commit with an accepted answer, and vanish with a raise, an answer feedproc
refuses or a refused fence. What cannot work so is refused when the watcher starts."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Connection

from feedproc import Feed, InvalidInput, Item, Pipeline, Response, RetryLater, TransactionalProcessor, Watcher
from feedproc.store import Store
from feedproc.watcher import WatcherConfig

from ..support import ledger_rows, wait_status, watching


def insert_row(connection: Connection, item: Item) -> None:
    connection.execute(text("INSERT INTO ledger (item_id, pid) VALUES (:id, 0)"), {"id": item.id})


class Ledger(TransactionalProcessor):
    """One ledger row per item, then done; the first delivery of each odd item raises after its insert."""

    def __init__(self, *, fail_odd_once: bool = False) -> None:
        self.fail_odd_once = fail_odd_once
        self.threads: set[str] = set()

    def process(self, item: Item, connection: Connection) -> Response:
        self.threads.add(threading.current_thread().name)
        insert_row(connection, item)
        if self.fail_odd_once and item.json()["n"] % 2 and item.attempt == 1:
            raise RetryLater("not this time", after=0.05)
        return Response(done=True)


def items_of(count: int) -> list[tuple[int, bytes]]:
    return [(0, f'{{"n": {n}}}'.encode()) for n in range(count)]


@pytest.mark.usefixtures("ledger")
def test_every_item_completes_with_exactly_one_row_of_its_processor(db_url: str, feed: Feed) -> None:
    feed.add_partition("scans", items_of(30))
    with watching(db_url, Ledger(), concurrency=4):
        status = wait_status(feed, "scans", "complete")
    assert status.items["complete"] == 30
    assert ledger_rows(feed) == Counter({item.id: 1 for item in feed.items("scans")})


@pytest.mark.usefixtures("ledger")
def test_a_processor_that_raises_leaves_no_row_and_its_retry_writes_one(db_url: str, feed: Feed) -> None:
    feed.add_partition("scans", items_of(10))
    with watching(db_url, Ledger(fail_odd_once=True), concurrency=3):
        wait_status(feed, "scans", "complete")
    assert ledger_rows(feed) == Counter({item.id: 1 for item in feed.items("scans")})
    attempts = {item.id: [h.outcome for h in feed.item(item.id).history] for item in feed.items("scans")}
    assert sorted(Counter(tuple(a) for a in attempts.values()).items()) == [(("done",), 5), (("retry", "done"), 5)]


@pytest.mark.usefixtures("ledger")
def test_an_answer_feedproc_refuses_rolls_the_processors_row_back(db_url: str, feed: Feed) -> None:
    """More children than --max-children: the item fails for good, its processor's row goes with it."""

    class TooMany(TransactionalProcessor):
        def process(self, item: Item, connection: Connection) -> Response:
            insert_row(connection, item)
            return Response(done=True, items=[{"gate": 1, "data": {}}] * 3)

    feed.add_partition("scans", items_of(1))
    with watching(db_url, TooMany(), max_children=2):
        wait_status(feed, "scans", "failed")
    assert ledger_rows(feed) == Counter()


@pytest.mark.usefixtures("ledger")
def test_a_pipeline_gate_declared_transactional_gets_the_connection(db_url: str, feed: Feed) -> None:
    pipeline = Pipeline("default")

    @pipeline.gate("split", 0)
    def split(item: Item) -> Response:
        return Response(done=True, items=[{"gate": "book", "data": {"n": n}} for n in range(5)])

    @pipeline.gate("book", 1, transactional=True)
    def book(item: Item, connection: Connection) -> Response:
        insert_row(connection, item)
        return Response(done=True)

    feed.add_partition("orders", [(0, b"{}")])
    with watching(db_url, pipeline):
        wait_status(feed, "orders", "complete")
    booked = [item.id for item in feed.items("orders") if item.gate == 1]
    assert len(booked) == 5
    assert ledger_rows(feed) == Counter({item_id: 1 for item_id in booked})


def test_a_transactional_processor_with_batches_is_refused_at_start(store: Store) -> None:
    with pytest.raises(InvalidInput, match="cannot take --batch"):
        Watcher(store, Ledger(), WatcherConfig(batch=10))


def test_an_async_transactional_processor_is_refused_at_start(store: Store) -> None:
    class Async(TransactionalProcessor):
        async def process(self, item: Item, connection: Connection) -> Response:  # type: ignore[override]
            return Response(done=True)

    with pytest.raises(InvalidInput, match="plain def"):
        Watcher(store, Async(), WatcherConfig())  # type: ignore[arg-type]  # what a type checker refuses too


def test_an_async_or_batched_transactional_gate_is_refused_where_it_is_declared() -> None:
    pipeline = Pipeline("default")
    with pytest.raises(ValueError, match="plain def"):

        @pipeline.gate("book", 0, transactional=True)  # type: ignore[type-var]  # a type checker refuses it too
        async def book(item: Item, connection: Connection) -> Response:
            return Response(done=True)

    with pytest.raises(ValueError, match="batch"):

        @pipeline.gate("book", 0, transactional=True, batch=5)
        def batched(item: Item, connection: Connection) -> Response:
            return Response(done=True)


@pytest.mark.usefixtures("ledger")
def test_a_call_past_its_item_timeout_has_its_row_rolled_back_once_it_returns(db_url: str, feed: Feed) -> None:
    """The timed-out call runs on, unheard: its transaction is rolled back when it returns, and the
    item's next delivery writes the one row that stays."""
    returned = threading.Event()

    class Slow(TransactionalProcessor):
        def process(self, item: Item, connection: Connection) -> Response:
            insert_row(connection, item)
            if item.attempt == 1:
                returned.wait(1.5)  # past the item timeout; nothing sets it: a bounded wait, not a sync
            return Response(done=True)

    feed.add_partition("scans", items_of(1))
    with watching(db_url, Slow(), item_timeout=0.5):
        wait_status(feed, "scans", "complete")
    [item] = feed.items("scans")
    assert [h.outcome for h in feed.item(item.id).history] == ["retry", "done"]
    assert ledger_rows(feed) == Counter({item.id: 1})
