"""Pull workers' claims (every database): what may be claimed, in what order, by whom; what a token
may still do; what an expired claim costs. Through `Feed`, the API's and the worker's front door.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update

from feedproc import Feed
from feedproc.core.errors import InvalidInput, NotFound, Refused, StaleClaim
from feedproc.core.policy import RetryPolicy
from feedproc.store.foundations import seconds_from_now
from feedproc.store.schema import claims

from ..support import A, register

QUEUE = "gpu"


@pytest.fixture
def pull(feed: Feed) -> Feed:
    feed.set_queue(QUEUE, mode="pull")
    feed.policy = RetryPolicy(max_attempts=3, retry_delay=0.0)
    return feed


def add(feed: Feed, key: str, *items: tuple[int, bytes], priority: int = 0, **kwargs: object) -> None:
    feed.add_partition(key, list(items), queue=QUEUE, priority=priority, **kwargs)  # type: ignore[call-overload]


def run_out(feed: Feed) -> None:
    """Every active claim's time is up (its worker went silent)."""
    with feed.store.write() as conn:
        conn.execute(update(claims).where(claims.c.state == "active").values(expires_at=seconds_from_now(-1)))


def refusal(call: object) -> str:
    with pytest.raises(StaleClaim) as caught:
        call()  # type: ignore[operator]
    return caught.value.reason


# ---------------------------------------------------------------- what is claimed


def test_claims_come_in_priority_order_then_oldest_partition_then_due_order(pull: Feed) -> None:
    add(pull, "old", (0, b"1"), (0, b"2"))
    add(pull, "urgent", (0, b"3"), priority=9)
    add(pull, "new", (0, b"4"))
    claimed = pull.claim(QUEUE, "w", max_items=10)
    assert [(c["partition"], c["data"]) for c in claimed] == [
        ("urgent", b"3"),
        ("old", b"1"),
        ("old", b"2"),
        ("new", b"4"),
    ]
    assert all(c["attempt"] == 1 and c["token"] and c["lease_expires_at"] for c in claimed)


def test_only_the_current_gate_is_claimed_until_it_drains(pull: Feed) -> None:
    add(pull, "p", (0, b"a"), (0, b"b"), (1, b"c"))
    first = pull.claim(QUEUE, "w", max_items=10)
    assert sorted(c["data"] for c in first) == [b"a", b"b"]
    pull.answer(first[0]["id"], first[0]["token"], {"done": True})
    assert pull.claim(QUEUE, "w", max_items=10) == []  # gate 0 still has an item in flight: the barrier holds
    pull.answer(first[1]["id"], first[1]["token"], {"done": True})
    second = pull.claim(QUEUE, "w", max_items=10)
    assert [(c["data"], c["gate"]) for c in second] == [(b"c", 1)]


def test_a_claimed_item_is_not_claimed_again(pull: Feed) -> None:
    add(pull, "p", (0, b"a"), (0, b"b"))
    assert len(pull.claim(QUEUE, "w1", max_items=1)) == 1
    assert len(pull.claim(QUEUE, "w2", max_items=10)) == 1
    assert pull.claim(QUEUE, "w3", max_items=10) == []


def test_a_push_queue_refuses_claims(feed: Feed) -> None:
    feed.add_partition("p", [(0, b"a")])
    with pytest.raises(Refused, match="not in pull mode"):
        feed.claim("default", "w")


def test_watchers_leave_a_pull_queue_alone(pull: Feed) -> None:
    add(pull, "p", (0, b"a"))
    register(pull.store, A, queue=QUEUE)
    assert pull.store.acquire(A, QUEUE, 10, 30) == []
    pull.set_queue(QUEUE, mode="push")
    assert [lease.key for lease in pull.store.acquire(A, QUEUE, 10, 30)] == ["p"]


def test_a_partition_leased_by_a_watcher_is_not_claimed(pull: Feed) -> None:
    pull.set_queue(QUEUE, mode="push")
    add(pull, "p", (0, b"a"))
    register(pull.store, A, queue=QUEUE)
    assert pull.store.acquire(A, QUEUE, 10, 30)
    pull.set_queue(QUEUE, mode="pull")
    assert pull.claim(QUEUE, "w") == []


def test_the_queue_limit_counts_claims_by_weight(pull: Feed) -> None:
    pull.set_queue(QUEUE, limit=5)
    add(pull, "heavy", (0, b"a"), (0, b"b"), (0, b"c"), weight=2)
    assert len(pull.claim(QUEUE, "w", max_items=10)) == 2  # 2 + 2 of 5; a third would make 6
    assert pull.queue(QUEUE).slots_in_use == 4
    assert pull.claim(QUEUE, "w", max_items=10) == []


