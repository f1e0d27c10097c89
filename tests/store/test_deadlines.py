"""Deadlines and bounded waiting (store level, every database): "not yet" answers are counted per
item and gate in the database, apart from attempts, and a gate's `max_not_yet` bounds them; a
partition past its deadline fails, its unfinished items cancelled saying why."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import update

from feedproc.core.errors import InvalidInput, NotFound
from feedproc.core.models import Response
from feedproc.core.pipelines import parse_toml
from feedproc.core.policy import RetryPolicy, outcome_of
from feedproc.core.records import Kind, ReadyItem
from feedproc.store import Store
from feedproc.store.foundations import seconds_from_now
from feedproc.store.schema import partitions

from ..api_support import ApiServer
from ..support import A, answer, lease_and_fetch, register

NOT_YET = Response(gate=0, retry_after=0)


def ask(store: Store, policy: RetryPolicy, response: Response = NOT_YET) -> ReadyItem:
    """Fetch the one ready item, answer `response` to it as a watcher does, and return it as fetched."""
    [ready] = lease_and_fetch(store, A)
    outcome = outcome_of(ready, policy, response=response)
    outcome.n, outcome.attempt = ready.deliveries + 1, ready.attempts + 1
    assert store.apply(A, [outcome]).written == [ready.id]
    return ready


def test_not_yet_answers_are_counted_in_the_database_apart_from_attempts(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"{}")])
    for _ in range(3):
        ask(store, RetryPolicy())
    [ready] = lease_and_fetch(store, A)
    assert (ready.not_yet, ready.attempts, ready.deliveries) == (3, 0, 3)


def test_moving_on_to_another_gate_starts_the_count_again(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"{}")])
    ask(store, RetryPolicy())
    ask(store, RetryPolicy(), Response(gate=1))
    [ready] = lease_and_fetch(store, A)
    assert (ready.gate, ready.not_yet) == (1, 0)


def test_the_max_not_yet_th_not_yet_answer_fails_the_item_and_its_partition(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"{}")])
    policy = RetryPolicy(max_not_yet=3)
    ask(store, policy)
    ask(store, policy)
    last = ask(store, policy)
    item = store.item(last.id)
    assert (item["status"], item["attempts"]) == ("failed", 0)
    assert item["last_error"] == "not yet answered 3 times (max_not_yet 3)"
    assert store.status("p")["status"] == "failed"


def test_an_operator_retry_starts_the_count_again(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"{}")])
    policy = RetryPolicy(max_not_yet=1)
    failed = ask(store, policy)
    store.retry("p")
    [ready] = lease_and_fetch(store, A)
    assert (ready.id, ready.not_yet) == (failed.id, 0)


# ---------------------------------------------------------------- a partition's deadline


def overdue(store: Store, key: str) -> None:
    """Partition `key`'s deadline passed (a second ago, on the database's clock)."""
    with store.write() as conn:
        conn.execute(update(partitions).where(partitions.c.key == key).values(deadline=seconds_from_now(-1)))


def test_a_partition_before_its_deadline_is_left_alone(store: Store) -> None:
    store.add_partition("p", [(0, b"{}")], deadline=timedelta(hours=1))
    assert store.fail_overdue("default") == []
    assert store.status("p")["status"] == "available"


def test_a_partition_past_its_deadline_fails_and_its_unfinished_items_say_deadline_exceeded(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"{}"), (0, b"{}"), (1, b"{}")], deadline=3600)
    [first, _] = lease_and_fetch(store, A)
    store.apply(A, [answer(first, Kind.DONE)])
    overdue(store, "p")
    assert store.fail_overdue("default") == ["p"]
    status = store.status("p", history=10)
    assert status["status"] == "failed"
    assert status["history"][-1]["kind"] == "failed"
    assert status["history"][-1]["detail"]["error"] == "deadline exceeded"
    states = sorted((i["status"], i["last_error"]) for i in store.items("p"))
    assert states == [("cancelled", "deadline exceeded"), ("cancelled", "deadline exceeded"), ("complete", None)]


def test_an_answer_after_the_deadline_failed_the_partition_is_dropped(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"{}")], deadline=3600)
    [ready] = lease_and_fetch(store, A)
    overdue(store, "p")
    store.fail_overdue("default")
    applied = store.apply(A, [answer(ready, Kind.DONE)])
    assert (applied.written, applied.lost) == ([], {ready.partition_id})
    assert store.status("p")["status"] == "failed"


def test_a_deadline_failure_calls_the_queues_on_fail_hook(store: Store) -> None:
    store.set_queue("default", hooks={"on_fail": "https://app.example/failed"})
    store.add_partition("p", [(0, b"{}")], deadline=3600)
    overdue(store, "p")
    store.fail_overdue("default")
    [hook] = store.hooks(queue="default")
    assert (hook["hook"], hook["key"]) == ("on_fail", "p")
    assert store.hook(hook["id"])["payload"]["first_error"]["error"] == "deadline exceeded"


def test_only_the_queues_own_partitions_past_their_deadline_fail(store: Store) -> None:
    store.add_partition("mine", [(0, b"{}")], deadline=3600)
    store.add_partition("other", [(0, b"{}")], queue="elsewhere", deadline=3600)
    store.add_partition("none", [(0, b"{}")])
    overdue(store, "mine")
    overdue(store, "other")
    assert store.fail_overdue("default") == ["mine"]
    assert store.status("other")["status"] == "available"


@pytest.mark.parametrize("bad", [0, -5, float("inf"), float("nan"), "10m", True, 400 * 86400])
def test_a_deadline_that_is_not_a_time_or_a_positive_duration_is_refused(store: Store, bad: Any) -> None:
    with pytest.raises(InvalidInput, match="deadline must be"):
        store.add_partition("p", [(0, b"{}")], deadline=bad)
    with pytest.raises(NotFound):
        store.status("p")


# ---------------------------------------------------------------- a gate's max_time

TIMED = """
queue = "default"
[[gate]]
name = "fetch"
number = 0
[[gate]]
name = "ocr"
number = 1
max_time = 60
"""


def at_gate_since(store: Store, key: str, seconds_ago: float) -> None:
    """Partition `key` reached its gate `seconds_ago` (on the database's clock)."""
    with store.write() as conn:
        conn.execute(
            update(partitions).where(partitions.c.key == key).values(gate_since=seconds_from_now(-seconds_ago))
        )


def test_a_partition_longer_at_a_gate_than_its_max_time_fails_saying_which_gate(store: Store) -> None:
    store.apply_pipeline(parse_toml(TIMED))
    register(store, A)
    store.add_partition("p", [(0, b"{}"), (1, b"{}")])
    [first] = lease_and_fetch(store, A)
    store.apply(A, [answer(first, Kind.DONE)])  # on to gate 1, whose max_time counts from now
    assert store.fail_overdue("default") == []
    at_gate_since(store, "p", 61)
    assert store.fail_overdue("default") == ["p"]
    assert store.status("p")["status"] == "failed"
    at_gate_1 = [i["last_error"] for i in store.items("p") if i["gate"] == 1]
    assert at_gate_1 == ["max_time exceeded at gate 1 (ocr)"]


def test_a_gate_without_max_time_lets_a_partition_stay_as_long_as_it_takes(store: Store) -> None:
    store.apply_pipeline(parse_toml(TIMED))
    store.add_partition("p", [(0, b"{}"), (1, b"{}")])
    at_gate_since(store, "p", 86400)
    assert store.fail_overdue("default") == []


def test_the_api_takes_a_deadline_in_seconds_or_as_a_time_and_refuses_anything_else(db_url: str) -> None:
    api = ApiServer(db_url)
    try:
        in_seconds = api.post("/api/v1/partitions", {"key": "a", "open": True, "deadline": 600})
        as_time = api.post("/api/v1/partitions", {"key": "b", "open": True, "deadline": "2099-01-01T00:00:00"})
        refused = api.post("/api/v1/partitions", {"key": "c", "open": True, "deadline": "soon"})
    finally:
        api.close()
    assert (in_seconds.status_code, as_time.status_code, refused.status_code) == (201, 201, 400)
    assert in_seconds.json()["partition"]["schedule"]["deadline"] is not None
    assert as_time.json()["partition"]["schedule"]["deadline"] == "2099-01-01T00:00:00.000Z"
    assert "deadline" in refused.json()["error"]
