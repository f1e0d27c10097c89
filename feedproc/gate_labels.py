"""Gate names beside gate numbers, where the front doors (API, CLI, dashboard) show or take gates.

`Feed` and the store speak gate numbers; a queue's pipeline names them (issue 22). What the front
doors show gets the name added beside the number: `gate_name` next to a row's `gate` (null for a
gate the pipeline does not name) and `gate_names` (`{"0": "ocr", ...}`, the pipeline's gates) next
to per-gate counts. Objects of a queue without a pipeline get nothing added: they stay exactly what
`Feed` returns, so clients that know nothing of pipelines see nothing new. A gate filter takes a
name too (`gate_filter`).

Showing must not fail for want of a name: a stored pipeline that cannot be read shows numbers only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .core.errors import InvalidInput
from .core.models import check_gate

if TYPE_CHECKING:
    from .feed import Feed

#: A gate given as digits (a query string, a command-line option) is a number, not a name.
_DIGITS = re.compile(r"-?[0-9]{1,20}")


def gate_filter(feed: Feed, key: str, value: int | str | None, where: str = "gate: ") -> int | None:
    """A gate filter on partition `key`'s items as a number: digits or a number as they are, a name
    by the pipeline of the partition's queue; InvalidInput (naming it) for a name it does not have."""
    if value is None:
        return None
    if isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
        value = int(value)
    with feed.gate_naming(key=key):
        return check_gate(value, where)


def label(gate: Any, name: str | None) -> str:
    """`1 (ocr)`, or `1` without a name."""
    return f"{gate} ({name})" if name else str(gate)


def with_name(row: dict[str, Any], names: dict[int, str], field: str = "gate") -> dict[str, Any]:
    """`row` with `<field>_name` right after `field` (its name, or None); `row` itself when `names`
    is empty (the queue has no pipeline) or it has no such field."""
    if not names or field not in row:
        return row
    out: dict[str, Any] = {}
    for k, v in row.items():
        out[k] = v
        if k == field:
            out[f"{field}_name"] = names.get(v) if isinstance(v, int) else None
    return out


class GateNames:
    """Gate number -> name per queue, every stored pipeline read once (one query), when first needed:
    one per request or command, so that a page of partitions of many queues costs one read."""

    def __init__(self, feed: Feed) -> None:
        self.feed = feed
        self._by_queue: dict[str, dict[int, str]] | None = None

    def of(self, queue: str | None) -> dict[int, str]:
        """The names of `queue`'s gates (empty without a pipeline)."""
        if self._by_queue is None:
            try:
                self._by_queue = {spec.queue: spec.numbers for spec in self.feed.pipelines()}
            except InvalidInput:  # a stored pipeline this version cannot read: numbers only
                self._by_queue = {}
        return self._by_queue.get(queue, {}) if queue is not None else {}

    def any(self) -> bool:
        """Whether any queue has a pipeline."""
        self.of(None)
        return bool(self._by_queue)

    def of_items(self, key: str, rows: list[dict[str, Any]]) -> dict[int, str]:
        """The names for rows of partition `key`'s items (which do not carry its queue): its queue is
        read only when some queue has a pipeline at all."""
        if not rows or not self.any():
            return {}
        return self.of(self.feed.queue_of(key))

    def row(self, row: dict[str, Any], queue: str | None = None) -> dict[str, Any]:
        """A row with `queue` and `gate` (a lease, a running item, a failure): `gate_name` added."""
        return with_name(row, self.of(queue if queue is not None else row.get("queue")))

    def rows(self, rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        return [self.row(row) for row in rows]

    def status(self, status: dict[str, Any]) -> dict[str, Any]:
        """A partition's status object (or a row of `Feed.partitions`): `gate_name` beside `gate`,
        `gate_names` beside `gates`, `gate_name` on each failed item."""
        names = self.of(status.get("queue"))
        if not names:
            return status
        out = with_name(status, names)
        if "gates" in out:
            named: dict[str, Any] = {}
            for k, v in out.items():
                named[k] = v
                if k == "gates":
                    named["gate_names"] = {str(number): name for number, name in sorted(names.items())}
            out = named
        if out.get("failed_items"):
            out["failed_items"] = [with_name(f, names) for f in out["failed_items"]]
        return out

    def summary(self, summary: dict[str, Any]) -> dict[str, Any]:
        """The summary object (`status --json` without a key): its recent partitions named."""
        if summary.get("recent"):
            return {**summary, "recent": self.rows(summary["recent"])}
        return summary

    def item(self, item: dict[str, Any]) -> dict[str, Any]:
        """One item (`Feed.item`): `gate_name`, and on each of its deliveries."""
        names = self.of(item.get("queue"))
        if not names:
            return item
        out = with_name(item, names)
        if out.get("history"):
            out["history"] = [with_name(h, names) for h in out["history"]]
        return out
