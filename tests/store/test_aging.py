"""Aging (issue 34), on every database: with its queue's `aging`, a waiting partition's priority
counts one higher per `aging` seconds of its age, for leasing and for a watcher's fetch (whose items
carry the aged priority, so the buffer serves by it too), up to the highest priority; without it,
priorities are as given. The setting is stored, shown and cleared; a malformed one is refused."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from feedproc import Feed
from feedproc.core.errors import InvalidInput
from feedproc.core.models import MAX_PRIORITY
from feedproc.store.schema import partitions

from ..support import A, register


def age(feed: Feed, key: str, seconds: float) -> None:
    """Make partition `key` as if created `seconds` earlier."""
    with feed.store.engine.begin() as conn:
        created = conn.execute(select(partitions.c.created_at).where(partitions.c.key == key)).scalar_one()
        conn.execute(
            update(partitions).where(partitions.c.key == key).values(created_at=created - timedelta(seconds=seconds))
        )


def old_low_and_new_high(feed: Feed) -> None:
    feed.add_partition("old-low", [(0, b"x")] * 3, priority=0)
    feed.add_partition("new-high", [(0, b"x")] * 3, priority=5)
    age(feed, "old-low", 100)  # 10 steps of 10 s: 10 > 5


def test_without_aging_the_higher_priority_is_leased_first(feed: Feed) -> None:
    old_low_and_new_high(feed)
    register(feed.store, A)
    assert [lease.key for lease in feed.store.acquire(A, "default", 1, 30)] == ["new-high"]


def test_with_aging_an_old_low_priority_partition_is_leased_before_a_newer_higher_one(feed: Feed) -> None:
    old_low_and_new_high(feed)
    register(feed.store, A)
    assert [lease.key for lease in feed.store.acquire(A, "default", 1, 30, aging=10.0)] == ["old-low"]
    assert [lease.key for lease in feed.store.acquire(A, "default", 1, 30, aging=10.0)] == ["new-high"]


def test_the_fetch_follows_the_aged_priority_and_its_items_carry_it(feed: Feed) -> None:
    old_low_and_new_high(feed)
    register(feed.store, A)
    feed.store.acquire(A, "default", 10, 30)
    aged = [(item.partition, item.priority) for item in feed.store.fetch_ready(A, 4, aging=10.0)]
    assert [key for key, _ in aged] == ["old-low"] * 3 + ["new-high"]
    assert aged[0][1] in (10, 11) and aged[-1][1] == 5  # 100 s and the test's own second or so
    plain = [(item.partition, item.priority) for item in feed.store.fetch_ready(A, 4)]
    assert plain == [("new-high", 5)] * 3 + [("old-low", 0)]


def test_an_aged_priority_stops_at_the_highest(feed: Feed) -> None:
    feed.add_partition("top", [(0, b"x")], priority=MAX_PRIORITY - 1)
    age(feed, "top", 1000)
    register(feed.store, A)
    assert [lease.key for lease in feed.store.acquire(A, "default", 1, 30, aging=1.0)] == ["top"]
    assert [item.priority for item in feed.store.fetch_ready(A, 1, aging=1.0)] == [MAX_PRIORITY]


def test_a_queues_aging_is_stored_shown_and_cleared_by_0(feed: Feed) -> None:
    assert feed.set_queue("ocr", aging=10).aging == 10.0
    assert feed.queue("ocr").aging == 10.0
    assert feed.queue("ocr").to_json()["aging"] == 10.0
    assert feed.set_queue("ocr", limit=3).aging == 10.0  # kept when not given
    assert feed.set_queue("ocr", aging=0).aging is None
    assert "aging" not in feed.queue("ocr").to_json()


@pytest.mark.parametrize("bad", [-1, math.nan, math.inf, True, "10", 400 * 86400])
def test_a_malformed_aging_is_refused_and_nothing_changes(feed: Feed, bad: object) -> None:
    feed.set_queue("ocr", aging=5)
    with pytest.raises(InvalidInput, match="aging"):
        feed.set_queue("ocr", aging=bad, limit=9)  # type: ignore[arg-type]
    assert (feed.queue("ocr").aging, feed.queue("ocr").limit) == (5.0, None)
