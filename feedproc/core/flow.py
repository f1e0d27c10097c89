"""Flow control beyond concurrency limits: concurrency groups, rate limits and the room one fetch
(or pull claim) has left while it picks items.

* A partition may carry a `group` (a tenant, a customer). A queue's `group_limit` holds at most N
  items of any one group in flight fleet-wide; a pipeline gate's `group_limit` does so at that gate.
* A `rate` ("600/min") is a token bucket on the database clock: one token per item started, refilled
  at the rate, holding at most `burst` tokens (one second's worth, at least 1) so that over any
  window of T seconds at most rate * T + burst items start. Per queue, per pipeline gate, and
  per group (the queue's `group_rate`: every group its own bucket).

`Room` is the arithmetic of one fetch: what each group and bucket has left, item by item, in
dispatch order. Pure: no database, network or clock.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .errors import InvalidInput
from .models import MAX_INT32, shown

#: Seconds per unit of a rate's spelling.
_UNITS = {
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:/|per)\s*([a-z]+?)s?\s*$")
#: A rate at most, per second (above it a bucket is as good as none), and at least (one a day).
MAX_RATE, MIN_RATE = 1_000_000.0, 1 / 86400.0
#: Characters a group name may have at most (the column's width).
MAX_GROUP = 200


def parse_rate(value: Any, what: str = "rate") -> float:
    """Items per second from `value`: "600/min", "10/s", "5 per second", "100/hour", "2/day", or a
    number (per second). InvalidInput naming `what` otherwise."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        per_second = float(value)
    elif isinstance(value, str) and (match := _RATE.match(value.lower())) and match.group(2) in _UNITS:
        per_second = float(match.group(1)) / _UNITS[match.group(2)]
    else:
        raise InvalidInput(f"{what} must be like 600/min, 10/s or 100/hour, got {shown(value)}")
    if not math.isfinite(per_second) or not MIN_RATE <= per_second <= MAX_RATE:
        raise InvalidInput(f"{what} must be from 1/day to {MAX_RATE:g}/s, got {shown(value)}")
    return per_second


def format_rate(per_second: float) -> str:
    """A rate as people write it: the largest unit in which it is a whole number, else per second."""
    for unit, seconds in (("s", 1.0), ("min", 60.0), ("hour", 3600.0), ("day", 86400.0)):
        count = per_second * seconds
        if abs(count - round(count)) < 1e-9 and round(count) >= 1:
            return f"{round(count)}/{unit}"
    return f"{per_second:g}/s"


def burst(per_second: float) -> float:
    """The tokens a bucket of this rate holds at most: one second's worth, at least one."""
    return max(1.0, per_second)


def refill(tokens: float, elapsed: float, per_second: float) -> float:
    """A bucket's tokens after `elapsed` seconds of refilling from `tokens` (capped at its burst)."""
    return min(burst(per_second), tokens + max(elapsed, 0.0) * per_second)


def check_group(value: Any) -> str | None:
    """`value` if it is a group name (a non-empty printable string of at most MAX_GROUP characters:
    no newline to break a one-line listing) or None."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_GROUP or not value.isprintable():
        raise InvalidInput(f"group must be a non-empty name of at most {MAX_GROUP} characters, got {shown(value)}")
    return value


def check_group_limit(value: Any, what: str = "group limit") -> int:
    """`value` if it is an integer up to MAX_INT32 (< 1: no limit)."""
    if isinstance(value, bool) or not isinstance(value, int) or value > MAX_INT32:
        raise InvalidInput(f"{what} must be an integer up to {MAX_INT32}, got {shown(value)}")
    return value


#: A rate as a setting holds it: items per second (a bucket of its own), or the name of a shared
#: rate (`feedproc rate set NAME 600/min`): one bucket for every queue and gate that names it.
Rate = float | str
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,99}$")


def parse_rate_setting(value: Any, what: str = "rate") -> Rate:
    """A rate setting: a rate (`parse_rate`) or the name of a shared rate."""
    if isinstance(value, str) and _NAME.match(value.strip()):
        return value.strip()
    return parse_rate(value, what)


def check_rate_name(value: Any) -> str:
    """`value` if it names a shared rate: a letter, then letters, digits, `_`, `.` or `-` (100 at most)."""
    if not isinstance(value, str) or not _NAME.match(value):
        raise InvalidInput(
            f"a rate's name must be a letter then letters, digits, _ . or - (100 at most), got {shown(value)}"
        )
    return value


def shown_rate(rate: Rate) -> str:
    """A rate setting as people write it: "600/min"-style, or the shared rate's name."""
    return rate if isinstance(rate, str) else format_rate(rate)


