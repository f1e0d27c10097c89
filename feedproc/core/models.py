"""The values feedproc passes around: statuses, the item a Processor sees, and its answer."""

from __future__ import annotations

import json
import math
import re
import reprlib
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, cast

from .errors import InvalidInput
from .gate_names import resolve_gate

KEY_PATTERN = re.compile(r"^[A-Za-z0-9._:/-]{1,200}$")
QUEUE_PATTERN = re.compile(r"^[A-Za-z0-9._:/-]{1,100}$")
#: How much of an error text is kept on an item (the history keeps each one too).
ERROR_LIMIT = 2000
#: The highest gate: gate columns are 32-bit INTEGERs on PostgreSQL, and SQLite keeps the same range
#: so that a partition behaves the same on both. Every gate is checked against it where it is made.
MAX_GATE = 2**31 - 1
MAX_INT32 = 2**31 - 1  # weights and limits are 32-bit columns
#: Priorities are signed 64-bit integers (BIGINT; SQLite's INTEGER): any of Scylla's 0..4_294_967_295,
#: and room for a timestamp or a sequence as a priority.
MIN_PRIORITY, MAX_PRIORITY = -(2**63), 2**63 - 1


MAX_PAGE = 500  # rows per page of the operators' reads (HTTP API, dashboard), at most
#: Child items one answer may add, by default (`--max-children` of `feedproc watch` and `serve`), and
#: items one API request may add (`feedproc serve --max-items`): room for a real fan-out, while an
#: answer of 900,000 children took a watcher to 1.4 GB and 16-46 s in one transaction.
MAX_CHILDREN = 100_000
MAX_ITEMS = 100_000


class Status(StrEnum):
    """Status of a partition or an item."""

    AVAILABLE = "available"
    COMPLETE = "complete"
    FAILED = "failed"
    CANCELLED = "cancelled"


STATUSES = tuple(s.value for s in Status)


def check_key(key: str) -> str:
    """Return `key` if it is a valid partition key, else raise InvalidInput."""
    if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):  # `$` alone would let "key\n" through
        raise InvalidInput(f"invalid partition key {key!r}: use 1-200 characters of A-Z a-z 0-9 . _ : / -")
    return key


def check_priority(value: Any, what: str = "priority") -> int:
    """Return `value` if it is a priority (an integer from MIN_PRIORITY to MAX_PRIORITY), else raise
    InvalidInput naming `what`."""
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise InvalidInput(f"{what} must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}, got {shown(value)}")
    return value


def check_weight(value: Any, what: str = "weight") -> int:
    """Return `value` if it is a weight (a partition's items' share of a concurrency limit: an
    integer from 1 to MAX_INT32), else raise InvalidInput naming `what`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_INT32:
        raise InvalidInput(f"{what} must be an integer from 1 to {MAX_INT32}, got {shown(value)}")
    return value


def uuid7(millis: int, random: bytes) -> str:
    """A UUIDv7 (RFC 9562) as text, for generated partition keys: its first 48 bits are `millis`
    (Unix time in milliseconds), so such keys sort by creation to the millisecond, and 74 of the
    80 bits of `random` (10 bytes) fill the rest beside the version and variant. Python 3.11's
    `uuid` has no uuid7; the caller reads the clock and the randomness (the core has neither)."""
    if len(random) != 10:
        raise ValueError("uuid7 takes 10 random bytes")
    value = (millis & (2**48 - 1)) << 80 | int.from_bytes(random, "big")
    value = value & ~(0xF << 76) | 0x7 << 76  # the version, 7, in the 4 bits after the time
    value = value & ~(0x3 << 62) | 0x2 << 62  # the RFC's variant, 0b10, at the top of the last 64 bits
    return str(uuid.UUID(int=value))


@dataclass(frozen=True, slots=True)
class AddedPartition:
    """What `Feed.add_partition(None, ...)` created: the key it generated, and the items added."""

    key: str
    items: int


def check_queue(queue: str) -> str:
    if not isinstance(queue, str) or not QUEUE_PATTERN.fullmatch(queue):
        raise InvalidInput(f"invalid queue name {queue!r}: use 1-100 characters of A-Z a-z 0-9 . _ : / -")
    return queue


#: A table prefix (`Store(table_prefix=...)`, `feedproc --table-prefix`): lower case, since
#: PostgreSQL folds unquoted names, a letter first, and short enough that the longest name made of
#: it (`_alembic_tmp_` + prefix + `partitions_leasable`) stays within PostgreSQL's 63 characters.
TABLE_PREFIX_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,23}")


def check_table_prefix(prefix: str) -> str:
    """Return `prefix` if it can begin feedproc's table names, else raise InvalidInput."""
    if not isinstance(prefix, str) or not TABLE_PREFIX_PATTERN.fullmatch(prefix):
        raise InvalidInput(f"table prefix {prefix!r} must be 1-24 characters of a-z, 0-9 and _, starting with a letter")
    return prefix


