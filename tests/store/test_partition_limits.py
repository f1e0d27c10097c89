"""Partition limits in the store (issue 34), on every database: a partition's own `partition_limit`
(stored, in its status, in its lease) and a queue's (stored, shown, cleared by 0); a malformed one
refused with nothing written."""

from __future__ import annotations

import pytest

from feedproc import Feed
from feedproc.core.errors import InvalidInput
from feedproc.core.models import MAX_INT32

from ..support import A, db_state, register


def test_a_partitions_limit_is_stored_shown_in_its_status_and_carried_by_its_lease(feed: Feed) -> None:
    feed.add_partition("limited", [(0, b"x")], partition_limit=3)
    feed.add_partition("free", [(0, b"x")])
    assert feed.status("limited").schedule.partition_limit == 3
    assert feed.status("free").schedule.partition_limit is None
    assert "partition_limit" not in feed.status("free").schedule.to_json()
    register(feed.store, A)
    leases = {lease.key: lease for lease in feed.store.acquire(A, "default", 10, 30)}
    assert (leases["limited"].partition_limit, leases["free"].partition_limit) == (3, None)
    assert {lease.key: lease.partition_limit for lease in feed.store.owned(A)} == {"limited": 3, "free": None}


@pytest.mark.parametrize("bad", [0, -1, MAX_INT32 + 1, True, "2", 1.5])
def test_a_malformed_partition_limit_is_refused_and_nothing_is_written(feed: Feed, bad: object) -> None:
    before = db_state(feed)
    with pytest.raises(InvalidInput, match="partition limit"):
        feed.add_partition("p", [(0, b"x")], partition_limit=bad)  # type: ignore[call-overload]
    assert db_state(feed) == before


def test_a_queues_partition_limit_is_stored_shown_and_cleared_by_0(feed: Feed) -> None:
    settings = feed.set_queue("ocr", partition_limit=4, limit=10)
    assert settings.partition_limit == 4
    assert feed.queue("ocr").partition_limit == 4
    assert feed.queue("ocr").to_json()["partition_limit"] == 4
    assert feed.set_queue("ocr", limit=12).partition_limit == 4  # kept when not given
    assert feed.set_queue("ocr", partition_limit=0).partition_limit is None
    assert "partition_limit" not in feed.queue("ocr").to_json()


@pytest.mark.parametrize("bad", [MAX_INT32 + 1, True, "3"])
def test_a_malformed_queue_partition_limit_is_refused(feed: Feed, bad: object) -> None:
    feed.set_queue("ocr", partition_limit=2)
    with pytest.raises(InvalidInput, match="partition limit"):
        feed.set_queue("ocr", partition_limit=bad)  # type: ignore[arg-type]
    assert feed.queue("ocr").partition_limit == 2