def test_a_partition_whose_window_is_closed_is_not_claimed(pull: Feed) -> None:
    later = datetime.now(UTC) + timedelta(hours=2)  # a window that opens in two hours
    window = f"{later:%H}:00-{(later + timedelta(hours=1)):%H}:00"
    add(pull, "closed", (0, b"a"), windows=window)
    add(pull, "open", (0, b"b"))
    assert [c["partition"] for c in pull.claim(QUEUE, "w", max_items=10)] == ["open"]


def test_a_queue_whose_window_is_closed_claims_nothing(pull: Feed) -> None:
    later = datetime.now(UTC) + timedelta(hours=2)
    pull.set_queue(QUEUE, windows=f"{later:%H}:00-{(later + timedelta(hours=1)):%H}:00")
    add(pull, "p", (0, b"a"))
    assert pull.claim(QUEUE, "w") == []


@pytest.mark.parametrize(
    ("worker", "max_items", "lease"), [("", 1, 60.0), ("w", 0, 60.0), ("w", 1001, 60.0), ("w", 1, 0.5)]
)
def test_malformed_claims_are_refused(pull: Feed, worker: str, max_items: int, lease: float) -> None:
    with pytest.raises(InvalidInput):
        pull.claim(QUEUE, worker, max_items=max_items, lease_seconds=lease)


# ---------------------------------------------------------------- answers


def test_an_answer_fans_out_and_the_children_are_claimed_once_the_gate_advances(pull: Feed) -> None:
    add(pull, "p", (0, b'{"upload": 1}'))
    (parent,) = pull.claim(QUEUE, "w")
    result = pull.answer(
        parent["id"], parent["token"], {"gate": 1, "items": [{"gate": 1, "data": {"n": i}} for i in range(3)]}
    )
    assert result["outcome"] == "move"
    children = pull.claim(QUEUE, "w", max_items=10)
    assert sorted(c["data"] for c in children) == [b'{"n":0}', b'{"n":1}', b'{"n":2}', b'{"upload": 1}']
    for c in children:
        pull.answer(c["id"], c["token"], {"done": True, "data": {"ok": c["id"]}})
    assert pull.status("p").status == "complete"


def test_a_reported_error_retries_and_no_retry_fails_the_item(pull: Feed) -> None:
    add(pull, "p", (0, b"a"), (0, b"b"))
    a, b = pull.claim(QUEUE, "w", max_items=2)
    assert pull.answer(a["id"], a["token"], {"error": "GPU out of memory"})["outcome"] == "retry"
    assert (
        pull.answer(b["id"], b["token"], {"error": {"message": "corrupt file", "no_retry": True}})["outcome"] == "fail"
    )
    item = pull.item(a["id"])
    assert item.attempts == 1 and "GPU out of memory" in (item.last_error or "")
    assert [h.outcome for h in item.history] == ["retry"]
    assert item.history[0].watcher == "w"
    again = pull.claim(QUEUE, "w")
    assert [(c["id"], c["attempt"]) for c in again] == [(a["id"], 2)]


def test_a_malformed_answer_is_refused_and_changes_nothing(pull: Feed) -> None:
    add(pull, "p", (0, b"a"))
    (c,) = pull.claim(QUEUE, "w")
    for bad in ({"gate": -1}, {"nothing": True}, {"done": True, "items": "x"}, {"data_base64": "%%%"}):
        with pytest.raises(InvalidInput):
            pull.answer(c["id"], c["token"], bad)
    assert pull.item(c["id"]).deliveries == 0
    assert pull.answer(c["id"], c["token"], {"done": True})["outcome"] == "done"


def test_data_that_is_not_json_travels_as_base64(pull: Feed) -> None:
    add(pull, "p", (0, b"a"))
    (c,) = pull.claim(QUEUE, "w")
    pull.answer(c["id"], c["token"], {"done": True, "data_base64": "AAEC/w=="})
    assert pull.item(c["id"]).data == b"\x00\x01\x02\xff"


# ---------------------------------------------------------------- stale tokens


def test_a_second_answer_with_the_same_token_is_refused(pull: Feed) -> None:
    add(pull, "p", (0, b"a"), (0, b"b"))
    c = pull.claim(QUEUE, "w")[0]
    pull.answer(c["id"], c["token"], {"done": True})
    assert refusal(lambda: pull.answer(c["id"], c["token"], {"done": True})) == "superseded"


