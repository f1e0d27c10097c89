"""What every part of the watcher shares: its settings, its bookkeeping of leases and items in
flight, its executors, and the few helpers all parts call (database calls, forgetting a partition,
giving up)."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import socket
import threading
import time
import uuid
import warnings
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar, cast

from tenacity import RetryCallState, wait_random_exponential

from ..core.errors import DatabaseConflict, DatabaseRefusesWrites
from ..core.models import Item
from ..core.policy import RetryPolicy
from ..core.records import Lease, Outcome, ProgressReport, QueueSettings, ReadyItem, Unanswered
from ..metrics import WatcherMetrics
from ..processors import HTTPOptions, HTTPProcessor, ProcessorLike
from ..processors.pipeline import GateRouter, Pipeline
from ..store import Store
from .config import WatcherConfig

log = logging.getLogger("feedproc.watcher")
P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _RetryState:
    """The one field of tenacity's RetryCallState that its wait strategies read."""

    attempt_number: int


class _Health:
    """Tracks database outages: logs one when it starts and when it ends, not once per attempt.

    An outage in which the database refused to write (read-only, disk full) ends only with a write:
    reads work throughout one, and a loop that only read must not declare it over (the heartbeat
    writes within a third of a lease). A conflict (a deadlock, a serialization failure) is no outage:
    it only lengthens the backoff of the loop that met it."""

    def __init__(self) -> None:
        self.down_since: float | None = None
        self.failures = 0  # consecutive failed calls, for the backoff
        self.error = ""  # what the outage is, as its last failure said
        self._writes_refused = False

    def failed(self, what: str, error: BaseException | None) -> None:
        self.failures += 1
        if isinstance(error, DatabaseConflict):
            return
        self._writes_refused = self._writes_refused or isinstance(error, DatabaseRefusesWrites)
        self.error = str(error)
        if self.down_since is None:
            self.down_since = time.monotonic()
            log.warning(
                "database unavailable (%s): %s; retrying with backoff",
                what,
                error,
                extra={"event": "database_unavailable", "error": str(error)},
            )

    def ok(self, *, wrote: bool = True) -> None:
        """A call succeeded; `wrote`: it wrote (only that ends an outage of refused writes)."""
        if self._writes_refused and not wrote:
            return
        self.failures = 0
        self._writes_refused = False
        if self.down_since is not None:
            log.warning(
                "database reachable again after %.1fs",
                time.monotonic() - self.down_since,
                extra={"event": "database_available"},
            )
            self.down_since = None

    def outage(self) -> str | None:
        """The outage now (what it is, for how long), or None."""
        if self.down_since is None:
            return None
        return f"{self.error} (for {time.monotonic() - self.down_since:.1f}s)"


CANCELLED_CALL = "the call was cancelled: its item or its partition was cancelled (or skipped), or its partition failed"
STOPPED = threading.Event()  # what `item.stop` becomes when its call is cancelled (`item.cancelled`)
STOPPED.set()