def gate_problem(gate: Any) -> str | None:
    """Why `gate` is not a valid gate, or None: a gate is an int (not a bool) from 0 to MAX_GATE."""
    if isinstance(gate, bool) or not isinstance(gate, int) or gate < 0:
        return f"gate must be an integer >= 0, got {shown(gate)}"
    if gate > MAX_GATE:
        return f"gate {shown(gate)} is out of range (0..{MAX_GATE})"
    return None


def check_gate(gate: Any, where: str = "") -> int:
    """Return `gate` if it is a valid gate (0..MAX_GATE) or the name of one in the pipeline in scope
    (`gate_names.naming`), as its number; else raise InvalidInput."""
    try:
        return gate_number(gate, where)
    except (TypeError, ValueError) as error:
        raise InvalidInput(str(error)) from None


def gate_number(gate: Any, where: str = "") -> int:
    """`gate` as a number: a name of the pipeline in scope is resolved (ValueError when unknown);
    anything but a valid gate number or a str raises TypeError or ValueError naming `where`."""
    if isinstance(gate, str):
        try:
            return resolve_gate(gate)
        except ValueError as error:
            raise ValueError(f"{where}{error}") from None
    if problem := gate_problem(gate):
        raise (TypeError if isinstance(gate, bool) or not isinstance(gate, int) else ValueError)(where + problem)
    return int(gate)


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 60


def shown(value: Any) -> str:
    """A short repr of `value` for an error message (an answer may hold a 4,000-digit number)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"{'-' if value < 0 else ''}<an integer of {value.bit_length()} bits>"
    try:
        return _SHORT.repr(value)
    except Exception:  # a user's object whose repr fails
        return f"<{type(value).__name__}>"


def truncate_error(text: str) -> str:
    return text if len(text) <= ERROR_LIMIT else text[: ERROR_LIMIT - 3] + "..."


@dataclass(frozen=True, slots=True)
class NewItem:
    """An item to add: its gate and its data (bytes); `collect`, an earlier gate whose items'
    results it receives when delivered (fan-in, for a queue without a pipeline that says so)."""

    gate: int
    data: bytes
    collect: int | None = None

    @classmethod
    def coerce(cls, value: NewItem | tuple[int, Any] | dict[str, Any], where: str = "") -> NewItem:
        """Accept `NewItem`, `(gate, data)` or `{"gate": g, "data": ..., "collect": c}`, data by the
        rule of `encode_data` (bytes, str, or any JSON value); anything else raises InvalidInput."""
        try:
            return coerce_item(value, where)
        except (TypeError, ValueError) as error:
            raise InvalidInput(str(error)) from None


def coerce_item(value: Any, where: str = "") -> NewItem:
    """`NewItem`, `(gate, data)` or `{"gate": g, "data": d}` (gate defaults to 0, data to null) as a
    checked NewItem: TypeError for another shape or a gate that is not an int, ValueError for a gate
    out of range or data that is not standard JSON. `where` prefixes the messages ("child 2: ")."""
    gate: Any
    data: Any
    collect: Any = None
    if isinstance(value, NewItem):
        gate, data, collect = value.gate, value.data, value.collect
    elif isinstance(value, tuple) and len(value) == 2:
        gate, data = value
    elif isinstance(value, dict):
        unknown = set(value) - {"gate", "data", "collect"}
        if unknown:
            raise TypeError(f"{where}unknown item field(s) {', '.join(sorted(map(str, unknown)))}")
        gate, data, collect = value.get("gate", 0), value.get("data"), value.get("collect")
    else:
        raise TypeError(f"{where}an item is (gate, data) or {{'gate': g, 'data': ...}}, got {shown(value)}")
    gate = gate_number(gate, where)
    if collect is not None:
        collect = collect_number(collect, gate, where)
    return NewItem(gate, data if type(data) is bytes else encode_data(data, f"{where}data"), collect)


def collect_number(collect: Any, gate: int, where: str = "") -> int:
    """An item's `collect` as a gate number (a name of the pipeline in scope is resolved) below its
    own `gate`: the gate whose items' results it receives. TypeError or ValueError naming `where`."""
    number = gate_number(collect, f"{where}collect: ")
    if number >= gate:
        raise ValueError(f"{where}collect must name an earlier gate than the item's ({gate}), got gate {number}")
    return number


