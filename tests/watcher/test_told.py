"""Every failure is told: a processor's exception, a retry, an item failure and a partition failure
each leave a log record with their key, gate, item, attempt and error, and the item's record keeps
the traceback (in-process watcher, every database)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from feedproc import Feed, Item, Processor, Response

from ..support import wait_status, wait_until, watching


class RaisesKeyError(Processor):
    def process(self, item: Item) -> Response:
        responses: dict[str, Response] = {}
        return responses["missing"]  # a processor's own bug


def records(caplog: pytest.LogCaptureFixture, event: str) -> list[Any]:  # Any: the fields are `extra=` attributes
    return [r for r in caplog.records if getattr(r, "event", None) == event]


def test_a_processor_that_raises_is_logged_at_each_retry_and_when_it_fails(
    db_url: str, feed: Feed, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="feedproc.watcher")
    feed.add_partition("told", [(0, b"{}")])
    with watching(db_url, RaisesKeyError(), max_attempts=3):
        wait_status(feed, "told", "failed")
    (item,) = feed.items("told")
    retries, failures = records(caplog, "item_retried"), records(caplog, "item_failed")
    assert [(r.levelno, r.key, r.gate, r.item, r.attempt) for r in retries] == [
        (logging.WARNING, "told", 0, item.id, 1),
        (logging.WARNING, "told", 0, item.id, 2),
    ]
    (failed,) = failures
    assert failed.levelno == logging.WARNING and failed.attempt == 3 and failed.error == "KeyError: 'missing'"
    assert "told" in failed.getMessage() and "KeyError: 'missing'" in failed.getMessage()
    (partition,) = records(caplog, "partition_failed")
    assert partition.levelno == logging.INFO and partition.key == "told"
    assert records(caplog, "leased")[0].key == "told"
    history = feed.item(item.id).history
    assert [h.outcome for h in history] == ["retry", "retry", "failed"]
    assert all("Traceback" in (h.error or "") and "KeyError: 'missing'" in (h.error or "") for h in history)


def test_gate_advances_and_completions_are_logged_at_info(
    db_url: str, feed: Feed, caplog: pytest.LogCaptureFixture
) -> None:
    class Moves(Processor):
        def process(self, item: Item) -> Response:
            return Response(gate=2) if item.gate == 0 else Response(done=True)

    caplog.set_level(logging.INFO, logger="feedproc.watcher")
    feed.add_partition("steps", [(0, b"{}"), (0, b"{}")])
    with watching(db_url, Moves()):
        wait_status(feed, "steps", "complete")
    (advance,) = records(caplog, "gate_advanced")
    assert (advance.key, advance.gate) == ("steps", 2) and "from gate 0 to gate 2" in advance.getMessage()
    (completed,) = records(caplog, "partition_completed")
    assert completed.key == "steps"


def test_a_partition_cancelled_while_leased_is_logged_at_info_not_as_a_lost_lease(
    db_url: str, feed: Feed, caplog: pytest.LogCaptureFixture
) -> None:
    class Slow(Processor):
        async def process(self, item: Item) -> Response:
            await asyncio.sleep(0.2)
            return Response(done=True)

    caplog.set_level(logging.INFO, logger="feedproc.watcher")
    feed.add_partition("doomed", [(0, b"{}")] * 50)
    with watching(db_url, Slow(), concurrency=2):
        wait_until(lambda: records(caplog, "leased"), what="the partition leased")
        feed.cancel("doomed")
        (cancelled,) = wait_until(lambda: records(caplog, "partition_cancelled"), what="the cancellation told")
    assert cancelled.key == "doomed" and cancelled.levelno == logging.INFO
    assert not records(caplog, "lease_lost")