class WatcherState:
    """The watcher's state; the parts (leases, fetching, delivery, writing) are mixins over it."""

    def __init__(
        self,
        store: Store,
        processor: ProcessorLike | None,
        config: WatcherConfig | None = None,
        *,
        http_options: HTTPOptions | Mapping[str, Any] | None = None,
    ) -> None:
        self.store = store
        #: The watcher's own processor (`--handler`/`--processor`); None: the queue's pipeline routes every gate.
        self.processor = processor
        self._owns_store = False  # True when connect() made the store
        self.config = config or WatcherConfig()
        if self.config.batch > 1 and getattr(processor, "request", "json") == "raw":
            raise ValueError("a raw-request HTTPProcessor sends one item per request: batch must be 1")
        self.policy = self.config.retry_policy
        # Pipelines: a Python `Pipeline` given as the processor is the pipeline (its code is its
        # version); otherwise the queue's stored pipeline is followed (`_follow_pipeline`), each
        # version through a router of its own. `http_options` make its gates' HTTP processors.
        self.code_pipeline = processor if isinstance(processor, Pipeline) else None
        self.http_options = _http_options(http_options, self.config)
        spec = self.code_pipeline.spec if self.code_pipeline is not None else None
        self.router = GateRouter(spec, processor, self.policy, route=False)
        self._started_processors: set[int] = set()  # ids of the processors started (each once)
        self._retired: list[ProcessorLike] = []  # earlier versions' processors, closed on stop
        self.id = f"{socket.gethostname()[:60]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.owned: dict[int, Lease] = {}
        self.inflight: dict[int, ReadyItem] = {}  # fetched, not yet committed or dropped
        self.busy: set[int] = set()  # items a worker is processing now
        # The calls running now, by item: (partition, the worker task awaiting it, the Items of the
        # call, its start in epoch microseconds and on the perf counter); `_cancel_calls` cancels those
        # of a cancelled partition, or of skipped or cancelled items.
        self._running: dict[int, tuple[int, asyncio.Task[Any], tuple[Item, ...], int, int]] = {}
        self._cancelled_calls: set[asyncio.Task[Any]] = set()
        self._next_claim_check = 0.0  # monotonic time of the next look at expired claims and finished items
        self.results: list[Outcome] = []
        self.processed = 0
        # prometheus-client metrics in a registry of this watcher's own, served by /metrics
        self.metrics = WatcherMetrics(self.config.queue, leases_held=lambda: len(self.owned))
        self._buffer: asyncio.Queue[ReadyItem | None] = asyncio.Queue()  # None: a worker's stop signal
        self._wake = asyncio.Event()
        self._results_ready = asyncio.Event()
        self._stopping = asyncio.Event()
        self._health = _Health()
        self._last_renewal = time.monotonic()
        self._last_steal = -math.inf  # steals may be asked for at once
        self._share: int | None = None  # the queue's fair share of partitions (None: alone), and when read
        self._share_read_at = -math.inf
        self._valid_until: dict[int, float] = {}  # partition -> monotonic time its lease surely lasts
        self._given_up: dict[tuple[int, int], None] = {}  # (partition, epoch) leases let go, oldest first
        self.queue_settings = QueueSettings(self.config.queue)  # limit and windows, re-read every poll interval
        self._settings_read_at = -math.inf
        # Answers' accumulate operations per gate, under the router and queue settings they were
        # made from (`Delivering._accumulate_refusal`): rebuilt when either is replaced.
        self._operations: tuple[Any, QueueSettings, dict[int, dict[str, str]]] | None = None
        self._progress: dict[int, ProgressReport] = {}  # reported since the last heartbeat, by item
        # Deliveries started since the last heartbeat and still running at it: the heartbeat writes
        # their start (the dashboard's running view), so an item that finishes sooner costs nothing.
        self._unannounced: dict[int, ProgressReport] = {}
        self._tally: Counter[str] = Counter()  # throughput since the last heartbeat (feedproc_stats)
        # Slots the database counts for this watcher (and per limited gate), as last set by a fetch.
        self._slots_reported: tuple[int, dict[int, int]] = (0, {})
        self._answered: set[int] = set()  # in `inflight` but their call has returned: no slot held
        self._closing = False  # stop() was called and the workers are done: flush what is left
        self._maintain_now = True  # lease bookkeeping is due (a lease may be lost, start-up)
        self._acquire_now = False  # work arrived or capacity freed: lease more now (no other bookkeeping)
        self.fatal: str | None = None  # why the watcher gave up (its write path or a task died); None while well
        self._uncharged: dict[int, Lease] = {}  # taken over with deliveries left unanswered, not yet charged
        self._suspects: deque[ReadyItem] = deque()  # fetched items to deliver alone (see `_is_suspect`)
        self._suspect_found = asyncio.Event()
        self._isolating = False  # delivering a suspect alone: nothing else is fetched or started
        self._failed_writes = 0  # group commits in a row that wrote nothing for reasons other than an outage
        self._appended: Counter[int] = Counter()  # fetches appended to each partition's record since its rewrite
        self._failed_polls = 0
        self._handler = getattr(processor, "url", None) if isinstance(processor, HTTPProcessor) else None
        # Three threads, three connections: the heartbeat never waits behind anything; flushes
        # (writes) and polls (reads, leasing) overlap. That is safe: an item leaves `inflight` only
        # after its outcome committed, and each fetch excludes what is in `inflight` when it starts,
        # so a fetch either excludes an item or runs after its commit and no longer sees it ready.
        self._db = ThreadPoolExecutor(1, thread_name_prefix="feedproc-poll")
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="feedproc-flush")
        self._hb = ThreadPoolExecutor(1, thread_name_prefix="feedproc-heartbeat")

    def _policy_of(self, ready: ReadyItem) -> RetryPolicy:
        """The attempts and backoff of `ready`'s gate under the pipeline version now followed."""
        return self.router.route(ready.gate).policy

    def stop(self) -> None:
        """Ask the watcher to stop: no new leases or items; in-flight items get `shutdown_grace`."""
        self._stopping.set()
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def database_outage(self) -> str | None:
        """The database outage this watcher is waiting out (what it is, for how long), or None. The
        database may answer a ping meanwhile: a read-only one does, and refuses every write."""
        return self._health.outage()

    @property
    def heartbeat_age(self) -> float:
        """Seconds since the leases were last renewed (or the watcher started)."""
        return time.monotonic() - self._last_renewal

    async def _db_call(self, executor: ThreadPoolExecutor, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)` (a store call) on `executor`'s thread, typed as `fn` is."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, lambda: fn(*args, **kwargs))

    def _outage_delay(self, cap: float) -> float:
        """Exponential backoff with jitter while the database fails (tenacity's schedule)."""
        wait = wait_random_exponential(multiplier=0.2, max=cap)
        return float(wait(cast(RetryCallState, _RetryState(self._health.failures))))

    def _die(self, reason: str, error: BaseException | None = None) -> None:
        """Give up: record why (`fatal`, shown by /healthz), say so, stop; leases are released on the way out."""
        if self.fatal is None:
            self.fatal = reason
            log.error(
                "watcher cannot go on: %s; releasing its leases and stopping",
                reason,
                exc_info=error,
                extra={"event": "fatal", "error": reason, "watcher": self.id},
            )
        self.stop()

    async def _register(self, executor: ThreadPoolExecutor) -> None:
        """Record this watcher (host, pid, queue, capacity) so others count it for fair shares."""
        cfg = self.config
        await self._db_call(
            executor,
            self.store.register_watcher,
            self.id,
            host=socket.gethostname(),
            pid=os.getpid(),
            queue=cfg.queue,
            concurrency=cfg.concurrency,
            capacity=cfg.effective_max_partitions,
            lease_seconds=cfg.lease_seconds,
            slots=0,  # slots are only ever claimed under the queue's lock, by the fetch (`_fill_within_limit`)
        )
        self._slots_reported = (0, {})
        self._wake.set()  # a limited queue: claim what is still running at once

    def _cancel_calls(self, partition_id: int | None = None, item_ids: Iterable[int] = ()) -> int:
        """Cancel the calls running for the items of a cancelled (or failed) partition, or for
        `item_ids` (items an operator skipped or cancelled): an `async def` processor's call (and the HTTP processor's
        request) gets CancelledError, a plain `def` one sees `item.cancelled`. Their outcomes are
        dropped by the group commit (no lease, or a new item version). Returns how many."""
        named = set(item_ids)
        cancelled = 0
        for item_id, (pid, task, items, *_) in list(self._running.items()):
            if pid != partition_id and item_id not in named:
                continue
            del self._running[item_id]
            for item in items:  # no Event per delivery (1.5 us each): the stopped ones share one
                item.stop = STOPPED
            cancelled += 1
            if task not in self._cancelled_calls:
                self._cancelled_calls.add(task)
                task.cancel(CANCELLED_CALL)
        return cancelled

    def _was_cancelled(self, task: asyncio.Task[Any]) -> bool:
        """Whether the CancelledError `task` caught is `_cancel_calls`' (then it is taken back:
        the worker goes on) rather than the watcher stopping."""
        if task not in self._cancelled_calls:
            return False
        self._cancelled_calls.discard(task)
        task.uncancel()
        return True

    def _forget(self, pid: int) -> None:
        """Stop holding partition `pid` (released, handed over or lost); drop its buffered items."""
        self._valid_until.pop(pid, None)
        self._appended.pop(pid, None)
        lease = self.owned.pop(pid, None)
        if lease is not None:
            self._given_up[(pid, lease.epoch)] = None
            while len(self._given_up) > 10_000:
                self._given_up.pop(next(iter(self._given_up)))
        self._drop_buffered(lambda item: item.partition_id == pid)

    def _drop_buffered(self, which: Any) -> None:
        """Forget buffered (never dispatched) items that match `which`."""
        kept: list[ReadyItem | None] = []
        while not self._buffer.empty():
            item = self._buffer.get_nowait()
            if item is not None and which(item):
                self.inflight.pop(item.id, None)
            else:
                kept.append(item)
        for item in kept:
            self._buffer.put_nowait(item)

    def _unanswered(
        self, which: Callable[[ReadyItem], bool], outcome: str, reason: str | None = None
    ) -> dict[int, list[Unanswered]]:
        """Per partition, this watcher's deliveries in flight that match `which`, as let go of unanswered
        (`Store.release`) with `outcome`: with their start and how long they ran, from their answer
        when they have one, else up to now (a call still running)."""
        answers = {o.item_id: o for o in self.results}
        now_ns = time.perf_counter_ns()
        given: dict[int, list[Unanswered]] = {}
        for item in self.inflight.values():
            if not which(item):
                continue
            started_us = duration_us = None
            if (answer := answers.get(item.id)) is not None:
                started_us, duration_us = answer.started_us, answer.duration_us
            elif (running := self._running.get(item.id)) is not None:
                started_us, duration_us = running[3], (now_ns - running[4]) // 1000
            delivery = Unanswered(item.id, item.version, outcome, started_us, duration_us, reason)
            given.setdefault(item.partition_id, []).append(delivery)
        return given

    def _inflight_entries(self, which: Callable[[ReadyItem], bool]) -> dict[int, list[tuple[int, int]]]:
        """Per partition, the (id, version) of this watcher's items in flight that match `which`."""
        taken: dict[int, list[tuple[int, int]]] = {}
        for item in self.inflight.values():
            if which(item):
                taken.setdefault(item.partition_id, []).append((item.id, item.version))
        return taken


def _http_options(given: HTTPOptions | Mapping[str, Any] | None, config: WatcherConfig) -> HTTPOptions:
    """`given`, else the defaults with the watcher's `max_children`; a mapping (the old, untyped
    form) is taken as HTTPOptions' fields, with a DeprecationWarning."""
    if isinstance(given, HTTPOptions):
        return given
    if given is not None:
        warnings.warn("http_options as a mapping is deprecated: pass an HTTPOptions", DeprecationWarning, stacklevel=3)
    return HTTPOptions(**{"max_children": config.max_children, **(given or {})})
