"""Flow control in the store (issue 34), on every database: concurrency groups (a partition's
`group`, a queue's and a pipeline gate's `group_limit`, counted across watchers and pull claims
exactly) and rate limits (token buckets on the database clock, per queue, per gate and per group);
the settings stored, shown and refused with nothing written."""

from __future__ import annotations

import time

import pytest

from feedproc import Feed
from feedproc.core.errors import InvalidInput, NotFound, Refused
from feedproc.core.flow import FlowRules
from feedproc.core.policy import RetryPolicy
from feedproc.core.records import Fetched, ReadyItem, SlotClaim
from feedproc.store import Store

from ..support import A, B, db_state, register


def lease(store: Store, watcher: str, queue: str = "default") -> list[str]:
    register(store, watcher, queue=queue, capacity=100)
    return [got.key for got in store.acquire(watcher, queue, 100, 30)]


def claim_of(items: list[ReadyItem], queue: str = "default", flow: FlowRules | None = None) -> SlotClaim:
    """What a watcher holding `items` (unanswered) asks with."""
    held: dict[tuple[str, int], int] = {}
    for item in items:
        if item.group is not None:
            held[(item.group, item.gate)] = held.get((item.group, item.gate), 0) + item.weight
    return SlotClaim(queue, sum(i.weight for i in items), flow=flow or FlowRules(), group_held=held)


def fetch(
    store: Store, watcher: str, want: int, held: list[ReadyItem], flow: FlowRules | None = None
) -> list[ReadyItem]:
    return store.fetch_ready(watcher, want, [i.id for i in held], slots=claim_of(held, flow=flow))


# ---------------------------------------------------------------- groups


def test_a_partitions_group_is_stored_and_shown_in_its_status(feed: Feed) -> None:
    feed.add_partition("acme-1", [(0, b"x")], group="acme")
    feed.add_partition("loose", [(0, b"x")])
    assert feed.status("acme-1").group == "acme"
    assert feed.status("loose").group is None
    assert "group" not in feed.status("loose").to_json()


@pytest.mark.parametrize("bad", ["", "  ", "x" * 201, 7, True])
def test_a_malformed_group_is_refused_and_nothing_is_written(feed: Feed, bad: object) -> None:
    before = db_state(feed)
    with pytest.raises(InvalidInput, match="group"):
        feed.add_partition("p", [(0, b"x")], group=bad)  # type: ignore[call-overload]
    assert db_state(feed) == before


def test_a_group_limit_holds_across_watchers_while_other_groups_use_the_rest(feed: Feed) -> None:
    store = feed.store
    feed.set_queue("default", group_limit=3)
    for n in range(2):
        feed.add_partition(f"acme-{n}", [(0, b"x")] * 10, group="acme")
    feed.add_partition("globex", [(0, b"x")] * 10, group="globex")
    lease(store, A)
    a = fetch(store, A, 20, [])
    assert sum(i.group == "acme" for i in a) == 3
    assert sum(i.group == "globex" for i in a) == 3
    # B leases nothing of acme's here; give it a partition of acme's and it gets no slot of acme's.
    feed.add_partition("acme-late", [(0, b"x")] * 5, group="acme")
    lease(store, B)
    assert [i for i in fetch(store, B, 20, []) if i.group == "acme"] == []
    # A answers one of acme's: its next fetch gives the slot back, and one of acme's runs again.
    done = next(i for i in a if i.group == "acme")
    still = [i for i in a if i is not done]
    again = fetch(store, A, 20, still)
    assert sum(i.group == "acme" for i in [*still, *again]) == 3


def test_items_without_a_group_are_not_held_by_a_group_limit(feed: Feed) -> None:
    feed.set_queue("default", group_limit=1)
    feed.add_partition("loose", [(0, b"x")] * 8)
    lease(feed.store, A)
    assert len(fetch(feed.store, A, 8, [])) == 8


def test_a_gates_group_limit_counts_that_gate_only(feed: Feed) -> None:
    flow = FlowRules(gate_group_limits={1: 2})
    feed.set_queue("default", limit=1000)  # the queue's row: its lock arbitrates the slots
    feed.add_partition("acme-0", [(0, b"x")] * 4, group="acme")
    feed.add_partition("acme-1", [(1, b"x")] * 4, group="acme")
    store = feed.store
    lease(store, A)
    got = fetch(store, A, 20, [], flow)
    # acme-1 is at gate 1 (its only gate); acme-0 at gate 0 takes all 4, acme-1 only 2.
    assert sorted((i.partition, i.gate) for i in got).count(("acme-1", 1)) == 2
    assert sum(i.partition == "acme-0" for i in got) == 4


