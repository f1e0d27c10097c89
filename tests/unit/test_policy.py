"""Pure tests of how an answer becomes an item's next state: backoff, failure classes, answer parsing.

No database and no network: `RetryPolicy`, `outcome_of`, `read_answer`, `response_from_json`,
`parse_retry_after` and `call_processor` are plain functions of their inputs.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import random
import time
from typing import Any

import pytest

from feedproc import Item, PermanentError, Processor, Response, RetryLater
from feedproc.core.errors import InvalidAnswer
from feedproc.core.models import NewItem
from feedproc.core.policy import RetryPolicy, outcome_of
from feedproc.core.records import Kind
from feedproc.processors import call_processor, parse_retry_after, read_answer, response_from_json

from ..support import ready


def body(value: object) -> bytes:
    return json.dumps(value).encode()


# ---------------------------------------------------------------- backoff


@pytest.mark.parametrize("retry", [1, 2, 3, 4, 5, 6])
def test_backoff_of_nth_retry_is_retry_delay_doubled_plus_at_most_25_percent_jitter(retry: int) -> None:
    policy = RetryPolicy(max_attempts=10, retry_delay=0.5, max_retry_delay=1000.0)
    rng = random.Random(1234 + retry)
    base = 0.5 * 2 ** (retry - 1)
    delays = [policy.backoff(retry, rng) for _ in range(500)]
    assert all(base <= d <= base * 1.25 for d in delays), (min(delays), max(delays), base)
    # The jitter is real: it spreads over most of its 0-25% range.
    assert max(delays) - min(delays) > 0.2 * base


def test_backoff_is_reproducible_with_a_seeded_random() -> None:
    policy = RetryPolicy(retry_delay=1.0)
    first = [policy.backoff(n, random.Random(42)) for n in range(1, 6)]
    second = [policy.backoff(n, random.Random(42)) for n in range(1, 6)]
    assert first == second


def test_backoff_with_zero_retry_delay_is_zero() -> None:
    assert RetryPolicy(retry_delay=0.0).backoff(3, random.Random(1)) == 0.0


def test_backoff_never_exceeds_max_retry_delay() -> None:
    policy = RetryPolicy(max_attempts=50, retry_delay=1.0, max_retry_delay=10.0)
    rng = random.Random(7)
    delays = [policy.backoff(retry, rng) for retry in range(5, 30) for _ in range(20)]
    # 2**(n-1) is far past the cap for every n here: the wait is the cap, never more.
    assert max(delays) <= 10.0, f"backoff went up to {max(delays):.3f}s with max_retry_delay=10"


@pytest.mark.parametrize("retry", [1024, 1025, 5000])
def test_backoff_of_a_very_late_retry_is_the_cap_not_an_overflow(retry: int) -> None:
    # --max-attempts has no upper bound; with max_retry_delay capping the wait, retry 1025 is legal.
    policy = RetryPolicy(max_attempts=10_000, retry_delay=1.0, max_retry_delay=600.0)
    delay = policy.backoff(retry, random.Random(3))
    assert 600.0 * 0.75 <= delay <= 600.0 * 1.25


def test_backoff_reaches_the_cap_when_doubling_passes_it() -> None:
    policy = RetryPolicy(max_attempts=50, retry_delay=1.0, max_retry_delay=10.0)
    rng = random.Random(8)
    assert min(policy.backoff(retry, rng) for retry in range(5, 30)) >= 10.0 * 0.75


# ---------------------------------------------------------------- outcomes of failures


def test_first_transient_failure_is_retried_after_retry_delay() -> None:
    policy = RetryPolicy(max_attempts=5, retry_delay=2.0)
    outcome = outcome_of(ready(), policy, error=ValueError("boom"))
    assert outcome.kind == Kind.RETRY
    assert outcome.attempts == 1
    assert 2.0 <= outcome.delay <= 2.5
    assert outcome.error == "ValueError: boom"


def test_third_transient_failure_waits_four_retry_delays() -> None:
    policy = RetryPolicy(max_attempts=5, retry_delay=2.0)
    outcome = outcome_of(ready(attempts=2), policy, error=RuntimeError("again"))
    assert outcome.kind == Kind.RETRY
    assert outcome.attempts == 3
    assert 8.0 <= outcome.delay <= 10.0


def test_outcome_carries_the_fencing_facts_of_the_dispatch() -> None:
    outcome = outcome_of(ready(gate=4), RetryPolicy(), response=Response(done=True))
    assert (outcome.item_id, outcome.version, outcome.partition_id, outcome.epoch, outcome.gate) == (7, 3, 11, 5, 4)


def test_retry_later_after_longer_than_backoff_wins() -> None:
    policy = RetryPolicy(max_attempts=5, retry_delay=1.0)
    outcome = outcome_of(ready(), policy, error=RetryLater("busy", after=30.0))
    assert outcome.kind == Kind.RETRY
    assert outcome.delay == 30.0
    assert outcome.error == "busy"


def test_retry_later_after_shorter_than_backoff_keeps_the_backoff() -> None:
    policy = RetryPolicy(max_attempts=5, retry_delay=4.0)
    outcome = outcome_of(ready(), policy, error=RetryLater("busy", after=0.5))
    assert 4.0 <= outcome.delay <= 5.0


def test_permanent_error_fails_at_once() -> None:
    policy = RetryPolicy(max_attempts=5)
    outcome = outcome_of(ready(), policy, error=PermanentError("bad input"))
    assert outcome.kind == Kind.FAIL
    assert outcome.attempts == 1
    assert outcome.error == "bad input"


def test_running_out_of_attempts_fails_with_the_last_error() -> None:
    policy = RetryPolicy(max_attempts=5)
    outcome = outcome_of(ready(attempts=4), policy, error=RetryLater("HTTP 503: down"))
    assert outcome.kind == Kind.FAIL
    assert outcome.attempts == 5
    assert outcome.error == "HTTP 503: down"


def test_max_attempts_one_fails_on_the_first_transient_error() -> None:
    outcome = outcome_of(ready(), RetryPolicy(max_attempts=1), error=TimeoutError())
    assert outcome.kind == Kind.FAIL
    assert outcome.attempts == 1
    assert outcome.error == "TimeoutError"


# ---------------------------------------------------------------- outcomes of answers


def test_done_answer_completes_with_data_and_children() -> None:
    response = Response(done=True, data=b'{"r":1}', items=[(3, b'{"c":1}')])
    outcome = outcome_of(ready(gate=2), RetryPolicy(), response=response)
    assert outcome.kind == Kind.DONE
    assert outcome.data == b'{"r":1}'
    assert outcome.children == (NewItem(3, b'{"c":1}'),)


def test_higher_gate_answer_moves_the_item() -> None:
    outcome = outcome_of(ready(gate=2), RetryPolicy(), response=Response(gate=5, data=b"[]"))
    assert outcome.kind == Kind.MOVE
    assert outcome.new_gate == 5
    assert outcome.data == b"[]"


def test_not_yet_answer_is_not_a_failure_and_keeps_attempts() -> None:
    policy = RetryPolicy(max_attempts=3, retry_delay=100.0, not_yet_delay=0.25)
    outcome = outcome_of(ready(gate=2, attempts=2), policy, response=Response(gate=2, retry_after=7.5))
    assert outcome.kind == Kind.LATER
    assert outcome.attempts == 2
    assert outcome.delay == 7.5
    assert outcome.error is None


def test_not_yet_answer_without_retry_after_waits_the_poll_interval() -> None:
    policy = RetryPolicy(retry_delay=100.0, not_yet_delay=0.25)
    outcome = outcome_of(ready(gate=1), policy, response=Response(gate=1))
    assert outcome.kind == Kind.LATER
    assert outcome.delay == 0.25


def test_gate_lower_than_the_items_is_an_invalid_transient_answer() -> None:
    policy = RetryPolicy(max_attempts=5, retry_delay=1.0)
    outcome = outcome_of(ready(gate=2), policy, response=Response(gate=1))
    assert outcome.kind == Kind.RETRY
    assert outcome.attempts == 1
    assert outcome.error == "invalid answer: gate 1 is lower than the item's gate 2"


def test_not_yet_answer_with_children_is_an_invalid_transient_answer() -> None:
    outcome = outcome_of(ready(gate=2), RetryPolicy(), response=Response(gate=2, items=[(2, b"{}")]))
    assert outcome.kind == Kind.RETRY
    assert outcome.error is not None and outcome.error.startswith("invalid answer:")
    assert outcome.children == ()


def test_child_below_the_partition_gate_is_an_invalid_transient_answer() -> None:
    outcome = outcome_of(ready(gate=2), RetryPolicy(), response=Response(done=True, items=[(3, b"{}"), (1, b"{}")]))
    assert outcome.kind == Kind.RETRY
    assert outcome.attempts == 1
    assert outcome.error is not None and outcome.error.startswith("invalid answer:")
    assert "gate 1" in outcome.error
    assert outcome.children == ()


def test_invalid_answer_on_the_last_attempt_fails_the_item() -> None:
    outcome = outcome_of(ready(gate=2, attempts=2), RetryPolicy(max_attempts=3), response=Response(gate=0))
    assert outcome.kind == Kind.FAIL
    assert outcome.attempts == 3
    assert outcome.error == "invalid answer: gate 0 is lower than the item's gate 2"


def test_processor_returning_something_else_than_a_response_is_an_invalid_answer() -> None:
    class Sloppy(Processor):
        def process(self, item: Item) -> Any:
            return {"done": True}

    item = Item(id=1, partition="p", queue="default", gate=0, attempt=1, data=b"{}")
    with pytest.raises(InvalidAnswer, match=r"invalid answer: .*dict"):
        asyncio.run(call_processor(Sloppy(), item))


def test_async_and_plain_processors_are_both_called() -> None:
    item = Item(id=1, partition="p", queue="default", gate=3, attempt=1, data=b'{"x": 1}')

    class Plain(Processor):
        def process(self, item: Item) -> Response:
            return Response(gate=item.gate + item.json()["x"])

    class Async(Processor):
        async def process(self, item: Item) -> Response:
            return Response(gate=item.gate + 2)

    assert asyncio.run(call_processor(Plain(), item)).gate == 4
    assert asyncio.run(call_processor(Async(), item)).gate == 5


# ---------------------------------------------------------------- reading HTTP answers: 2xx forms


def test_done_true_is_done() -> None:
    response = read_answer(200, body({"done": True}), None)
    assert response.done is True
    assert response.data is None
    assert tuple(response.items) == ()


def test_any_2xx_status_is_an_answer() -> None:
    assert read_answer(201, body({"done": True}), None).done is True
    assert read_answer(299, body({"gate": 3}), None).gate == 3


def test_gate_with_data_moves_and_replaces_data() -> None:
    response = read_answer(200, body({"gate": 3, "data": {"k": [1, 2]}}), None)
    assert response.done is False
    assert response.gate == 3
    assert json.loads(response.data) == {"k": [1, 2]}


def test_data_null_is_stored_as_json_null() -> None:
    assert read_answer(200, body({"gate": 1, "data": None}), None).data == b"null"


def test_not_yet_with_retry_after_field() -> None:
    response = read_answer(200, body({"gate": 2, "retry_after": 4.5, "data": "x"}), None)
    assert response.gate == 2
    assert response.retry_after == 4.5
    assert response.data == b'"x"'


def test_children_are_read_with_their_gate_and_data() -> None:
    answer = {"done": True, "items": [{"gate": 1, "data": {"n": 1}}, {"gate": 4, "data": [1]}]}
    response = read_answer(200, body(answer), None)
    assert response.done is True
    assert [(c.gate, json.loads(c.data)) for c in response.items] == [(1, {"n": 1}), (4, [1])]  # type: ignore[union-attr]


def test_go_feed_complete_means_done() -> None:
    assert read_answer(200, body({"complete": True}), None).done is True


def test_go_feed_response_means_data() -> None:
    response = read_answer(200, body({"complete": True, "response": {"out": 1}}), None)
    assert response.done is True
    assert json.loads(response.data) == {"out": 1}


def test_go_feed_response_with_a_gate() -> None:
    response = read_answer(200, body({"gate": 2, "response": [1, 2]}), None)
    assert response.gate == 2
    assert json.loads(response.data) == [1, 2]


# ---------------------------------------------------------------- reading HTTP answers: error objects


def test_go_feed_error_with_no_retry_is_permanent() -> None:
    with pytest.raises(PermanentError, match=r"^cannot parse$"):
        read_answer(200, body({"error": {"message": "cannot parse", "no_retry": True}}), None)


def test_go_feed_error_without_no_retry_is_transient() -> None:
    with pytest.raises(RetryLater, match=r"^try later$"):
        read_answer(200, body({"error": {"message": "try later", "no_retry": False}}), None)
    with pytest.raises(RetryLater, match=r"^try later$"):
        read_answer(200, body({"error": {"message": "try later"}}), None)


def test_go_feed_error_outweighs_done() -> None:
    with pytest.raises(RetryLater, match="half done"):
        read_answer(200, body({"done": True, "error": {"message": "half done", "no_retry": False}}), None)


def test_go_feed_error_outweighs_complete() -> None:
    with pytest.raises(PermanentError, match="nope"):
        read_answer(200, body({"complete": True, "error": {"message": "nope", "no_retry": True}}), None)


def test_permanent_4xx_stays_permanent_with_no_retry_false() -> None:
    with pytest.raises(PermanentError, match="HTTP 422"):
        read_answer(422, body({"error": {"message": "bad", "no_retry": False}}), None)


def test_no_retry_true_makes_a_5xx_permanent() -> None:
    with pytest.raises(PermanentError, match="HTTP 503"):
        read_answer(503, body({"error": {"message": "gone for good", "no_retry": True}}), None)


def test_transient_error_object_honours_retry_after_header() -> None:
    with pytest.raises(RetryLater) as raised:
        read_answer(200, body({"error": {"message": "busy"}}), "12")
    assert raised.value.after == 12.0


# ---------------------------------------------------------------- reading HTTP answers: status classes


@pytest.mark.parametrize("status", [400, 401, 403, 404, 405, 409, 410, 413, 422, 451, 499])
def test_4xx_other_than_408_and_429_is_permanent(status: int) -> None:
    with pytest.raises(PermanentError, match=f"^HTTP {status}"):
        read_answer(status, b"no", None)


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504, 599])
def test_408_429_and_5xx_are_transient(status: int) -> None:
    with pytest.raises(RetryLater, match=f"^HTTP {status}"):
        read_answer(status, body({"done": True}), None)


@pytest.mark.parametrize("status", [301, 304])
def test_non_2xx_non_error_status_is_not_an_answer(status: int) -> None:
    with pytest.raises(Exception) as raised:
        read_answer(status, body({"done": True}), None)
    assert f"HTTP {status}" in str(raised.value)


def test_non_2xx_message_names_the_status_and_keeps_the_start_of_the_body() -> None:
    text = "upstream database exploded; " + "x" * 5000
    with pytest.raises(RetryLater) as raised:
        read_answer(500, text.encode(), None)
    message = str(raised.value)
    assert message.startswith("HTTP 500")
    assert "upstream database exploded" in message
    assert len(message) < 2100


def test_non_2xx_message_with_empty_body_names_the_status() -> None:
    with pytest.raises(RetryLater, match=r"^HTTP 502$"):
        read_answer(502, b"", None)


def test_non_2xx_body_that_is_not_utf8_is_kept_readable() -> None:
    with pytest.raises(PermanentError) as raised:
        read_answer(400, b"\xff\xfe bad bytes", None)
    assert "bad bytes" in str(raised.value)


# ---------------------------------------------------------------- Retry-After


def test_429_retry_after_seconds_is_read() -> None:
    with pytest.raises(RetryLater) as raised:
        read_answer(429, b"slow down", "7")
    assert raised.value.after == 7.0


def test_503_retry_after_http_date_is_read() -> None:
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    with pytest.raises(RetryLater) as raised:
        read_answer(503, b"", when)
    assert raised.value.after is not None
    assert 28.0 <= raised.value.after <= 30.5


def test_retry_after_parses_seconds_and_dates() -> None:
    assert parse_retry_after("120") == 120.0
    assert parse_retry_after(" 3 ") == 3.0
    assert parse_retry_after("1.5") == 1.5
    future = email.utils.formatdate(time.time() + 60, usegmt=True)
    assert 58.0 <= parse_retry_after(future) <= 60.5  # type: ignore[operator]


def test_retry_after_in_the_past_is_zero() -> None:
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0
    assert parse_retry_after("-5") == 0.0


def test_retry_after_missing_or_garbage_is_none() -> None:
    assert parse_retry_after(None) is None
    assert parse_retry_after("") is None
    assert parse_retry_after("soon") is None


def test_retry_after_header_on_a_2xx_not_yet_is_used() -> None:
    assert read_answer(200, body({"gate": 0}), "9").retry_after == 9.0


def test_retry_after_field_and_header_the_longer_wins() -> None:
    assert read_answer(200, body({"gate": 0, "retry_after": 3}), "9").retry_after == 9.0
    assert read_answer(200, body({"gate": 0, "retry_after": 30}), "9").retry_after == 30.0


# ---------------------------------------------------------------- invalid answers


@pytest.mark.parametrize(
    "content",
    [b"[]", b'[{"done": true}]', b"null", b"42", b'"done"', b"true", b"OK", b"", b"{not json", b"\xff\xfe"],
    ids=["list", "list-of-answer", "null", "number", "string", "bool", "text", "empty", "broken-json", "binary"],
)
def test_2xx_that_is_not_a_json_object_is_invalid(content: bytes) -> None:
    with pytest.raises(InvalidAnswer) as raised:
        read_answer(200, content, None)
    assert str(raised.value).startswith("invalid answer:")


def test_empty_object_is_invalid() -> None:
    with pytest.raises(InvalidAnswer, match="invalid answer"):
        read_answer(200, b"{}", None)
    with pytest.raises(InvalidAnswer):
        response_from_json({})


@pytest.mark.parametrize(
    "answer",
    [
        {"done": False},
        {"complete": False},
        {"data": {"x": 1}},
        {"items": [{"gate": 1, "data": 1}]},
        {"gate": "2"},
        {"gate": 1.5},
        {"gate": True},
        {"gate": None},
        {"done": True, "items": {"gate": 1}},
        {"done": True, "items": [1]},
        {"done": True, "items": [{"gate": "1", "data": 1}]},
        {"gate": 1, "retry_after": -1},
        {"gate": 1, "retry_after": "5"},
    ],
    ids=[
        "done-false",
        "complete-false",
        "data-only",
        "items-only",
        "gate-string",
        "gate-float",
        "gate-bool",
        "gate-null",
        "items-not-list",
        "child-not-object",
        "child-gate-string",
        "retry-after-negative",
        "retry-after-string",
    ],
)
def test_malformed_answer_objects_are_invalid(answer: dict[str, object]) -> None:
    with pytest.raises(InvalidAnswer):
        read_answer(200, body(answer), None)
