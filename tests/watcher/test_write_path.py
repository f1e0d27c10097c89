"""The write path cannot die: a failure injected into each stage between a processor's answer and its
commit (validation, encoding, the database write, the settle) is contained to its item or partition,
recorded, and the other partitions keep flowing. A watcher whose writes keep failing says so, lets
its leases go and stops, instead of holding them while doing nothing."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select

from feedproc import Feed, Item, Processor, Response
from feedproc.core.records import Kind
from feedproc.store import Store
from feedproc.store.schema import items, partitions
from feedproc.watcher import delivery as watcher_module  # where a delivery's answer is read

from ..support import WatcherThread, json_of, wait_status, wait_until, watching


class Numbered(Processor):
    """Completes every item at once (the items' data is {"n": N})."""

    async def process(self, item: Item) -> Response:
        return Response(done=True)


def add(feed: Feed, key: str, count: int = 20) -> None:
    feed.add_partition(key, [(0, json.dumps({"n": n}).encode()) for n in range(count)])


def item_id(feed: Feed, key: str, n: int) -> int:
    return next(i.id for i in feed.items(key) if json_of(i.data) == {"n": n})


class Times:
    """True for the first `times` calls, then False; thread-safe."""

    def __init__(self, times: int) -> None:
        self.left = itertools.count(times, -1)
        self.lock = threading.Lock()

    def __call__(self) -> bool:
        with self.lock:
            return next(self.left) > 0


def test_an_answer_the_rules_cannot_read_fails_its_item_transiently(
    db_url: str, feed: Feed, monkeypatch: pytest.MonkeyPatch
) -> None:
    add(feed, "bad")
    add(feed, "good")
    target = item_id(feed, "bad", 7)
    real = watcher_module.outcome_of

    def outcome_of(item: Any, policy: Any, **kwargs: Any) -> Any:
        if item.id == target and item.deliveries == 0 and kwargs.get("response") is not None:
            raise TypeError("injected: validation")
        return real(item, policy, **kwargs)

    monkeypatch.setattr(watcher_module, "outcome_of", outcome_of)
    with watching(db_url, Numbered()):
        wait_status(feed, "good", "complete")
        wait_status(feed, "bad", "complete")
    history = feed.item(target).history
    assert [h.outcome for h in history] == ["retry", "done"]
    assert "injected: validation" in (history[0].error or "") and "Traceback" in (history[0].error or "")


def test_an_answer_that_cannot_be_encoded_fails_its_item_and_the_batch_is_written(
    db_url: str, feed: Feed, monkeypatch: pytest.MonkeyPatch
) -> None:
    add(feed, "bad")
    add(feed, "good")
    target, once = item_id(feed, "bad", 3), Times(1)
    real = watcher_module.outcome_of

    def outcome_of(item: Any, policy: Any, **kwargs: Any) -> Any:
        outcome = real(item, policy, **kwargs)
        if item.id == target and outcome.kind == Kind.DONE and once():
            outcome.data = {"label": "invoice"}  # type: ignore[assignment]  # not bytes: the driver cannot bind it
        return outcome

    monkeypatch.setattr(watcher_module, "outcome_of", outcome_of)
    with watching(db_url, Numbered()):
        wait_status(feed, "good", "complete")
        wait_status(feed, "bad", "complete")
    history = feed.item(target).history
    assert [h.outcome for h in history] == ["retry", "done"]
    assert "the answer could not be written" in (history[0].error or "")


def test_a_database_write_that_fails_for_one_answer_fails_only_that_item(
    db_url: str, feed: Feed, monkeypatch: pytest.MonkeyPatch
) -> None:
    add(feed, "bad")
    add(feed, "good")
    target = item_id(feed, "bad", 11)
    first = item_version(feed, target)  # its first delivery's answer is written under this version

    def refuse(rows: list[Any]) -> None:
        """The database refuses the row of the target's first answer, "done", as the dialect writes it."""
        if any(row["id"] == target and row["version"] == first and row["status"] == "complete" for row in rows):
            raise RuntimeError("injected: the database refused the row")

    # The dialect's two writes of answers: the common "done" (where the dialect writes it narrowly)
    # and every other answer.
    inject(monkeypatch, feed, "complete_items", lambda conn, done, *rest: refuse([_done_row(o) for o in done]))
    inject(monkeypatch, feed, "update_items", lambda conn, rows, *rest: refuse(rows))
    with watching(db_url, Numbered()):
        wait_status(feed, "good", "complete")
        wait_status(feed, "bad", "complete")
    (failed, done) = feed.item(target).history
    assert failed.outcome == "retry" and "injected: the database refused the row" in (failed.error or "")
    assert done.outcome == "done"
    assert feed.status("bad").items["complete"] == 20


def test_an_error_holding_nul_is_recorded_escaped_and_its_batch_is_written(db_url: str, feed: Feed) -> None:
    """PostgreSQL refuses NUL in text: the error of one item used to fail the whole group commit,
    and the answers written one by one recorded the statement and its parameters as the error."""
    add(feed, "p")
    target = item_id(feed, "p", 3)

    class FailsOnceWithNul(Processor):
        async def process(self, item: Item) -> Response:
            if item.id == target and item.attempt == 1:
                raise ValueError("bad\x00byte")
            return Response(done=True)

    with watching(db_url, FailsOnceWithNul()):
        wait_status(feed, "p", "complete")
    (failed, done) = feed.item(target).history
    assert failed.outcome == "retry" and "ValueError: bad\\u0000byte" in (failed.error or "")
    assert "could not be written" not in (failed.error or "") and "[SQL" not in (failed.error or "")
    assert done.outcome == "done"
    assert all(i.deliveries == 1 for i in feed.items("p") if i.id != target)  # none delivered twice


def test_a_settle_that_fails_lets_its_partition_go_charged_and_the_others_flow(
    db_url: str, feed: Feed, monkeypatch: pytest.MonkeyPatch
) -> None:
    add(feed, "bad")
    add(feed, "good")
    bad, let_go, good_done = partition_id(feed, "bad"), threading.Event(), threading.Event()
    let_gos: list[str] = []

    def settle(conn: Any, pids: list[int], *rest: Any) -> None:
        """The settle's first statement (each answered partition's ready_at) fails for "bad" until
        "good" is complete or "bad" was let go twice: three group commits in a row that write
        nothing stop a watcher (the next test)."""
        if bad in pids and not good_done.is_set() and len(let_gos) < 2:
            raise RuntimeError("injected: settle")

    inject(monkeypatch, feed, "refresh_ready_at", settle)

    class GoodAfterALetGo(Processor):
        """Answers "good" only once "bad" was let go: "good" flows while "bad" cannot be written."""

        async def process(self, item: Item) -> Response:
            if item.partition == "good":
                await asyncio.to_thread(let_go.wait, 30)
            return Response(done=True)

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if "letting the partition go" in message and record.levelno == logging.ERROR:
                let_gos.append(message)
                let_go.set()
            elif message == "partition good completed":
                good_done.set()

    logger, seen = logging.getLogger("feedproc.watcher"), Seen()
    logger.addHandler(seen)
    try:
        # A lease of 10 s: writing "bad" in parts under load once took past a 3 s lease, and the
        # watcher gave the lease up before the failure this test reads was written.
        with watching(db_url, GoodAfterALetGo(), lease_seconds=10):
            wait_status(feed, "good", "complete")
            wait_status(feed, "bad", "complete")  # taken again once its writes work
    finally:
        logger.removeHandler(seen)
    assert let_go.is_set()
    # Recorded on the items whose answers could not be written (those in flight when "bad" was let
    # go are lost with the lease instead, and delivered again).
    errors = [entry.error or "" for i in range(20) for entry in feed.item(item_id(feed, "bad", i)).history]
    assert any("could not write the answer of delivery 1: RuntimeError: injected: settle" in e for e in errors), errors


def test_a_watcher_whose_writes_keep_failing_stops_and_lets_its_leases_go(
    db_url: str, feed: Feed, monkeypatch: pytest.MonkeyPatch
) -> None:
    add(feed, "p")

    def apply(self: Store, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("injected: every write fails")

    monkeypatch.setattr(Store, "apply", apply)
    running = WatcherThread(db_url, Numbered())
    try:
        wait_until(lambda: not running.thread.is_alive(), timeout=30, what="the watcher to give up")
        assert running.watcher.fatal is not None and "injected: every write fails" in running.watcher.fatal
        assert feed.status("p").lease is None  # released on the way out
    finally:
        running.stop()


def inject(monkeypatch: pytest.MonkeyPatch, feed: Feed, operation: str, fault: Callable[..., None]) -> None:
    """Run `fault` (with the operation's arguments: it raises to fail it) before each call of the named
    operation of the database's `Dialect`, in every store of this process (the watcher's included)."""
    dialect = type(feed.store.dialect)
    real = getattr(dialect, operation)

    def faulty(self: Any, *args: Any) -> Any:
        fault(*args)
        return real(self, *args)

    monkeypatch.setattr(dialect, operation, faulty)


def _done_row(outcome: Any) -> dict[str, Any]:
    """A "done" outcome as the row `update_items` would write."""
    return {"id": outcome.item_id, "version": outcome.version, "status": "complete"}


def item_version(feed: Feed, item: int) -> int:
    with feed.store.read() as conn:
        return conn.execute(select(items.c.version).where(items.c.id == item)).scalar_one()


def partition_id(feed: Feed, key: str) -> int:
    with feed.store.read() as conn:
        return conn.execute(select(partitions.c.id).where(partitions.c.key == key)).scalar_one()
