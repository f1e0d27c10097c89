"""Fan-in that joins: the rules of what flows across a gate, written once.

- **Tolerated failures** (`Tolerance`): a gate (or a partition) may let some of its items fail
  without failing the partition: `"5%"` of the gate's items, or a count. Within it the barrier
  lets the gate advance once nothing else there is available; past it the partition fails at once.
- **Accumulators** (`check_operations`, `check_accumulate`, `merge`): an answer's `accumulate`
  numbers, each name merged by the operation its gate (or queue) declares: `sum`, `min`, `max` or
  `count` (how many answers carried the name).
- **Collected results** (`CollectedResult`, `Collected`): what the items of an earlier gate of the
  partition produced, handed to the item that collects them; inline up to a bound, past it paged.

Pure: no database, network or clock.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import re
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .models import shown

#: How an accumulator's numbers merge.
OPERATIONS = ("sum", "min", "max", "count")
#: An accumulator's name: as a JSON key in any language, and a column value of 64 characters at most.
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
#: Names one answer may carry, and one gate or queue may declare.
MAX_NAMES = 32
#: Collected results sent inline in a request at most (more are paged): a gate's `collect_inline`.
COLLECT_INLINE = 1000
#: Bytes of collected results sent inline at most (more are paged).
COLLECT_INLINE_BYTES = 1024 * 1024
#: Results one page of a paged collection holds at most.
PAGE = 1000
#: Bytes of results (and errors) one page holds at most, past its first result: a page of large
#: results stays a few MB, however large each may be (an answer, and so a result, may be 10 MiB).
PAGE_BYTES = 1024 * 1024


# ---------------------------------------------------------------- tolerated failures


@dataclass(frozen=True, slots=True)
class Tolerance:
    """Failed items a gate lets pass: `count` of them, or `percent` of the gate's items."""

    count: int | None = None
    percent: float | None = None

    @classmethod
    def parse(cls, value: Any, what: str = "tolerate") -> Tolerance:
        """`"5%"` (0 to 100), or a count (an integer >= 0, or its text); ValueError naming `what` otherwise."""
        if isinstance(value, str) and value.strip().endswith("%"):
            number = value.strip()[:-1].strip()
            try:
                percent = float(number)
            except ValueError:
                percent = math.nan
            if not (math.isfinite(percent) and 0 <= percent <= 100):
                raise ValueError(f"{what} must be a percentage from 0% to 100% or a count, got {shown(value)}")
            return cls(percent=percent)
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value.strip())
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 2**31 - 1:
            raise ValueError(f'{what} must be a count (an integer >= 0) or a percentage like "5%", got {shown(value)}')
        return cls(count=value)

    def allowed(self, total: int) -> int:
        """How many of `total` items may fail."""
        if self.count is not None:
            return self.count
        return math.floor((self.percent or 0.0) * total / 100 + 1e-9)

    def exceeded(self, failed: int, total: int) -> bool:
        """Whether `failed` of `total` items are more than this tolerance lets pass."""
        return failed > self.allowed(total)

    def __str__(self) -> str:
        if self.count is not None:
            return str(self.count)
        return f"{self.percent:g}%"


# ---------------------------------------------------------------- accumulators