def encode_data(value: Any, what: str = "data") -> bytes:
    """An item's data as bytes: bytes, bytearray and memoryview as they are, a str as UTF-8, any other
    value as standard JSON (no NaN or Infinity). TypeError or ValueError naming `what` otherwise."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        try:
            return value.encode()
        except UnicodeEncodeError as error:
            raise ValueError(f"{what} is not valid text: {error}") from None
    return strict_json(value, what)


def strict_json(value: Any, what: str = "data") -> bytes:
    """`value` as standard JSON text in UTF-8 (no NaN or Infinity): TypeError when it is not
    JSON-serialisable, ValueError when it is not standard JSON; both name `what`."""
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False).encode()
    except TypeError as error:
        raise TypeError(f"{what} is not JSON-serialisable: {error}") from None
    except (ValueError, RecursionError) as error:  # NaN/Infinity, a circular or too deep structure, a lone surrogate
        raise ValueError(f"{what} is not standard JSON: {error}") from None


def item_from_row(row: Any, where: str = "") -> NewItem:
    """One `{"gate": int, "data": <any JSON>[, "collect": gate]}` object (a JSON Lines row, or an
    HTTP body's item) as a NewItem; the data is stored as its JSON text. Without "gate", gate 0 (as
    `Feed`'s items and handlers' children). Shared by `feedproc add` and the HTTP API."""
    if not isinstance(row, dict):
        raise InvalidInput(f'{where}expected an object like {{"gate": 0, "data": ...}}')
    unknown = set(row) - {"gate", "data", "collect"}
    if unknown:
        raise InvalidInput(f"{where}unknown field(s) {', '.join(sorted(unknown))}")
    gate = check_gate(row.get("gate", 0), where=where)
    collect = row.get("collect")
    if collect is not None:
        try:
            collect = collect_number(collect, gate, where)
        except (TypeError, ValueError) as error:
            raise InvalidInput(str(error)) from None
    return NewItem(gate, encode_json(row.get("data"), where), collect)


#: How deeply item data may nest (arrays and objects): JSON parsers in other languages, and this
#: API's own responses, stop around a few hundred levels; real data stays far below.
MAX_DEPTH = 64


def json_depth(value: Any) -> int:
    """How deeply `value` nests (0 for a scalar), without recursion; stops counting past MAX_DEPTH."""
    depth, level = 0, [value]
    while depth <= MAX_DEPTH:
        containers = [node for node in level if isinstance(node, dict | list)]
        if not containers:
            break
        depth += 1
        level = [child for node in containers for child in (node.values() if isinstance(node, dict) else node)]
    return depth


def encode_json(value: Any, where: str = "") -> bytes:
    """`value` as compact UTF-8 JSON that any language's parser reads back: InvalidInput for NaN or
    Infinity (not JSON), lone surrogates (not UTF-8) and nesting deeper than MAX_DEPTH."""
    if json_depth(value) > MAX_DEPTH:
        raise InvalidInput(f"{where}data nests deeper than {MAX_DEPTH} levels")
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except UnicodeEncodeError:
        raise InvalidInput(f"{where}data holds a lone surrogate (\\ud800-\\udfff), which UTF-8 cannot encode") from None
    except ValueError:
        raise InvalidInput(f"{where}data holds NaN or Infinity, which JSON does not have") from None


@dataclass(slots=True)
class Item:
    """One item handed to a Processor."""

    id: int
    partition: str
    queue: str
    gate: int
    attempt: int  # failed deliveries at this gate + 1
    data: bytes
    reporter: Callable[[float], None] | None = field(default=None, repr=False, compare=False)
    stop: threading.Event | None = field(default=None, repr=False, compare=False)  # set when cancelled
    #: At a gate that collects (fan-in): what the collected gate's items produced (`core.fanin.Collected`,
    #: iterated a page at a time), and the partition's accumulator {name: number}. None elsewhere.
    collected: Any = field(default=None, repr=False, compare=False)
    accumulated: Mapping[str, float] | None = field(default=None, repr=False, compare=False)
    #: This delivery's number among all of the item's deliveries, every gate and every answer
    #: counted ("not yet" ones too, which `attempt` does not count), this one included.
    deliveries: int = 1

    @property
    def cancelled(self) -> bool:
        """True once the item (or its partition) was cancelled while in flight: a plain-`def`
        processor polls it to stop early (an `async def` one is cancelled outright)."""
        return self.stop is not None and self.stop.is_set()

    def json(self) -> Any:
        """The item's data parsed as JSON."""
        return json.loads(self.data)

    def progress(self, fraction: float) -> Awaitable[None]:
        """Report how far this item has got (0..1): `await item.progress(0.4)` (a plain-def processor
        may call it without await). Stored with the watcher's next lease heartbeat, fenced like every
        write; status shows the mean progress of a gate's items in flight."""
        if self.reporter is not None:
            self.reporter(check_progress(fraction))
        return _DONE


