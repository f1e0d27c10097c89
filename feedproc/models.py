"""The values feedproc passes around: statuses, the item a Processor sees, and its answer."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from .errors import InvalidInput

KEY_PATTERN = re.compile(r"^[A-Za-z0-9._:/-]{1,200}$")
QUEUE_PATTERN = re.compile(r"^[A-Za-z0-9._:/-]{1,100}$")
#: How much of an error text is kept on an item (the history keeps each one too).
ERROR_LIMIT = 2000


class Status(StrEnum):
    """Status of a partition or an item."""

    AVAILABLE = "available"
    COMPLETE = "complete"
    FAILED = "failed"
    CANCELLED = "cancelled"


STATUSES = tuple(s.value for s in Status)


def check_key(key: str) -> str:
    """Return `key` if it is a valid partition key, else raise InvalidInput."""
    if not isinstance(key, str) or not KEY_PATTERN.match(key):
        raise InvalidInput(f"invalid partition key {key!r}: use 1-200 characters of A-Z a-z 0-9 . _ : / -")
    return key


def check_queue(queue: str) -> str:
    if not isinstance(queue, str) or not QUEUE_PATTERN.match(queue):
        raise InvalidInput(f"invalid queue name {queue!r}: use 1-100 characters of A-Z a-z 0-9 . _ : / -")
    return queue


def check_gate(gate: Any, where: str = "") -> int:
    if isinstance(gate, bool) or not isinstance(gate, int) or gate < 0:
        raise InvalidInput(f"{where}gate must be an integer >= 0, got {gate!r}")
    return gate


def truncate_error(text: str) -> str:
    return text if len(text) <= ERROR_LIMIT else text[: ERROR_LIMIT - 3] + "..."


@dataclass(frozen=True, slots=True)
class NewItem:
    """An item to add: its gate and its data (bytes)."""

    gate: int
    data: bytes

    @classmethod
    def coerce(cls, value: NewItem | tuple[int, bytes] | dict[str, Any], where: str = "") -> NewItem:
        """Accept `NewItem`, `(gate, data)` or `{"gate": g, "data": ...}` (data: bytes or JSON)."""
        if isinstance(value, NewItem):
            gate, data = value.gate, value.data
        elif isinstance(value, tuple) and len(value) == 2:
            gate, data = value
        elif isinstance(value, dict):
            gate, data = value.get("gate", 0), value.get("data")
            if not isinstance(data, bytes | bytearray):
                data = encode_json(data)
        else:
            raise InvalidInput(f"{where}an item is (gate, data) or {{'gate': g, 'data': ...}}, got {value!r}")
        check_gate(gate, where)
        if isinstance(data, str):
            data = data.encode()
        if not isinstance(data, bytes | bytearray):
            raise InvalidInput(f"{where}item data must be bytes, got {type(data).__name__}")
        return cls(gate, bytes(data))


def item_from_row(row: Any, where: str = "") -> NewItem:
    """One `{"gate": int, "data": <any JSON>}` object (a JSON Lines row, or an HTTP body's item) as a
    NewItem; the data is stored as its JSON text. Shared by `feedproc add` and the HTTP API."""
    if not isinstance(row, dict):
        raise InvalidInput(f'{where}expected an object like {{"gate": 0, "data": ...}}')
    unknown = set(row) - {"gate", "data"}
    if unknown:
        raise InvalidInput(f"{where}unknown field(s) {', '.join(sorted(unknown))}")
    return NewItem(check_gate(row.get("gate", 0), where=where), encode_json(row.get("data")))


def encode_json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


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
    """A Processor's answer for one item.

    `Response(done=True)` completes the item; `Response(gate=G)` moves it to gate G (G equal to
    its gate means "not yet: ask again later", after `retry_after` seconds or the poll interval).
    `data` replaces the item's data; `items` are new child items `(gate, data)` added to the same
    partition in the same transaction (fan-out).
    """

    done: bool = False
    gate: int | None = None
    data: bytes | None = None
    items: Sequence[tuple[int, bytes]] | Iterable[NewItem] = field(default_factory=tuple)
    retry_after: float | None = None
    progress: float | None = None  # with a "not yet" answer: how far the item has got (0..1)

    def __post_init__(self) -> None:
        if self.done == (self.gate is not None):
            raise ValueError("a Response has either done=True or a gate, not both and not neither")
        if self.gate is not None and (isinstance(self.gate, bool) or not isinstance(self.gate, int)):
            raise ValueError(f"gate must be an int, got {self.gate!r}")
        if isinstance(self.data, str):
            self.data = self.data.encode()
        self.items = tuple(NewItem.coerce(child) for child in self.items) if self.items else ()
        if self.progress is not None:
            self.progress = check_progress(self.progress)


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
