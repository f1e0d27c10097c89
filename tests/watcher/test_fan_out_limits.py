"""Fan-out within limits: an answer with more children than `max_children` fails its item at once,
before anything is written, whichever processor made it; a fan-out at the limit (100,000 children)
is written once, with a short lease, without the lease being lost or anything delivered twice."""

from __future__ import annotations

import json
import logging
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import func, select

from feedproc import Feed, HTTPProcessor, Item, Processor, Response
from feedproc.core.models import MAX_CHILDREN
from feedproc.store.schema import items

from ..support import HandlerService, history_of, wait_status, wait_until, watching

LIMIT_ERROR = "answer has 4 children; the limit is 3 (--max-children)"


def test_a_handlers_answer_with_more_children_than_the_limit_fails_its_item_at_once(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    handler.behavior = lambda body: (200, {"done": True, "items": [{"gate": 1, "data": n} for n in range(4)]})
    feed.add_partition("fan", [(0, b"{}")])
    processor = HTTPProcessor(handler.url, max_children=3)
    with watching(db_url, processor, max_children=3, max_attempts=5):
        status = wait_status(feed, "fan", "failed")
    (failed,) = status.failed_items
    assert (failed.attempts, failed.last_error) == (1, LIMIT_ERROR)  # permanent: not retried
    assert status.items["total"] == 1  # no child written
    assert len(handler.deliveries) == 1


def test_a_python_processors_answer_with_more_children_than_the_limit_fails_its_item_at_once(
    db_url: str, feed: Feed
) -> None:
    class FansOutFour(Processor):
        async def process(self, item: Item) -> Response:
            return Response(done=True, items=[(1, {"n": n}) for n in range(4)])

    feed.add_partition("fan", [(0, b"{}")])
    with watching(db_url, FansOutFour(), max_children=3, max_attempts=5):
        status = wait_status(feed, "fan", "failed")
    (failed,) = status.failed_items
    assert (failed.attempts, failed.last_error) == (1, LIMIT_ERROR)
    assert status.items["total"] == 1


def test_a_fan_out_at_the_limit_is_written_once_within_a_short_lease_while_another_watcher_polls(
    db_url: str, feed: Feed, handler: HandlerService, caplog: pytest.LogCaptureFixture
) -> None:
    """The root item's handler answers 100,000 children (1.1 MB, read in a second or so); writing
    them takes 1-5 s, more than the 3 s lease may have left. The heartbeat is not held up by the reading (done
    off the event loop) and waits behind the write (its rows are locked), and the group commit
    renews the lease before it commits: the second watcher, polling every 50 ms, never finds the
    lease expired, and the siblings in flight meanwhile are not delivered again. (On MariaDB the
    heartbeat waiting behind the write was the victim of a deadlock; and the heartbeat that read
    right after the commit released the partition took it for a lease lost.)"""
    fan_out = b'{"done": true, "items": [%s]}' % b",".join([b'{"gate": 1}'] * MAX_CHILDREN)
    handler.behavior = lambda body: (200, fan_out) if body["data"] == {"root": True} else (200, {"done": True}, {}, 0.2)
    siblings = [(0, json.dumps({"sibling": n}).encode()) for n in range(20)]
    feed.add_partition("fan", [(0, b'{"root": true}'), *siblings], manual_checkpoint=True)
    settings = {"lease_seconds": 3.0, "concurrency": 4}
    with (
        watching(db_url, HTTPProcessor(handler.url), **settings),
        watching(db_url, HTTPProcessor(handler.url), **settings),
    ):
        wait_until(lambda: feed.status("fan").gates["0"]["complete"] == 21, timeout=120, what="gate 0 to be worked off")
    assert feed.status("fan").gates["1"]["available"] == MAX_CHILDREN
    with feed.store.read() as conn:
        seqs = conn.execute(select(func.count(), func.count(items.c.seq.distinct())).where(items.c.gate == 1)).one()
    assert tuple(seqs) == (MAX_CHILDREN, MAX_CHILDREN)  # each child once
    assert sorted(Counter(d.body["id"] for d in handler.deliveries).values()) == [1] * 21  # nothing twice
    assert history_of(feed, "fan", "expired") == []  # no lease taken over
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert [m for m in said if "(heartbeat)" in m or "lost the lease" in m] == []  # every beat got through


def test_a_fan_out_at_the_limit_that_drains_its_gate_releases_the_partition_without_a_lease_lost(
    db_url: str, feed: Feed, handler: HandlerService, caplog: pytest.LogCaptureFixture
) -> None:
    """The heartbeat waiting behind the write reads the leases the moment it commits: the partition
    its own group commit released is not a lease lost."""
    fan_out = b'{"done": true, "items": [%s]}' % b",".join([b'{"gate": 1}'] * MAX_CHILDREN)
    handler.behavior = lambda body: (200, fan_out)
    feed.add_partition("fan", [(0, b"{}")], manual_checkpoint=True)
    with watching(db_url, HTTPProcessor(handler.url), lease_seconds=3.0):
        wait_until(lambda: feed.status("fan").gates.get("1", {}).get("available") == MAX_CHILDREN, timeout=60)
        wait_until(lambda: feed.status("fan").lease is None, timeout=30, what="the partition to be released")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_fan_outs_answered_together_are_written_in_group_commits_of_at_most_the_limits_children(
    db_url: str, feed: Feed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten answers of 100,000 children in one group commit would hold their partitions' rows for
    ten times as long as one: a commit takes no more children than one answer may have."""

    class FansOutThree(Processor):
        async def process(self, item: Item) -> Response:
            return Response(done=True, items=[(1, b"{}")] * 3)

    committed: list[int] = []
    with watching(db_url, FansOutThree(), max_children=4, concurrency=10) as running:
        apply = running.store.apply

        def counted(watcher_id: str, outcomes: Any, **settings: Any) -> Any:
            committed.append(sum(len(o.children) for o in outcomes))
            return apply(watcher_id, outcomes, **settings)

        monkeypatch.setattr(running.store, "apply", counted)
        feed.add_partition("fan", [(0, b"{}")] * 10, manual_checkpoint=True)
        wait_until(lambda: feed.status("fan").gates.get("1", {}).get("available") == 30, what="30 children")
    assert max(committed) == 3 and sum(committed) == 30  # one fan-out a commit: two would be 6 > 4