def _named(value: Any, what: str, like: str, verb: str) -> list[tuple[str, Any]]:
    """The (name, value) pairs of a mapping of accumulator names, each name checked."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} must be {like}, got {shown(value)}")
    if len(value) > MAX_NAMES:
        raise ValueError(f"{what} {verb} {len(value)} names; at most {MAX_NAMES}")
    for name in value:
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ValueError(f"{what}: {shown(name)} is not a name (a letter or _, then letters, digits, _ . -)")
    return list(value.items())


def check_operations(value: Any, what: str = "accumulate") -> dict[str, str]:
    """A declaration `{"pages": "sum", "max_score": "max"}` checked; ValueError naming `what` otherwise."""
    checked: dict[str, str] = {}
    for name, operation in _named(value, what, 'a table of name = operation, like {pages = "sum"}', "declares"):
        if operation not in OPERATIONS:
            choices = ", ".join(OPERATIONS)
            raise ValueError(f"{what}: {name}: the operation must be one of {choices}, got {shown(operation)}")
        checked[name] = operation
    return checked


#: Names that passed the check already (a gate's answers repeat a few names): a name found here is
#: not matched again. Bounded: past it, names are checked every time.
_NAMES_SEEN: set[str] = set()
_NAMES_SEEN_MAX = 1024
_EXACT = 2**53  # integers below this become floats exactly (and never overflow)


def check_accumulate(value: Any, what: str = "accumulate") -> dict[str, float]:
    """An answer's `accumulate` checked: an object of at most MAX_NAMES names to finite numbers."""
    # Every answer of flat-accumulate carries one: the full check (a regular expression per name,
    # the overflow guard) cost 5 us an answer, 7% of a watcher's time per item at 15,000 items/s.
    if type(value) is dict and len(value) <= MAX_NAMES:
        fast: dict[str, float] = {}
        for name, number in value.items():
            kind = type(number)
            if name not in _NAMES_SEEN or not (
                (kind is float and math.isfinite(number)) or (kind is int and -_EXACT < number < _EXACT)
            ):
                break
            fast[name] = float(number)
        else:
            return fast
    checked: dict[str, float] = {}
    for name, number in _named(value, what, 'an object of names to numbers, like {"pages": 12}', "carries"):
        if isinstance(number, bool) or not isinstance(number, int | float):
            raise ValueError(f"{what}: {name} must be a number, got {shown(number)}")
        try:
            as_float = float(number)
        except OverflowError:
            as_float = math.inf
        if not math.isfinite(as_float):
            raise ValueError(f"{what}: {name} must be a finite number, got {shown(number)}")
        checked[name] = as_float
    if len(_NAMES_SEEN) < _NAMES_SEEN_MAX:
        _NAMES_SEEN.update(checked)
    return checked


def undeclared(accumulate: Mapping[str, float], operations: Mapping[str, str]) -> list[str]:
    """The names of `accumulate` that `operations` declares no operation for."""
    return [name for name in accumulate if name not in operations]


def refusal(accumulate: Mapping[str, float], operations: Mapping[str, str], gate: str, queue: str) -> str | None:
    """Why an answer's `accumulate` cannot be merged (its item then fails for good), or None: the
    first name its gate (`gate`, as shown) of `queue` declares no operation for. A name nobody
    declared is a typo or a forgotten declaration; dropping it would lose what it counted unseen."""
    missing = undeclared(accumulate, operations)
    if not missing:
        return None
    name = missing[0]
    declared = ", ".join(f"{n}={op}" for n, op in sorted(operations.items())) or "nothing"
    return (
        f"accumulate: {name!r} has no operation declared at {gate} of queue {queue!r} (declared: {declared});"
        f' declare it on the gate (accumulate = {{{name} = "sum"}}) or the queue'
        f" (feedproc queue set {queue} --accumulate {name}=sum)"
    )


def parse_operations(pairs: list[str] | tuple[str, ...], what: str = "--accumulate") -> dict[str, str]:
    """`["pages=sum", "max_score=max"]` (the CLI's form) as a declaration; ValueError naming `what`
    and the pair at fault otherwise."""
    declared: dict[str, str] = {}
    for pair in pairs:
        name, sep, operation = pair.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"{what}: {shown(pair)} is not NAME=OPERATION (like pages=sum)")
        declared[name.strip()] = operation.strip()
    return check_operations(declared, what)


def merge(operations: Mapping[str, str], into: dict[str, float], numbers: Mapping[str, float]) -> None:
    """Merge one answer's `numbers` into `into` by each name's operation (names without one are skipped)."""
    for name, number in numbers.items():
        operation = operations.get(name)
        if operation is None:
            continue
        step = 1.0 if operation == "count" else number
        into[name] = step if name not in into else combine(operation, into[name], step)


def combine(operation: str, merged: float, step: float) -> float:
    """`merged` and one more answer's `step` by `operation` (a count's step is 1)."""
    if operation in ("sum", "count"):
        return merged + step
    if operation == "min":
        return min(merged, step)
    return max(merged, step)