@dataclass(slots=True)
class Response:
    """A Processor's answer for one item, checked when it is made.

    `Response(done=True)` completes the item; `Response(gate=G)` moves it to gate G (G equal to
    its gate means "not yet: ask again later", after `retry_after` seconds or the poll interval).
    G, and a child's gate, may be a gate's name in the queue's pipeline (`"rank"`): it is made
    its number here (an unknown name raises ValueError).
    `data` replaces the item's data: bytes, a str (stored as UTF-8) or any other JSON value (stored
    as its JSON text). `result` is what the item produced, kept apart from its data (by the same
    rule; its input stays as it was): the results a later gate collects. `accumulate` adds numbers
    to the partition's accumulator (`{"pages": 12}`, each name merged by the operation its gate or
    queue declares). `items` are new child items added to the same partition in the same
    transaction (fan-out): `(gate, data)`, `{"gate": g, "data": d}` or `NewItem`, data by the same
    rule. Gates are ints from 0 to MAX_GATE; `retry_after` is a finite number of seconds >= 0.
    Anything else raises TypeError or ValueError here, in the processor's own call (a transient
    failure of the item), never later in the watcher.
    """

    done: bool = False
    gate: int | str | None = None  # an int once made
    data: Any = None  # bytes once made (None: the item's data is kept)
    items: Sequence[tuple[int, Any]] | Iterable[NewItem | tuple[int, Any] | dict[str, Any]] = field(
        default_factory=tuple
    )
    retry_after: float | None = None
    progress: float | None = None  # with a "not yet" answer: how far the item has got (0..1)
    result: Any = None  # bytes once made (None: no result)
    accumulate: Mapping[str, Any] | None = None  # {name: finite number} once made

    @property
    def children(self) -> tuple[NewItem, ...]:
        """`items` once the Response is made: checked `NewItem`s."""
        return cast("tuple[NewItem, ...]", self.items)

    def __post_init__(self) -> None:
        if self.done == (self.gate is not None):
            raise ValueError("a Response has either done=True or a gate, not both and not neither")
        if isinstance(self.gate, str):
            self.gate = gate_number(self.gate, "Response ")
        elif self.gate is not None and (problem := gate_problem(self.gate)):
            raise ValueError(f"Response {problem}")
        if self.data is not None and type(self.data) is not bytes:
            self.data = encode_data(self.data, "Response data")
        if self.result is not None and type(self.result) is not bytes:
            self.result = encode_data(self.result, "Response result")
        if self.accumulate is not None:
            from .fanin import check_accumulate

            self.accumulate = check_accumulate(self.accumulate, "Response accumulate") or None
        if self.items:
            if isinstance(self.items, str | bytes | bytearray | dict):
                raise TypeError(f"Response items must be a list of children, got {type(self.items).__name__}")
            self.items = tuple(
                coerce_item(child, f"Response child {n}: ") for n, child in enumerate(self.items, start=1)
            )
        else:
            self.items = ()
        if self.retry_after is not None:
            self.retry_after = check_delay(self.retry_after, "Response retry_after")
        if self.progress is not None:
            self.progress = check_progress(self.progress)


def check_delay(seconds: Any, what: str = "retry_after") -> float:
    """A delay asked for: a finite number of seconds >= 0 (how long it may be is the policy's cap)."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ValueError(f"{what} must be a finite number of seconds >= 0, got {shown(seconds)}")
    try:
        value = float(seconds)
    except OverflowError:  # an int past any float
        value = math.inf
    if not (math.isfinite(value) and value >= 0):  # NaN fails both
        raise ValueError(f"{what} must be a finite number of seconds >= 0, got {shown(seconds)}")
    return value


def check_progress(fraction: Any) -> float:
    """A progress figure: a number from 0 to 1."""
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 <= fraction <= 1:
        raise ValueError(f"progress must be a number from 0 to 1, got {fraction!r}")
    return float(fraction)


class _Done:
    """An awaitable that is already finished (what `Item.progress` returns)."""

    def __await__(self) -> Any:
        return iter(())


_DONE = _Done()
