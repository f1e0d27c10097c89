"""Fair dispatch in the store (issue 34), on every database: a fetch walks the leased partitions of
each priority from the one after the last partition the previous fetch served (`after`, by id,
wrapping around), so successive fetches take turns through the partitions held and a watcher can
serve a newly leased partition first; a higher priority still comes first; each partition's items
in due order, each carrying its partition's priority."""

from __future__ import annotations

from collections import Counter

from feedproc.store import Store

from ..support import A, register


def fetched(store: Store, limit: int, after: int = 0, exclude: list[int] | None = None) -> list[str]:
    return [item.partition for item in store.fetch_ready(A, limit, exclude or [], after=after)]


def lease_all(store: Store) -> dict[str, int]:
    """Lease every partition; their ids by key."""
    register(store, A, capacity=100)
    return {lease.key: lease.partition_id for lease in store.acquire(A, "default", 100, 30)}


def test_successive_fetches_take_turns_through_the_partitions(store: Store) -> None:
    for n in range(3):
        store.add_partition(f"p{n}", [(0, b"x")] * 100)
    ids = lease_all(store)
    assert fetched(store, 10) == ["p0"] * 10
    assert fetched(store, 10, after=ids["p0"]) == ["p1"] * 10
    assert fetched(store, 10, after=ids["p1"]) == ["p2"] * 10
    assert fetched(store, 10, after=ids["p2"]) == ["p0"] * 10  # wrapping around


def test_a_fetch_from_a_new_partition_takes_its_items_then_goes_on_to_the_others(store: Store) -> None:
    store.add_partition("big", [(0, b"x")] * 400)
    store.add_partition("small", [(0, b"x")] * 5)
    ids = lease_all(store)
    assert fetched(store, 20, after=ids["small"] - 1) == ["small"] * 5 + ["big"] * 15


def test_a_higher_priority_comes_first_wherever_the_turn_is(store: Store) -> None:
    store.add_partition("low-a", [(0, b"x")] * 20)
    store.add_partition("high", [(0, b"x")] * 6, priority=5)
    store.add_partition("low-b", [(0, b"x")] * 20)
    ids = lease_all(store)
    assert Counter(fetched(store, 16, after=ids["low-a"])) == {"high": 6, "low-b": 10}


def test_a_partition_alone_gets_the_whole_fetch_in_due_order_wherever_the_turn_is(store: Store) -> None:
    store.add_partition("only", [(0, bytes([n])) for n in range(30)])
    ids = lease_all(store)
    for after in (0, ids["only"], ids["only"] + 1000):
        assert [item.data for item in store.fetch_ready(A, 25, after=after)] == [bytes([n]) for n in range(25)]


def test_items_in_flight_are_skipped_wherever_the_turn_is(store: Store) -> None:
    store.add_partition("a", [(0, b"x")] * 6)
    store.add_partition("b", [(0, b"x")] * 6)
    ids = lease_all(store)
    first = store.fetch_ready(A, 4, after=ids["a"])
    assert {item.partition for item in first} == {"b"}
    again = store.fetch_ready(A, 8, [item.id for item in first], after=ids["a"])
    assert [item.partition for item in again] == ["b", "b", "a", "a", "a", "a", "a", "a"]


def test_each_item_carries_its_partitions_priority(store: Store) -> None:
    store.add_partition("p", [(0, b"x")], priority=-3)
    store.add_partition("q", [(0, b"x")], priority=7)
    lease_all(store)
    assert [(item.partition, item.priority) for item in store.fetch_ready(A, 5)] == [("q", 7), ("p", -3)]
