"""Operators' actions on single items (every database): retry, skip and cancel, by id or by
partition and gate; what they record; what they refuse; and a watcher's answer for an item that
changed meanwhile (dropped, the rest of its group commit written)."""

from __future__ import annotations

import pytest

from feedproc import Feed
from feedproc.core.errors import InvalidInput, NotFound, Refused
from feedproc.core.records import Kind

from ..support import A, answer, fail, lease_and_fetch, register


def failed_partition(feed: Feed) -> list[int]:
    """Partition "p": item a fails for good at gate 0 (b completes), c waits at gate 1; failed."""
    feed.add_partition("p", [(0, b'"a"'), (0, b'"b"'), (1, b'"c"')])
    register(feed.store, A)
    fetched = {r.data: r for r in lease_and_fetch(feed.store)}
    feed.store.apply(A, [fail(fetched[b'"a"'], attempts=5), answer(fetched[b'"b"'], Kind.DONE)])
    assert feed.status("p").status == "failed"
    return [fetched[b'"a"'].id, fetched[b'"b"'].id]


def test_skipping_the_failed_item_lets_the_partition_move_on(feed: Feed) -> None:
    failed, _ = failed_partition(feed)
    done = feed.act_on_items("skip", ids=[failed], by="ops")
    assert done == {"action": "skip", "items": 1, "partitions": ["p"]}
    status = feed.status("p", history=5)
    assert (status.status, status.gate) == ("available", 1)
    item = feed.item(failed)
    assert item.status == "complete"
    assert (item.history[-1].outcome, item.history[-1].watcher) == ("skipped", "ops")
    assert any(e.kind == "items_skipped" and e.detail["by"] == "ops" for e in status.history or ())


def test_retrying_one_failed_item_puts_it_and_its_partition_back_to_work(feed: Feed) -> None:
    failed, _ = failed_partition(feed)
    feed.act_on_items("retry", ids=[failed])
    item = feed.item(failed)
    assert (item.status, item.attempts) == ("available", 0)
    assert feed.status("p").status == "available"
    assert [r.id for r in lease_and_fetch(feed.store)] == [failed]


def test_cancelling_by_partition_and_gate_cancels_only_what_is_left_there(feed: Feed) -> None:
    feed.add_partition("p", [(0, b"1"), (0, b"2"), (1, b"3")])
    done = feed.act_on_items("cancel", key="p", gate=0)
    assert done["items"] == 2
    assert [(i.gate, i.status) for i in feed.items("p")] == [(0, "cancelled"), (0, "cancelled"), (1, "available")]
    assert feed.status("p").gate == 1  # the gate drained: the barrier lets go


def test_a_named_item_that_is_not_failed_or_available_is_refused_and_nothing_changes(feed: Feed) -> None:
    failed, completed = failed_partition(feed)
    with pytest.raises(Refused, match=f"item {completed} is complete"):
        feed.act_on_items("skip", ids=[failed, completed])
    assert feed.item(failed).status == "failed"
    assert feed.status("p").status == "failed"


def test_items_of_a_finished_partition_cannot_change(feed: Feed) -> None:
    feed.add_partition("p", [(0, b"1")])
    feed.cancel("p")
    with pytest.raises(Refused, match="cancelled"):
        feed.act_on_items("retry", key="p")


@pytest.mark.parametrize(
    "kwargs",
    [{"ids": []}, {"ids": [0]}, {"ids": [1], "key": "p"}, {}, {"ids": [True]}],
)
def test_malformed_selections_are_refused(feed: Feed, kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidInput):
        feed.act_on_items("skip", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        feed.act_on_items("delete", ids=[1])


def test_an_unknown_item_is_not_found(feed: Feed) -> None:
    with pytest.raises(NotFound):
        feed.act_on_items("cancel", ids=[12345])


def test_a_watchers_answer_for_a_skipped_item_is_dropped_and_the_rest_written(feed: Feed) -> None:
    feed.add_partition("p", [(0, b"1"), (0, b"2")])
    register(feed.store, A)
    first, second = lease_and_fetch(feed.store)
    feed.act_on_items("skip", ids=[first.id])  # while the watcher processes it
    applied = feed.store.apply(A, [answer(first, Kind.DONE, data=b'"late"'), answer(second, Kind.DONE)])
    assert applied.superseded == [first.id] and applied.written == [second.id]
    assert feed.item(first.id).data == b"1"  # the skip stands; the late answer changed nothing
    assert feed.status("p").status == "complete"


def test_a_failed_item_is_not_counted_as_done_in_the_progress(feed: Feed) -> None:
    failed_partition(feed)  # gate 0: one failed, one complete
    assert feed.status("p").progress.gates["0"].done == 1
