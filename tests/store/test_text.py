"""Text is text on every database (issue 30, finding 1): text from outside holding what a database
refuses in text (NUL, which PostgreSQL refuses; a lone surrogate, which no driver can send) is
stored escaped (`\\u0000`) and never fails its write, nor anything sharing its transaction; and what
the database does refuse is told in a summary, never with the statement or its parameters."""

from __future__ import annotations

import traceback

import pytest
from sqlalchemy import insert

from feedproc import Feed
from feedproc.core.errors import DatabaseRefused, NotFound
from feedproc.core.policy import RetryPolicy
from feedproc.store.foundations import db_now
from feedproc.store.schema import claims

QUEUE = "gpu"


@pytest.fixture
def pull(feed: Feed) -> Feed:
    feed.set_queue(QUEUE, mode="pull")
    feed.policy = RetryPolicy(max_attempts=3, retry_delay=0.0)
    return feed


def claimed(feed: Feed, worker: str, count: int) -> list[dict[str, object]]:
    feed.add_partition("p", [(0, b"{}")] * count, queue=QUEUE)
    return feed.claim(QUEUE, worker, max_items=count)


def test_errors_holding_nul_or_a_lone_surrogate_are_stored_escaped_and_their_batch_is_written(pull: Feed) -> None:
    nul, surrogate, done = claimed(pull, "w", 3)
    results = pull.answer_many(
        [
            (nul["id"], nul["token"], {"error": "x\x00y"}),  # type: ignore[list-item]
            (surrogate["id"], surrogate["token"], {"error": "a\ud800b"}),  # type: ignore[list-item]
            (done["id"], done["token"], {"done": True}),  # type: ignore[list-item]
        ]
    )
    assert [r["outcome"] for r in results] == ["retry", "retry", "done"]  # type: ignore[index]
    assert pull.item(nul["id"]).last_error == "x\\u0000y"  # type: ignore[arg-type]
    assert pull.item(surrogate["id"]).last_error == "a\\ud800b"  # type: ignore[arg-type]
    assert [h.error for h in pull.item(nul["id"]).history] == ["x\\u0000y"]  # type: ignore[arg-type]
    assert pull.status("p").items["complete"] == 1


def test_a_worker_named_with_nul_is_named_escaped_in_its_claims_and_deliveries(pull: Feed) -> None:
    (item,) = claimed(pull, "gpu\x00box", 1)
    assert [r.by for r in pull.running()] == ["gpu\\u0000box"]
    pull.answer(item["id"], item["token"], {"done": True})  # type: ignore[arg-type]
    assert [h.watcher for h in pull.item(item["id"]).history] == ["gpu\\u0000box"]  # type: ignore[arg-type]


def test_a_worker_name_longer_once_escaped_is_cut_to_its_column_never_inside_an_escape(pull: Feed) -> None:
    name = "a" + "\x00" * 119  # 120 characters, as long as a worker's name may be; 715 once escaped
    claimed(pull, name, 1)
    (running,) = pull.running()
    assert running.by == "a" + "\\u0000" * 19  # 115 characters: a 20th escape would pass 120


def test_a_token_holding_nul_is_refused_as_any_unknown_token(pull: Feed) -> None:
    (item,) = claimed(pull, "w", 1)
    (result,) = pull.answer_many([(item["id"], "tok\x00en", {"done": True})])  # type: ignore[list-item]
    assert isinstance(result, NotFound)
    with pytest.raises(NotFound):
        pull.heartbeat(item["id"], "tok\x00en")  # type: ignore[arg-type]


def test_who_acted_on_items_is_recorded_escaped(feed: Feed) -> None:
    feed.add_partition("p", [(0, b"{}")])
    (item,) = feed.items("p")
    feed.act_on_items("skip", ids=[item.id], by="ops\x00desk")
    assert [h.watcher for h in feed.item(item.id).history] == ["ops\\u0000desk"]


def test_a_statement_the_database_refuses_is_told_without_its_sql_or_parameters(feed: Feed) -> None:
    feed.add_partition("p", [(0, b"{}")])
    secret = "tok-s3cret-never-shown"
    row = {"token": secret, "item_id": 1, "partition_id": 1, "queue": QUEUE, "worker": None, "gate": 0}
    row |= {"version": 1, "weight": 1, "lease_seconds": 1.0, "state": "active"}
    with pytest.raises(DatabaseRefused) as refused, feed.store.write() as conn:
        conn.execute(insert(claims).values(claimed_at=db_now(), expires_at=db_now()), row)
    told = "".join(traceback.format_exception(refused.value))  # what a log line with its traceback shows
    assert "worker" in str(refused.value)  # the database's own summary: the column it would not take empty
    assert secret not in told and "INSERT" not in told and "[SQL" not in told