def shared_bucket(name: str) -> str:
    """The bucket of the shared rate `name`."""
    return f"n:{name}"


def queue_bucket(queue: str, rate: Rate = 0.0) -> str:
    return shared_bucket(rate) if isinstance(rate, str) else f"q:{queue}"


def gate_bucket(queue: str, gate: int, rate: Rate = 0.0) -> str:
    return shared_bucket(rate) if isinstance(rate, str) else f"g:{gate}:{queue}"


def group_bucket(queue: str, group: str) -> str:
    return f"p:{queue}:{group}"


@dataclass(frozen=True, slots=True)
class FlowRules:
    """A queue's flow controls, with its pipeline's: group limits and rates (items per second, or
    a shared rate's name; the group rate is each group's own)."""

    group_limit: int | None = None
    gate_group_limits: Mapping[int, int] = field(default_factory=dict)
    rate: Rate | None = None
    gate_rates: Mapping[int, Rate] = field(default_factory=dict)
    group_rate: float | None = None

    @property
    def grouped(self) -> bool:
        """Whether items' groups matter: a group limit or a group rate applies somewhere."""
        return bool(self.group_limit or self.gate_group_limits or self.group_rate)

    @property
    def rated(self) -> bool:
        return bool(self.rate or self.gate_rates or self.group_rate)

    @property
    def any(self) -> bool:
        return self.grouped or self.rated

    def buckets(self, queue: str, groups: Iterable[str]) -> dict[str, float | None]:
        """The token buckets a fetch of `queue` touching `groups` may take from: name -> rate
        (None: a shared rate's, read with its bucket)."""
        found: dict[str, float | None] = {}
        if self.rate:
            found[queue_bucket(queue, self.rate)] = None if isinstance(self.rate, str) else self.rate
        for gate, rate in self.gate_rates.items():
            found[gate_bucket(queue, gate, rate)] = None if isinstance(rate, str) else rate
        if self.group_rate:
            for group in groups:
                found[group_bucket(queue, group)] = self.group_rate
        return found


GroupUse = dict[tuple[str, int], int]  # (group, gate) -> weight in flight


@dataclass
class Room:
    """What one fetch or claim may still take, item by item: per group (its queue-wide and per-gate
    limits, against `used`, the weight in flight elsewhere and here) and per token bucket (`tokens`,
    whole tokens available). `take` admits an item and charges it; `spent` is what was taken from
    each bucket."""

    queue: str
    rules: FlowRules
    used: GroupUse
    tokens: dict[str, int]
    #: Per bucket read: its rate and the part of a token it holds beyond `tokens` (for `next_token_in`).
    rates: Mapping[str, float] = field(default_factory=dict)
    fractions: Mapping[str, float] = field(default_factory=dict)
    read_at: datetime | None = None  # the database's clock when the buckets were read
    stored: frozenset[str] = frozenset()  # the buckets that have a row (the others are written new)
    spent: dict[str, int] = field(default_factory=dict)

    def _buckets_of(self, gate: int, group: str | None) -> list[str]:
        names = []
        if self.rules.rate:
            names.append(queue_bucket(self.queue, self.rules.rate))
        if gate in self.rules.gate_rates:
            names.append(gate_bucket(self.queue, gate, self.rules.gate_rates[gate]))
        if group is not None and self.rules.group_rate:
            names.append(group_bucket(self.queue, group))
        return list(dict.fromkeys(names))  # a queue and its gate may name one shared rate: one token

    def group_weight(self, group: str, gate: int | None = None) -> int:
        """Weight in flight of `group` (at `gate`, or at every gate)."""
        return sum(w for (g, at), w in self.used.items() if g == group and (gate is None or at == gate))

    def group_full(self, group: str, gate: int | None = None) -> bool:
        """Whether `group` has no slot left in the queue (or at `gate`), or no token."""
        limit = self.rules.group_limit
        if limit and self.group_weight(group) >= limit:
            return True
        at_gate = self.rules.gate_group_limits.get(gate) if gate is not None else None
        if at_gate and self.group_weight(group, gate) >= at_gate:
            return True
        name = group_bucket(self.queue, group)
        return bool(self.rules.group_rate) and self.tokens.get(name, 0) <= 0

    def gate_dry(self, gate: int) -> bool:
        """Whether `gate`'s bucket has no token (its items are not fetched now)."""
        rate = self.rules.gate_rates.get(gate)
        return rate is not None and self.tokens.get(gate_bucket(self.queue, gate, rate), 0) <= 0

    @property
    def queue_dry(self) -> bool:
        rate = self.rules.rate
        return bool(rate) and self.tokens.get(queue_bucket(self.queue, rate or 0.0), 0) <= 0

    def take(self, gate: int, group: str | None, weight: int) -> bool:
        """Admit an item of `group` at `gate` of `weight` if every limit and bucket has room, and
        charge it; False (nothing charged) otherwise. A weight above a group limit counts as the
        limit (such an item runs alone in its group)."""
        names = self._buckets_of(gate, group)
        if any(self.tokens.get(name, 0) <= 0 for name in names):
            return False
        if group is not None:
            limit, at_gate = self.rules.group_limit, self.rules.gate_group_limits.get(gate)
            if limit and self.group_weight(group) + min(weight, limit) > limit:
                return False
            if at_gate and self.group_weight(group, gate) + min(weight, at_gate) > at_gate:
                return False
            charged = min(weight, *(n for n in (limit, at_gate) if n)) if (limit or at_gate) else weight
            self.used[(group, gate)] = self.used.get((group, gate), 0) + charged
        for name in names:
            self.tokens[name] -= 1
            self.spent[name] = self.spent.get(name, 0) + 1
        return True

    def next_token_in(self) -> float | None:
        """Seconds until the first dry bucket has a whole token again; None when none is dry."""
        waits = [
            (1.0 - self.fractions.get(name, 0.0)) / rate
            for name, rate in self.rates.items()
            if self.tokens.get(name, 0) <= 0
        ]
        return max(min(waits), 0.0) if waits else None


