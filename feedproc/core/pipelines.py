"""Pipelines: a queue's gates named, each routed to its own handler with its own settings, and the
partitions it starts on a schedule.

A `PipelineSpec` is what `feedproc pipeline apply FILE.toml` stores (as the JSON of `to_mapping`)
and every watcher of the queue follows. It is checked whole when it is made, so a stored pipeline
is always one a watcher can serve:

```toml
queue = "uploads"
priority = 10              # optional: partitions added to the queue without a priority (or weight) get it

[defaults]                 # optional: every gate's settings unless the gate says otherwise
timeout = 30

[[gate]]
name = "list"
number = 0
handler = "http://127.0.0.1:8081/"

[[gate]]
name = "ocr"
number = 1
handler = "http://127.0.0.1:8082/"
limit = 8                  # at most 8 items at this gate in flight, fleet-wide
partition_limit = 2        # and at most 2 of any one partition
timeout = 120

[hooks]                    # optional: called once each partition finishes (completed, failed, cancelled)
on_complete = "https://app.example/hooks/uploads"

[[schedule]]
name = "nightly"
cron = "0 2 * * *"
timezone = "Europe/Berlin"
key = "nightly-{date:%Y%m%d}"
items = [{gate = "list", data = {folder = "/incoming"}}]
```

Pure: no database, network or clock.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from typing import Any, cast

from . import windows as timewindows
from .errors import InvalidInput
from .fanin import COLLECT_INLINE, Tolerance, check_operations
from .flow import FlowRules, parse_rate_setting, shown_rate
from .gate_names import check_gate_name, naming
from .hooks import check_hooks
from .models import (
    MAX_GATE,
    MAX_INT32,
    NewItem,
    check_gate,
    check_priority,
    check_queue,
    check_weight,
    encode_json,
    gate_problem,
    shown,
)
from .policy import RetryPolicy
from .redaction import credentials_conflict, redact_url

#: Items a batch delivery holds at most (the watcher's `--batch` bound too).
MAX_BATCH = 1000

#: The settings a gate may give (and `[defaults]` may give every gate), with their types.
GATE_SETTINGS: dict[str, type] = {
    "timeout": float,
    "item_timeout": float,
    "max_attempts": int,
    "max_not_yet": int,
    "max_time": float,
    "retry_delay": float,
    "max_retry_delay": float,
    "limit": int,
    "partition_limit": int,
    "group_limit": int,
    "rate": str,
    "windows": list,
    "timezone": str,
    "batch": int,
    "headers": dict,
    # Fan-in (core/fanin.py): the earlier gate whose results this gate's items receive (a name or
    # a number), how many of them travel inline, the failures the gate tolerates, and how answers'
    # `accumulate` numbers merge into the partition's accumulator.
    "collect": str,
    "collect_inline": int,
    "tolerate": str,
    "accumulate": dict,
}
_GATE_KEYS = {"name", "number", "handler", "processor", *GATE_SETTINGS}
_SCHEDULE_KEYS = {"name", "cron", "timezone", "key", "items", "priority"}


@dataclass(frozen=True, slots=True)
class GateSpec:
    """One gate of a pipeline: its name and number, where its items go (a handler URL or a Python
    processor `module:attr`; neither: the watcher's own processor), and its settings (None: the
    watcher's)."""

    name: str
    number: int
    handler: str | None = None
    processor: str | None = None
    timeout: float | None = None  # seconds one HTTP request may take
    item_timeout: float | None = None  # seconds a processor call may take
    max_attempts: int | None = None
    max_not_yet: int | None = None  # "not yet" answers of one item at this gate before it fails
    max_time: float | None = None  # seconds a partition may spend at this gate before it fails
    retry_delay: float | None = None
    max_retry_delay: float | None = None
    limit: int | None = None  # items of this gate in flight fleet-wide, by weight
    partition_limit: int | None = None  # items of one partition at this gate in flight at once
    group_limit: int | None = None  # items of one concurrency group at this gate in flight, fleet-wide
    rate: str | None = None  # items of this gate started at most, fleet-wide: "600/min", or a shared rate's name
    windows: str | None = None  # "22:00-06:00,12:00-13:00": when items of this gate may start
    timezone: str | None = None  # of the windows (None: UTC)
    batch: int | None = None  # items of one partition delivered in one call at most
    headers: tuple[tuple[str, str], ...] = ()  # extra headers on this gate's handler requests
    collect: int | None = None  # an earlier gate whose items' results (and the accumulator) this gate's items get
    collect_inline: int | None = None  # collected results sent inline at most (None: fanin.COLLECT_INLINE)
    tolerate: str | None = None  # "5%" or a count: failed items of this gate that do not fail the partition
    accumulate: tuple[tuple[str, str], ...] = ()  # name -> operation (sum, min, max, count)

    @property
    def tolerance(self) -> Tolerance | None:
        """The failures this gate tolerates, or None (any failure fails the partition once the gate drains)."""
        return Tolerance.parse(self.tolerate) if self.tolerate is not None else None

    @property
    def operations(self) -> dict[str, str]:
        """How answers' `accumulate` numbers merge at this gate: name -> operation."""
        return dict(self.accumulate)

    def policy(self, base: RetryPolicy) -> RetryPolicy:
        """`base` (the watcher's) with this gate's attempts, backoff and "not yet" bound where it gives them."""
        if (
            self.max_attempts is None
            and self.retry_delay is None
            and self.max_retry_delay is None
            and self.max_not_yet is None
        ):
            return base
        return RetryPolicy(
            self.max_attempts if self.max_attempts is not None else base.max_attempts,
            self.retry_delay if self.retry_delay is not None else base.retry_delay,
            self.max_retry_delay if self.max_retry_delay is not None else base.max_retry_delay,
            base.not_yet_delay,
            self.max_not_yet if self.max_not_yet is not None else base.max_not_yet,
        )

    @property
    def parsed_windows(self) -> tuple[timewindows.Window, ...]:
        return timewindows.parse_windows(self.windows)

    def to_mapping(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "number": self.number}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in out or value is None or value == ():
                continue
            if f.name == "windows":
                value = value.split(",")
            elif f.name in ("headers", "accumulate"):
                value = dict(value)
            out[f.name] = value
        return out


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """Partitions started on a schedule: at every tick of `cron` (five fields, or six with seconds
    last) in `timezone`, a partition keyed `key.format(date=<the tick in that zone>)` with `items`
    and `priority` (its own, else its pipeline's, else 0), created once per tick across every watcher."""

    name: str
    cron: str
    key: str
    timezone: str = "UTC"
    items: tuple[NewItem, ...] = ()
    priority: int = 0

    def to_mapping(self, gate_names: Mapping[int, str]) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "cron": self.cron, "timezone": self.timezone, "key": self.key}
        out["items"] = [{"gate": gate_names.get(i.gate, i.gate), "data": _json_of(i.data)} for i in self.items]
        out["priority"] = self.priority
        return out


