"""The values the watcher and the store exchange: leases, items ready to deliver, outcomes of
deliveries and what a group commit did with them, and the in-flight record's encoding. Pure data:
nothing here touches a database."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from operator import itemgetter
from typing import Any

from . import windows as timewindows
from .flow import FlowRules, Rate, format_rate, shown_rate
from .models import NewItem
from .redaction import redact_url
from .timestamps import iso

RECORD_OUTCOMES = {
    "done": "done",
    "move": "moved",
    "later": "not yet",
    "retry": "retry",
    "fail": "failed",
    "accepted": "accepted",
}
# The records of deliveries that ended without an answer written: `lost` (charged by whoever took
# the partition over from a watcher that died or stalled), `abandoned` (still running when their
# watcher stopped, past its shutdown grace) and `given back` (let go by a watcher that still ran: an
# answer that could not be written, a lease it gave up on while the delivery was under way).
LOST, ABANDONED, GIVEN_BACK = "lost", "abandoned", "given back"


@dataclass(frozen=True, slots=True)
class Lease:
    """A partition leased to a watcher under a lease epoch (the fencing token)."""

    partition_id: int
    key: str
    epoch: int
    wanted_by: str | None = None
    remaining: float = 0.0  # seconds the lease had left on the database clock when read
    # Scheduling controls of the partition (issue 7): its share of the queue's concurrency limit,
    # its per-item time limit, and the windows of the day in which it may be dispatched.
    weight: int = 1
    item_timeout: float | None = None
    windows: str | None = None
    window_tz: str | None = None
    # Taken over from a watcher that died, stalled or stopped with deliveries unanswered: (that
    # watcher, its in-flight entries). `Store.charge_lost` counts them before anything is fetched.
    pending: tuple[str, str] | None = None
    partition_limit: int | None = None  # its items in flight at once at most (None: no limit of its own)


@dataclass(frozen=True, slots=True)
class ReadyItem:
    """An item at its partition's current gate, ready to dispatch."""

    id: int
    version: int
    partition_id: int
    partition: str
    queue: str
    epoch: int
    gate: int
    attempts: int
    data: bytes
    weight: int = 1  # its share of the queue's concurrency limit while in flight
    deliveries: int = 0  # the item's deliveries so far, every gate (its next one is number deliveries + 1)
    lost: int = 0  # its last deliveries in a row whose watcher died or stalled before answering
    collect: int | None = None  # the gate whose results it collects, given when it was added (no pipeline)
    not_yet: int = 0  # "not yet" answers at its current gate so far
    priority: int = 0  # its partition's, when fetched: the buffer serves the highest first
    group: str | None = None  # its partition's concurrency group, when group limits apply


class Kind(StrEnum):
    """What an outcome does to its item."""

    DONE = "done"  # complete
    MOVE = "move"  # to a higher gate
    LATER = "later"  # "not yet": same gate, ask again after a delay
    RETRY = "retry"  # transient failure, another attempt after a backoff
    FAIL = "fail"  # permanent failure, or attempts ran out
    ACCEPTED = "accepted"  # a handler's 202: it answers later, through the API, within `delay` seconds


@dataclass(slots=True)
class Outcome:
    """The result of one delivery, ready to be written by `Store.apply`."""

    item_id: int
    version: int
    partition_id: int
    epoch: int
    gate: int  # the item's gate when it was dispatched
    kind: str
    new_gate: int | None = None
    data: bytes | None = None
    children: tuple[NewItem, ...] = ()
    delay: float = 0.0
    attempts: int = 0  # the item's attempts after this outcome
    error: str | None = None
    progress: float | None = None  # reported with a "not yet" answer (0..1)
    not_yet: int | None = None  # the item's "not yet" answers at its gate after this outcome (None: unchanged)
    result: bytes | None = None  # what the item produced (fan-in), kept apart from its data
    pushback: str | None = None  # the handler pushed back: "429", "503" or "timeout" (adaptive concurrency)
    accumulate: Mapping[str, float] | None = None  # numbers for the partition's accumulator
    # How they merge: the operations its gate (over its queue) declared when the answer was read,
    # every name of `accumulate` among them (`core.fanin.refusal`); a name without one is not merged.
    operations: Mapping[str, str] | None = None
    # The delivery's record (feedproc_attempts; a completing delivery's lives on the item row).
    n: int = 0  # the item's delivery number (its deliveries + 1)
    attempt: int = 0  # the attempt number the processor saw
    started_us: int | None = None  # when the processor was called: epoch microseconds, the watcher's clock
    duration_us: int | None = None  # microseconds the call took
    detail: str | None = None  # the error with its traceback or the answer's start, for the record
    token: str | None = None  # ACCEPTED: the token the request carried, for the handler's later answer


