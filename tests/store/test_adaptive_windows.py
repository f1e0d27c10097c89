"""Adaptive concurrency in the store (issue 34), on every database: a watcher's report of push-backs
opens a gate's window, cuts it, grows it and removes it (`Store.adapt`); every fetch and pull
claim treats the window as a gate limit, fleet-wide."""

from __future__ import annotations

import time

from feedproc import Feed
from feedproc.core.flow import BACKOFF, GateReport
from feedproc.core.policy import RetryPolicy
from feedproc.core.records import SlotClaim

from ..support import A, B, register


def test_a_first_push_back_opens_a_window_from_what_the_fleet_runs(feed: Feed) -> None:
    register(feed.store, A, concurrency=16)
    register(feed.store, B, concurrency=16)
    widths = feed.store.adapt(A, "default", {0: GateReport(pushbacks=2, in_flight=10)})
    assert widths == {0: 20 * BACKOFF}  # 10 here, times two watchers
    assert feed.store.gate_windows("default") == widths


def test_a_window_is_cut_by_a_push_back_under_it_and_grown_by_successes(feed: Feed) -> None:
    store = feed.store
    register(store, A, concurrency=64)
    store.adapt(A, "default", {0: GateReport(pushbacks=1, in_flight=32)})  # 24
    time.sleep(0.1)  # past the interval between two cuts
    assert store.adapt(A, "default", {0: GateReport(pushbacks=1, under=24.0)}) == {0: 18.0}
    assert store.adapt(A, "default", {0: GateReport(pushbacks=1, under=24.0)}) == {0: 18.0}  # stale: no cut
    assert store.adapt(A, "default", {0: GateReport(successes=18)}) == {0: 19.0}


def test_a_window_grown_past_the_fleets_concurrency_is_removed(feed: Feed) -> None:
    store = feed.store
    register(store, A, concurrency=8)
    store.adapt(A, "default", {0: GateReport(pushbacks=1, in_flight=8)})  # 6
    assert store.adapt(A, "default", {0: GateReport(successes=100)}) == {}
    assert store.gate_windows("default") == {}


def test_a_fetch_takes_no_more_than_the_window_across_watchers(feed: Feed) -> None:
    store = feed.store
    feed.set_queue("default", limit=1000)  # the queue's row: its lock arbitrates the slots
    for key in ("a", "b"):
        feed.add_partition(key, [(0, b"x")] * 20)
    register(store, A, concurrency=10, capacity=1)
    register(store, B, concurrency=10, capacity=1)
    store.acquire(A, "default", 1, 30)
    store.acquire(B, "default", 1, 30)
    store.adapt(A, "default", {0: GateReport(pushbacks=1, in_flight=4)})  # 4 x 2 watchers x 3/4 = 6
    first = store.fetch_ready(A, 10, slots=SlotClaim("default"))
    second = store.fetch_ready(B, 10, slots=SlotClaim("default"))
    assert (len(first), len(second)) == (6, 0)


def test_a_pull_claim_takes_no_more_than_the_window(feed: Feed) -> None:
    store = feed.store
    feed.set_queue("pulled", mode="pull")
    feed.add_partition("p", [(0, b"x")] * 20, queue="pulled")
    store.adapt("a-worker-api", "pulled", {0: GateReport(pushbacks=1, in_flight=4)})  # no watcher: 4 x 1 x 3/4 = 3
    assert len(store.claim("pulled", "w1", 10, 60, RetryPolicy())) == 3
    assert store.claim("pulled", "w2", 10, 60, RetryPolicy()) == []