@dataclass(frozen=True, slots=True)
class PipelineSpec:
    """A queue's pipeline: its gates in number order and its schedules. `version` is the stored
    version (0: not stored)."""

    queue: str
    gates: tuple[GateSpec, ...]
    schedules: tuple[ScheduleSpec, ...] = ()
    version: int = 0
    #: Its completion hooks ([hooks]): (on_complete | on_fail | on_cancel, URL or "python"), sorted.
    #: Applied, they replace the queue's; a pipeline without them leaves the queue's alone.
    hooks: tuple[tuple[str, str], ...] = ()
    #: The priority and weight of a partition added to the queue without its own (a partition has
    #: one priority, whatever its gate: so these are the pipeline's, not a gate's). Applied, they
    #: become the queue's defaults; a pipeline without them leaves the queue's alone.
    priority: int | None = None
    weight: int | None = None
    _by_number: dict[int, GateSpec] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_number.update({gate.number: gate for gate in self.gates})

    @property
    def names(self) -> dict[str, int]:
        """Gate name -> number."""
        return {gate.name: gate.number for gate in self.gates}

    @property
    def numbers(self) -> dict[int, str]:
        """Gate number -> name."""
        return {gate.number: gate.name for gate in self.gates}

    def gate(self, number: int) -> GateSpec | None:
        """The gate of that number, if the pipeline has it."""
        return self._by_number.get(number)

    def number(self, gate: int | str) -> int:
        """A gate's number from its number or name; InvalidInput for a name the pipeline lacks."""
        if isinstance(gate, str):
            if gate not in self.names:
                raise InvalidInput(
                    f"unknown gate {gate!r}: the pipeline of queue {self.queue!r} has {', '.join(self.names)}"
                )
            return self.names[gate]
        if problem := gate_problem(gate):
            raise InvalidInput(problem)
        return int(gate)

    @property
    def limits(self) -> dict[int, int]:
        """Gate number -> its fleet-wide concurrency limit, for the gates that have one."""
        return {gate.number: gate.limit for gate in self.gates if gate.limit}

    @property
    def flow(self) -> FlowRules:
        """Its gates' group limits and rates (items per second), for the gates that have them."""
        return FlowRules(
            gate_group_limits={gate.number: gate.group_limit for gate in self.gates if gate.group_limit},
            gate_rates={gate.number: parse_rate_setting(gate.rate) for gate in self.gates if gate.rate},
        )

    def closed_gates(self, now: datetime) -> list[int]:
        """Numbers of the gates outside their time windows at `now` (aware): items there do not start."""
        return [
            gate.number
            for gate in self.gates
            if gate.windows is not None
            and not timewindows.is_open(gate.parsed_windows, timewindows.zone(gate.timezone), now)
        ]

    def to_mapping(self) -> dict[str, Any]:
        """The pipeline as TOML's shape in plain values (what is stored, as JSON, and shown)."""
        out: dict[str, Any] = {"queue": self.queue, "gate": [gate.to_mapping() for gate in self.gates]}
        if self.priority is not None:
            out["priority"] = self.priority
        if self.weight is not None:
            out["weight"] = self.weight
        if self.schedules:
            out["schedule"] = [schedule.to_mapping(self.numbers) for schedule in self.schedules]
        if self.hooks:
            out["hooks"] = dict(self.hooks)
        return out

    def shown(self) -> dict[str, Any]:
        """`to_mapping` with its `version`, fit to show (status, the API, `pipeline show`): a
        handler URL's `user:password@` as `***@`, header values as `***`."""
        out = {"version": self.version, **self.to_mapping()}
        for gate in out["gate"]:
            if "handler" in gate:
                gate["handler"] = redact_url(gate["handler"])
            if "headers" in gate:
                gate["headers"] = dict.fromkeys(gate["headers"], "***")
        if "hooks" in out:
            out["hooks"] = {hook: redact_url(target) for hook, target in out["hooks"].items()}
        return out

    def with_version(self, version: int) -> PipelineSpec:
        return PipelineSpec(self.queue, self.gates, self.schedules, version, self.hooks, self.priority, self.weight)