def encode_group_slots(used: Mapping[tuple[str, int], int]) -> str | None:
    """A watcher's weight in flight per (group, gate) as stored: JSON [[group, gate, weight], ...]."""
    rows = [[group, gate, weight] for (group, gate), weight in sorted(used.items()) if weight > 0]
    return json.dumps(rows, ensure_ascii=False) if rows else None


def decode_group_slots(text: str | None) -> GroupUse:
    """What `encode_group_slots` wrote."""
    used: GroupUse = {}
    for group, gate, weight in json.loads(text) if text else ():
        used[(str(group), int(gate))] = used.get((str(group), int(gate)), 0) + int(weight)
    return used


# ---------------------------------------------------------------- adaptive concurrency

#: A push-back cuts a gate's window to this share of itself (multiplicative decrease).
BACKOFF = 0.75
#: Seconds (database clock) a cut holds before another push-back may cut again: reporters that saw
#: the same overload at once cut once. (Each watcher also ignores push-backs of deliveries it
#: started before it learned of the last cut: they answer to the old window.)
CUT_INTERVAL = 0.05


@dataclass(frozen=True, slots=True)
class GateReport:
    """What one watcher saw at a gate since its last report: push-backs (429, 503, timeouts of
    deliveries started under the window it knew), answers that succeeded, its calls running there
    now, and the window it knew (`under`; None: none)."""

    pushbacks: int = 0
    successes: int = 0
    in_flight: int = 0
    under: float | None = None


def adapted(
    width: float | None, report: GateReport, *, fleet: int, ceiling: int, since_cut: float | None
) -> float | None:
    """A gate's concurrency window after `report` (AIMD): a push-back cuts it to BACKOFF of itself
    (the first one to BACKOFF of `fleet`, the estimate of what the fleet runs there, at most
    `ceiling`), at least 1. Only a push-back under the window as it is cuts it: a watcher that knew
    a larger one, or none, saw the overload a cut answered already (it learns the window instead);
    nor does one within CUT_INTERVAL of the last cut. Successes grow it by one per window's worth of
    them; grown to `ceiling` (what the fleet may run at all) it is gone (None: no window)."""
    if report.pushbacks:
        if width is None:
            return max(1.0, min(max(fleet, 1), ceiling) * BACKOFF)
        stale = report.under is None or report.under > width + 1e-9
        if stale or (since_cut is not None and since_cut < CUT_INTERVAL):
            return width
        return max(1.0, width * BACKOFF)
    if width is None:
        return None
    grown = width + report.successes / width
    return None if grown >= ceiling else grown