def test_an_expired_claim_is_refused_even_before_anyone_claims_again(pull: Feed) -> None:
    add(pull, "p", (0, b"a"))
    (c,) = pull.claim(QUEUE, "w")
    run_out(pull)
    assert refusal(lambda: pull.answer(c["id"], c["token"], {"done": True})) == "expired"
    assert refusal(lambda: pull.heartbeat(c["id"], c["token"])) == "expired"
    assert pull.item(c["id"]).status == "available"


def test_a_cancelled_partition_refuses_its_workers(pull: Feed) -> None:
    add(pull, "p", (0, b"a"))
    (c,) = pull.claim(QUEUE, "w")
    pull.cancel("p")
    assert refusal(lambda: pull.heartbeat(c["id"], c["token"])) == "cancelled"
    assert refusal(lambda: pull.answer(c["id"], c["token"], {"done": True})) == "cancelled"


def test_an_unknown_token_is_not_found(pull: Feed) -> None:
    add(pull, "p", (0, b"a"))
    (c,) = pull.claim(QUEUE, "w")
    with pytest.raises(NotFound):
        pull.answer(c["id"], "not-a-token", {"done": True})
    with pytest.raises(NotFound):
        pull.answer(c["id"] + 1, c["token"], {"done": True})


# ---------------------------------------------------------------- heartbeats, expiry, release


def test_a_heartbeat_extends_the_claim_and_keeps_progress(pull: Feed) -> None:
    add(pull, "p", (0, b"a"))
    (c,) = pull.claim(QUEUE, "w", lease_seconds=5)
    later = pull.heartbeat(c["id"], c["token"], progress=0.4, lease_seconds=600)
    assert later > c["lease_expires_at"]
    assert pull.status("p").progress.gates["0"].mean_progress == pytest.approx(0.4)


def test_an_expired_claim_counts_an_attempt_and_goes_back_to_work(pull: Feed) -> None:
    add(pull, "p", (0, b"a"))
    (c,) = pull.claim(QUEUE, "silent")
    run_out(pull)
    (again,) = pull.claim(QUEUE, "w2")
    assert (again["id"], again["attempt"]) == (c["id"], 2)
    item = pull.item(c["id"])
    assert item.attempts == 1 and "claim by worker silent expired" in (item.last_error or "")
    assert [(h.outcome, h.watcher) for h in item.history] == [("retry", "silent")]


def test_claims_that_keep_expiring_fail_the_item_when_attempts_run_out(pull: Feed) -> None:
    add(pull, "p", (0, b"a"))
    for _ in range(3):  # max_attempts=3
        assert len(pull.claim(QUEUE, "silent")) == 1
        run_out(pull)
    assert pull.expire_claims(QUEUE) == 1
    assert pull.status("p").status == "failed"
    assert pull.claim(QUEUE, "w") == []


def test_a_released_item_is_ready_again_without_an_attempt(pull: Feed) -> None:
    add(pull, "p", (0, b"a"))
    (c,) = pull.claim(QUEUE, "w")
    pull.release(c["id"], c["token"])
    (again,) = pull.claim(QUEUE, "w2")
    assert (again["id"], again["attempt"]) == (c["id"], 1)
    assert refusal(lambda: pull.answer(c["id"], c["token"], {"done": True})) == "superseded"


# ---------------------------------------------------------------- concurrency


@pytest.mark.smoke  # the fast tier's database smoke
def test_concurrent_claimers_never_share_an_item(pull: Feed, db_url: str) -> None:
    for p in range(8):
        add(pull, f"p{p}", *[(0, str(i).encode()) for i in range(25)])
    seen: Counter[int] = Counter()
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        with Feed(db_url, policy=pull.policy) as mine:
            try:
                while claimed := mine.claim(QUEUE, f"w{n}", max_items=7):
                    with lock:
                        seen.update(c["id"] for c in claimed)
                    for c in claimed:
                        mine.answer(c["id"], c["token"], {"done": True})
            except BaseException as error:
                errors.append(error)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    assert len(seen) == 200 and set(seen.values()) == {1}
    assert pull.summary().items["complete"] == 200


def test_a_not_yet_answer_counts_a_delivery_not_an_attempt(pull: Feed) -> None:
    add(pull, "p", (0, b"a"))
    (c,) = pull.claim(QUEUE, "w")
    assert (c["attempt"], c["deliveries"]) == (1, 1)
    pull.answer(c["id"], c["token"], {"gate": 0, "retry_after": 0})
    (again,) = pull.claim(QUEUE, "w")
    assert (again["id"], again["attempt"], again["deliveries"]) == (c["id"], 1, 2)