def shown_number(value: float) -> int | float:
    """An accumulator's value as shown: an int when it is one (pages: 12, not 12.0)."""
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


# ---------------------------------------------------------------- collected results


@dataclass(frozen=True, slots=True)
class CollectedResult:
    """One item of the collected gate: its id and result (complete), or its error (failed, tolerated)."""

    id: int
    result: bytes | None = None
    error: str | None = None
    failed: bool = False

    def json(self) -> Any:
        """The result parsed as JSON (None for a failed item, or one that produced no result)."""
        return None if self.result is None else json.loads(self.result)

    def to_json(self) -> dict[str, Any]:
        """As a request carries it: `{"id", "result"}` (JSON, or `result_base64` for other bytes), or
        `{"id", "error"}` for a failed item."""
        if self.failed:
            return {"id": self.id, "error": self.error}
        return {"id": self.id, **result_json(self.result)}


def result_json(result: bytes | None) -> dict[str, Any]:
    """`{"result": <JSON>}`, or `{"result_base64": ...}` when the bytes are not JSON (a Python
    processor's), or `{"result": null}` when there is none."""
    if result is None:
        return {"result": None}
    try:
        return {"result": json.loads(result)}
    except (ValueError, UnicodeDecodeError, RecursionError):
        return {"result_base64": base64.b64encode(result).decode()}


#: Reads one page of a collection: (after this item id, or None for the first page, at most this
#: many) -> the page, in item id order.
PageReader = Callable[[int | None, int], list[CollectedResult]]


@dataclass(slots=True)
class Collected:
    """What the items of gate `gate` of the partition produced, handed to the item that collects
    them: `count` complete and `failed` failed (tolerated) items. Iterate it (`for r in
    item.collected`, or `async for` in an `async def` processor) to get each `CollectedResult`
    once, in item id order, read a page at a time: memory stays flat however many there are.

    How a request carries it (`to_json`) is set by whoever delivers it: `inline`, every result when
    they fit in the request; else `results_url`, which serves them a page at a time to the holder of
    the delivery's `token` (valid while that delivery is)."""

    gate: int
    count: int
    failed: int
    read_page: PageReader = field(repr=False)
    gate_name: str | None = None
    page: int = PAGE
    inline: list[CollectedResult] | None = field(default=None, repr=False)
    results_url: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return self.count + self.failed

    def __iter__(self) -> Iterator[CollectedResult]:
        # A page may be short of `page` (its bytes are bounded too): the counts say when it is over.
        seen, after = 0, None
        while seen < len(self):
            rows = self.read_page(after, self.page)
            if not rows:
                return
            yield from rows
            seen, after = seen + len(rows), rows[-1].id

    async def __aiter__(self) -> AsyncIterator[CollectedResult]:
        seen, after = 0, None
        while seen < len(self):
            rows = await asyncio.to_thread(self.read_page, after, self.page)  # the read blocks: not on the loop
            if not rows:
                return
            for row in rows:
                yield row
            seen, after = seen + len(rows), rows[-1].id

    def to_json(self) -> dict[str, Any]:
        """As a request carries it: `{"gate", "count", "failed"}` (the gate by its name where the
        pipeline names it) with `"results"` inline, or `"results_url"`."""
        shown: dict[str, Any] = {"gate": self.gate_name or self.gate, "count": self.count, "failed": self.failed}
        if self.inline is not None:
            shown["results"] = [row.to_json() for row in self.inline]
        elif self.results_url is not None:
            shown["results_url"] = self.results_url
        return shown


def inline_results(results: list[CollectedResult]) -> PageReader:
    """A page reader over results already read (a request's inline ones, a claim's)."""

    def read_page(after: int | None, limit: int) -> list[CollectedResult]:
        start = 0 if after is None else next((n for n, r in enumerate(results) if r.id > after), len(results))
        return results[start : start + limit]

    return read_page


def result_size(row: CollectedResult) -> int:
    """About how many bytes `row` takes in a request (what the inline and page bounds count)."""
    return 24 + len(row.result or b"") + len(row.error or "")
