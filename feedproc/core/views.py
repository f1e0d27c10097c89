"""What `Feed`'s reads return: frozen records, typed field by field (issue 32).

Each read's result is a frozen dataclass (`PartitionStatus`, `ItemView`, `QueueView`, ...) whose
nested records are dataclasses too; genuine maps (counts per status, per gate) stay maps.
`to_json()` gives the object the read returned before these types existed, key for key and in the
same order (timestamps ISO 8601 strings, an item's data and result bytes): the API, the CLI's
`--json` and the dashboard show exactly that, so their output did not change.

Indexing a view as the dict it replaced (`status["items"]`, `.get`, `.keys`) still works for one
release, with a `ViewKeyAccess` warning (a DeprecationWarning) naming the attribute to use instead:
it answers from `to_json()`, so nested values come back as the dicts and lists they were. A view
never equals a dict: compare its `to_json()`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

if TYPE_CHECKING:  # mypy reports each use of the dict-style access (error code `deprecated`)
    from typing_extensions import deprecated
else:

    def deprecated(_message: str) -> Callable[[Any], Any]:
        return lambda method: method


V = TypeVar("V", bound="View")


class ViewKeyAccess(DeprecationWarning):
    """A view read as the dict it replaced (`view["key"]`): use the attribute (`view.key`)."""


class View:
    """Base of the views: `to_json()`, `from_json()` and the deprecated dict-style access."""

    __slots__ = ()
    #: Fields left out of `to_json()` when they hold this value (keys the old dict had only sometimes).
    _omitted: ClassVar[Mapping[str, object]] = {}
    #: How a field's JSON value becomes its typed value (nested records); the others are taken as they are.
    _nested: ClassVar[Mapping[str, Callable[[Any], Any]]] = {}

    @classmethod
    def from_json(cls: type[V], raw: Mapping[str, Any]) -> V:
        """The view of `raw`, an object as the store reads it (TypeError for a key it does not know)."""
        nested = cls._nested
        return cls(**{k: nested[k](v) if k in nested else v for k, v in raw.items()})

    def to_json(self) -> dict[str, Any]:
        """The object as the read returned it before it was typed (and as the API shows it)."""
        out: dict[str, Any] = {}
        omitted = self._omitted
        for name in _names(type(self)):
            value = getattr(self, name)
            if name in omitted and value is omitted[name]:
                continue
            out[name] = value if type(value) in _SCALARS else _plain(value)
        return out

    # -------------------------------------------------- deprecated: the dict these views replaced

    def _old(self, key: str) -> None:
        warnings.warn(
            f"{type(self).__name__}[{key!r}] is deprecated: use the attribute .{key} (to_json() for the dict)",
            ViewKeyAccess,
            stacklevel=3,
        )

    @deprecated("read a view by attribute (view.key), or its to_json()")
    def __getitem__(self, key: str) -> Any:
        self._old(key)
        return self.to_json()[key]

    @deprecated("read a view by attribute (view.key), or its to_json()")
    def get(self, key: str, default: Any = None) -> Any:
        """Deprecated: `getattr(view, key, default)`, or `to_json().get(key)`."""
        self._old(key)
        return self.to_json().get(key, default)

    @deprecated("read a view by attribute (view.key), or its to_json()")
    def keys(self) -> Any:
        """Deprecated: `to_json().keys()`."""
        self._old("keys")
        return self.to_json().keys()

    @deprecated("read a view by attribute (view.key), or its to_json()")
    def __contains__(self, key: object) -> bool:
        self._old(str(key))
        return key in self.to_json()

    @deprecated("read a view by attribute (view.key), or its to_json()")
    def __iter__(self) -> Iterator[str]:
        self._old("__iter__")
        return iter(self.to_json())


def listed_json(views: Iterable[View]) -> list[dict[str, Any]]:
    """Each view's `to_json()`: a read's list as the front doors show it."""
    return [view.to_json() for view in views]


_SCALARS = frozenset({str, int, float, bool, bytes, type(None)})


_NAMES: dict[type, tuple[str, ...]] = {}


def _names(view: type[View]) -> tuple[str, ...]:
    """A view's fields in declaration order, the order of its JSON's keys (read once per class:
    dataclasses.fields() took two thirds of to_json()'s time)."""
    names = _NAMES.get(view)
    if names is None:
        names = _NAMES[view] = tuple(f.name for f in fields(view))  # type: ignore[arg-type]
    return names


def _plain(value: Any) -> Any:
    if isinstance(value, View):
        return value.to_json()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def one(view: type[V]) -> Callable[[Any], V | None]:
    """A nested record, or None."""
    return lambda raw: None if raw is None else view.from_json(raw)


def many(view: type[V]) -> Callable[[Any], tuple[V, ...]]:
    """A list of nested records, as a tuple."""
    return lambda raw: tuple(view.from_json(r) for r in raw)


def by_key(view: type[V]) -> Callable[[Any], dict[str, V]]:
    """A map of nested records (per gate), in its order."""
    return lambda raw: {k: view.from_json(r) for k, r in raw.items()}


def _counts_by_gate(raw: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    return {gate: dict(counts) for gate, counts in raw.items()}


# ---------------------------------------------------------------- partitions


@dataclass(frozen=True, slots=True)
class Lease(View):
    """Who holds a partition's lease, until when (ISO 8601)."""

    owner: str
    expires_at: str | None


@dataclass(frozen=True, slots=True)
class StatusLease(View):
    """A partition's lease as its status shows it: with the watcher that asked for it (`wanted_by`)."""

    owner: str
    expires_at: str | None
    wanted_by: str | None


@dataclass(frozen=True, slots=True)
class FailedItem(View):
    """A failed item of a partition's status (the first FAILED_ITEMS_SHOWN)."""

    id: int
    gate: int
    attempts: int
    last_error: str | None


@dataclass(frozen=True, slots=True)
class Tolerated(View):
    """A gate's failures against its tolerance: `failed`, `allowed` ("5%" or a count), whether
    `exceeded`; in one partition's status also `items` (those that reached the gate) and `limit`
    (how many of them may fail), None in a list of partitions."""

    _omitted: ClassVar[Mapping[str, object]] = {"items": None, "limit": None}

    failed: int
    allowed: str
    items: int | None = field(default=None, kw_only=True)  # kw_only: optional, and still in JSON order
    limit: int | None = field(default=None, kw_only=True)
    exceeded: bool


@dataclass(frozen=True, slots=True)
class HistoryEntry(View):
    """One event of a partition's history: when, its kind, the item and watcher concerned and its
    detail (JSON). `id` (the page key of `Feed.history`) is None in a status's history."""

    _omitted: ClassVar[Mapping[str, object]] = {"id": None}

    id: int | None = field(default=None, kw_only=True)  # kw_only: optional, and still first in JSON
    at: str | None
    kind: str
    item: int | None
    watcher: str | None
    detail: Any


@dataclass(frozen=True, slots=True)
class QueueView(View):
    """A queue's settings and state: mode, pause, concurrency `limit` (None: none) and the
    `slots_in_use`, windows of the day in `timezone`, whether one is open and when the next opens,
    how its answers' accumulate numbers merge, its completion hooks (URLs redacted), and the
    `priority` and `weight` a partition added without its own gets (None: 0 and 1), and the
    `partition_limit` on each of its partitions' items in flight (None: none) and its `aging`;
    its flow controls (`group_limit`, `rate` and `group_rate` as "600/min"; None: none), the
    weight each concurrency group has in flight (`groups`, when any has) and the adaptive
    concurrency window of each gate whose handler pushed back (`adaptive`, when any did)."""

    _omitted: ClassVar[Mapping[str, object]] = {
        "partition_limit": None,
        "aging": None,
        "group_limit": None,
        "rate": None,
        "group_rate": None,
        "groups": None,
        "adaptive": None,
    }

    name: str
    mode: str
    paused: bool
    paused_at: str | None
    paused_by: str | None
    limit: int | None
    slots_in_use: int | None
    windows: str | None
    timezone: str
    window_open: bool
    next_window_opens_at: str | None
    accumulate: Mapping[str, str]
    hooks: Mapping[str, str]
    priority: int | None = None
    weight: int | None = None
    partition_limit: int | None = None
    aging: float | None = None  # seconds after which a waiting partition's priority counts one higher
    group_limit: int | None = None  # items of one concurrency group in flight at most
    rate: str | None = None  # items started at most, as "600/min"
    group_rate: str | None = None  # the same for each concurrency group
    groups: Mapping[str, int] | None = None  # concurrency group -> weight in flight, fleet-wide
    #: Adaptive concurrency: gate (as text) -> the fleet's window there, for gates whose handler pushed back.
    adaptive: Mapping[str, float] | None = None


@dataclass(frozen=True, slots=True)
class RateView(View):
    """A shared rate (`Feed.set_rate`): its name, its rate as written back ("10/s") and per second,
    and the tokens its bucket holds now (items that may start at once)."""

    name: str
    rate: str
    per_second: float
    tokens: float


@dataclass(frozen=True, slots=True)
class PartitionSchedule(View):
    """When a partition's items may run: its weight, item timeout and windows, its queue, whether a
    window is open now and when the next opens; `windows_never_overlap` when its windows and its
    queue's never meet; its `deadline` and its own `partition_limit`, when it has them."""

    _omitted: ClassVar[Mapping[str, object]] = {
        "windows_never_overlap": False,
        "deadline": None,
        "partition_limit": None,
    }
    _nested: ClassVar[Mapping[str, Callable[[Any], Any]]] = {"queue": QueueView.from_json}

    weight: int
    item_timeout: float | None
    windows: str | None
    timezone: str
    queue: QueueView
    window_open: bool
    next_window_opens_at: str | None
    windows_never_overlap: bool = False
    deadline: str | None = None  # when it fails unless finished (ISO 8601)
    partition_limit: int | None = None  # its own limit on its items in flight at once


@dataclass(frozen=True, slots=True)
class GateProgress(View):
    """One gate's items done (complete or cancelled) of its total, and those in flight reporting progress."""

    done: int
    total: int
    in_flight: int
    mean_progress: float | None


@dataclass(frozen=True, slots=True)
class Progress(View):
    """A partition's items done of its total, and per gate."""

    _nested: ClassVar[Mapping[str, Callable[[Any], Any]]] = {"gates": by_key(GateProgress)}

    done: int
    total: int
    gates: Mapping[str, GateProgress]


@dataclass(frozen=True, slots=True)
class PartitionStatus(View):
    """One partition (`Feed.status`, `Feed.wait`; `status KEY --json`): where it is, its lease, its
    items counted by status in all (`items`, with a "total") and per gate (`gates`), its failed
    items, tolerance, accumulated numbers, schedule and progress; its last events (`history`) when
    asked, else None."""

    _omitted: ClassVar[Mapping[str, object]] = {"history": None, "group": None}
    _nested: ClassVar[Mapping[str, Callable[[Any], Any]]] = {
        "lease": one(StatusLease),
        "gates": _counts_by_gate,
        "failed_items": many(FailedItem),
        "tolerated": by_key(Tolerated),
        "schedule": PartitionSchedule.from_json,
        "progress": Progress.from_json,
        "history": many(HistoryEntry),
    }

    key: str
    queue: str
    status: str
    gate: int
    priority: int
    sealed: bool
    manual_checkpoint: bool
    not_before: str | None
    created_at: str | None
    updated_at: str | None
    lease: StatusLease | None
    items: Mapping[str, int]
    gates: Mapping[str, Mapping[str, int]]
    failed_items: tuple[FailedItem, ...]
    tolerate: str | None
    tolerated: Mapping[str, Tolerated]
    accumulated: Mapping[str, int | float]
    schedule: PartitionSchedule
    progress: Progress
    history: tuple[HistoryEntry, ...] | None = None
    group: str | None = None  # its concurrency group


@dataclass(frozen=True, slots=True)
class PartitionRow(View):
    """A partition in a list (`Feed.partitions`): as its status, without failed items, schedule,
    progress and history; `tolerated` without the per-gate `items` and `limit`."""

    _nested: ClassVar[Mapping[str, Callable[[Any], Any]]] = {
        "lease": one(Lease),
        "gates": _counts_by_gate,
        "tolerated": by_key(Tolerated),
    }

    key: str
    queue: str
    status: str
    gate: int
    priority: int
    sealed: bool
    manual_checkpoint: bool
    lease: Lease | None
    created_at: str | None
    updated_at: str | None
    items: Mapping[str, int]
    gates: Mapping[str, Mapping[str, int]]
    tolerate: str | None
    tolerated: Mapping[str, Tolerated]


# ---------------------------------------------------------------- items


@dataclass(frozen=True, slots=True)
class ItemRow(View):
    """An item in a partition's page of items (`Feed.items`): data and result as bytes (None: no result)."""

    id: int
    gate: int
    status: str
    attempts: int
    deliveries: int
    last_error: str | None
    data: bytes
    result: bytes | None


@dataclass(frozen=True, slots=True)
class Delivery(View):
    """One delivery of an item: its number `n`, the `attempt` its processor saw, gate, watcher (or
    worker), start and end, `duration` (seconds), `outcome` (done, moved, not yet, retry, failed,
    lost, abandoned, given back) and `error` (with a traceback for a Python processor's exception)."""

    n: int
    attempt: int
    gate: int
    watcher: str | None
    started_at: str | None
    ended_at: str | None
    duration: float | None
    outcome: str
    error: str | None


@dataclass(frozen=True, slots=True)
class ItemView(View):
    """One item (`Feed.item`): its fields, partition and queue, the item that made it (`parent`),
    data and result (bytes), the gate it collects and its deliveries, oldest first (`history`)."""

    _nested: ClassVar[Mapping[str, Callable[[Any], Any]]] = {"history": many(Delivery)}

    id: int
    partition: str
    queue: str
    gate: int
    status: str
    attempts: int
    deliveries: int
    last_error: str | None
    parent: int | None
    progress: float | None
    created_at: str | None
    updated_at: str | None
    data: bytes
    result: bytes | None
    collect: int | None
    history: tuple[Delivery, ...]


# ---------------------------------------------------------------- operators' reads


@dataclass(frozen=True, slots=True)
class WatcherView(View):
    """A registered watcher: where it runs, its queue and concurrency, since when, its last
    heartbeat, whether it is `alive`, how many partitions it leases, and the newest schema revision
    its feedproc knows (`revision`: its release; None for one older than 0019)."""

    id: str
    host: str | None
    pid: int | None
    queue: str
    concurrency: int
    started_at: str | None
    heartbeat_at: str | None
    alive: bool
    leases: int
    revision: str | None = None


@dataclass(frozen=True, slots=True)
class RecentPartition(View):
    """A recently updated partition of the summary, with its lease `owner`."""

    key: str
    queue: str
    status: str
    gate: int
    priority: int
    owner: str | None
    updated_at: str | None


@dataclass(frozen=True, slots=True)
class Summary(View):
    """Partitions and items counted by status (`Feed.summary`; `status --json`); with `recent`, the
    most recently updated partitions and the watchers, else None."""

    _omitted: ClassVar[Mapping[str, object]] = {"recent": None, "watchers": None}
    _nested: ClassVar[Mapping[str, Callable[[Any], Any]]] = {
        "recent": many(RecentPartition),
        "watchers": many(WatcherView),
    }

    partitions: Mapping[str, int]
    items: Mapping[str, int]
    recent: tuple[RecentPartition, ...] | None = None
    watchers: tuple[WatcherView, ...] | None = None


@dataclass(frozen=True, slots=True)
class RunningItem(View):
    """An item in flight: who runs it (`by`) and how (`via`: watcher, worker or callback), since
    when and for how long (seconds; None until known), and the progress it reported."""

    item: int
    partition: str
    queue: str
    gate: int
    attempt: int
    by: str
    via: str
    started_at: str | None
    elapsed: float | None
    progress: float | None


@dataclass(frozen=True, slots=True)
class LeaseRow(View):
    """A partition leased now (`Feed.leases`): its owner, deadline and the watcher that wants it."""

    key: str
    queue: str
    gate: int
    owner: str
    expires_at: str | None
    wanted_by: str | None


@dataclass(frozen=True, slots=True)
class Failure(View):
    """A recently failed partition (`Feed.recent_failures`) with one of its failed items' errors."""

    key: str
    queue: str
    gate: int
    failed_at: str | None
    error: str | None


@dataclass(frozen=True, slots=True)
class Bucket(View):
    """One step of the throughput chart: items added, processed, completed, failed, and the backlog at its end."""

    at: str | None
    added: int
    processed: int
    completed: int
    failed: int
    backlog: int


@dataclass(frozen=True, slots=True)
class Throughput(View):
    """Items per `step` seconds, oldest first (`Feed.throughput`), and the backlog now."""

    _nested: ClassVar[Mapping[str, Callable[[Any], Any]]] = {"buckets": many(Bucket)}

    step: int
    backlog: int
    buckets: tuple[Bucket, ...]


@dataclass(frozen=True, slots=True)
class GateTiming(View):
    """How long a gate takes: its deliveries sampled, their p50 and p95 (seconds); when the partition
    reached it (`arrived_at`, None: not seen) and the time it spent there (None: still there, unknown)."""

    deliveries: int
    p50: float | None
    p95: float | None
    arrived_at: str | None = None
    time_at_gate: float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"deliveries": self.deliveries, "p50": self.p50, "p95": self.p95}
        if self.arrived_at is not None:  # both, or neither: only a gate it reached has a time there
            out.update(arrived_at=self.arrived_at, time_at_gate=self.time_at_gate)
        return out


@dataclass(frozen=True, slots=True)
class CurrentGate(View):
    """A running partition's current gate: items remaining and finished, the pace and an ETA."""

    gate: int
    remaining: int
    finished: int
    per_second: float | None
    eta_seconds: float | None


@dataclass(frozen=True, slots=True)
class Timings(View):
    """Per gate of a partition, how long it takes (`Feed.timings`); its current gate's pace when running."""

    _nested: ClassVar[Mapping[str, Callable[[Any], Any]]] = {
        "gates": by_key(GateTiming),
        "current": one(CurrentGate),
    }

    gates: Mapping[str, GateTiming]
    current: CurrentGate | None


@dataclass(frozen=True, slots=True)
class ScheduleView(View):
    """A pipeline's schedule (`Feed.schedules`): cron, zone, key template, priority, number of items,
    the last tick and its key, the next ticks (ISO, UTC) and the key of the next."""

    _nested: ClassVar[Mapping[str, Callable[[Any], Any]]] = {"next_ticks": tuple}

    queue: str
    name: str
    cron: str
    timezone: str
    key: str
    priority: int
    items: int
    last_tick: str | None
    last_key: str | None
    next_ticks: tuple[str, ...]
    next_key: str


# ---------------------------------------------------------------- completion hooks


@dataclass(frozen=True, slots=True)
class HookView(View):
    """One delivery of a completion hook (`Feed.hooks`, `Feed.hook`): its id (the idempotency key
    its receiver sees), the queue and partition `key` it tells of, which hook (on_complete, on_fail,
    on_cancel), its target (a URL with credentials redacted, or "python"), its status (pending,
    sent, failed), attempts made, whether a watcher holds it now (`claimed`), when the next attempt
    is due (pending only), the last attempt's error and HTTP status, when it was written and sent;
    `payload` (the summary sent) from `Feed.hook` only, else None."""

    _omitted: ClassVar[Mapping[str, object]] = {"payload": None}

    id: int
    queue: str
    key: str
    hook: str
    target: str
    status: str
    attempts: int
    claimed: bool
    next_attempt_at: str | None
    last_error: str | None
    response_status: int | None
    created_at: str | None
    sent_at: str | None
    payload: Mapping[str, Any] | None = None


__all__ = [
    "Bucket",
    "CurrentGate",
    "Delivery",
    "FailedItem",
    "Failure",
    "GateProgress",
    "GateTiming",
    "HistoryEntry",
    "HookView",
    "ItemRow",
    "ItemView",
    "Lease",
    "LeaseRow",
    "PartitionRow",
    "PartitionSchedule",
    "PartitionStatus",
    "Progress",
    "QueueView",
    "RateView",
    "RecentPartition",
    "RunningItem",
    "ScheduleView",
    "StatusLease",
    "Summary",
    "Throughput",
    "Timings",
    "Tolerated",
    "View",
    "ViewKeyAccess",
    "WatcherView",
    "listed_json",
]