def test_pull_claims_count_against_a_group_limit_with_the_watchers(feed: Feed) -> None:
    store = feed.store
    feed.set_queue("pulled", mode="pull", group_limit=4)
    feed.add_partition("acme-a", [(0, b"x")] * 10, queue="pulled", group="acme")
    feed.add_partition("acme-b", [(0, b"x")] * 10, queue="pulled", group="acme")
    feed.add_partition("globex", [(0, b"x")] * 3, queue="pulled", group="globex")
    policy = RetryPolicy()
    first = store.claim("pulled", "w1", 20, 60, policy)
    assert sum(c["partition"].startswith("acme") for c in first) == 4
    assert sum(c["partition"] == "globex" for c in first) == 3
    assert [c for c in store.claim("pulled", "w2", 20, 60, policy) if c["partition"].startswith("acme")] == []
    assert feed.queue("pulled").groups == {"acme": 4, "globex": 3}


def test_a_queue_shows_each_groups_weight_in_flight(feed: Feed) -> None:
    feed.set_queue("default", group_limit=5)
    feed.add_partition("acme", [(0, b"x")] * 9, group="acme", weight=2)
    feed.add_partition("globex", [(0, b"x")] * 2, group="globex")
    lease(feed.store, A)
    fetch(feed.store, A, 20, [])
    # acme's weight 2 items: two fit in 5 (a third would make 6); globex's two.
    assert feed.queue("default").groups == {"acme": 4, "globex": 2}
    assert feed.queue("default").to_json()["groups"] == {"acme": 4, "globex": 2}


def test_a_queues_group_limit_is_stored_shown_and_cleared_by_0(feed: Feed) -> None:
    assert feed.set_queue("ocr", group_limit=7).group_limit == 7
    assert feed.queue("ocr").group_limit == 7
    assert feed.set_queue("ocr", limit=3).group_limit == 7  # kept when not given
    assert feed.set_queue("ocr", group_limit=0).group_limit is None
    assert "group_limit" not in feed.queue("ocr").to_json()


# ---------------------------------------------------------------- rates


def test_a_rate_is_stored_and_shown_as_written_and_cleared_by_0(feed: Feed) -> None:
    settings = feed.set_queue("ocr", rate="600/min", group_rate="1/s")
    assert (settings.rate, settings.group_rate) == (10.0, 1.0)
    assert (feed.queue("ocr").rate, feed.queue("ocr").group_rate) == ("10/s", "1/s")
    assert feed.set_queue("ocr", rate="90/hour").rate == pytest.approx(0.025)
    assert feed.queue("ocr").rate == "90/hour"
    assert feed.set_queue("ocr", rate=0).rate is None
    assert "rate" not in feed.queue("ocr").to_json()


@pytest.mark.parametrize("bad", ["10/fortnight", "-1/s", "0.00001/s", "2000000/s", True, "10 / ", "10"])
def test_a_malformed_rate_is_refused_and_nothing_changes(feed: Feed, bad: object) -> None:
    feed.set_queue("ocr", rate="5/s")
    before = db_state(feed)
    with pytest.raises(InvalidInput, match="rate"):
        feed.set_queue("ocr", rate=bad)  # type: ignore[arg-type]
    assert db_state(feed) == before


def test_a_queue_rate_starts_a_bursts_worth_then_one_per_period(feed: Feed) -> None:
    store = feed.store
    feed.set_queue("default", rate="5/s")  # a burst of 5, then one every 0.2 s
    feed.add_partition("p", [(0, b"x")] * 50)
    lease(store, A)
    first = fetch(store, A, 50, [])
    assert len(first) == 5
    assert isinstance(first, Fetched) and first.retry_in is not None and 0 < first.retry_in <= 0.2 + 1e-6
    assert fetch(store, A, 50, first) == []  # dry: nothing more now
    time.sleep(0.45)  # the database clock moves on: two tokens (and a part of a third)
    assert len(fetch(store, A, 50, first)) == 2


def test_watchers_and_pull_claims_share_one_bucket(feed: Feed) -> None:
    store = feed.store
    feed.set_queue("pulled", mode="pull", rate="1/min")  # a burst of 1, and no refill to speak of
    feed.add_partition("p", [(0, b"x")] * 5, queue="pulled")
    policy = RetryPolicy()
    assert len(store.claim("pulled", "w1", 5, 60, policy)) == 1
    assert store.claim("pulled", "w2", 5, 60, policy) == []


