"""Stored pipelines and gate limits in the store (issue 22), on every database: versions, the
per-gate slot claim of a fetch, and gates whose partitions are not fetched from."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update

from feedproc import Feed, InvalidInput
from feedproc.core.pipelines import parse_toml
from feedproc.core.policy import RetryPolicy
from feedproc.core.records import SlotClaim
from feedproc.store import Store
from feedproc.store.foundations import seconds_from_now
from feedproc.store.schema import claims, pipelines

from ..support import register, statements_observed

TWO_GATES = """
queue = "default"
[[gate]]
name = "list"
number = 0
[[gate]]
name = "ocr"
number = 1
limit = 2
"""


def lease_all(store: Store, watcher: str) -> None:
    while store.acquire(watcher, "default", 50, 30):
        pass


def test_a_pipeline_is_stored_with_a_version_that_each_change_raises(feed: Feed) -> None:
    spec = parse_toml(TWO_GATES)
    assert feed.apply_pipeline(spec).version == 1
    assert feed.apply_pipeline(spec).version == 1  # nothing changed
    changed = parse_toml(TWO_GATES.replace("limit = 2", "limit = 3"))
    assert feed.apply_pipeline(changed).version == 2
    stored = feed.pipeline("default")
    assert stored is not None and stored.version == 2 and stored.limits == {1: 3}
    assert feed.store.pipeline_version("default") == 2


def test_a_removed_pipeline_is_gone_and_its_version_is_0(feed: Feed) -> None:
    feed.apply_pipeline(parse_toml(TWO_GATES))
    assert feed.remove_pipeline("default") is True
    assert feed.pipeline("default") is None and feed.store.pipeline_version("default") == 0
    assert feed.remove_pipeline("default") is False


def test_a_stored_pipeline_shows_no_credentials(feed: Feed) -> None:
    text = (
        '[[gate]]\nname = "g"\nnumber = 0\nhandler = "http://user:s3cret@127.0.0.1:9/?api_key=K3Y&mode=1"\n'
        'headers = {X-Token = "t0k"}\n'
    )
    feed.apply_pipeline(parse_toml(text))
    shown = str(feed.pipeline("default").shown())  # type: ignore[union-attr]
    assert "s3cret" not in shown and "t0k" not in shown and "K3Y" not in shown
    assert "http://***@127.0.0.1:9/?api_key=***&mode=1" in shown


def test_names_resolve_in_items_added_later_to_a_partition_of_the_queue(feed: Feed) -> None:
    feed.apply_pipeline(parse_toml(TWO_GATES))
    feed.add_partition("p", [{"gate": "list", "data": 1}], sealed=False)
    assert feed.add_items("p", [{"gate": "ocr", "data": 2}]) == 1
    assert [i.gate for i in feed.items("p")] == [0, 1]
    with pytest.raises(InvalidInput, match="unknown gate 'rank'"):
        feed.add_items("p", [{"gate": "rank", "data": 3}])


def test_a_fetch_takes_no_more_of_a_limited_gate_than_its_limit(feed: Feed, store: Store) -> None:
    feed.add_partition("a", [(1, b"{}")] * 5)
    feed.add_partition("b", [(0, b"{}")] * 3)  # gate 0 has no limit
    register(store, "w1")
    lease_all(store, "w1")
    taken = store.fetch_ready("w1", 10, slots=SlotClaim("default", gate_limits={1: 2}))
    assert sorted(i.gate for i in taken) == [0, 0, 0, 1, 1]


def test_gate_slots_held_by_one_watcher_are_not_given_to_another(feed: Feed, store: Store) -> None:
    feed.add_partition("a", [(1, b"{}")] * 4)
    feed.add_partition("b", [(1, b"{}")] * 4)
    register(store, "w1")
    register(store, "w2")
    assert store.acquire("w1", "default", 1, 30) and store.acquire("w2", "default", 1, 30)
    limits = {1: 3}
    first = store.fetch_ready("w1", 2, slots=SlotClaim("default", gate_limits=limits))
    second = store.fetch_ready("w2", 10, slots=SlotClaim("default", gate_limits=limits))
    assert (len(first), len(second)) == (2, 1)
    again = store.fetch_ready("w2", 10, [i.id for i in second], slots=SlotClaim("default", 1, limits, {1: 1}))
    assert again == []
    # w1's calls returned: its next fetch hands its slots back, and w2 may take them
    assert store.fetch_ready("w1", 0, [i.id for i in first], slots=SlotClaim("default", 0, limits, {})) == []
    more = store.fetch_ready("w2", 10, [i.id for i in second], slots=SlotClaim("default", 1, limits, {1: 1}))
    assert len(more) == 2


def test_a_partition_at_a_full_gate_does_not_hold_up_the_others(feed: Feed, store: Store) -> None:
    feed.add_partition("full", [(1, b"{}")] * 5, priority=9)  # first in dispatch order
    feed.add_partition("free", [(0, b"{}")] * 2)
    register(store, "w1")
    lease_all(store, "w1")
    taken = store.fetch_ready("w1", 2, slots=SlotClaim("default", 0, {1: 1}, {1: 1}))  # gate 1 is full
    assert [i.partition for i in taken] == ["free", "free"]


def test_partitions_at_a_closed_gate_are_not_fetched_from(feed: Feed, store: Store) -> None:
    feed.add_partition("shut", [(1, b"{}")] * 2, priority=9)
    feed.add_partition("open", [(0, b"{}")] * 2)
    register(store, "w1")
    lease_all(store, "w1")
    assert {i.partition for i in store.fetch_ready("w1", 10, closed_gates=[1])} == {"open"}


def test_pull_claims_take_no_more_of_a_limited_gate_than_its_limit(feed: Feed) -> None:
    feed.set_queue("pulled", mode="pull")
    feed.apply_pipeline(parse_toml(TWO_GATES.replace('queue = "default"', 'queue = "pulled"')))
    feed.add_partition("ocr", [(1, b"{}")] * 5, queue="pulled", priority=9)  # first in claim order
    feed.add_partition("list", [(0, b"{}")] * 3, queue="pulled")
    first = feed.claim("pulled", "w1", max_items=10)
    assert sorted(c["gate"] for c in first) == [0, 0, 0, 1, 1]  # a full gate does not hold up gate 0
    assert feed.claim("pulled", "w2", max_items=10) == []
    ocr = next(c for c in first if c["gate"] == 1)
    feed.answer(ocr["id"], ocr["token"], {"done": True})  # one of gate 1's slots comes back
    (again,) = feed.claim("pulled", "w2", max_items=10)
    assert again["gate"] == 1


def test_pull_claims_and_watchers_share_a_gates_limit(feed: Feed, store: Store) -> None:
    feed.set_queue("pulled", mode="pull")
    feed.apply_pipeline(parse_toml(TWO_GATES.replace('queue = "default"', 'queue = "pulled"')))
    feed.add_partition("ocr", [(1, b"{}")] * 5, queue="pulled")
    register(store, "w1", queue="pulled")
    with store.write() as conn:  # a watcher of the queue holds one of gate 1's two slots
        store._set_slots(conn, "w1", 1, gate_slots={1: 1})
    assert len(feed.claim("pulled", "worker", max_items=10)) == 1


def test_a_pull_workers_failure_is_retried_or_failed_by_its_gates_attempts(feed: Feed) -> None:
    feed.set_queue("pulled", mode="pull")
    feed.policy = RetryPolicy(max_attempts=5, retry_delay=0.0)
    pipeline = TWO_GATES.replace('queue = "default"', 'queue = "pulled"') + "max_attempts = 1\n"  # gate 1
    feed.apply_pipeline(parse_toml(pipeline))
    feed.add_partition("a", [(1, b"{}")], queue="pulled", priority=1)
    feed.add_partition("b", [(1, b"{}")], queue="pulled")
    answered, expired = feed.claim("pulled", "w1", max_items=2)
    result = feed.answer(answered["id"], answered["token"], {"error": "OCR crashed"})
    assert (result["outcome"], result["attempts"]) == ("fail", 1)  # gate 1's one attempt, not the queue's 5
    with feed.store.write() as conn:  # the other claim runs out: its worker went silent
        conn.execute(update(claims).where(claims.c.token == expired["token"]).values(expires_at=seconds_from_now(-1)))
    assert feed.expire_claims("pulled") == 1
    item = feed.store.item(expired["id"])
    assert (item["status"], item["attempts"]) == ("failed", 1)
    assert "claim by worker w1 expired" in item["last_error"]


def test_the_queue_of_a_partition_or_an_item_is_read_for_naming_gates(feed: Feed) -> None:
    feed.add_partition("p", [(0, b"{}")], queue="uploads")
    (item,) = feed.items("p")
    assert feed.queue_of("p") == "uploads" and feed.queue_of("nope") is None
    assert feed.store.queue_of_item(item.id) == "uploads" and feed.store.queue_of_item(10**9) is None


def test_the_queues_of_many_items_are_read_in_one_query(feed: Feed) -> None:
    feed.add_partition("a", [(0, b"{}"), (0, b"{}")], queue="ocr")
    feed.add_partition("b", [(0, b"{}")], queue="hr:payroll")
    ids = [item.id for key in ("a", "b") for item in feed.items(key)]
    seen: list[str] = []
    with statements_observed(feed.store, lambda conn, statement: seen.append(statement)):
        queues = feed.queues_of_items([*ids, ids[0], 10**9])
    assert queues == {ids[0]: "ocr", ids[1]: "ocr", ids[2]: "hr:payroll"}
    assert len([s for s in seen if "items" in s]) == 1, seen
    assert feed.queues_of_items([]) == {}


def pulled_pipeline(feed: Feed, extra: str = "") -> None:
    feed.set_queue("pulled", mode="pull")
    feed.apply_pipeline(parse_toml(TWO_GATES.replace('queue = "default"', 'queue = "pulled"') + extra))


def test_a_claim_passes_over_a_full_gate_whatever_it_asks_for(feed: Feed) -> None:
    pulled_pipeline(feed)
    feed.add_partition("ocr", [(1, b"{}")] * 5, queue="pulled", priority=9)  # first in claim order
    feed.add_partition("list", [(0, b"{}")], queue="pulled")
    assert [c["gate"] for c in feed.claim("pulled", "w1", max_items=2)] == [1, 1]  # gate 1 is full now
    assert [c["partition"] for c in feed.claim("pulled", "w2", max_items=1)] == ["list"]


def test_a_partition_heavier_than_its_gates_limit_is_claimed_alone(feed: Feed) -> None:
    pulled_pipeline(feed)
    feed.add_partition("heavy", [(1, b"{}")] * 3, queue="pulled", priority=9, weight=5)
    feed.add_partition("light", [(1, b"{}")] * 3, queue="pulled")
    (alone,) = feed.claim("pulled", "w1", max_items=10)  # takes gate 1's whole limit of 2; not overtaken
    assert alone["partition"] == "heavy"
    assert feed.claim("pulled", "w2", max_items=10) == []


def test_a_claim_takes_nothing_of_a_gate_outside_its_windows(feed: Feed) -> None:
    later = (datetime.now(UTC) + timedelta(hours=2)).hour
    pulled_pipeline(feed, f'windows = ["{later:02}:00-{(later + 1) % 24:02}:00"]\n')  # gate 1's
    feed.add_partition("ocr", [(1, b"{}")] * 2, queue="pulled", priority=9)
    feed.add_partition("list", [(0, b"{}")], queue="pulled")
    assert [c["partition"] for c in feed.claim("pulled", "w1", max_items=1)] == ["list"]


def test_pull_workers_go_on_by_the_queues_settings_when_its_stored_pipeline_cannot_be_read(feed: Feed) -> None:
    pulled_pipeline(feed)
    with feed.store.write() as conn:  # as a newer feedproc might have written it
        conn.execute(update(pipelines).where(pipelines.c.queue == "pulled").values(spec='{"gate": "?"}'))
    feed.add_partition("p", [(1, b"{}")] * 3, queue="pulled")
    claimed = feed.claim("pulled", "w1", max_items=10)
    assert len(claimed) == 3  # no gate limit of 2 is known
    assert feed.answer(claimed[0]["id"], claimed[0]["token"], {"done": True})["outcome"] == "done"


def test_claims_follow_a_pipeline_applied_through_the_same_store_at_once(feed: Feed) -> None:
    feed.set_queue("pulled", mode="pull")
    feed.add_partition("ocr", [(1, b"{}")] * 4, queue="pulled")
    assert len(feed.claim("pulled", "w1", max_items=1)) == 1  # no pipeline yet (and that was read)
    pulled_pipeline(feed)  # gate 1: limit 2
    assert len(feed.claim("pulled", "w1", max_items=10)) == 1
