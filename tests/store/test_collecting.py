"""Collected results (every database): what a fan-in item receives of an earlier gate of its
partition, counted and read a page at a time, and the delivery token that authorises reading it."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from feedproc.core.errors import NotFound, StaleClaim
from feedproc.core.fanin import CollectedResult
from feedproc.core.pipelines import Collects
from feedproc.core.policy import RetryPolicy
from feedproc.core.records import Kind, ReadyItem
from feedproc.store import Store
from feedproc.store.foundations import seconds_from_now
from feedproc.store.schema import claims, items, partitions

from ..support import A, answer, lease_and_fetch, register

KB = 1024


def set_items(store: Store, ids: list[int], **values: object) -> None:
    with store.write() as conn:
        conn.execute(update(items).where(items.c.id.in_(ids)).values(**values))


def _pid(store: Store, key: str) -> int:
    with store.read() as conn:
        return int(conn.execute(partitions.select().where(partitions.c.key == key)).one().id)


Fanned = tuple[Store, int, list[int]]  # the store, partition "p"'s id, its items' ids
Delivering = tuple[Store, list[int], ReadyItem, str]  # the store, the items' ids, the fan-in item, its token


@pytest.fixture
def fanned(store: Store) -> Fanned:
    """Partition "p": gate 1 holds items 1-8 (complete with results, two failed with errors, one
    still available, one moved on to gate 2, one cancelled); the fan-in item waits at gate 3; an
    item of another partition sits at gate 1 too."""
    store.add_partition("other", [(1, b"{}")])
    store.add_partition("p", [*[(1, b"{}") for _ in range(8)], {"gate": 3, "data": {}, "collect": 1}])
    ids = [i["id"] for i in store.items("p")]
    for n, item_id in enumerate(ids[:4]):
        set_items(store, [item_id], status="complete", result=f'{{"n":{n}}}'.encode())
    set_items(store, [ids[4]], status="failed", last_error="unreadable scan")
    set_items(store, [ids[5]], status="failed", last_error="timed out")
    set_items(store, [ids[6]], status="complete", gate=2, result=b'"moved on"')
    set_items(store, [ids[7]], status="cancelled")
    set_items(store, [i["id"] for i in store.items("other")], status="complete", result=b'"not ours"')
    return store, _pid(store, "p"), ids


def test_the_collection_is_the_gates_complete_and_failed_items_of_the_partition(fanned: Fanned) -> None:
    store, pid, ids = fanned
    collection = store.collection(pid, 1)
    assert (collection.count, collection.failed) == (4, 2)
    assert (collection.first, collection.last) == (ids[0], ids[5])
    page = store.collected_page(pid, 1, collection.first - 1, collection.last)
    assert page == [
        *[CollectedResult(ids[n], f'{{"n":{n}}}'.encode()) for n in range(4)],
        CollectedResult(ids[4], error="unreadable scan", failed=True),  # tolerated failures, with their errors
        CollectedResult(ids[5], error="timed out", failed=True),
    ]
    assert [r.to_json() for r in page][3:5] == [
        {"id": ids[3], "result": {"n": 3}},
        {"id": ids[4], "error": "unreadable scan"},
    ]


def test_an_empty_collection_counts_nothing_and_reads_no_page(fanned: Fanned) -> None:
    store, pid, _ = fanned
    empty = store.collection(pid, 0)
    assert (empty.count, empty.failed, empty.first, empty.last) == (0, 0, 0, 0)
    assert store.collected_page(pid, 0, -1, 0) == []


def test_pages_go_in_id_order_and_give_each_result_once(fanned: Fanned) -> None:
    store, pid, ids = fanned
    collection = store.collection(pid, 1)
    seen: list[int] = []
    after = collection.first - 1
    while page := store.collected_page(pid, 1, after, collection.last, 4):
        assert len(page) <= 4
        seen += [r.id for r in page]
        after = page[-1].id
    assert seen == ids[:6]


def test_pages_walk_past_other_partitions_items_between_theirs(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from feedproc.store import collecting

    monkeypatch.setattr(collecting, "WINDOW", 2)  # windows of 2 ids, doubled while they hold too few
    store.add_partition("a", [(0, b"{}")], sealed=False)
    store.add_partition("b", [(0, b"{}")], sealed=False)
    for n in range(12):  # a's and b's items interleaved, and runs of b's
        store.add_items("a" if n % 4 == 0 else "b", [(1, b"{}"), (1, b"{}")])
    ours = [i["id"] for i in store.items("a", gate=1)]
    set_items(store, ours + [i["id"] for i in store.items("b", gate=1)], status="complete", result=b"1")
    pid = _pid(store, "a")
    collection = store.collection(pid, 1)
    assert collection.count == len(ours) == 6
    seen, after = [], collection.first - 1
    while page := store.collected_page(pid, 1, after, collection.last, 4):
        seen += [r.id for r in page]
        after = page[-1].id
    assert seen == ours


def test_a_page_of_large_results_stops_near_its_byte_bound_and_reads_them_whole(store: Store) -> None:
    store.add_partition("big", [*[(1, b"{}") for _ in range(7)], (2, b"{}")])
    ids = [i["id"] for i in store.items("big")][:7]
    sizes = [300 * KB, 3 * KB, 300 * KB, 300 * KB, 300 * KB, 10, 2 * 1024 * KB]
    for item_id, size in zip(ids, sizes, strict=True):
        set_items(store, [item_id], status="complete", result=b"x" * size)
    pid = _pid(store, "big")
    collection = store.collection(pid, 1)
    first = store.collected_page(pid, 1, collection.first - 1, collection.last)
    assert [len(r.result or b"") for r in first] == sizes[:4]  # 903 KiB: a fifth would pass 1 MiB
    second = store.collected_page(pid, 1, first[-1].id, collection.last)
    assert [len(r.result or b"") for r in second] == sizes[4:6]
    third = store.collected_page(pid, 1, second[-1].id, collection.last)
    assert [len(r.result or b"") for r in third] == [2 * 1024 * KB]  # one result larger than a page: alone
    assert store.collected_page(pid, 1, third[-1].id, collection.last) == []


def test_what_a_fan_in_item_gathers_is_inline_within_its_bounds(fanned: Fanned) -> None:
    store, pid, ids = fanned
    inline = store.gather(pid, Collects(1, "classify", inline=6))
    assert [r.id for r in inline.results or []] == ids[:6] and inline.accumulated == {}
    assert store.gather(pid, Collects(1, inline=5)).results is None  # more than the gate's collect_inline
    assert store.gather(pid, Collects(1), inline_bytes=100).results is None  # more than the bytes allowed
    assert store.gather(pid, Collects(1), inline_bytes=0).results is None  # never inline (a raw request)
    assert store.gather(pid, Collects(0), inline_bytes=0).results == []  # nothing to collect: nothing to page


# ---------------------------------------------------------------- the delivery's token


@pytest.fixture
def delivering(fanned: Fanned) -> Delivering:
    """The fan-in item fetched by watcher A, its collecting delivery on record."""
    store, _, ids = fanned
    with store.write() as conn:  # gate 1 drained: the partition is at the fan-in item's gate
        conn.execute(update(partitions).where(partitions.c.key == "p").values(gate=3))
    register(store, A)
    (ready,) = [r for r in lease_and_fetch(store) if r.partition == "p"]
    token = store.open_collection(ready.id, ready.version, A, 30)
    return store, ids, ready, token


def test_the_delivery_token_reads_the_collection(delivering: Delivering) -> None:
    store, ids, ready, token = delivering
    collection = store.collected_by(ready.id, token)
    assert (collection.gate, collection.count, collection.failed, collection.last) == (1, 4, 2, ids[5])
    bare = store.collected_by(ready.id, token, counted=False)
    assert (bare.partition_id, bare.gate, bare.count) == (collection.partition_id, 1, 0)


def test_another_token_or_another_item_is_not_found(delivering: Delivering) -> None:
    store, ids, ready, token = delivering
    with pytest.raises(NotFound):
        store.collected_by(ready.id, token[:-1] + ("A" if token[-1] != "A" else "B"))
    with pytest.raises(NotFound):
        store.collected_by(ids[0], token)


def test_the_token_is_refused_once_the_answer_is_written(delivering: Delivering) -> None:
    store, _, ready, token = delivering
    store.apply(A, [answer(ready, Kind.DONE)])
    with pytest.raises(StaleClaim) as refused:
        store.collected_by(ready.id, token)
    assert refused.value.reason == "superseded"


def test_the_token_is_refused_once_its_lease_ran_out(delivering: Delivering) -> None:
    store, _, ready, token = delivering
    with store.write() as conn:
        conn.execute(update(claims).where(claims.c.token == token).values(expires_at=seconds_from_now(-1)))
    with pytest.raises(StaleClaim) as refused:
        store.collected_by(ready.id, token)
    assert refused.value.reason == "expired"


def test_the_token_is_refused_once_the_partition_is_cancelled(delivering: Delivering) -> None:
    store, _, ready, token = delivering
    store.cancel("p")
    with pytest.raises(StaleClaim) as refused:
        store.collected_by(ready.id, token)
    assert refused.value.reason == "cancelled"


def test_a_collecting_delivery_counts_against_no_limit_and_is_never_expired_as_a_claim(delivering: Delivering) -> None:
    store, _, ready, token = delivering
    with store.write() as conn:
        conn.execute(update(claims).where(claims.c.token == token).values(expires_at=seconds_from_now(-1)))
        assert store._slots_in_use(conn, "default") == 0
    assert store.expire_claims(None, RetryPolicy()) == 0
    assert [r for r in store.running() if r["via"] != "watcher"] == []  # the watcher's delivery alone
    assert store.item(ready.id)["attempts"] == 0


def test_results_and_collecting_claims_go_with_their_partition(delivering: Delivering) -> None:
    store, _, ready, _ = delivering
    store.apply(A, [answer(ready, Kind.DONE, result=b'"joined"')])
    with store.write() as conn:  # finished an hour ago
        conn.execute(update(partitions).where(partitions.c.key == "p").values(status="complete"))
        conn.execute(update(partitions).where(partitions.c.key == "p").values(updated_at=seconds_from_now(-3600)))
    deleted = store.cleanup(60)
    assert (deleted["partitions"], deleted["items"], deleted["claims"]) == (1, 9, 1)
    with store.read() as conn:
        assert conn.execute(claims.select()).all() == []