@dataclass(frozen=True, slots=True)
class Collects:
    """What an item collects (fan-in): the results of `gate` (named `name` in the pipeline, if it
    is), `inline` of them at most sent inside a request."""

    gate: int
    name: str | None = None
    inline: int = COLLECT_INLINE


def collects(spec: PipelineSpec | None, gate: int, collect: int | None) -> Collects | None:
    """What an item at `gate` collects under pipeline `spec`: its gate's `collect` setting, else the
    item's own (`collect`, given when it was added to a queue without a pipeline saying so); None
    when it collects nothing (nearly every item: one attribute read)."""
    settings = spec.gate(gate) if spec is not None else None
    if settings is not None and settings.collect is not None:
        collected = spec.gate(settings.collect) if spec is not None else None
        inline = settings.collect_inline if settings.collect_inline is not None else COLLECT_INLINE
        return Collects(settings.collect, collected.name if collected is not None else None, inline)
    if collect is None:
        return None
    collected = spec.gate(collect) if spec is not None else None
    inline = settings.collect_inline if settings is not None and settings.collect_inline is not None else COLLECT_INLINE
    return Collects(collect, collected.name if collected is not None else None, inline)


def parse_toml(text: str, *, source: str = "pipeline") -> PipelineSpec:
    """A pipeline from its TOML text: InvalidInput naming the problem (and `source`) otherwise."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise InvalidInput(f"{source}: invalid TOML: {error}") from None
    return from_mapping(document, source=source)


def from_mapping(document: Mapping[str, Any], *, source: str = "pipeline", version: int = 0) -> PipelineSpec:
    """A pipeline from its TOML shape (also what is stored): every value checked, InvalidInput
    naming the first problem and where it is."""
    if not isinstance(document, Mapping):
        raise InvalidInput(f"{source}: a pipeline is a table")
    unknown = set(document) - {"queue", "priority", "weight", "defaults", "gate", "schedule", "hooks"}
    if unknown:
        raise InvalidInput(
            f"{source}: unknown key(s) {', '.join(sorted(unknown))}"
            " (queue, priority, weight, defaults, gate, schedule, hooks)"
        )
    priority, weight = document.get("priority"), document.get("weight")
    if priority is not None:
        check_priority(priority, f"{source}: priority")
    if weight is not None:
        check_weight(weight, f"{source}: weight")
    try:
        queue = check_queue(document.get("queue", "default"))
    except InvalidInput as error:
        raise InvalidInput(f"{source}: {error}") from None
    defaults = document.get("defaults", {})
    if not isinstance(defaults, Mapping):
        raise InvalidInput(f"{source}: [defaults] must be a table")
    bad = set(defaults) - set(GATE_SETTINGS)
    if bad:
        raise InvalidInput(f"{source}: [defaults]: unknown setting(s) {', '.join(sorted(bad))}")
    raw_gates = document.get("gate", [])
    if not isinstance(raw_gates, list) or not raw_gates:
        raise InvalidInput(f"{source}: a pipeline needs at least one [[gate]]")
    gates: list[GateSpec] = []
    for n, raw in enumerate(raw_gates, start=1):
        where = f"{source}: gate {n}: "
        if not isinstance(raw, Mapping):
            raise InvalidInput(f"{where}a gate is a table")
        gates.append(_gate({**defaults, **raw}, where))
    seen_names: set[str] = set()
    seen_numbers: set[int] = set()
    for gate in gates:
        if gate.name in seen_names:
            raise InvalidInput(f"{source}: two gates are named {gate.name!r}")
        if gate.number in seen_numbers:
            raise InvalidInput(f"{source}: two gates have number {gate.number}")
        seen_names.add(gate.name)
        seen_numbers.add(gate.number)
    gates.sort(key=lambda gate: gate.number)
    names = {gate.name: gate.number for gate in gates}
    gates = [_resolve_collect(gate, names, source) for gate in gates]
    raw_schedules = document.get("schedule", [])
    if not isinstance(raw_schedules, list):
        raise InvalidInput(f"{source}: schedule must be an array of tables ([[schedule]])")
    schedules: list[ScheduleSpec] = []
    for n, raw in enumerate(raw_schedules, start=1):
        where = f"{source}: schedule {n}: "
        if not isinstance(raw, Mapping):
            raise InvalidInput(f"{where}a schedule is a table")
        with naming(names, f"queue {queue!r}"):
            schedules.append(_schedule(raw, where, priority or 0))
    if len({s.name for s in schedules}) != len(schedules):
        raise InvalidInput(f"{source}: two schedules have the same name")
    hooks = check_hooks(document.get("hooks", {}), where=f"{source}: [hooks]")
    hooks_given = tuple(sorted(hooks.items()))
    return PipelineSpec(queue, tuple(gates), tuple(schedules), version, hooks_given, priority, weight)


def _named(raw: Mapping[str, Any], keys: set[str], where: str, kind: str) -> tuple[str, str]:
    """A gate's or a schedule's table checked for unknown keys, and its name; with `where` now
    naming it ("uploads.toml: gate 'ocr': ") instead of its position."""
    unknown = set(raw) - keys
    if unknown == {"transactional"} and kind == "gate":  # the code's, not stored: say where it goes
        raise InvalidInput(
            f"{where}transactional is not a stored setting: it is a Python processor's "
            "(`transactional = True`, or `@pipeline.gate(..., transactional=True)`); "
            "an HTTP handler cannot complete in feedproc's transaction"
        )
    if unknown:
        raise InvalidInput(f"{where}unknown key(s) {', '.join(sorted(unknown))}")
    try:
        name = check_gate_name(raw.get("name"))
    except ValueError as error:
        raise InvalidInput(f"{where}{str(error).replace('gate name', f'{kind} name')}") from None
    return name, f"{where.rsplit(': ', 2)[0]}: {kind} {name!r}: "


def _gate(raw: Mapping[str, Any], where: str) -> GateSpec:
    name, where = _named(raw, _GATE_KEYS, where, "gate")
    number = raw.get("number")
    if problem := gate_problem(number):
        raise InvalidInput(f"{where}number: {problem}")
    handler, processor = raw.get("handler"), raw.get("processor")
    if handler is not None and processor is not None:
        raise InvalidInput(f"{where}give a handler or a processor, not both")
    if handler is not None and (not isinstance(handler, str) or not handler.startswith(("http://", "https://"))):
        raise InvalidInput(f"{where}handler must be an http:// or https:// URL, got {shown(handler)}")
    if processor is not None and (not isinstance(processor, str) or ":" not in processor):
        raise InvalidInput(f"{where}processor must be module:attr, got {shown(processor)}")
    values: dict[str, Any] = {}
    for key in ("timeout", "item_timeout", "retry_delay", "max_retry_delay", "max_time"):
        if key in raw:
            values[key] = _seconds(raw[key], f"{where}{key}", positive=key != "retry_delay")
    for key, low, high in (
        ("max_attempts", 1, MAX_INT32),
        ("max_not_yet", 1, MAX_INT32),
        ("limit", 1, MAX_INT32),
        ("partition_limit", 1, MAX_INT32),
        ("group_limit", 1, MAX_INT32),
        ("batch", 1, MAX_BATCH),
    ):
        if key in raw:
            value = raw[key]
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise InvalidInput(f"{where}{key} must be an integer from {low} to {high}, got {shown(value)}")
            values[key] = value
    if "rate" in raw:
        try:
            rate = parse_rate_setting(raw["rate"])
            values["rate"] = raw["rate"].strip() if isinstance(raw["rate"], str) else shown_rate(rate)
        except InvalidInput as error:
            raise InvalidInput(f"{where}{error}") from None
    if "windows" in raw:
        spec = raw["windows"]
        spec = [spec] if isinstance(spec, str) else spec
        if not isinstance(spec, list) or not all(isinstance(w, str) for w in spec):
            raise InvalidInput(f'{where}windows must be a list like ["22:00-06:00"]')
        try:
            values["windows"] = timewindows.format_windows(timewindows.parse_windows(spec))
        except InvalidInput as error:
            raise InvalidInput(f"{where}{error}") from None
    if "timezone" in raw:
        try:
            timewindows.zone(raw["timezone"])
        except InvalidInput as error:
            raise InvalidInput(f"{where}{error}") from None
        values["timezone"] = raw["timezone"]
    if "headers" in raw:
        headers = raw["headers"]
        if not isinstance(headers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) and "\n" not in k + v for k, v in headers.items()
        ):
            raise InvalidInput(f'{where}headers must be a table of strings, like {{Authorization = "Bearer ..."}}')
        values["headers"] = tuple(sorted(headers.items()))
        if isinstance(handler, str) and (conflict := credentials_conflict(handler, headers)):
            raise InvalidInput(f"{where}{conflict}")
    values.update(_fan_in(raw, where))
    return GateSpec(name, cast(int, number), handler, processor, **values)


def _fan_in(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A gate's fan-in settings checked (`collect` is resolved to a number once every gate is known)."""
    values: dict[str, Any] = {}
    if "collect" in raw:
        collect = raw["collect"]
        if isinstance(collect, bool) or not isinstance(collect, int | str):
            raise InvalidInput(f"{where}collect must be a gate's name or number, got {shown(collect)}")
        values["collect"] = collect
    if "collect_inline" in raw:
        inline = raw["collect_inline"]
        if isinstance(inline, bool) or not isinstance(inline, int) or not 0 <= inline <= 100_000:
            raise InvalidInput(f"{where}collect_inline must be an integer from 0 to 100000, got {shown(inline)}")
        values["collect_inline"] = inline
    if "tolerate" in raw:
        try:
            values["tolerate"] = str(Tolerance.parse(raw["tolerate"]))
        except ValueError as error:
            raise InvalidInput(f"{where}{error}") from None
    if "accumulate" in raw:
        try:
            values["accumulate"] = tuple(sorted(check_operations(raw["accumulate"]).items()))
        except ValueError as error:
            raise InvalidInput(f"{where}{error}") from None
    return values