def test_a_gate_rate_holds_that_gate_only_and_does_not_hold_up_the_others(feed: Feed) -> None:
    store = feed.store
    flow = FlowRules(gate_rates={1: 1 / 60})  # one token, then nothing for a minute
    feed.set_queue("default", limit=1000)
    feed.add_partition("slow", [(1, b"x")] * 5)
    feed.add_partition("fast", [(0, b"x")] * 5)
    lease(store, A)
    got = fetch(store, A, 20, [], flow)
    assert sorted(i.partition for i in got) == ["fast"] * 5 + ["slow"]
    again = fetch(store, A, 20, got, flow)
    assert again == []


def test_each_group_has_its_own_bucket_under_a_group_rate(feed: Feed) -> None:
    store = feed.store
    feed.set_queue("default", group_rate="2/min")  # a burst of 1 token per group (at least one)
    feed.add_partition("acme", [(0, b"x")] * 5, group="acme")
    feed.add_partition("globex", [(0, b"x")] * 5, group="globex")
    lease(store, A)
    got = fetch(store, A, 20, [])
    assert sorted(i.group or "" for i in got) == ["acme", "globex"]


# ---------------------------------------------------------------- shared rates


def test_a_shared_rate_is_declared_listed_changed_and_removed(feed: Feed) -> None:
    assert feed.set_rate("ocr-api", "600/min").rate == "10/s"
    assert [(r.name, r.per_second, r.tokens) for r in feed.rates()] == [("ocr-api", 10.0, 10.0)]
    assert feed.set_rate("ocr-api", "30/s").per_second == 30.0
    feed.remove_rate("ocr-api")
    assert feed.rates() == []
    with pytest.raises(NotFound):
        feed.remove_rate("ocr-api")


def test_a_queue_may_name_a_shared_rate_only_once_it_is_declared(feed: Feed) -> None:
    before = db_state(feed)
    with pytest.raises(Refused, match="no rate named 'ocr-api'"):
        feed.set_queue("ocr", rate="ocr-api")
    assert db_state(feed) == before
    feed.set_rate("ocr-api", "5/s")
    assert feed.set_queue("ocr", rate="ocr-api").rate == "ocr-api"
    assert feed.queue("ocr").rate == "ocr-api"
    with pytest.raises(Refused, match="queue 'ocr'"):
        feed.remove_rate("ocr-api")


def test_queues_naming_one_shared_rate_draw_from_one_bucket_watchers_and_claims_alike(feed: Feed) -> None:
    store = feed.store
    feed.set_rate("ocr-api", "2/s")  # a burst of 2, for both queues
    feed.set_queue("pushed", rate="ocr-api")
    feed.set_queue("pulled", mode="pull", rate="ocr-api")
    feed.add_partition("p", [(0, b"x")] * 10, queue="pushed")
    feed.add_partition("q", [(0, b"x")] * 10, queue="pulled")
    lease(store, A, queue="pushed")
    pushed = store.fetch_ready(A, 10, slots=SlotClaim("pushed"))
    pulled = store.claim("pulled", "w1", 10, 60, RetryPolicy())
    assert (len(pushed), len(pulled)) == (2, 0)  # within the second: the watcher took both tokens


def test_a_pipeline_gate_may_name_a_shared_rate(feed: Feed) -> None:
    store = feed.store
    feed.set_rate("ocr-api", "1/min")
    feed.set_queue("default", limit=1000)
    feed.add_partition("p", [(1, b"x")] * 5)
    lease(store, A)
    got = fetch(store, A, 20, [], FlowRules(gate_rates={1: "ocr-api"}))
    assert len(got) == 1


def test_a_fetch_ahead_takes_tokens_and_gives_back_what_it_did_not_use(feed: Feed) -> None:
    store = feed.store
    feed.set_rate("api", "5/s")  # a burst of 5
    assert store.take_tokens("default", "api", 3) == (3, None)
    granted, retry_in = store.take_tokens("default", "api", 9)
    assert granted == 2 and retry_in is not None and 0 < retry_in <= 0.2 + 1e-6
    store.give_back_tokens("default", "api", 2)
    assert store.take_tokens("default", "api", 9)[0] == 2
    assert store.take_tokens("default", 10 / 60, 4)[0] == 1  # the queue's own bucket
