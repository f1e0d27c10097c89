"""Accumulators in the store (every database): answers' accumulate numbers merged into their
partition's accumulator by each name's operation, exactly once per written answer: not by an answer
the fence drops (a stale lease epoch, a stale item version, a second answer of a claim); queues'
accumulate declarations; the accumulator in a partition's status."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from sqlalchemy import select

from feedproc import Feed
from feedproc.core.errors import InvalidInput, StaleClaim
from feedproc.core.pipelines import parse_toml
from feedproc.core.policy import RetryPolicy
from feedproc.core.records import Kind, Outcome, ReadyItem
from feedproc.store import Store
from feedproc.store.schema import partitions

from ..support import A, B, answer, lease_and_fetch, register

OPERATIONS = {"pages": "sum", "lowest": "min", "best": "max", "answers": "count"}


def summed(ready: ReadyItem, kind: str = Kind.DONE, **numbers: float) -> Outcome:
    """An answer of `ready` carrying `numbers`, merged by OPERATIONS (as a watcher reads it)."""
    return answer(ready, kind, accumulate=numbers, operations=OPERATIONS)


def accumulated(store: Store, key: str) -> dict[str, float]:
    with store.read() as conn:
        pid = conn.execute(select(partitions.c.id).where(partitions.c.key == key)).scalar_one()
    return store.accumulated(pid)


def test_each_operation_merges_within_a_batch_and_across_batches(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"{}") for _ in range(5)])
    first, second, third, fourth, fifth = lease_and_fetch(store)
    store.apply(A, [summed(first, pages=3, lowest=7, best=0.5, answers=99), summed(second, pages=4, lowest=2)])
    assert accumulated(store, "p") == {"pages": 7, "lowest": 2, "best": 0.5, "answers": 1}  # answers carrying it
    store.apply(A, [summed(third, pages=1.5, lowest=9, best=0.25), summed(fourth, best=0.97, answers=0)])
    store.apply(A, [summed(fifth, Kind.LATER, pages=10, lowest=-1)])  # a "not yet" answer's numbers count too
    assert accumulated(store, "p") == {"pages": 18.5, "lowest": -1, "best": 0.97, "answers": 2}


def test_partitions_accumulate_apart_and_answers_without_numbers_change_nothing(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"{}"), (0, b"{}")])
    store.add_partition("q", [(0, b"{}")])
    ready = lease_and_fetch(store)
    p1, p2 = [r for r in ready if r.partition == "p"]
    (q1,) = [r for r in ready if r.partition == "q"]
    store.apply(A, [summed(p1, pages=2), summed(q1, pages=40), answer(p2, Kind.DONE)])
    assert accumulated(store, "p") == {"pages": 2}
    assert accumulated(store, "q") == {"pages": 40}


def test_names_without_an_operation_are_not_merged(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"{}")])
    (ready,) = lease_and_fetch(store)
    store.apply(A, [answer(ready, Kind.DONE, accumulate={"pages": 2, "typo": 1}, operations={"pages": "sum"})])
    assert accumulated(store, "p") == {"pages": 2}


def test_a_name_two_gates_merge_differently_is_merged_each_way_in_one_batch(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"{}"), (0, b"{}"), (0, b"{}")])
    first, second, third = lease_and_fetch(store)
    store.apply(
        A,
        [
            answer(first, Kind.DONE, accumulate={"x": 3}, operations={"x": "sum"}),
            answer(second, Kind.DONE, accumulate={"x": 5}, operations={"x": "max"}),
            answer(third, Kind.DONE, accumulate={"x": 1}, operations={"x": "sum"}),
        ],
    )
    assert accumulated(store, "p") == {"x": 5}  # 3 + 1, then the greater of that and 5


def test_a_stale_owners_group_commit_adds_nothing(store: Store) -> None:
    """A partition taken over (a steal, an expired lease): the old owner's late batch is fenced out
    by the lease epoch, its numbers with it."""
    register(store, A)
    register(store, B)
    store.add_partition("p", [(0, b"{}"), (0, b"{}")])
    (lease,) = store.acquire(A, "default", 10, 30)
    stale, other = store.fetch_ready(A, 10)
    store.release(A, [lease])
    store.acquire(B, "default", 10, 30)
    fresh = store.fetch_ready(B, 10)[0]
    applied = store.apply(A, [summed(stale, pages=5), summed(other, pages=5)])
    assert applied.written == [] and applied.lost == {stale.partition_id}
    assert accumulated(store, "p") == {}
    store.apply(B, [summed(fresh, pages=1)])
    assert accumulated(store, "p") == {"pages": 1}


def test_an_answer_written_once_adds_nothing_when_applied_again(store: Store) -> None:
    """A group commit retried after it committed (its acknowledgement lost), or a redelivered item's
    late first answer: the item's version no longer matches, so its numbers are not merged again,
    while the rest of the batch is."""
    register(store, A)
    store.add_partition("p", [(0, b"{}"), (0, b"{}")])
    first, second = lease_and_fetch(store)
    written = summed(first, pages=3, answers=1)
    assert store.apply(A, [written]).written == [first.id]
    again = store.apply(A, [written, summed(second, pages=4)])
    assert (again.written, again.superseded) == ([second.id], [first.id])
    assert accumulated(store, "p") == {"pages": 7, "answers": 1}


# ---------------------------------------------------------------- declarations


def test_a_queue_declares_its_operations_and_can_remove_them(feed: Feed) -> None:
    settings = feed.set_queue("docs", accumulate={"pages": "sum", "max_score": "max"})
    assert settings.operations == {"pages": "sum", "max_score": "max"}
    assert feed.queue("docs").accumulate == {"max_score": "max", "pages": "sum"}
    feed.set_queue("docs", limit=3)  # other settings keep it
    assert feed.queue("docs").accumulate == {"max_score": "max", "pages": "sum"}
    assert feed.set_queue("docs", accumulate={}).operations == {}


@pytest.mark.parametrize(
    ("declared", "says"),
    [
        ({"pages": "avg"}, "pages: the operation must be one of sum, min, max, count"),
        ({"1pages": "sum"}, "is not a name"),
        (["pages"], "must be a table of name = operation"),
    ],
)
def test_a_bad_declaration_is_refused_and_changes_nothing(feed: Feed, declared: object, says: str) -> None:
    feed.set_queue("docs", accumulate={"pages": "sum"})
    with pytest.raises(InvalidInput, match=says):
        feed.set_queue("docs", limit=5, accumulate=declared)  # type: ignore[arg-type]
    assert (feed.queue("docs").limit, feed.queue("docs").accumulate) == (None, {"pages": "sum"})


def test_a_gates_declaration_is_over_its_queues(store: Store) -> None:
    store.set_queue("default", accumulate={"pages": "sum", "best": "max"})
    pipeline = 'queue = "default"\n[[gate]]\nname = "rank"\nnumber = 1\naccumulate = {best = "min"}\n'
    store.apply_pipeline(parse_toml(pipeline))
    with store.read() as conn:
        assert store._operations(conn, "default", 0) == {"pages": "sum", "best": "max"}
        assert store._operations(conn, "default", 1) == {"pages": "sum", "best": "min"}


# ---------------------------------------------------------------- pull workers and callbacks

PULL = "gpu"


@pytest.fixture
def pull(feed: Feed) -> Feed:
    feed.set_queue(PULL, mode="pull", accumulate={"pages": "sum", "best": "max"})
    feed.policy = RetryPolicy(max_attempts=3, retry_delay=0.0)
    return feed


def _accumulated(feed: Feed, key: str) -> Mapping[str, float]:
    return feed.status(key).accumulated


def test_pull_workers_answers_merge_in_their_own_transaction(pull: Feed) -> None:
    pull.add_partition("p", [(0, b"{}") for _ in range(3)], queue=PULL)
    a, b, c = pull.claim(PULL, "w", max_items=3)
    results = pull.answer_many(
        [
            (a["id"], a["token"], {"done": True, "accumulate": {"pages": 2, "best": 0.5}}),
            (b["id"], b["token"], {"done": True, "accumulate": {"pages": 5}}),
        ]
    )
    assert [r["outcome"] for r in results] == ["done", "done"]  # type: ignore[index]
    pull.answer(c["id"], c["token"], {"done": True, "accumulate": {"best": 0.9}})
    assert _accumulated(pull, "p") == {"pages": 7, "best": 0.9}


def test_a_second_answer_with_the_same_token_adds_nothing(pull: Feed) -> None:
    pull.add_partition("p", [(0, b"{}"), (0, b"{}")], queue=PULL)
    c = pull.claim(PULL, "w")[0]
    numbers = {"done": True, "accumulate": {"pages": 3}}
    pull.answer(c["id"], c["token"], numbers)
    with pytest.raises(StaleClaim):
        pull.answer(c["id"], c["token"], numbers)
    (result,) = pull.answer_many([(c["id"], c["token"], numbers), (c["id"], c["token"], numbers)])[:1]
    assert isinstance(result, StaleClaim)
    assert _accumulated(pull, "p") == {"pages": 3}


def test_a_workers_undeclared_name_fails_the_item_saying_which(pull: Feed) -> None:
    pull.add_partition("p", [(0, b"{}"), (0, b"{}")], queue=PULL)
    c = pull.claim(PULL, "w")[0]
    result = pull.answer(c["id"], c["token"], {"done": True, "accumulate": {"pages": 1, "bytes": 10}})
    assert result["outcome"] == "fail"
    assert "accumulate: 'bytes' has no operation declared at gate 0 of queue 'gpu'" in result["error"]
    assert "--accumulate bytes=sum" in result["error"]
    assert pull.item(c["id"]).status == "failed"
    assert _accumulated(pull, "p") == {}  # nothing of a refused answer is merged


def test_the_accumulator_shows_in_status_as_numbers(pull: Feed) -> None:
    pull.add_partition("p", [(0, b"{}")], queue=PULL)
    assert pull.status("p").accumulated == {}
    (c,) = pull.claim(PULL, "w")
    pull.answer(c["id"], c["token"], {"done": True, "accumulate": {"pages": 12, "best": 0.97}})
    assert pull.status("p").accumulated == {"best": 0.97, "pages": 12}
    assert isinstance(pull.status("p").accumulated["pages"], int)
