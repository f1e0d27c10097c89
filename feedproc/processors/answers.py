"""Reading a handler's answers (the HTTP handler contract): an answer or a batch's answers as
Responses, or the failures they are; standard JSON only; `Retry-After`."""

from __future__ import annotations

import email.utils
import json
import math
import time
from typing import Any

from ..core.errors import InvalidAnswer, PermanentError, RetryLater, TooManyChildren
from ..core.fanin import check_accumulate
from ..core.models import (
    MAX_CHILDREN,
    NewItem,
    Response,
    check_delay,
    check_progress,
    gate_number,
    shown,
    strict_json,
)

BODY_KEPT = 500  # bytes of a failed answer's body kept in last_error


class _NonStandardJSON(Exception):
    """NaN, Infinity or a number past any float in a JSON text."""


def _no_constant(name: str) -> Any:
    raise _NonStandardJSON(f"non-standard JSON: {name} is not allowed")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NonStandardJSON(f"non-standard JSON: the number {text[:40]} is out of range")
    return value


# One decoder for every answer: json.loads with hooks builds a new one per call (1.4 against 3.0 us
# for `{"done": true}`, timeit).
_STRICT_JSON = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float)


def parse_json(content: bytes) -> Any:
    """Standard JSON only: NaN, Infinity, -Infinity and numbers past a float (1e400) raise
    _NonStandardJSON (Python's parser accepts them; no database or handler should see them);
    anything else that is not JSON raises ValueError."""
    try:
        return _STRICT_JSON.decode(content.decode(json.detect_encoding(content), "surrogatepass"))
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


#: The statuses by which a handler pushes back (its gate's fleet-wide concurrency backs off).
PUSHBACK_STATUSES = {429: "429", 503: "503"}


def read_answer(
    status: int,
    content: bytes,
    retry_after_header: str | None,
    url: str | None = None,
    max_children: int = MAX_CHILDREN,
) -> Response:
    """Turn an HTTP answer into a Response, or raise the failure the contract says it is.

    `url` (shown without credentials) is named in the message of a non-2xx answer; an answer with
    more than `max_children` children is TooManyChildren (a permanent failure)."""
    retry_after = parse_retry_after(retry_after_header)
    ok = 200 <= status < 300
    parsed: Any = None
    problem: str | None = None
    try:
        parsed = parse_json(content) if content else None
    except _NonStandardJSON as error:
        problem = str(error)
    except (ValueError, UnicodeDecodeError):
        parsed = None
    go_error = parsed.get("error") if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict) else None
    if not ok:
        text = content[:BODY_KEPT].decode("utf-8", "replace")
        where = f"HTTP {status} from {url}" if url else f"HTTP {status}"
        message = f"{where}: {text}" if text else where
        permanent = (400 <= status < 500 and status not in (408, 429)) or bool(go_error and go_error.get("no_retry"))
        if permanent:
            raise PermanentError(message)
        raise RetryLater(message, after=retry_after, pushback=PUSHBACK_STATUSES.get(status))
    if problem is not None:
        raise InvalidAnswer(problem)
    if not isinstance(parsed, dict):
        shown = content[:100].decode("utf-8", "replace")
        raise InvalidAnswer(f"expected a JSON object, got {shown!r}")
    return answer_from_object(parsed, retry_after, max_children)


def answer_from_object(
    answer: dict[str, Any], retry_after: float | None = None, max_children: int = MAX_CHILDREN
) -> Response:
    """One item's `2xx` answer object as a Response, or the failure it reports (`"error": {...}`)."""
    go_error = answer.get("error")
    if isinstance(go_error, dict):
        message = str(go_error.get("message") or "handler reported an error")
        if go_error.get("no_retry"):
            raise PermanentError(message)
        raise RetryLater(message, after=retry_after)
    return response_from_json(answer, retry_after, max_children)


def read_batch_answer(
    status: int,
    content: bytes,
    retry_after_header: str | None,
    ids: list[int],
    url: str | None = None,
    max_children: int = MAX_CHILDREN,
) -> list[Response | Exception]:
    """A batch's HTTP answer as each item's Response or failure, in the order of `ids`.

    `{"answers": [...]}` answers the items in order, or by each answer's `"id"` when every answer
    carries one. A non-`2xx` status, a body that is not standard JSON or has no `answers` list is
    every item's failure (as `read_answer` judges it); a missing answer, or one that is not an
    object or is invalid, is its own item's failure only."""
    count = len(ids)
    try:
        parsed = parse_json(content) if content else None
    except (_NonStandardJSON, ValueError, UnicodeDecodeError):
        parsed = None
    answers = parsed.get("answers") if isinstance(parsed, dict) else None
    if not 200 <= status < 300 or not isinstance(answers, list):
        try:  # the failure this body would be as a single item's answer, else the missing list
            read_answer(status, content, retry_after_header, url)
            raise InvalidAnswer(f'expected {{"answers": [...]}}, got {shown(content[:100].decode("utf-8", "replace"))}')
        except Exception as error:
            return [error] * count
    retry_after = parse_retry_after(retry_after_header)
    if answers and all(isinstance(a, dict) and "id" in a for a in answers):
        by_id = {a["id"]: a for a in answers}
        chosen = [by_id.get(item_id, _MISSING) for item_id in ids]
    else:
        chosen = [answers[n] if n < len(answers) else _MISSING for n in range(count)]
    results: list[Response | Exception] = []
    for n, answer in enumerate(chosen):
        if answer is _MISSING:
            missing = f"no answer for item {ids[n]} in the batch answer ({len(answers)} answers for {count} items)"
            results.append(InvalidAnswer(missing))
        elif not isinstance(answer, dict):
            results.append(InvalidAnswer(f"answer {n + 1} of the batch is not a JSON object"))
        else:
            try:
                results.append(answer_from_object(answer, retry_after, max_children))
            except Exception as error:
                results.append(error)
    return results


