"""Completion hooks' outbox (every database): a finished partition's hook row is written in the
transaction that finished it, with the partition's summary, and only for the hook its queue has;
claims are fenced by their token, so a claim that expired and was taken again records nothing;
failed attempts come back after their delay, exhausted ones stay failed until retried."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import select

from feedproc import Feed
from feedproc.core.errors import InvalidInput, NotFound
from feedproc.core.pipelines import parse_toml
from feedproc.core.records import Kind
from feedproc.store import Store
from feedproc.store.schema import hooks

from ..support import A, answer, lease_and_fetch, register, wait_until, work_off

URL = "http://127.0.0.1:9/hooks?token=abc"
B = "watcher-b"


def rows(store: Store) -> list[Any]:
    with store.read() as conn:
        return list(conn.execute(select(hooks).order_by(hooks.c.id)).all())


def payload(store: Store, n: int = 0) -> dict[str, Any]:
    return dict(json.loads(rows(store)[n].payload))


def completed(store: Store, key: str = "p") -> None:
    """`key`: two items at gate 0 and one at gate 1, each answered done; it completes."""
    register(store, A)
    store.add_partition(key, [(0, b"1"), (0, b"2"), (1, b"3")])
    work_off(store, key)
    work_off(store, key)
    assert store.status(key)["status"] == "complete"


def failed(store: Store, key: str = "p") -> None:
    """`key`: one item done, one failed for good ("broken"); it fails at gate 0."""
    register(store, A)
    store.add_partition(key, [(0, b"1"), (0, b"2")])
    first, second = lease_and_fetch(store)
    store.apply(A, [answer(first, Kind.DONE), answer(second, Kind.FAIL, error="broken", attempts=1)])
    assert store.status(key)["status"] == "failed"


def test_a_completed_partition_writes_its_on_complete_hook_with_its_summary(store: Store) -> None:
    store.set_queue("default", hooks={"on_complete": URL})

    completed(store)

    [row] = rows(store)
    assert (row.queue, row.partition_key, row.hook, row.target, row.status, row.attempts) == (
        "default",
        "p",
        "on_complete",
        URL,
        "pending",
        0,
    )
    summary = payload(store)
    assert {k: summary[k] for k in ("key", "queue", "status", "gate", "items", "first_error")} == {
        "key": "p",
        "queue": "default",
        "status": "complete",
        "gate": 1,
        "items": 3,
        "first_error": None,
    }
    assert summary["gates"] == [
        {"gate": 0, "name": None, "complete": 2, "failed": 0, "cancelled": 0, "available": 0},
        {"gate": 1, "name": None, "complete": 1, "failed": 0, "cancelled": 0, "available": 0},
    ]
    assert summary["accumulated"] == {}
    assert summary["seconds"] >= 0 and summary["created_at"] <= summary["finished_at"]


def test_a_failed_partition_writes_its_on_fail_hook_with_the_first_error(store: Store) -> None:
    store.set_queue("default", hooks={"on_fail": URL})

    failed(store)

    summary = payload(store)
    assert (rows(store)[0].hook, summary["status"]) == ("on_fail", "failed")
    assert summary["first_error"]["error"] == "broken"
    assert summary["first_error"]["gate"] == 0
    assert summary["gates"][0] | {"name": None} == {
        "gate": 0,
        "name": None,
        "complete": 1,
        "failed": 1,
        "cancelled": 0,
        "available": 0,
    }


def test_a_cancelled_partition_writes_its_on_cancel_hook(store: Store) -> None:
    store.set_queue("default", hooks={"on_cancel": URL})
    store.add_partition("p", [(0, b"1")])

    store.cancel("p")

    assert [(r.hook, r.partition_key) for r in rows(store)] == [("on_cancel", "p")]
    assert payload(store)["gates"][0]["cancelled"] == 1


def test_the_accumulator_is_in_the_summary(store: Store) -> None:
    store.set_queue("default", accumulate={"pages": "sum"}, hooks={"on_complete": URL})
    register(store, A)
    store.add_partition("p", [(0, b"1"), (0, b"2")])
    ready = lease_and_fetch(store)
    store.apply(A, [answer(r, Kind.DONE, accumulate={"pages": 3}, operations={"pages": "sum"}) for r in ready])

    assert payload(store)["accumulated"] == {"pages": 6.0}


def test_a_queue_without_that_hook_writes_nothing(store: Store) -> None:
    store.set_queue("default", hooks={"on_fail": URL})  # not on_complete

    completed(store)
    store.add_partition("other", [(0, b"1")], queue="elsewhere")
    store.cancel("other")

    assert rows(store) == []


def test_a_finish_rolled_back_leaves_no_hook_and_a_committed_one_leaves_one(db_url: str) -> None:
    with Feed(db_url) as feed:
        feed.set_queue("default", hooks={"on_cancel": URL})
        feed.add_partition("p", [(0, b"1")])
        with feed.begin() as conn:
            feed.cancel("p", connection=conn)
            conn.rollback()
        assert (feed.status("p").status, rows(feed.store)) == ("available", [])

        with feed.begin() as conn:
            feed.cancel("p", connection=conn)
        assert [r.hook for r in rows(feed.store)] == ["on_cancel"]


def test_a_claim_takes_due_hooks_and_raises_their_attempts(store: Store) -> None:
    store.set_queue("default", hooks={"on_cancel": URL})
    for key in ("a", "b"):
        store.add_partition(key, [(0, b"1")])
        store.cancel(key)

    assert store.hooks_due("default")
    calls = store.claim_hooks(A, "default")

    assert [(c.key, c.attempt, c.hook, c.target) for c in calls] == [
        ("a", 1, "on_cancel", URL),
        ("b", 1, "on_cancel", URL),
    ]
    assert json.loads(calls[0].body())["id"] == calls[0].id
    assert store.claim_hooks(B, "default") == []  # claimed: nobody else takes them
    assert not store.hooks_due("default")


def test_python_hooks_are_claimed_only_by_a_watcher_with_a_function_for_them(store: Store) -> None:
    store.set_queue("default", hooks={"on_cancel": "python"})
    store.add_partition("p", [(0, b"1")])
    store.cancel("p")

    assert store.claim_hooks(A, "default") == []
    assert [c.hook for c in store.claim_hooks(B, "default", python_hooks=["on_cancel"])] == ["on_cancel"]


def test_an_expired_claim_taken_again_records_nothing(store: Store) -> None:
    store.set_queue("default", hooks={"on_cancel": URL})
    store.add_partition("p", [(0, b"1")])
    store.cancel("p")
    [first] = store.claim_hooks(A, "default", claim_seconds=0.2)

    [second] = wait_until(lambda: store.claim_hooks(B, "default"), timeout=10, what="the claim to expire")

    assert (first.id, second.attempt) == (second.id, 2)
    assert store.hook_sent(first) is False  # its claim is no longer the row's
    assert store.hook_failed(first, "late", retry_in=1) is False
    assert store.hook_sent(second, response_status=204) is True
    [row] = rows(store)
    assert (row.status, row.attempts, row.response_status, row.claim) == ("sent", 2, 204, None)
    assert store.hook_sent(second) is False  # recorded once


def test_a_failed_attempt_waits_its_delay_and_the_last_one_fails_the_hook(store: Store) -> None:
    store.set_queue("default", hooks={"on_cancel": URL})
    store.add_partition("p", [(0, b"1")])
    store.cancel("p")
    [call] = store.claim_hooks(A, "default")

    assert store.hook_failed(call, "answered HTTP 503", retry_in=0.3, response_status=503)
    assert store.claim_hooks(A, "default") == []  # not due yet
    [again] = wait_until(lambda: store.claim_hooks(A, "default"), timeout=10, what="the retry to be due")
    assert store.hook_failed(again, "answered HTTP 503", retry_in=None, response_status=503)

    [shown] = store.hooks(status="failed")
    assert (shown["attempts"], shown["last_error"], shown["response_status"]) == (2, "answered HTTP 503", 503)
    assert shown["target"] == "http://127.0.0.1:9/hooks?token=***"  # redacted when shown
    assert store.claim_hooks(A, "default") == []


def test_retry_makes_failed_hooks_pending_and_due_with_fresh_attempts(store: Store) -> None:
    store.set_queue("default", hooks={"on_cancel": URL})
    store.add_partition("p", [(0, b"1")])
    store.cancel("p")
    [call] = store.claim_hooks(A, "default")
    store.hook_failed(call, "down", retry_in=None)

    assert store.retry_hooks([call.id]) == 1

    [again] = store.claim_hooks(A, "default")
    assert (again.id, again.attempt) == (call.id, 1)
    assert store.retry_hooks(failed=True) == 0  # pending now: left alone
    with pytest.raises(NotFound):
        store.retry_hooks([call.id + 1000])
    with pytest.raises(InvalidInput):
        store.retry_hooks()


def test_hooks_are_listed_newest_first_and_by_state_queue_and_key(store: Store) -> None:
    store.set_queue("default", hooks={"on_cancel": URL})
    store.set_queue("other", hooks={"on_cancel": URL})
    for key, queue in (("a", "default"), ("b", "other"), ("c", "default")):
        store.add_partition(key, [(0, b"1")], queue=queue)
        store.cancel(key)

    assert [h["key"] for h in store.hooks()] == ["c", "b", "a"]
    assert [h["key"] for h in store.hooks(queue="default")] == ["c", "a"]
    assert [h["key"] for h in store.hooks(key="b")] == ["b"]
    assert [h["key"] for h in store.hooks(limit=1, before=store.hooks()[0]["id"])] == ["b"]
    assert store.hooks(status="sent") == []
    assert store.hook(store.hooks()[0]["id"])["payload"]["key"] == "c"
    assert store.queue_gauges()["hooks"] == {("default", "pending"): 2, ("other", "pending"): 1}
    with pytest.raises(InvalidInput):
        store.hooks(status="lost")


def test_a_removed_partition_keeps_its_hook_to_deliver(store: Store) -> None:
    store.set_queue("default", hooks={"on_cancel": URL})
    store.add_partition("p", [(0, b"1")])
    store.cancel("p")

    store.remove("p")

    assert [c.key for c in store.claim_hooks(A, "default")] == ["p"]


def test_queue_hooks_are_merged_and_an_empty_value_removes_one(store: Store) -> None:
    store.set_queue("default", hooks={"on_complete": URL, "on_fail": "python"})
    store.set_queue("default", limit=3)  # other settings keep the hooks
    settings = store.set_queue("default", hooks={"on_fail": "", "on_cancel": URL})

    assert dict(settings.hooks) == {"on_complete": URL, "on_cancel": URL}
    assert store.queue("default")["hooks"] == {
        "on_complete": "http://127.0.0.1:9/hooks?token=***",
        "on_cancel": "http://127.0.0.1:9/hooks?token=***",
    }


@pytest.mark.parametrize(
    "hooks_, problem",
    [
        ({"on_done": URL}, "unknown hook 'on_done'"),
        ({"on_complete": "ftp://host/x"}, "must be an http:// or https:// URL"),
        ({"on_complete": "http://user:pw@host/x"}, "no credentials in a hook URL"),
        ({"on_complete": 3}, "must be a URL"),
    ],
)
def test_a_bad_hook_is_refused_and_changes_nothing(store: Store, hooks_: dict[str, Any], problem: str) -> None:
    store.set_queue("default", hooks={"on_complete": URL})
    with pytest.raises(InvalidInput, match=problem):
        store.set_queue("default", limit=5, hooks=hooks_)
    settings = store.queue_settings("default")
    assert (settings.limit, dict(settings.hooks)) == (0, {"on_complete": URL})


def test_a_pipelines_hooks_replace_the_queues_and_one_without_leaves_them(store: Store) -> None:
    store.set_queue("default", hooks={"on_fail": URL})
    gates = '[[gate]]\nname = "only"\nnumber = 0\nhandler = "http://127.0.0.1:9/"\n'

    store.apply_pipeline(parse_toml(f'{gates}[hooks]\non_complete = "python"\n'))
    assert dict(store.queue_settings("default").hooks) == {"on_complete": "python"}

    store.apply_pipeline(parse_toml(gates.replace("only", "single")))
    assert dict(store.queue_settings("default").hooks) == {"on_complete": "python"}


def test_cleanup_deletes_sent_hooks_and_keeps_failed_and_pending_ones(store: Store) -> None:
    store.set_queue("default", hooks={"on_cancel": URL})
    for key in ("sent", "failed", "pending"):
        store.add_partition(key, [(0, b"1")])
        store.cancel(key)
    sent, failed_, _ = store.claim_hooks(A, "default")
    store.hook_sent(sent)
    store.hook_failed(failed_, "down", retry_in=None)
    store.hook_failed(_, "down", retry_in=0)

    assert store.cleanup(3600, dry_run=True)["hooks"] == 0  # sent just now
    wait_until(lambda: store.cleanup(0, dry_run=True)["hooks"] == 1, timeout=10, what="the sent hook to be older")
    assert store.cleanup(0)["hooks"] == 1

    assert sorted(h["key"] for h in store.hooks()) == ["failed", "pending"]
