"""Results kept apart from inputs, and `collect` as an item field (every database): an answer's
`result` is stored beside the item's data, never over it, on every answer path (a watcher's group
commit, a pull worker's or callback's answer); an item added (or spawned) with `collect` keeps it
and the fetch hands it to the watcher."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import pytest

from feedproc import Feed
from feedproc.core.errors import InvalidInput
from feedproc.core.models import NewItem
from feedproc.core.pipelines import parse_toml
from feedproc.core.records import Kind
from feedproc.store import Store

from ..support import A, answer, lease_and_fetch, register


def results_of(store: Store, key: str) -> list[tuple[bytes, bytes | None]]:
    return [(i["data"], i["result"]) for i in store.items(key)]


@pytest.mark.parametrize(
    ("kind", "fields"),
    [(Kind.DONE, {}), (Kind.MOVE, {"new_gate": 4}), (Kind.LATER, {}), (Kind.DONE, {"data": b'{"new":1}'})],
    ids=["done", "move", "not-yet", "done-with-data"],
)
def test_an_answers_result_is_kept_apart_from_the_items_data(store: Store, kind: Kind, fields: dict[str, Any]) -> None:
    register(store, A)
    store.add_partition("p", [(0, b'{"file":"a.pdf"}')])
    (ready,) = lease_and_fetch(store)
    store.apply(A, [answer(ready, kind, result=b'{"label":"invoice"}', **fields)])
    (row,) = store.items("p")
    assert row["result"] == b'{"label":"invoice"}'
    assert row["data"] == fields.get("data", b'{"file":"a.pdf"}')  # the input stays, unless the answer says data


def test_a_result_replaces_the_last_one_and_an_answer_without_one_keeps_it(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"1"), (0, b"2")])
    first, second = lease_and_fetch(store)
    # One group commit with and one without a result: each item gets its own.
    store.apply(A, [answer(first, Kind.LATER, result=b'"draft"'), answer(second, Kind.LATER)])
    assert results_of(store, "p") == [(b"1", b'"draft"'), (b"2", None)]
    first, second = lease_and_fetch(store)
    store.apply(A, [answer(first, Kind.LATER, result=b'"final"'), answer(second, Kind.LATER, result=b'"x"')])
    first, second = lease_and_fetch(store)
    store.apply(A, [answer(first, Kind.RETRY, error="blip", attempts=1), answer(second, Kind.DONE)])
    assert results_of(store, "p") == [(b"1", b'"final"'), (b"2", b'"x"')]  # a failure, a plain done: kept
    (first,) = lease_and_fetch(store)
    store.apply(A, [answer(first, Kind.DONE, data=b"10")])
    assert results_of(store, "p") == [(b"10", b'"final"'), (b"2", b'"x"')]


def test_a_pull_workers_answer_keeps_its_result_apart(feed: Feed) -> None:
    feed.set_queue("gpu", mode="pull")
    feed.add_partition("p", [(0, b'{"n":1}'), (0, b'{"n":2}')], queue="gpu")
    one, two = feed.claim("gpu", "w", max_items=2)
    feed.answer(one["id"], one["token"], {"done": True, "result": {"label": "invoice"}})
    raw = base64.b64encode(b"\x00\xff").decode()
    feed.answer(two["id"], two["token"], {"done": True, "result_base64": raw, "data": {"n": 20}})
    assert [(i.data, i.result) for i in feed.items("p")] == [
        (b'{"n":1}', b'{"label":"invoice"}'),
        (b'{"n":20}', b"\x00\xff"),
    ]


def test_a_result_as_base64_must_be_base64(feed: Feed) -> None:
    feed.set_queue("gpu", mode="pull")
    feed.add_partition("p", [(0, b"{}")], queue="gpu")
    (one,) = feed.claim("gpu", "w")
    with pytest.raises(InvalidInput, match="result_base64 is not valid base64"):
        feed.answer(one["id"], one["token"], {"done": True, "result_base64": "not base64!"})


def test_items_added_with_collect_keep_it_and_the_fetch_hands_it_over(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [{"gate": 2, "data": {"rank": True}, "collect": 1}, (2, b"{}")])
    assert [store.item(i["id"])["collect"] for i in store.items("p")] == [1, None]
    assert sorted((r.data, r.collect) for r in lease_and_fetch(store)) == [(b'{"rank":true}', 1), (b"{}", None)]


def test_an_answers_child_may_collect_an_earlier_gate(store: Store) -> None:
    register(store, A)
    store.add_partition("p", [(0, b"{}")])
    (ready,) = lease_and_fetch(store)
    children = (NewItem(1, b'"a"'), NewItem(1, b'"b"'), NewItem(2, b'"fan-in"', collect=1))
    store.apply(A, [answer(ready, Kind.DONE, children=children)])
    rows = store.items("p")[1:]
    assert [(r["gate"], store.item(r["id"])["collect"]) for r in rows] == [(1, None), (1, None), (2, 1)]


def test_children_read_from_an_http_answer_carry_collect() -> None:
    from feedproc.processors.answers import response_from_json

    response = response_from_json({"done": True, "items": [{"gate": 3, "data": 1, "collect": 2}, {"gate": 2}]})
    assert [(c.gate, c.collect) for c in response.children] == [(3, 2), (2, None)]


@pytest.mark.parametrize(
    ("row", "said"),
    [
        ({"gate": 2, "collect": 2}, "collect must name an earlier gate than the item's (2), got gate 2"),
        ({"gate": 2, "collect": 5}, "collect must name an earlier gate than the item's (2), got gate 5"),
        ({"gate": 2, "collect": -1}, "collect: gate must be an integer >= 0"),
        ({"gate": 2, "collect": "x"}, "collect: gate 'x' is a name"),
    ],
)
def test_collect_must_name_an_earlier_gate(feed: Feed, row: dict[str, Any], said: str) -> None:
    with pytest.raises(InvalidInput, match=re.escape(said)):
        feed.add_partition("p", [row])
    with pytest.raises(KeyError):
        feed.status("p")  # nothing was written


def test_collect_may_name_a_gate_of_the_queues_pipeline(feed: Feed) -> None:
    pipeline = """
        queue = "uploads"
        [[gate]]
        name = "classify"
        number = 1
        [[gate]]
        name = "rank"
        number = 3
    """
    feed.apply_pipeline(parse_toml(pipeline))
    feed.add_partition("p", [{"gate": "rank", "data": {}, "collect": "classify"}], queue="uploads")
    (row,) = feed.items("p")
    assert (row.gate, feed.item(row.id).collect) == (3, 1)


def test_items_and_item_show_the_result(feed: Feed) -> None:
    register(feed.store, A)
    feed.add_partition("p", [(0, json.dumps({"n": 1}).encode())])
    (ready,) = lease_and_fetch(feed.store)
    feed.store.apply(A, [answer(ready, Kind.DONE, result=b'{"score":0.9}')])
    (row,) = feed.items("p")
    assert row.result == b'{"score":0.9}' and feed.item(row.id).result == b'{"score":0.9}'
