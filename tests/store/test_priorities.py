"""Priorities (issue 34), on every database: signed 64-bit, stored and ordered at both ends; changed
after creation (`Feed.set_priority`), which the next lease follows; a queue's (or its pipeline's)
default priority and weight for partitions added without theirs; pull claims of a priority range."""

from __future__ import annotations

import pytest

from feedproc import Feed
from feedproc.core.errors import InvalidInput, NotFound
from feedproc.core.models import MAX_PRIORITY, MIN_PRIORITY
from feedproc.core.pipelines import parse_toml

from ..support import A, register

SCYLLA_MAX = 4_294_967_295  # Scylla's priorities are 0..2^32-1: past a 32-bit column
OUT_OF_RANGE = (MAX_PRIORITY + 1, MIN_PRIORITY - 1, True, "5", 1.0)


def lease_order(feed: Feed, count: int, queue: str = "default") -> list[str]:
    """The keys a watcher leases, one at a time."""
    register(feed.store, A, queue=queue)
    return [lease.key for _ in range(count) for lease in feed.store.acquire(A, queue, 1, 30)]


def test_priorities_at_both_64_bit_ends_are_stored_and_read_back(feed: Feed) -> None:
    for key, priority in (("lowest", MIN_PRIORITY), ("scylla", SCYLLA_MAX), ("highest", MAX_PRIORITY)):
        feed.add_partition(key, [(0, b"x")], priority=priority)
        assert feed.status(key).priority == priority


def test_leases_go_highest_first_across_the_whole_64_bit_range(feed: Feed) -> None:
    for key, priority in (("low", MIN_PRIORITY), ("zero", 0), ("high", MAX_PRIORITY), ("scylla", SCYLLA_MAX)):
        feed.add_partition(key, [(0, b"x")], priority=priority)
    assert lease_order(feed, 4) == ["high", "scylla", "zero", "low"]


def test_set_priority_changes_the_next_lease_order_and_returns_the_old_priority(feed: Feed) -> None:
    feed.add_partition("first", [(0, b"x")], priority=5)
    feed.add_partition("second", [(0, b"x")])
    assert feed.set_priority("second", MAX_PRIORITY) == 0
    assert feed.status("second").priority == MAX_PRIORITY
    assert lease_order(feed, 2) == ["second", "first"]


def test_set_priority_is_kept_in_the_history_with_who_did_it(feed: Feed) -> None:
    feed.add_partition("p", [(0, b"x")], priority=3)
    feed.set_priority("p", -7, by="cli")
    feed.set_priority("p", -7)  # unchanged: nothing recorded
    changes = [entry.detail for entry in feed.history("p") if entry.kind == "priority"]
    assert changes == [{"priority": -7, "was": 3, "by": "cli"}]


def test_set_priority_of_an_unknown_partition_is_not_found(feed: Feed) -> None:
    with pytest.raises(NotFound, match="nope"):
        feed.set_priority("nope", 1)


@pytest.mark.parametrize("bad", OUT_OF_RANGE)
def test_a_priority_outside_64_bits_is_refused_at_add_and_at_set_and_nothing_changes(feed: Feed, bad: object) -> None:
    with pytest.raises(InvalidInput, match="priority must be an integer from -9223372036854775808"):
        feed.add_partition("new", [(0, b"x")], priority=bad)  # type: ignore[call-overload]
    with pytest.raises(NotFound):
        feed.status("new")
    feed.add_partition("p", [(0, b"x")], priority=2)
    with pytest.raises(InvalidInput, match="priority must be an integer"):
        feed.set_priority("p", bad)  # type: ignore[arg-type]
    assert feed.status("p").priority == 2
    assert [entry.kind for entry in feed.history("p")].count("priority") == 0


def test_a_queues_default_priority_and_weight_apply_when_add_gives_none(feed: Feed) -> None:
    settings = feed.set_queue("q", priority=SCYLLA_MAX, weight=3)
    assert (settings.default_priority, settings.default_weight) == (SCYLLA_MAX, 3)
    assert (feed.queue("q").priority, feed.queue("q").weight) == (SCYLLA_MAX, 3)
    feed.add_partition("defaulted", [(0, b"x")], queue="q")
    feed.add_partition("own", [(0, b"x")], queue="q", priority=-1, weight=1)
    feed.add_partition("elsewhere", [(0, b"x")])
    statuses = [feed.status(key) for key in ("defaulted", "own", "elsewhere")]
    assert [(s.priority, s.schedule.weight) for s in statuses] == [
        (SCYLLA_MAX, 3),
        (-1, 1),
        (0, 1),
    ]


def test_queue_defaults_are_checked_kept_by_other_changes_and_cleared(feed: Feed) -> None:
    feed.set_queue("q", priority=4, weight=2)
    with pytest.raises(InvalidInput, match="default priority must be"):
        feed.set_queue("q", priority=MAX_PRIORITY + 1, limit=5)
    with pytest.raises(InvalidInput, match="default weight must be"):
        feed.set_queue("q", weight=0)
    assert feed.set_queue("q", limit=5).default_priority == 4  # nothing else changed them
    cleared = feed.set_queue("q", clear_defaults=True)
    assert (cleared.default_priority, cleared.default_weight, cleared.limit) == (None, None, 5)
    feed.add_partition("p", [(0, b"x")], queue="q")
    assert feed.status("p").priority == 0


def test_a_pipelines_priority_and_weight_become_its_queues_defaults(feed: Feed) -> None:
    spec = parse_toml('queue = "q"\npriority = -9\nweight = 4\n[[gate]]\nname = "only"\nnumber = 0\n')
    assert (spec.priority, spec.weight) == (-9, 4)
    feed.apply_pipeline(spec)
    assert (feed.queue("q").priority, feed.queue("q").weight) == (-9, 4)
    feed.add_partition("p", [(0, b"x")], queue="q")
    assert feed.status("p").priority == -9
    feed.apply_pipeline(parse_toml('queue = "q"\n[[gate]]\nname = "only"\nnumber = 0\n'))
    assert feed.queue("q").priority == -9  # a pipeline without them leaves the queue's


def test_a_pipeline_priority_outside_64_bits_is_refused_naming_it() -> None:
    with pytest.raises(InvalidInput, match=r"q\.toml: priority must be an integer"):
        parse_toml(f'priority = {MAX_PRIORITY + 1}\n[[gate]]\nname = "only"\nnumber = 0\n', source="q.toml")


def test_a_pull_claim_takes_only_partitions_within_its_priority_range(feed: Feed) -> None:
    feed.set_queue("gpu", mode="pull")
    for key, priority in (("lowest", MIN_PRIORITY), ("low", -1), ("mid", 10), ("high", 11), ("top", MAX_PRIORITY)):
        feed.add_partition(key, [(0, b"x")], queue="gpu", priority=priority)

    def claimed(**bounds: int) -> list[str]:
        return [c["partition"] for c in feed.claim("gpu", "w", max_items=10, **bounds)]

    assert claimed(min_priority=0, max_priority=10) == ["mid"]
    assert claimed(max_priority=-1) == ["low", "lowest"]
    assert claimed(min_priority=MAX_PRIORITY) == ["top"]
    assert claimed() == ["high"]


def test_a_pull_claims_priority_bound_outside_64_bits_is_refused(feed: Feed) -> None:
    feed.set_queue("gpu", mode="pull")
    with pytest.raises(InvalidInput, match="max_priority must be an integer"):
        feed.claim("gpu", "w", max_priority=MAX_PRIORITY + 1)