def _resolve_collect(gate: GateSpec, names: Mapping[str, int], source: str) -> GateSpec:
    """`gate` with its `collect` as the number of an earlier gate of the pipeline."""
    wanted: Any = gate.collect
    if wanted is None:
        return gate
    if isinstance(wanted, str):
        if wanted not in names:
            raise InvalidInput(
                f"{source}: gate {gate.name!r}: collect: unknown gate {wanted!r} (the pipeline has {', '.join(names)})"
            )
        wanted = names[wanted]
    elif problem := gate_problem(wanted):
        raise InvalidInput(f"{source}: gate {gate.name!r}: collect: {problem}")
    if wanted >= gate.number:
        raise InvalidInput(f"{source}: gate {gate.name!r}: collect must name an earlier gate, got gate {wanted}")
    return replace(gate, collect=wanted)


def _seconds(value: Any, what: str, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise InvalidInput(f"{what} must be a number of seconds, got {shown(value)}")
    if positive and value == 0:
        raise InvalidInput(f"{what} must be more than 0 seconds")
    return float(value)


def _schedule(raw: Mapping[str, Any], where: str, default_priority: int) -> ScheduleSpec:
    from .schedules import check_cron, render_key  # the cron parser, kept out of the module's import cost

    name, where = _named(raw, _SCHEDULE_KEYS, where, "schedule")
    timezone = raw.get("timezone", "UTC")
    try:
        timewindows.zone(timezone)
    except InvalidInput as error:
        raise InvalidInput(f"{where}{error}") from None
    cron = raw.get("cron")
    try:
        check_cron(cron)
    except ValueError as error:
        raise InvalidInput(f"{where}{error}") from None
    key = raw.get("key")
    if not isinstance(key, str) or "{date" not in key:
        raise InvalidInput(f"{where}key must be a template with {{date...}}, like 'nightly-{{date:%Y%m%d}}'")
    try:
        render_key(key, timezone_name=timezone)
    except ValueError as error:
        raise InvalidInput(f"{where}{error}") from None
    priority = check_priority(raw.get("priority", default_priority), f"{where}priority")
    raw_items = raw.get("items", [])
    if not isinstance(raw_items, list):
        raise InvalidInput(f'{where}items must be a list like [{{gate = "list", data = {{}}}}]')
    items: list[NewItem] = []
    for n, row in enumerate(raw_items, start=1):
        if not isinstance(row, Mapping) or set(row) - {"gate", "data"}:
            raise InvalidInput(f"{where}item {n}: expected {{gate = ..., data = ...}}")
        gate = check_gate(row.get("gate", 0), f"{where}item {n}: ")
        items.append(NewItem(gate, encode_json(row.get("data"), f"{where}item {n}: ")))
    return ScheduleSpec(name, cast(str, cron), key, timezone, tuple(items), priority)


def _json_of(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return data.decode("utf-8", "replace")


__all__ = [
    "GATE_SETTINGS",
    "MAX_GATE",
    "GateSpec",
    "PipelineSpec",
    "ScheduleSpec",
    "from_mapping",
    "parse_toml",
]
