"""Answers are validated where they are made: `Response`, children, and answers read from HTTP.

No database and no network: a Python processor's bad Response fails in its own call, an HTTP
answer's hostile values are InvalidAnswer, and the retry policy never returns an unschedulable delay.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import math
import random
import zlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from multidict import CIMultiDict

from feedproc import Item, Processor, Response
from feedproc.core.errors import InvalidAnswer, InvalidInput, PermanentError, RetryLater, TooManyChildren
from feedproc.core.models import MAX_CHILDREN, MAX_GATE, NewItem, check_gate
from feedproc.core.policy import MAX_DELAY, RetryPolicy, outcome_of, validate
from feedproc.core.records import Kind
from feedproc.core.redaction import redact_text, redact_url, url_secrets
from feedproc.processors import (
    AnswerTooLarge,
    UndecodableAnswer,
    call_batch,
    call_processor,
    parse_retry_after,
    read_answer,
    read_batch_answer,
    read_body,
    request_body,
)

from ..support import ready


def item(gate: int = 0) -> Item:
    return Item(id=1, partition="p", queue="default", gate=gate, attempt=1, data=b"{}")


# ---------------------------------------------------------------- Response: data


@pytest.mark.parametrize(
    ("data", "stored"),
    [
        (b'{"a":1}', b'{"a":1}'),
        (bytearray(b"raw"), b"raw"),
        (memoryview(b"view"), b"view"),
        ("text é", "text é".encode()),
        ({"label": "invoice"}, b'{"label":"invoice"}'),
        ([1, "é", None, True], '[1,"é",null,true]'.encode()),
        (42, b"42"),
        (1.5, b"1.5"),
        (False, b"false"),
    ],
    ids=["bytes", "bytearray", "memoryview", "str", "dict", "list", "int", "float", "bool"],
)
def test_response_data_is_bytes_str_or_any_json_value(data: Any, stored: bytes) -> None:
    response = Response(done=True, data=data)
    assert response.data == stored
    assert type(response.data) is bytes


def test_response_without_data_keeps_the_items_data() -> None:
    assert Response(done=True).data is None


@pytest.mark.parametrize(
    ("data", "error", "message"),
    [
        ({1, 2}, TypeError, r"^Response data is not JSON-serialisable: Object of type set"),
        ({"at": object()}, TypeError, r"^Response data is not JSON-serialisable: Object of type object"),
        ({"x": float("nan")}, ValueError, r"^Response data is not standard JSON: Out of range float"),
        ([float("inf")], ValueError, r"^Response data is not standard JSON"),
        (-math.inf, ValueError, r"^Response data is not standard JSON"),
        ("\ud800", ValueError, r"^Response data is not valid text"),
    ],
    ids=["set", "object", "nan", "inf", "minus-inf", "lone-surrogate"],
)
def test_response_data_that_is_not_standard_json_raises_naming_the_field(data: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        Response(done=True, data=data)


def test_response_data_with_a_cycle_raises_value_error() -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(ValueError, match="Response data is not standard JSON"):
        Response(done=True, data=cycle)


# ---------------------------------------------------------------- Response: children


def test_children_take_tuples_dicts_and_new_items_with_one_data_rule() -> None:
    response = Response(
        done=True,
        items=[
            (1, {"file": "a.pdf"}),
            {"gate": 2, "data": {"file": "b.pdf"}},
            NewItem(3, b"raw"),
            (4, "text"),
            {"gate": 5},
            (6, None),
        ],
    )
    assert response.items == (
        NewItem(1, b'{"file":"a.pdf"}'),
        NewItem(2, b'{"file":"b.pdf"}'),
        NewItem(3, b"raw"),
        NewItem(4, b"text"),
        NewItem(5, b"null"),
        NewItem(6, b"null"),
    )


def test_children_from_a_generator_are_kept() -> None:
    response = Response(done=True, items=((n, {"n": n}) for n in range(3)))
    assert [c.gate for c in response.items] == [0, 1, 2]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("items", "error", "message"),
    [
        ([(1, {1})], TypeError, r"^Response child 1: data is not JSON-serialisable"),
        ([(1, b"ok"), {"gate": 1, "data": float("nan")}], ValueError, r"^Response child 2: data is not standard JSON"),
        ([(1, b"a", "extra")], TypeError, r"^Response child 1: an item is \(gate, data\)"),
        ([[1, b"a"]], TypeError, r"^Response child 1: an item is \(gate, data\)"),
        ([5], TypeError, r"^Response child 1: an item is"),
        ([("1", b"a")], ValueError, r"^Response child 1: gate '1' is a name, and names need a pipeline"),
        ([(True, b"a")], TypeError, r"^Response child 1: gate must be an integer"),
        ([(-1, b"a")], ValueError, r"^Response child 1: gate must be an integer >= 0"),
        (
            [(2**63, b"a")],
            ValueError,
            r"^Response child 1: gate 9223372036854775808 is out of range \(0\.\.2147483647\)",
        ),
        ([{"gate": 1, "dat": 1}], TypeError, r"^Response child 1: unknown item field\(s\) dat"),
        ((1, b"not a list of children"), TypeError, r"^Response child 1: an item is"),
        ({"gate": 1, "data": 1}, TypeError, r"^Response items must be a list"),
    ],
    ids=[
        "set-data",
        "nan-data",
        "triple",
        "list-not-tuple",
        "int",
        "gate-name-without-pipeline",
        "gate-bool",
        "gate-negative",
        "gate-2**63",
        "unknown-field",
        "one-tuple-not-a-list",
        "dict-not-a-list",
    ],
)
def test_bad_children_raise_in_the_constructor(items: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        Response(done=True, items=items)


# ---------------------------------------------------------------- Response: gate, retry_after


def test_gate_of_max_gate_is_accepted_and_one_more_is_out_of_range() -> None:
    assert MAX_GATE == 2**31 - 1
    assert Response(gate=MAX_GATE).gate == MAX_GATE
    with pytest.raises(ValueError, match=r"^Response gate 2147483648 is out of range \(0\.\.2147483647\)$"):
        Response(gate=MAX_GATE + 1)


@pytest.mark.parametrize(
    "gate", [2**63, 2**64, 10**5000, -1, True, 1.0, "2"], ids=["2**63", "2**64", "10**5000", "-1", "True", "1.0", "str"]
)
def test_response_gate_out_of_range_or_not_an_int_is_a_value_error(gate: Any) -> None:
    with pytest.raises(ValueError, match=r"^Response gate"):
        Response(gate=gate)


def test_a_very_long_gate_is_shown_short() -> None:
    with pytest.raises(ValueError) as raised:
        Response(gate=10**5000)
    assert len(str(raised.value)) < 120
    assert "an integer of 16610 bits" in str(raised.value)


@pytest.mark.parametrize("seconds", [0, 0.5, 30, 1e308])
def test_retry_after_is_any_finite_number_of_seconds(seconds: float) -> None:
    assert Response(gate=1, retry_after=seconds).retry_after == float(seconds)


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), -float("inf"), -1, "5", True, 10**400])
def test_retry_after_that_is_not_a_finite_number_above_zero_raises(seconds: Any) -> None:
    with pytest.raises(ValueError, match=r"^Response retry_after must be a finite number of seconds >= 0"):
        Response(gate=1, retry_after=seconds)


def test_progress_nan_raises() -> None:
    with pytest.raises(ValueError, match="progress"):
        Response(gate=1, progress=float("nan"))


# ---------------------------------------------------------------- a bad Response fails in the processor's own call


class Returns(Processor):
    def __init__(self, make: Any) -> None:
        self.make = make

    def process(self, item: Item) -> Response:
        return self.make()


class ReturnsAsync(Returns):
    async def process(self, item: Item) -> Response:  # type: ignore[override]
        return self.make()


@pytest.mark.parametrize("kind", [Returns, ReturnsAsync], ids=["plain", "async"])
@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: Response(done=True, data={1, 2}), "TypeError: Response data is not JSON-serialisable"),
        (lambda: Response(gate=2**63), "ValueError: Response gate 9223372036854775808 is out of range"),
        (lambda: Response(done=True, items=[(2**63, b"")]), "ValueError: Response child 1: gate 9223372036854775808"),
        (lambda: Response(gate=0, retry_after=float("nan")), "ValueError: Response retry_after must be a finite"),
    ],
    ids=["data-set", "gate-2**63", "child-gate-2**63", "retry-after-nan"],
)
def test_a_bad_response_raises_in_the_processor_call_and_is_a_transient_failure(
    kind: type[Returns], make: Any, error: str
) -> None:
    with pytest.raises((TypeError, ValueError)) as raised:
        asyncio.run(call_processor(kind(make), item()))
    outcome = outcome_of(ready(), RetryPolicy(max_attempts=5), error=raised.value)
    assert outcome.kind == Kind.RETRY
    assert outcome.attempts == 1
    assert outcome.error is not None and outcome.error.startswith(error), outcome.error


def test_a_response_with_a_dict_as_data_completes() -> None:
    response = asyncio.run(call_processor(Returns(lambda: Response(done=True, data={"label": "invoice"})), item()))
    outcome = outcome_of(ready(), RetryPolicy(), response=response)
    assert outcome.kind == Kind.DONE
    assert outcome.data == b'{"label":"invoice"}'


# ---------------------------------------------------------------- validate(): the second line of defence


def test_validate_rejects_a_response_changed_after_it_was_made() -> None:
    response = Response(gate=3)
    response.gate = 2**63
    with pytest.raises(InvalidAnswer, match=r"gate 9223372036854775808 is out of range"):
        validate(ready(), response)

    response = Response(gate=3)
    response.data = {"x": 1}
    with pytest.raises(InvalidAnswer, match="data must be bytes"):
        validate(ready(), response)

    response = Response(gate=3, items=[(3, b"")])
    response.items = [(3, b"")]
    with pytest.raises(InvalidAnswer, match="child 1 is not a NewItem"):
        validate(ready(), response)

    response = Response(gate=3, items=[(3, b"")])
    response.items = (NewItem(2**40, b""),)
    with pytest.raises(InvalidAnswer, match=r"child 1: gate 1099511627776 is out of range"):
        validate(ready(), response)


# ---------------------------------------------------------------- producers: the same rules, as InvalidInput


def test_producers_items_follow_the_same_data_rule_and_gate_range() -> None:
    assert NewItem.coerce((1, {"file": "a"})) == NewItem(1, b'{"file":"a"}')
    assert NewItem.coerce({"gate": 2, "data": "x"}) == NewItem(2, b"x")
    with pytest.raises(InvalidInput, match=r"^item 3: gate 2147483648 is out of range"):
        NewItem.coerce((2**31, b""), where="item 3: ")
    with pytest.raises(InvalidInput, match=r"^item 1: data is not standard JSON"):
        NewItem.coerce((0, [float("nan")]), where="item 1: ")
    with pytest.raises(InvalidInput, match="gate 18446744073709551616 is out of range"):
        check_gate(2**64)


# ---------------------------------------------------------------- HTTP answers: hostile values


def raw(text: str) -> bytes:
    return text.encode()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"gate": 18446744073709551616}', "invalid answer: gate 18446744073709551616 is out of range (0..2147483647)"),
        ('{"gate": 2147483648}', "invalid answer: gate 2147483648 is out of range (0..2147483647)"),
        (
            '{"done": true, "items": [{"gate": 9223372036854775808, "data": 1}]}',
            "invalid answer: child 1: gate 9223372036854775808 is out of range (0..2147483647)",
        ),
        ('{"gate": 0, "retry_after": NaN}', "invalid answer: non-standard JSON: NaN is not allowed"),
        ('{"gate": 0, "retry_after": Infinity}', "invalid answer: non-standard JSON: Infinity is not allowed"),
        ('{"gate": 0, "retry_after": -Infinity}', "invalid answer: non-standard JSON: -Infinity is not allowed"),
        ('{"gate": 0, "retry_after": 1e400}', "invalid answer: non-standard JSON: the number 1e400 is out of range"),
        ('{"done": true, "data": {"score": NaN}}', "invalid answer: non-standard JSON: NaN is not allowed"),
        ('{"done": true, "items": [{"gate": 1, "data": [Infinity]}]}', "invalid answer: non-standard JSON: Infinity"),
        ('{"done": true, "progress": NaN}', "invalid answer: non-standard JSON: NaN is not allowed"),
        ('{"done": true, "data": "\\ud800"}', "invalid answer: data is not standard JSON"),
        ("[" * 100_000 + "]" * 100_000, "invalid answer: expected a JSON object"),
    ],
    ids=[
        "gate-2**64",
        "gate-2**31",
        "child-gate-2**63",
        "retry-after-nan",
        "retry-after-infinity",
        "retry-after-minus-infinity",
        "retry-after-1e400",
        "nan-in-data",
        "infinity-in-child-data",
        "progress-nan",
        "lone-surrogate",
        "nested-too-deep",
    ],
)
def test_hostile_2xx_answers_are_invalid(content: str, message: str) -> None:
    with pytest.raises(InvalidAnswer) as raised:
        read_answer(200, raw(content), None)
    assert str(raised.value).startswith(message), str(raised.value)


def test_retry_after_1e308_is_read_as_it_is_and_left_to_the_policy() -> None:
    assert read_answer(200, raw('{"gate": 0, "retry_after": 1e308}'), None).retry_after == 1e308


def test_a_non_2xx_with_non_standard_json_is_judged_by_its_status() -> None:
    with pytest.raises(RetryLater, match=r"^HTTP 503 from http://h/x: \{\"error\": NaN\}$"):
        read_answer(503, raw('{"error": NaN}'), None, url="http://h/x")


def test_a_non_2xx_names_status_url_and_the_first_500_bytes_of_the_body() -> None:
    with pytest.raises(RetryLater) as raised:
        read_answer(500, b"x" * 600 + b"TAIL", None, url="http://***@h:1/x")
    assert str(raised.value) == "HTTP 500 from http://***@h:1/x: " + "x" * 500


def test_an_answer_with_more_children_than_the_limit_is_a_permanent_failure_naming_both() -> None:
    answer = json.dumps({"done": True, "items": [{"gate": 1}] * 4}).encode()
    with pytest.raises(TooManyChildren) as raised:
        read_answer(200, answer, None, max_children=3)
    assert isinstance(raised.value, PermanentError)
    assert str(raised.value) == "answer has 4 children; the limit is 3 (--max-children)"
    assert len(read_answer(200, answer, None, max_children=4).children) == 4


def test_children_are_counted_before_any_is_read() -> None:
    # Not one of them is an object: what is refused is their number, before the first is looked at.
    with pytest.raises(TooManyChildren, match="answer has 3 children; the limit is 2"):
        read_answer(200, b'{"done": true, "items": [7, 8, 9]}', None, max_children=2)


def test_the_default_limit_takes_a_fan_out_of_100_000_children() -> None:
    children = b",".join([b"{}"] * MAX_CHILDREN)
    assert MAX_CHILDREN == 100_000
    assert len(read_answer(200, b'{"done": true, "items": [%s]}' % children, None).children) == MAX_CHILDREN
    with pytest.raises(TooManyChildren):
        read_answer(200, b'{"done": true, "items": [%s,{}]}' % children, None)


def test_each_answer_of_a_batch_is_held_to_the_limit_alone() -> None:
    answer = {"answers": [{"done": True, "items": [{}, {}]}, {"done": True, "items": [{}]}]}
    over, within = read_batch_answer(200, json.dumps(answer).encode(), None, [1, 2], max_children=1)
    assert isinstance(over, TooManyChildren) and isinstance(within, Response) and len(within.children) == 1


# ---------------------------------------------------------------- Retry-After


@pytest.mark.parametrize("value", ["inf", "Infinity", "-inf", "nan", "1e400", "NaN", "soon", ""])
def test_retry_after_header_that_is_not_a_finite_number_is_taken_as_absent(value: str) -> None:
    assert parse_retry_after(value) is None


def test_retry_after_header_far_away_is_read_as_it_is_and_left_to_the_policy() -> None:
    assert parse_retry_after("300000000000") == 3e11
    assert parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT") > 2.5e11  # type: ignore[operator]


def test_retry_after_dates_past_any_calendar_are_absent() -> None:
    assert parse_retry_after("Fri, 31 Dec 99999 23:59:59 GMT") is None


# ---------------------------------------------------------------- the retry policy caps every delay


POLICY = RetryPolicy(max_attempts=5, retry_delay=1.0, max_retry_delay=60.0, not_yet_delay=0.5)


@pytest.mark.parametrize(
    ("requested", "expected"),
    [(None, None), (3e11, 60.0), (1e308, 60.0), (30.0, 30.0), (0.1, None), (-5.0, None)],
)
def test_delay_for_a_requested_delay_wins_when_longer_and_is_capped(requested: Any, expected: float | None) -> None:
    delay = POLICY.delay_for(1, requested, random.Random(1))
    if expected is None:
        assert 1.0 <= delay <= 1.25  # the backoff
    else:
        assert delay == expected


@pytest.mark.parametrize("requested", [float("nan"), float("inf"), -float("inf"), True, "5"])
def test_delay_for_an_unusable_request_is_the_backoff(requested: Any) -> None:
    delay = POLICY.delay_for(2, requested, random.Random(1))
    assert 2.0 <= delay <= 2.5


@pytest.mark.parametrize(
    ("requested", "expected"),
    [(None, 0.5), (7.5, 7.5), (0.0, 0.0), (1e308, 60.0), (3e11, 60.0), (float("nan"), 0.5), (float("inf"), 0.5)],
)
def test_not_yet_waits_the_requested_delay_capped_or_the_poll_interval(requested: Any, expected: float) -> None:
    assert POLICY.not_yet(requested) == expected


@pytest.mark.parametrize("max_retry_delay", [float("inf"), float("nan"), -1.0, 1e300])
def test_a_policy_with_unusable_settings_still_returns_finite_delays(max_retry_delay: float) -> None:
    policy = RetryPolicy(retry_delay=1.0, max_retry_delay=max_retry_delay)
    for delay in (policy.delay_for(1000, 1e308), policy.not_yet(1e308), policy.backoff(5000), policy.cap(math.nan)):
        assert math.isfinite(delay) and 0 <= delay <= MAX_DELAY, delay


def test_every_delay_is_at_most_max_retry_delay() -> None:
    rng = random.Random(5)
    requests = [None, 0.0, 5.0, 59.0, 61.0, 1e9, 3e11, 1e308, float("inf"), float("nan")]
    delays = [POLICY.delay_for(retry, r, rng) for retry in range(1, 40) for r in requests]
    delays += [POLICY.not_yet(r) for r in requests]
    assert all(0 <= d <= 60.0 for d in delays), max(delays)


# ---------------------------------------------------------------- read_body: the size limit, decoded


async def streamed(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def body_of(chunks: list[bytes], limit: int, headers: dict[str, str] | None = None) -> bytes:
    return asyncio.run(read_body(CIMultiDict(headers or {}), streamed(chunks), limit))


def test_read_body_under_the_limit_is_the_whole_body() -> None:
    assert body_of([b"ab", b"cd"], 4) == b"abcd"
    assert body_of([gzip.compress(b"x" * 1000)], 1000, {"Content-Encoding": "gzip"}) == b"x" * 1000
    assert body_of([zlib.compress(b"y" * 10)], 10, {"Content-Encoding": "deflate"}) == b"y" * 10
    raw_deflate = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    data = raw_deflate.compress(b"z" * 10) + raw_deflate.flush()
    assert body_of([data], 10, {"Content-Encoding": "deflate"}) == b"z" * 10


def test_read_body_over_the_limit_stops_there() -> None:
    with pytest.raises(AnswerTooLarge, match=r"^answer larger than 4 bytes$") as raised:
        body_of([b"ab", b"cde", b"never read"], 4)
    assert raised.value.start == b"abcd"


def test_read_body_refuses_a_large_content_length_before_reading() -> None:
    with pytest.raises(AnswerTooLarge, match=r"answer larger than 10 bytes \(Content-Length: 1000000000000\)"):
        body_of([b"small"], 10, {"Content-Length": "1000000000000"})


def test_a_gzip_bomb_never_inflates_past_the_limit() -> None:
    bomb = gzip.compress(b"\0" * (64 * 1024 * 1024), compresslevel=9)  # 64 MiB in ~64 KiB
    assert len(bomb) < 100_000
    with pytest.raises(AnswerTooLarge) as raised:
        body_of([bomb], 1024, {"Content-Encoding": "gzip"})
    assert len(raised.value.start) == 1024  # one chunk of the bomb did not become 64 MiB


@pytest.mark.parametrize("encoding", ["br", "zstd", "gzip, gzip", "compress"])
def test_encodings_that_were_not_offered_are_undecodable(encoding: str) -> None:
    with pytest.raises(UndecodableAnswer, match="was not offered"):
        body_of([b"x"], 10, {"Content-Encoding": encoding})


def test_corrupt_gzip_is_undecodable() -> None:
    with pytest.raises(UndecodableAnswer, match="corrupt"):
        body_of([gzip.compress(b"hello")[:10] + b"\xff" * 20], 100, {"Content-Encoding": "gzip"})


# ---------------------------------------------------------------- credentials are never shown


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:secret@host:8080/x?q=1", "http://***@host:8080/x?q=1"),
        ("https://token@host/", "https://***@host/"),
        ("http://u:p@ss@host/", "http://***@host/"),
        ("http://host:8080/x", "http://host:8080/x"),
    ],
)
def test_redact_url_replaces_user_information(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://ocr/x?api_key=K3Y&mode=fast", "http://ocr/x?api_key=***&mode=fast"),
        ("http://ocr/x?mode=fast&access_token=T0K", "http://ocr/x?mode=fast&access_token=***"),
        ("https://s3/o?X-Amz-Signature=abc%2F&X-Amz-Date=1", "https://s3/o?X-Amz-Signature=***&X-Amz-Date=1"),
        ("http://u:p@ocr/?Password=p;sig=s", "http://***@ocr/?Password=***;sig=***"),
        ("http://ocr/x?page=2", "http://ocr/x?page=2"),
    ],
)
def test_redact_url_replaces_the_values_of_secret_query_parameters(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_the_secret_query_values_of_a_url_are_its_secrets_raw_and_decoded() -> None:
    secrets = url_secrets("http://ocr/x?api_key=a%2Bb%3D&mode=fast&token=t+1")
    assert {"a%2Bb%3D", "a+b=", "t+1", "t 1"} <= set(secrets) and "fast" not in secrets
    text = "GET http://ocr/x?mode=fast&api_key=a%2Bb%3D failed; key a+b= refused"
    assert redact_text(text, secrets) == "GET http://ocr/x?mode=fast&api_key=*** failed; key *** refused"


def test_redact_text_hides_user_information_of_any_url_and_the_secrets_given() -> None:
    url = "http://user:p%40ss@host/x"
    text = f"failed: {url}; password p@ss; other https://a:b@c:1/ and http://plain/ a@b.c"
    redacted = redact_text(text, url_secrets(url))
    assert redacted == "failed: http://***@host/x; password ***; other https://***@c:1/ and http://plain/ a@b.c"


# ---------------------------------------------------------------- request_body: the item as the handler gets it


@pytest.mark.parametrize(
    ("data", "sent"),
    [
        (b'{"kind": "file", "n": 1}', {"data": {"kind": "file", "n": 1}}),  # spliced as stored
        ('{"name": "café"}'.encode(), {"data": {"name": "café"}}),
        ('{"n": 1}'.encode("utf-16"), {"data": {"n": 1}}),  # JSON, not in UTF-8: parsed and encoded again
        (b'\xef\xbb\xbf{"n": 1}', {"data": {"n": 1}}),  # a UTF-8 byte order mark
        (b"\x00\xffraw", {"data_base64": "AP9yYXc="}),
        (b"not json", {"data_base64": "bm90IGpzb24="}),
    ],
)
def test_request_body_is_json_with_the_item_and_its_data(data: bytes, sent: dict[str, Any]) -> None:
    item = Item(7, 'folder "a"', "ocr", 2, 3, data, lambda fraction: None)
    body = json.loads(request_body(item))
    fields = {"id": 7, "partition": 'folder "a"', "queue": "ocr", "gate": 2, "attempt": 3, "deliveries": 1}
    assert body == {**fields, **sent}


# ---------------------------------------------------------------- batch answers: one result per item


def batch(status: int, answer: Any, ids: list[int] | None = None, retry_after: str | None = None) -> list[Any]:
    content = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
    return read_batch_answer(status, content, retry_after, ids or [1, 2, 3], "http://h/")


def test_a_batch_answer_answers_the_items_in_order() -> None:
    results = batch(200, {"answers": [{"done": True}, {"gate": 4}, {"gate": 0, "retry_after": 5}]})
    assert [r.done for r in results] == [True, False, False]
    assert results[1].gate == 4 and results[2].retry_after == 5


def test_a_batch_answer_whose_answers_all_carry_ids_is_matched_by_id() -> None:
    results = batch(200, {"answers": [{"id": 3, "gate": 3}, {"id": 1, "gate": 1}, {"id": 2, "gate": 2}]})
    assert [r.gate for r in results] == [1, 2, 3]


def test_a_short_batch_answer_fails_only_the_items_left_unanswered() -> None:
    first, second, third = batch(200, {"answers": [{"done": True}]})
    assert first.done
    for result in (second, third):
        assert isinstance(result, InvalidAnswer) and "(1 answers for 3 items)" in str(result)


def test_an_answer_that_is_not_an_object_or_invalid_fails_only_its_item() -> None:
    first, second, third = batch(200, {"answers": [7, {"done": True}, {"gate": -1}]})
    assert isinstance(first, InvalidAnswer) and "answer 1 of the batch is not a JSON object" in str(first)
    assert second.done
    assert isinstance(third, InvalidAnswer)


def test_a_per_item_error_object_is_that_items_failure() -> None:
    first, second, _ = batch(200, {"answers": [{"error": {"message": "no", "no_retry": True}}, {"error": {}}, {}]})
    assert isinstance(first, PermanentError) and str(first) == "no"
    assert isinstance(second, RetryLater)


def test_a_failed_or_malformed_batch_answer_is_every_items_failure() -> None:
    for status, answer, kind in [
        (503, {"answers": []}, RetryLater),
        (400, b"bad request", PermanentError),
        (200, b"not json", InvalidAnswer),
        (200, {"done": True}, InvalidAnswer),  # no answers list
        (200, b'{"answers": [NaN]}', InvalidAnswer),
    ]:
        results = batch(status, answer)
        assert len(results) == 3 and all(isinstance(r, kind) for r in results), (status, answer, results)
        assert len({str(r) for r in results}) == 1


def test_process_batch_answers_are_checked_per_item() -> None:
    class Short(Processor):
        def process(self, item: Item) -> Response:
            raise AssertionError

        def process_batch(self, items: list[Item]) -> list[Any]:  # type: ignore[override]  # plain: run in a thread
            return [Response(done=True), "nope"]

    items = [Item(n, "p", "q", 0, 1, b"{}", lambda f: None) for n in range(3)]
    done, wrong, missing = asyncio.run(call_batch(Short(), items))
    assert isinstance(done, Response)
    assert isinstance(wrong, InvalidAnswer) and "str, not a Response" in str(wrong)
    assert isinstance(missing, InvalidAnswer) and "2 answers for 3 items" in str(missing)