def response_from_json(
    answer: dict[str, Any], retry_after: float | None = None, max_children: int = MAX_CHILDREN
) -> Response:
    """Read an answer object (ours, or Go Feed's `complete` / `response` spelling).

    Every value is checked here, so that a hostile answer is an InvalidAnswer (a transient failure
    of its item) and never reaches the database: gates from 0 to MAX_GATE, a finite `retry_after`
    >= 0 (how long it may be is the policy's cap), standard JSON data. More than `max_children`
    children is TooManyChildren, counted before any child is read."""
    done = answer.get("done", answer.get("complete", False))
    data_value = answer["data"] if "data" in answer else answer.get("response", _MISSING)
    data = None if data_value is _MISSING else _answer_data(data_value, "data")
    field_retry = answer.get("retry_after")
    if field_retry is not None:
        try:
            field_retry = check_delay(field_retry)
        except ValueError as error:
            raise InvalidAnswer(str(error)) from None
        retry_after = max(field_retry, retry_after or 0.0)
    progress = answer.get("progress")
    if progress is not None:
        try:
            progress = check_progress(progress)
        except ValueError as error:
            raise InvalidAnswer(str(error)) from None
    children_value = answer.get("items") or []
    if not isinstance(children_value, list):
        raise InvalidAnswer('items must be a list of {"gate": G, "data": ...}')
    if len(children_value) > max_children:  # before a NewItem, a row and a statement's parameters each
        raise TooManyChildren(len(children_value), max_children)
    children = []
    for n, child in enumerate(children_value, start=1):
        if not isinstance(child, dict):
            raise InvalidAnswer(f"child {n} is not an object")
        gate = _answer_gate(child.get("gate", 0), f"child {n}: ")
        collect = child.get("collect")
        if collect is not None:  # a fan-out creating its own fan-in item (a queue without a pipeline)
            collect = _answer_gate(collect, f"child {n}: collect: ")
            if collect >= gate:
                raise InvalidAnswer(f"child {n}: collect must name an earlier gate than its own ({gate})")
        children.append(NewItem(gate, _answer_data(child.get("data"), f"child {n} data"), collect))
    result = _answer_data(answer["result"], "result") if answer.get("result") is not None else None
    accumulate = answer.get("accumulate")
    if accumulate is not None:
        try:
            accumulate = check_accumulate(accumulate) or None
        except ValueError as error:
            raise InvalidAnswer(str(error)) from None
    fields: dict[str, Any] = {"data": data, "items": children, "retry_after": retry_after, "progress": progress}
    if result is not None or accumulate is not None:  # rare beside the rest: the common answer stays as cheap
        fields.update(result=result, accumulate=accumulate)
    if done is True:
        return Response(done=True, **fields)
    if answer.get("gate") is None:
        raise InvalidAnswer('the answer has neither "done": true nor a "gate"')
    return Response(gate=_answer_gate(answer["gate"], ""), **fields)


def _answer_gate(value: Any, where: str) -> int:
    """An answer's gate: an integer from 0 to MAX_GATE, or the name of a gate of the queue's pipeline."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidAnswer(f"{where}gate must be an integer or a gate's name, got {shown(value)}")
    try:
        return gate_number(value)
    except ValueError as error:
        raise InvalidAnswer(f"{where}{error}") from None


def _answer_data(value: Any, what: str) -> bytes:
    """A JSON value of an answer as the bytes stored (a str too is stored as JSON text)."""
    try:
        return strict_json(value, what)
    except (TypeError, ValueError) as error:  # e.g. a lone surrogate "\\ud800" in a string
        raise InvalidAnswer(str(error)) from None


_MISSING = object()


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), or None.

    A value that is not a finite number or a date (`inf`, `nan`, `1e400`, garbage) is taken as no
    header at all: the header is advice, and unreadable advice should not turn an otherwise valid
    answer into a failure; the backoff applies. A finite but huge value is returned as it is: the
    retry policy caps every delay at `max_retry_delay`."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
        seconds = when.timestamp() - time.time()
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
    return max(0.0, seconds) if math.isfinite(seconds) else None