@dataclass(frozen=True, slots=True)
class Unanswered:
    """A delivery its watcher lets go of without an answer written (`Store.release`): charged to its
    item as an attempt and recorded with `outcome` (ABANDONED or GIVEN_BACK), when it started (epoch
    microseconds, the watcher's clock, as every record's start) and how long it had run. `reason`
    overrides the release's reason for it."""

    item_id: int
    version: int
    outcome: str = ABANDONED
    started_us: int | None = None
    duration_us: int | None = None
    reason: str | None = None


@dataclass(slots=True)
class Applied:
    """What `Store.apply` did: outcomes written and dropped, and what became of each partition."""

    written: list[int] = field(default_factory=list)  # item ids
    lost: set[int] = field(default_factory=set)  # partition ids no longer leased to this watcher
    released: set[int] = field(default_factory=set)  # partitions finished or idle: lease given up
    advanced: int = 0  # gate advances the batch caused (for metrics)
    advances: list[tuple[int, int, int]] = field(default_factory=list)  # (partition, from gate, to gate)
    moves: dict[int, str] = field(default_factory=dict)  # released partitions: "complete", "fail" or "wait"
    superseded: list[int] = field(default_factory=list)  # items an operator changed meanwhile: answers dropped


@dataclass(frozen=True, slots=True)
class ProgressReport:
    """How far an item in flight has got, as its processor reported, and when its delivery started
    (written with the heartbeat; None leaves what is stored)."""

    item_id: int
    partition_id: int
    epoch: int
    gate: int
    fraction: float | None
    started_us: int | None = None  # epoch microseconds, the watcher's clock


@dataclass(frozen=True, slots=True)
class SlotClaim:
    """A watcher of a limited queue (or of a pipeline with gate limits) asking for slots: its queue,
    the weight it has in flight, and per limited gate its limit and the weight it has in flight there;
    its pipeline's gate group limits and rates (`flow`: the queue's own are read with its row), and
    the weight it has in flight per (group, gate)."""

    queue: str
    held: int = 0
    gate_limits: Mapping[int, int] = field(default_factory=dict)
    gate_held: Mapping[int, int] = field(default_factory=dict)
    flow: FlowRules = field(default_factory=FlowRules)
    group_held: Mapping[tuple[str, int], int] = field(default_factory=dict)


class Fetched(list[ReadyItem]):
    """What a fetch under rate limits took, and `retry_in`: seconds until a bucket that ran dry
    has a token again (None: none ran dry), so the watcher looks again then, not a poll later."""

    def __init__(self, items: Iterable[ReadyItem] = (), *, retry_in: float | None = None) -> None:
        super().__init__(items)
        self.retry_in = retry_in


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """A queue's scheduling settings: concurrency limit (< 1: none), windows of the day, and its
    mode: `push` (watchers deliver its items) or `pull` (workers claim them through the API)."""

    name: str
    limit: int = 0
    windows: str | None = None
    window_tz: str | None = None
    mode: str = "push"
    paused: bool = False  # nothing new dispatched or claimed until resumed
    paused_at: datetime | None = None
    paused_by: str | None = None
    #: How answers' `accumulate` numbers merge in its partitions: (name, operation) pairs, sorted.
    accumulate: tuple[tuple[str, str], ...] = ()
    #: Its completion hooks: (on_complete | on_fail | on_cancel, URL or "python") pairs, sorted.
    hooks: tuple[tuple[str, str], ...] = ()
    #: What a partition added without its own priority or weight gets (None: 0 and 1).
    default_priority: int | None = None
    default_weight: int | None = None
    #: Items of any one of its partitions in flight at once at most (None: no limit).
    partition_limit: int | None = None
    #: Seconds after which a waiting partition's priority counts one higher (None: no aging).
    aging: float | None = None
    #: Items of one concurrency group in flight at most, fleet-wide (None: no limit).
    group_limit: int | None = None
    #: Items started per second at most: the whole queue's (or the name of the shared rate it draws
    #: from), and each group's (None: no rate).
    rate: Rate | None = None
    group_rate: float | None = None

    @property
    def operations(self) -> dict[str, str]:
        """The queue's accumulate declaration: name -> operation (sum, min, max, count)."""
        return dict(self.accumulate)

    @property
    def limited(self) -> bool:
        return self.limit >= 1

    def flow(self, gates: FlowRules | None = None) -> FlowRules:
        """Its flow controls with its pipeline gates' (`gates`): what a fetch or a claim goes by."""
        return replace(gates or FlowRules(), group_limit=self.group_limit, rate=self.rate, group_rate=self.group_rate)

    @property
    def parsed(self) -> tuple[timewindows.Window, ...]:
        return timewindows.parse_windows(self.windows)

    @property
    def zone(self) -> Any:
        return timewindows.zone(self.window_tz)

    def is_open(self, at: datetime) -> bool:
        """Whether the queue may dispatch at `at`: not paused, and in one of its windows (if any)."""
        return not self.paused and timewindows.is_open(self.parsed, self.zone, at)

    def describe(self, now: datetime, in_use: int | None = None) -> dict[str, Any]:
        opens = timewindows.next_opening(self.parsed, self.zone, now)
        return (
            {
                "name": self.name,
                "mode": self.mode,
                "paused": self.paused,
                "paused_at": iso(self.paused_at),
                "paused_by": self.paused_by,
                "limit": self.limit if self.limited else None,
                "slots_in_use": in_use,
                "windows": self.windows,
                "timezone": self.window_tz or "UTC",
                "window_open": opens == now,
                "next_window_opens_at": None if opens == now else iso(opens),
                "accumulate": self.operations,
                "hooks": {hook: redact_url(target) for hook, target in self.hooks},
                "priority": self.default_priority,
                "weight": self.default_weight,
            }
            | ({"partition_limit": self.partition_limit} if self.partition_limit is not None else {})
            | ({"aging": self.aging} if self.aging is not None else {})
            | ({"group_limit": self.group_limit} if self.group_limit is not None else {})
            | ({"rate": shown_rate(self.rate)} if self.rate is not None else {})
            | ({"group_rate": format_rate(self.group_rate)} if self.group_rate is not None else {})
        )


def encode_inflight(deliveries: Iterable[tuple[int, int]], *, alone: bool = False) -> str:
    """An in-flight record's entries: (item id, version) pairs as runs of consecutive ids with one
    version, `first-last/version` or `id/version`, comma-separated; `/i` ends each when the
    delivery is alone (isolated). Runs keep a fetch's record a few bytes however many items it took."""
    pairs = sorted(set(deliveries))
    suffix = "/i" if alone else ""
    one_run = len(pairs) > 1 and pairs[-1][0] - pairs[0][0] == len(pairs) - 1
    if one_run and len(set(map(itemgetter(1), pairs))) == 1:  # the common case of a fetch
        return f"{pairs[0][0]}-{pairs[-1][0]}/{pairs[0][1]}{suffix}"
    runs: list[str] = []
    first = last = version = None
    for item_id, item_version in pairs:
        if last is not None and item_id == last + 1 and item_version == version:
            last = item_id
            continue
        if first is not None:
            runs.append(f"{first}-{last}/{version}{suffix}" if last != first else f"{first}/{version}{suffix}")
        first = last = item_id
        version = item_version
    if first is not None:
        runs.append(f"{first}-{last}/{version}{suffix}" if last != first else f"{first}/{version}{suffix}")
    return ",".join(runs)


def decode_inflight(entries: str) -> dict[int, tuple[int, bool]]:
    """{item id: (version, alone)} from `encode_inflight`'s text (malformed runs are skipped)."""
    wanted: dict[int, tuple[int, bool]] = {}
    for run in entries.lstrip("=").split(","):
        parts = run.split("/")
        if len(parts) < 2 or not parts[1].isdigit():
            continue
        first, dash, last = parts[0].partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            continue
        span = range(int(first), int(last or first) + 1)
        if len(span) > 1_000_000:  # not written by us: never expand it
            continue
        alone = parts[2:] == ["i"]
        for item_id in span:
            wanted[item_id] = (int(parts[1]), alone)
    return wanted


def tally_outcomes(outcomes: Iterable[Outcome]) -> dict[str, int]:
    """Throughput counts of written answers: `processed` (all), `completed`, `failed`, and `added`
    (the children they fanned out)."""
    counts = {"processed": 0, "completed": 0, "failed": 0, "added": 0}
    for outcome in outcomes:
        counts["processed"] += 1
        if outcome.kind == Kind.DONE:
            counts["completed"] += 1
        elif outcome.kind == Kind.FAIL:
            counts["failed"] += 1
        counts["added"] += len(outcome.children)
    return counts
