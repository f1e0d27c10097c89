"""The watcher: leases partitions, dispatches their ready items to a Processor, writes the answers.

Inside one asyncio loop:

* a **heartbeat** task renews the watcher and its leases every `lease_seconds / 3` on its own
  thread and connection, so renewal never waits behind dispatch or a slow handler;
* a **poll** task (every `poll_interval`, or at once when woken) learns steal requests and lost
  leases, hands wanted partitions over once their in-flight items are done, leases new partitions
  up to `capacity`, asks for steals toward a fair share, and fetches ready items into a buffer;
* `concurrency` **worker** tasks take items from the buffer and call the Processor;
* a **flusher** task writes finished deliveries in group commits (`Store.apply`, one fenced
  transaction per batch) and wakes the poller, so a drained gate advances at once.

An item stays in `inflight` from the moment it is fetched until its outcome is committed (or
dropped), and fetches exclude `inflight`: this watcher never dispatches an item twice at once.

The fetch records what it takes as in flight (in the database, per partition), so a watcher that
dies or stalls mid-delivery is charged for it by the watcher that takes the partition over
(`Store.charge_lost`). An item whose last deliveries were lost that way is a *suspect*: it is
delivered alone (nothing else in flight here), so an item that kills its watcher is the one charged,
and fails after `max_attempts` instead of taking watchers down forever.

Nothing a processor answers can stop the write path: an answer that cannot be written fails its
item (transiently) and the rest of the batch is written. If writes keep failing for reasons other
than a database outage, or a task of the watcher dies, the watcher sets `fatal`, says so at ERROR,
releases its leases and stops (the command exits 1) instead of holding leases while doing nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
import traceback
import uuid
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, cast

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential,
    wait_random_exponential,
)

from . import tracing
from .core import windows
from .core.errors import DatabaseUnavailable, StaleWrite, WatcherGone
from .core.models import Item, check_queue
from .core.policy import RetryPolicy, outcome_of
from .core.records import Applied, Kind, Lease, Outcome, ProgressReport, QueueSettings, ReadyItem, SlotClaim
from .metrics import WatcherMetrics
from .processors import HTTPProcessor, ProcessorLike, call_processor
from .redact import redact_url
from .store import Store
from .store.notify import Listener

log = logging.getLogger("feedproc.watcher")
PREFETCH = 200  # ready items kept fetched ahead at least, whatever the concurrency
TRACEBACK_KEPT = 4096  # characters of a processor's traceback kept in its delivery record (the end)
FAILED_WRITES_FATAL = 3  # group commits in a row that could write nothing (not an outage): the watcher stops
FAILED_POLLS_FATAL = 5  # poll cycles in a row failing with an error of ours (not an outage): likewise
# A fetch appends to its partitions' in-flight records; every this many fetches of a partition its
# record is rewritten whole from what is in flight here (answered deliveries drop out of it).
COMPACT_AFTER = 32
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class WatcherConfig:
    """Settings of one watcher (the `feedproc watch` options)."""

    queue: str = "default"
    concurrency: int = 10
    capacity: int | None = None  # partitions leased at most; default 4 x concurrency (at least 8)
    lease_seconds: float = 30.0
    poll_interval: float = 1.0
    max_attempts: int = 5
    retry_delay: float = 1.0
    max_retry_delay: float = 600.0
    shutdown_grace: float = 30.0
    flush_batch: int = 500  # outcomes per group commit at most
    retention: float | None = None  # delete partitions finished longer ago than this (seconds)
    retention_every: float = 300.0
    steals_per_cycle: int = 16  # partitions asked for per steal request at most (the fair-share deficit bounds it)
    item_timeout: float | None = None  # seconds a processor call may take (a partition may override)

    def __post_init__(self) -> None:
        check_queue(self.queue)
        for name in ("concurrency", "max_attempts", "flush_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("lease_seconds", "poll_interval"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.retry_delay < 0 or self.shutdown_grace < 0:
            raise ValueError("retry_delay and shutdown_grace must be >= 0")
        if self.item_timeout is not None and self.item_timeout <= 0:
            raise ValueError("item_timeout must be positive")

    @property
    def max_partitions(self) -> int:
        return self.capacity if self.capacity is not None else max(8, 4 * self.concurrency)

    @property
    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(self.max_attempts, self.retry_delay, self.max_retry_delay, self.poll_interval)


@dataclass(frozen=True, slots=True)
class _RetryState:
    """The one field of tenacity's RetryCallState that its wait strategies read."""

    attempt_number: int


class _Health:
    """Tracks database outages: logs one when it starts and when it ends, not once per attempt."""

    def __init__(self) -> None:
        self.down_since: float | None = None
        self.failures = 0  # consecutive failed calls, for the backoff

    def failed(self, what: str, error: BaseException | None) -> None:
        self.failures += 1
        if self.down_since is None:
            self.down_since = time.monotonic()
            log.warning(
                "database unavailable (%s): %s; retrying with backoff",
                what,
                error,
                extra={"event": "database_unavailable", "error": str(error)},
            )

    def ok(self) -> None:
        self.failures = 0
        if self.down_since is not None:
            log.warning(
                "database reachable again after %.1fs",
                time.monotonic() - self.down_since,
                extra={"event": "database_available"},
            )
            self.down_since = None


class Watcher:
    """One watcher process's engine. `await watcher.run()` until `watcher.stop()` is called."""

    @classmethod
    def connect(cls, url: str, processor: ProcessorLike, config: WatcherConfig | None = None) -> Watcher:
        """A watcher of the database at `url` on a connection pool of its own, closed by `close()`:
        what `feedproc watch` runs. Raises SchemaMissing unless the schema is this version's."""
        # Four connections serve the poll, the group commit and the heartbeat; no ping before each
        # checkout on the hot path (a lost connection is an outage the loops retry).
        store = Store(url, pool_size=4, pre_ping=False)
        try:
            store.check_schema()
        except BaseException:
            store.close()
            raise
        watcher = cls(store, processor, config)
        watcher._owns_store = True
        return watcher

    def close(self) -> None:
        """Release the connections `connect()` opened (after `run()` has returned); a store passed
        to the constructor stays open: its owner closes it."""
        if self._owns_store:
            self.store.close()

    def __init__(self, store: Store, processor: ProcessorLike, config: WatcherConfig | None = None) -> None:
        self.store = store
        self.processor = processor
        self._owns_store = False  # True when connect() made the store
        self.config = config or WatcherConfig()
        self.policy = self.config.retry_policy
        self.id = f"{socket.gethostname()[:60]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.owned: dict[int, Lease] = {}
        self.inflight: dict[int, ReadyItem] = {}  # fetched, not yet committed or dropped
        self.busy: set[int] = set()  # items a worker is processing now
        self.results: list[Outcome] = []
        self.processed = 0
        self.metrics = WatcherMetrics(self.config.queue)  # plain int counters, read by /metrics
        self._buffer: asyncio.Queue[ReadyItem | None] = asyncio.Queue()  # None: a worker's stop signal
        self._wake = asyncio.Event()
        self._results_ready = asyncio.Event()
        self._stopping = asyncio.Event()
        self._health = _Health()
        self._last_renewal = time.monotonic()
        self._last_steal = -math.inf  # steals may be asked for at once
        self._valid_until: dict[int, float] = {}  # partition -> monotonic time its lease surely lasts
        self._given_up: dict[tuple[int, int], None] = {}  # (partition, epoch) leases let go, oldest first
        self.queue_settings = QueueSettings(self.config.queue)  # limit and windows, re-read every poll interval
        self._settings_read_at = -math.inf
        self._progress: dict[int, ProgressReport] = {}  # reported since the last heartbeat, by item
        self._slots_reported = 0  # slots the database counts for this watcher, as last set by a fetch
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

    # ------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Ask the watcher to stop: no new leases or items; in-flight items get `shutdown_grace`."""
        self._stopping.set()
        self._wake.set()

    def _work_arrived(self) -> None:
        """A notification: new work in our queue (or a partition handed over to us). Lease it now, not
        at the next poll. Holding nothing, read the leases too: a handed-over partition is found by a
        fetch (see `_unknown_lease`), and a watcher holding nothing does not fetch."""
        if self.owned:
            self._acquire_now = True
        else:
            self._maintain_now = True
        self._wake.set()

    def _partitions_wanted(self) -> None:
        """A notification: another watcher asked for partitions of ours. Read the leases and hand
        them over (once their items in flight are done) now, not at the next poll."""
        self._maintain_now = True
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    @property
    def heartbeat_age(self) -> float:
        """Seconds since the leases were last renewed (or the watcher started)."""
        return time.monotonic() - self._last_renewal

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
            capacity=cfg.max_partitions,
            lease_seconds=cfg.lease_seconds,
            slots=0,  # slots are only ever claimed under the queue's lock, by the fetch (`_fill_within_limit`)
        )
        self._slots_reported = 0
        self._wake.set()  # a limited queue: claim what is still running at once

    async def run(self) -> None:
        """Run until `stop()`; then finish or abandon in-flight items, release leases and exit."""
        cfg = self.config
        self.queue_settings = await self._db_call(self._db, self.store.queue_settings, cfg.queue)
        await self._register(self._db)
        log.info(
            "watcher %s on queue %r: concurrency %d, up to %d partitions, lease %gs",
            self.id,
            cfg.queue,
            cfg.concurrency,
            cfg.max_partitions,
            cfg.lease_seconds,
        )
        # Plain-`def` processors run in the default executor: give it a thread per concurrent item.
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(cfg.concurrency + 2, thread_name_prefix="feedproc-process")
        )
        start = getattr(self.processor, "start", None)
        if start is not None:
            await start()
        listener = None
        if self.store.postgres:
            loop = asyncio.get_running_loop()
            listener = Listener(
                self.store.engine,
                cfg.queue,
                lambda: loop.call_soon_threadsafe(self._work_arrived),
                watcher_id=self.id,
                on_wanted=lambda: loop.call_soon_threadsafe(self._partitions_wanted),
            )
            listener.start()
        workers = [asyncio.create_task(self._worker(), name=f"worker-{n}") for n in range(cfg.concurrency)]
        helpers = [
            asyncio.create_task(self._heartbeat_loop(), name="heartbeat"),
            asyncio.create_task(self._poll_loop(), name="poll"),
        ]
        helpers.append(asyncio.create_task(self._isolation_loop(), name="isolation"))
        if cfg.retention:
            helpers.append(asyncio.create_task(self._retention_loop(cfg.retention), name="retention"))
        flusher = asyncio.create_task(self._flush_loop(), name="flush")
        for task in [*workers, *helpers, flusher]:
            task.add_done_callback(self._task_ended)
        try:
            await self._stopping.wait()
        finally:
            if listener is not None:
                await asyncio.to_thread(listener.stop)
            await self._shutdown(workers, helpers, flusher)

    def _task_ended(self, task: asyncio.Task[Any]) -> None:
        """A task of the watcher ended. Before stop() that is a bug of ours: say so and give up."""
        if self.stopping or task.cancelled():
            return
        error = task.exception()
        reason = (
            f"{task.get_name()} task died: {type(error).__name__}: {error}" if error else f"{task.get_name()} ended"
        )
        self._die(reason, error)

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

    async def _shutdown(
        self, workers: list[asyncio.Task[Any]], helpers: list[asyncio.Task[Any]], flusher: asyncio.Task[Any]
    ) -> None:
        self._stopping.set()
        self._drop_buffered(lambda item: True)
        for _ in workers:  # each worker finishes its current item, then takes a sentinel and exits
            self._buffer.put_nowait(None)
        if self.busy:
            log.info("stopping: waiting up to %gs for %d in-flight items", self.config.shutdown_grace, len(self.busy))
        _, unfinished = await asyncio.wait(workers, timeout=self.config.shutdown_grace)
        if self.busy:
            log.warning(
                "abandoned %d items still running after the grace period; they will be redelivered", len(self.busy)
            )
        for task in [*unfinished, *helpers]:
            task.cancel()
        await asyncio.gather(*workers, *helpers, return_exceptions=True)
        # Let the flusher write every answer that arrived (it may be waiting out a database blip);
        # only past the grace period are unwritten answers given up (their items are redelivered).
        self._closing = True
        self._results_ready.set()
        try:
            await asyncio.wait_for(asyncio.shield(flusher), timeout=max(self.config.shutdown_grace, 1.0))
        except TimeoutError:
            log.warning("gave up writing %d answers on stop; those items will be delivered again", len(self.results))
            flusher.cancel()
            await asyncio.gather(flusher, return_exceptions=True)
        except Exception as error:
            log.error("writing answers on stop failed: %s", error)
        busy = self.busy
        abandoned = self._inflight_entries(lambda item: item.id in busy)  # still running: charged as lost
        try:
            # A lease taken by a poll that was cancelled mid-call is in the database, not in `owned`:
            # this read queues behind that call on the same thread, so it sees it.
            for lease in await self._db_call(self._db, self.store.owned, self.id):
                self.owned.setdefault(lease.partition_id, lease)
        except Exception:  # the release below says what went wrong, if anything
            pass
        try:
            released = await self._db_call(
                self._db,
                self.store.release,
                self.id,
                list(self.owned.values()),
                abandoned=abandoned,
                max_attempts=self.config.max_attempts,
            )
            await self._db_call(self._db, self.store.unregister_watcher, self.id)
            log.info(
                "stopped: released %d partitions",
                released,
                extra={"event": "stopped", "count": released, "watcher": self.id},
            )
        except Exception as error:  # the leases will expire on their own
            log.warning(
                "could not release leases on stop (%s); they expire after %gs", error, self.config.lease_seconds
            )
        close = getattr(self.processor, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                await close()
        for executor in (self._db, self._writer, self._hb):
            executor.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------ database calls

    async def _db_call(self, executor: ThreadPoolExecutor, fn: Any, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, lambda: fn(*args, **kwargs))

    def _outage_delay(self, cap: float) -> float:
        """Exponential backoff with jitter while the database fails (tenacity's schedule)."""
        wait = wait_random_exponential(multiplier=0.2, max=cap)
        return float(wait(cast(RetryCallState, _RetryState(self._health.failures))))

    # ------------------------------------------------------------ heartbeat

    async def _heartbeat_loop(self) -> None:
        interval = self.config.lease_seconds / 3
        delay = interval
        while True:
            await asyncio.sleep(delay)
            delay = interval
            reports, self._progress = self._progress, {}
            try:
                await self._refresh_leases(
                    self._hb, self.store.heartbeat, self.id, self.config.lease_seconds, list(reports.values())
                )
            except WatcherGone:
                log.warning("this watcher's registration was reaped; registering again")
                with contextlib.suppress(Exception):
                    await self._register(self._hb)
                continue
            except Exception as error:
                self._progress = {**reports, **self._progress}  # keep them for the next beat; newer win
                self._health.failed("heartbeat", error)
                delay = self._outage_delay(interval)  # retry sooner: renew before the leases expire
                if time.monotonic() - self._last_renewal > self.config.lease_seconds and self.owned:
                    log.warning(
                        "could not renew leases for %gs: assuming all %d are lost",
                        self.config.lease_seconds,
                        len(self.owned),
                    )
                    for lease in self._reconcile([], dict(self.owned)):
                        log.warning(
                            "lost the lease on partition %s; no longer dispatching it",
                            lease.key,
                            extra={"event": "lease_lost", "key": lease.key, "watcher": self.id},
                        )
                continue
            self._health.ok()
            self._last_renewal = time.monotonic()

    async def _refresh_leases(self, executor: ThreadPoolExecutor, fn: Any, *args: Any) -> list[Lease]:
        """Ask the database which leases this watcher holds (`fn`) and reconcile with `owned`.

        Returns stray leases: held in the database but already given up here (to be released)."""
        before = dict(self.owned)
        started = time.monotonic()
        leases = await self._db_call(executor, fn, *args)
        lost = self._reconcile(leases, before)
        self._note_deadlines(leases, started)
        if lost:
            await self._tell_lost(executor, lost)
        return [lease for lease in leases if (lease.partition_id, lease.epoch) in self._given_up]

    async def _tell_lost(self, executor: ThreadPoolExecutor, lost: list[Lease]) -> None:
        """Say why leases went: the partition was cancelled (INFO), or another watcher has it (WARNING)."""
        try:
            statuses = await self._db_call(executor, self.store.partition_statuses, [x.partition_id for x in lost])
        except Exception:  # only the wording depends on it
            statuses = {}
        for lease in lost:
            event = _FINISHED_EVENTS.get(statuses.get(lease.partition_id, ""))
            if event is not None:
                log.info(
                    "partition %s is %s; no longer dispatching it",
                    lease.key,
                    statuses[lease.partition_id],
                    extra={"event": event, "key": lease.key, "watcher": self.id},
                )
            else:
                log.warning(
                    "lost the lease on partition %s; no longer dispatching it",
                    lease.key,
                    extra={"event": "lease_lost", "key": lease.key, "watcher": self.id},
                )

    def _reconcile(self, leases: list[Lease], before: dict[int, Lease]) -> list[Lease]:
        """Bring `owned` in line with `leases`, read from the database while `owned` was `before`.

        Only leases held before the read can be judged lost (one leased meanwhile is not in the
        answer yet), and a lease given up meanwhile is not taken back from a stale answer. Returns
        the leases lost.
        """
        current = {lease.partition_id: lease for lease in leases}
        lost = []
        for pid, lease in before.items():
            held = self.owned.get(pid)
            if held is None or held.epoch != lease.epoch:
                continue  # released, handed over or re-leased since the read began
            now = current.get(pid)
            if now is None or now.epoch != lease.epoch:
                lost.append(lease)
                self._forget(pid)
        for pid, lease in current.items():
            if (pid, lease.epoch) in self._given_up:
                continue
            if pid not in self.owned and not self.stopping:
                log.info(
                    "received partition %s", lease.key, extra={"event": "stolen", "key": lease.key, "watcher": self.id}
                )
                self.metrics.stolen += 1
            self.owned[pid] = lease
            if lease.wanted_by:
                self._drop_buffered(lambda item, pid=pid: item.partition_id == pid)
        return lost

    def _note_deadlines(self, leases: list[Lease], read_at: float) -> None:
        """Remember, on our monotonic clock, until when each lease is surely still ours: what the
        database said it had left, counted from before we asked."""
        for lease in leases:
            held = self.owned.get(lease.partition_id)
            if held is not None and held.epoch == lease.epoch:
                self._valid_until[lease.partition_id] = read_at + lease.remaining

    def _lease_may_have_expired(self, pid: int) -> bool:
        """True when this watcher cannot be sure it still holds `pid` (e.g. it was paused past its
        lease): then it must not start another item of it until the leases are read again."""
        margin = min(1.0, self.config.lease_seconds / 10)
        return time.monotonic() >= self._valid_until.get(pid, 0.0) - margin

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

    async def _retention_loop(self, older_than: float) -> None:
        """Delete old finished partitions now and then (bounded batches, on a thread of its own)."""
        while True:
            try:
                deleted = await asyncio.to_thread(self.store.cleanup, older_than)
                if deleted["partitions"]:
                    log.info("retention: deleted %s", deleted)
            except Exception as error:
                log.warning("retention cleanup failed: %s", error)
            await asyncio.sleep(self.config.retention_every)

    # ------------------------------------------------------------ polling

    async def _poll_loop(self) -> None:
        """Fetch whenever woken (a flush landed, the buffer ran low); do the lease bookkeeping
        (learn steal requests, hand over, lease more, steal) once per poll interval or when due."""
        cfg = self.config
        next_maintenance = 0.0
        while not self.stopping:
            self._wake.clear()  # before the work: a wake-up arriving during it is kept, not lost
            delay = cfg.poll_interval
            try:
                if self._maintain_now or time.monotonic() >= next_maintenance:
                    self._maintain_now = self._acquire_now = False
                    await self._maintain()
                    next_maintenance = time.monotonic() + cfg.poll_interval
                elif self._acquire_now:  # the latency path: one statement, then the fetch below
                    self._acquire_now = False
                    await self._lease_more(steal=False)
                await self._fill_buffer()
                self._health.ok()
                self._failed_polls = 0
                delay = max(0.0, next_maintenance - time.monotonic())
            except DatabaseUnavailable as error:
                self._health.failed("poll", error)
                delay = self._outage_delay(5.0)
            except Exception as error:  # a bug of ours, or a database error that is not an outage
                self._failed_polls += 1
                log.error(
                    "poll failed (%s: %s)",
                    type(error).__name__,
                    error,
                    exc_info=error,
                    extra={"event": "poll_failed", "error": str(error), "watcher": self.id},
                )
                if self._failed_polls >= FAILED_POLLS_FATAL:
                    self._die(f"{self._failed_polls} polls in a row failed: {type(error).__name__}: {error}", error)
                    return
                self._maintain_now = True
                delay = self._outage_delay(5.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=delay)

    def _windowed(self, lease: Lease) -> bool:
        """Whether `lease`'s partition or its queue has time windows at all (most have none)."""
        return lease.windows is not None or self.queue_settings.windows is not None

    def _opens_at(self, lease: Lease, now: datetime) -> datetime:
        """When `lease`'s partition may next be dispatched: `now` if its windows and its queue's are
        open (windows that never overlap: look again in an hour)."""
        queue = self.queue_settings
        if lease.windows is None and queue.windows is None:
            return now
        own = (windows.parse_windows(lease.windows), windows.zone(lease.window_tz))
        opens = windows.next_dispatch((own, (queue.parsed, queue.zone)), now)
        return opens if opens is not None else now + timedelta(hours=1)

    def _closed(self) -> set[int]:
        """Owned partitions outside their time windows now."""
        now = datetime.now(UTC)
        return {pid for pid, lease in self.owned.items() if self._opens_at(lease, now) != now}

    async def _defer_closed(self) -> None:
        """Release partitions whose window is closed (once their items in flight are done) until it opens."""
        now = datetime.now(UTC)
        busy = Counter(item.partition_id for item in self.inflight.values())
        closed = [(lease, opens) for lease in self.owned.values() if (opens := self._opens_at(lease, now)) != now]
        closed = [(lease, opens) for lease, opens in closed if not busy[lease.partition_id]]
        if closed:
            deferred = await self._db_call(self._db, self.store.defer, self.id, closed)
            log.info("deferred %d partitions until their time window opens", deferred)
            for lease, _ in closed:
                self._forget(lease.partition_id)

    async def _maintain(self) -> None:
        cfg = self.config
        settings = self.queue_settings
        if time.monotonic() - self._settings_read_at >= cfg.poll_interval:  # not on every early maintenance
            settings = await self._db_call(self._db, self.store.queue_settings, cfg.queue)
            self._settings_read_at = time.monotonic()
        if settings.limited and (not self.queue_settings.limited or settings.limit < self.queue_settings.limit):
            # A limit set or lowered while items wait in the buffer: they hold no slot, so give them
            # back (they are fetched again through the slot claim) instead of dispatching them.
            self._drop_buffered(lambda item: True)
        self.queue_settings = settings
        await self._defer_closed()
        stray = await self._refresh_leases(self._db, self.store.owned, self.id)
        if stray:
            await self._db_call(self._db, self.store.release, self.id, stray, kind="released")
        await self._hand_over_wanted()
        await self._lease_more(steal=True)

    async def _lease_more(self, *, steal: bool) -> None:
        """Lease ready partitions up to capacity; with `steal`, when none is free, ask for a fair share."""
        cfg = self.config
        if self.stopping or not self.queue_settings.is_open(datetime.now(UTC)):
            return  # a closed queue: lease nothing until its window opens
        room = cfg.max_partitions - len(self.owned)
        if room > 0:
            started = time.monotonic()
            gained = await self._db_call(self._db, self.store.acquire, self.id, cfg.queue, room, cfg.lease_seconds)
            for lease in gained:
                self.owned[lease.partition_id] = lease
                log.info(
                    "leased partition %s",
                    lease.key,
                    extra={"event": "leased", "key": lease.key, "watcher": self.id},
                )
                if lease.pending is not None:
                    self._uncharged[lease.partition_id] = lease
            self._note_deadlines(gained, started)
            if self._uncharged:
                await self._charge_lost()
            if steal and not gained and time.monotonic() - self._last_steal >= max(1.0, cfg.poll_interval):
                self._last_steal = time.monotonic()
                marked = await self._db_call(
                    self._db,
                    self.store.request_steals,
                    self.id,
                    cfg.queue,
                    capacity=cfg.max_partitions,
                    most=cfg.steals_per_cycle,
                )
                if marked:
                    log.info("asked for %d partitions toward a fair share", marked)
                    self.metrics.steal_requests += marked

    async def _charge_lost(self) -> None:
        """Charge the deliveries that partitions taken over had unanswered, before fetching from them
        (a partition stays out of fetches until its charge is written)."""
        for pid, lease in list(self._uncharged.items()):
            if self.owned.get(pid) is not lease:
                self._uncharged.pop(pid, None)
                continue
            charged = await self._db_call(
                self._db, self.store.charge_lost, self.id, lease, max_attempts=self.config.max_attempts
            )
            self._uncharged.pop(pid, None)
            for c in charged:
                what = "failed" if c["failed"] else "will be delivered again"
                log.warning(
                    "item %s of partition %s at gate %s: %s; the item %s",
                    c["item"],
                    lease.key,
                    c["gate"],
                    c["error"],
                    what,
                    extra={
                        "event": "item_failed" if c["failed"] else "item_lost",
                        "key": lease.key,
                        "gate": c["gate"],
                        "item": c["item"],
                        "attempt": c["attempt"],
                        "error": c["error"],
                        "watcher": self.id,
                    },
                )
            if any(c["failed"] for c in charged):
                self._maintain_now = True  # the partition may have failed with it: read the leases again

    def _kept(self) -> dict[int, list[tuple[int, int]]]:
        """What the next fetch rewrites: the in-flight items of partitions whose record is due a rewrite."""
        due = {pid for pid, n in self._appended.items() if n >= COMPACT_AFTER}
        if not due:
            return {}
        taken = self._inflight_entries(lambda item: item.partition_id in due)
        return {pid: taken.get(pid, []) for pid in due}

    def _note_fetch(self, ready: list[ReadyItem], kept: dict[int, list[tuple[int, int]]]) -> None:
        """Count the appends to each fetched partition's record (a rewrite starts again at 0)."""
        for pid in {item.partition_id for item in ready}:
            self._appended[pid] = 0 if pid in kept else self._appended[pid] + 1

    def _inflight_entries(self, which: Callable[[ReadyItem], bool]) -> dict[int, list[tuple[int, int]]]:
        """Per partition, the (id, version) of this watcher's items in flight that match `which`."""
        taken: dict[int, list[tuple[int, int]]] = {}
        for item in self.inflight.values():
            if which(item):
                taken.setdefault(item.partition_id, []).append((item.id, item.version))
        return taken

    def _is_suspect(self, item: ReadyItem) -> bool:
        """An item to deliver alone: its last deliveries were lost with their watcher twice in a row, or
        once when one more loss would use up its attempts. Alone, a loss is surely its own doing."""
        return item.lost >= 2 or (item.lost >= 1 and item.attempts + 1 >= self.config.max_attempts)

    def _take(self, ready: list[ReadyItem]) -> None:
        """Put freshly fetched items in flight: into the buffer, or aside as suspects."""
        for item in ready:
            lease = self.owned.get(item.partition_id)
            if item.id in self.inflight or lease is None or lease.epoch != item.epoch or lease.wanted_by:
                self._unknown_lease(item, lease)
                continue  # (a limited queue: its slot stays counted until the next fetch sets the count again)
            self.inflight[item.id] = item
            if item.lost and self._is_suspect(item):  # `lost` is 0 but after a watcher died
                self._suspects.append(item)
                self._suspect_found.set()
            else:
                self._buffer.put_nowait(item)

    def _held_weight(self) -> int:
        """Weight of the items fetched whose processor call has not returned (buffered or running):
        the slots this watcher holds. An answered item's slot is free even before its answer is written."""
        return sum(item.weight for item_id, item in self.inflight.items() if item_id not in self._answered)

    def _not_now(self) -> set[int]:
        """Owned partitions not to fetch from now: outside their windows, or with a charge pending."""
        closed = self._closed()
        return closed | set(self._uncharged) if self._uncharged else closed

    async def _fill_buffer(self) -> None:
        if self._isolating:
            return  # a suspect is delivered alone
        if self.queue_settings.windows is not None and not self.queue_settings.is_open(datetime.now(UTC)):
            return  # in-flight items finish; nothing new is fetched
        if self.queue_settings.limited:
            return await self._fill_within_limit()
        target = max(4 * self.config.concurrency, PREFETCH)
        if self._buffer.qsize() > target // 2:  # still half full: fetch later, in a bigger batch
            return
        want = target - self._buffer.qsize() - len(self.busy)
        if want <= 0 or not self.owned or self.stopping:
            return
        ready = await self._db_call(
            self._db,
            self.store.fetch_ready,
            self.id,
            want,
            list(self.inflight),
            closed=self._not_now(),
            kept=(kept := self._kept()),
        )
        self._note_fetch(ready, kept)
        self._take(ready)

    def _unknown_lease(self, item: ReadyItem, lease: Lease | None) -> None:
        """A fetch found an item of a partition the database says we hold, under an epoch we do not
        know: handed over to us (a steal we asked for) or re-leased. Read the leases now, not at the
        next poll interval, and fetch again."""
        if lease is None or lease.epoch < item.epoch:
            self._maintain_now = True
            self._wake.set()

    async def _fill_within_limit(self) -> None:
        """A queue with a concurrency limit: fetch no more than idle workers can start now (a
        prefetched item would hold a slot while it waits). The same call gives back the slots of
        items answered since the last one and claims the new items' slots (workers wake the poller
        on every answer, so a freed slot is reused or returned at once)."""
        want = (
            0 if self.stopping or self._isolating else self.config.concurrency - len(self.busy) - self._buffer.qsize()
        )
        held = self._held_weight()
        if (want <= 0 or not self.owned) and held == self._slots_reported:
            return
        claim, want = SlotClaim(self.config.queue, held), max(want, 0) if self.owned else 0
        ready = await self._db_call(
            self._db,
            self.store.fetch_ready,
            self.id,
            want,
            list(self.inflight),
            slots=claim,
            closed=self._not_now(),
            kept=(kept := self._kept()),
        )
        self._note_fetch(ready, kept)
        self._slots_reported = held + sum(item.weight for item in ready)
        self._take(ready)

    async def _hand_over_wanted(self) -> None:
        busy = Counter(item.partition_id for item in self.inflight.values())
        for pid, lease in list(self.owned.items()):
            if lease.wanted_by and not busy[pid]:
                thief = await self._db_call(self._db, self.store.hand_over, self.id, lease, self.config.lease_seconds)
                if thief:
                    log.info(
                        "handed partition %s over to %s",
                        lease.key,
                        thief,
                        extra={"event": "handed_over", "key": lease.key, "watcher": self.id},
                    )
                    self.metrics.handed_over += 1
                    self._forget(pid)

    # ------------------------------------------------------------ dispatch

    async def _worker(self) -> None:
        while (item := await self._buffer.get()) is not None:
            lease = self.owned.get(item.partition_id)
            if self.stopping or self._isolating or lease is None or lease.epoch != item.epoch or lease.wanted_by:
                self.inflight.pop(item.id, None)
                continue
            if self._windowed(lease) and self._opens_at(lease, now := datetime.now(UTC)) != now:  # closed since
                self.inflight.pop(item.id, None)
                continue
            if self._lease_may_have_expired(item.partition_id):  # paused past the lease? ask first
                self.inflight.pop(item.id, None)
                self._maintain_now = True
                self._wake.set()
                continue
            await self._run_one(item, lease)
            if self._buffer.qsize() < max(4 * self.config.concurrency, PREFETCH) // 2:
                self._wake.set()

    async def _run_one(self, ready: ReadyItem, lease: Lease) -> None:
        """Deliver one item and queue its outcome, with its record, for the next group commit."""
        self.busy.add(ready.id)
        item = Item(
            ready.id, ready.partition, ready.queue, ready.gate, ready.attempts + 1, ready.data, self._reporter(ready)
        )
        failure: BaseException | None = None
        timeout = lease.item_timeout or self.config.item_timeout
        started_us = time.time_ns() // 1000
        started = time.perf_counter_ns()
        try:
            with tracing.delivery(ready.id, ready.partition, ready.queue, ready.gate, item.attempt) as span:
                try:
                    response = await call_processor(self.processor, item, timeout)
                except asyncio.CancelledError:
                    raise
                except Exception as error:  # a call past its item timeout is a RetryLater, like any transient one
                    failure = error
                elapsed = time.perf_counter_ns() - started
                self.metrics.latency.observe(elapsed / 1e9)
                if failure is None:
                    try:
                        outcome = outcome_of(ready, self.policy, response=response)
                    except Exception as error:  # an answer our rules cannot read: a transient failure
                        failure = error
                if failure is not None:
                    outcome = outcome_of(ready, self.policy, error=failure)
                span.outcome(outcome.kind, outcome.error)
        except Exception as error:  # a bug of ours, not the processor's: fail the delivery, transiently
            log.exception(
                "internal error delivering item %s",
                ready.id,
                extra={"event": "internal_error", "key": ready.partition, "item": ready.id, "watcher": self.id},
            )
            failure, elapsed = error, time.perf_counter_ns() - started
            outcome = outcome_of(ready, self.policy, error=error)
        finally:
            self.busy.discard(ready.id)
            report = self._progress.pop(ready.id, None)  # its answer is written instead
        # The delivery's record: its number, attempt, start, duration and (a Python processor's own
        # exception) the end of its traceback; the HTTP processor's errors are their own words.
        outcome.n, outcome.attempt = ready.deliveries + 1, item.attempt
        outcome.started_us, outcome.duration_us = started_us, elapsed // 1000
        if failure is not None and not isinstance(self.processor, HTTPProcessor):
            text = "".join(traceback.format_exception(failure)).rstrip()
            outcome.detail = text if len(text) <= TRACEBACK_KEPT else "..." + text[-(TRACEBACK_KEPT - 3) :]
        if report is not None and outcome.kind == Kind.LATER and outcome.progress is None:
            outcome.progress = report.fraction
        self.results.append(outcome)
        self._answered.add(ready.id)
        self._results_ready.set()

    async def _isolation_loop(self) -> None:
        """Deliver suspects alone: stop starting anything else, let what runs finish and its answers
        be written, record the suspect as the only delivery in flight here, deliver it, write its answer."""
        while True:
            await self._suspect_found.wait()
            self._suspect_found.clear()
            while self._suspects and not self.stopping:
                self._isolating = True
                self._drop_buffered(lambda item: True)  # taken, never started: fetched again afterwards
                await self._until_quiet()
                item = self._suspects.popleft()
                lease = self.owned.get(item.partition_id)
                if lease is None or lease.epoch != item.epoch or self.stopping:
                    self.inflight.pop(item.id, None)
                    continue
                try:
                    alone = await self._db_call(self._db, self.store.isolate, self.id, item)
                except Exception as error:
                    log.warning(
                        "could not deliver item %s alone (%s); it will be fetched again",
                        item.id,
                        error,
                        extra={"event": "isolation_failed", "item": item.id, "error": str(error), "watcher": self.id},
                    )
                    alone = False
                if not alone:
                    self.inflight.pop(item.id, None)
                    continue
                log.warning(
                    "delivering item %s of partition %s alone: its last %d deliveries were lost with their watcher",
                    item.id,
                    item.partition,
                    item.lost,
                    extra={
                        "event": "item_isolated",
                        "key": item.partition,
                        "gate": item.gate,
                        "item": item.id,
                        "attempt": item.attempts + 1,
                        "watcher": self.id,
                    },
                )
                await self._run_one(item, lease)
                await self._until_quiet()
            self._isolating = False
            self._wake.set()

    async def _until_quiet(self) -> None:
        """Wait until nothing is being delivered and every answer is written (suspects set aside)."""
        while not self.stopping and (self.busy or self.results or len(self.inflight) > len(self._suspects)):
            self._results_ready.set()
            await asyncio.sleep(0.01)

    def _reporter(self, ready: ReadyItem) -> Any:
        """`item.progress(f)` of one delivery: kept for the next heartbeat (may run on a processor's thread)."""

        def report(fraction: float) -> None:
            self._progress[ready.id] = ProgressReport(ready.id, ready.partition_id, ready.epoch, ready.gate, fraction)

        return report

    # ------------------------------------------------------------ writing results

    async def _flush_loop(self) -> None:
        """Write answers as they come; after stop(), until none is left."""
        while True:
            await self._results_ready.wait()
            self._results_ready.clear()
            await self._flush_all(final=self._closing)
            self._wake.set()
            if self._closing and not self.results:
                return

    async def _flush_all(self, *, final: bool = False) -> None:
        while self.results:
            batch = self.results[: self.config.flush_batch]
            await self._flush(batch, final=final)
            del self.results[: len(batch)]  # only now: a batch interrupted mid-write stays queued

    async def _apply(self, batch: list[Outcome], *, final: bool) -> Applied:
        """One group commit, retried with backoff while the database is unavailable."""
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(DatabaseUnavailable),
            wait=wait_exponential(multiplier=0.1, max=5.0),
            # Past a lease length another watcher may own the partitions; the fence would refuse.
            stop=stop_after_delay(self.config.shutdown_grace if final else self.config.lease_seconds),
            before_sleep=lambda state: self._health.failed("write", state.outcome.exception()),  # type: ignore[union-attr]
            reraise=True,
        )
        async for attempt in retrying:
            with attempt, tracing.group_commit(len(batch)):
                applied: Applied = await self._db_call(
                    self._writer, self.store.apply, self.id, batch, idle_after=self.config.lease_seconds / 3
                )
        return applied

    async def _flush(self, batch: list[Outcome], *, final: bool) -> None:
        try:
            applied = await self._apply(batch, final=final)
        except (StaleWrite, DatabaseUnavailable) as error:
            log.error(
                "dropped a batch of %d results: %s; the items will be delivered again",
                len(batch),
                error,
                extra={"event": "write_dropped", "count": len(batch), "error": str(error), "watcher": self.id},
            )
            self._settled(batch)
            return
        except Exception as error:  # some answer in the batch cannot be written: find it, write the rest
            log.error(
                "could not write a batch of %d answers (%s: %s); writing them one part at a time",
                len(batch),
                type(error).__name__,
                error,
                exc_info=error,
                extra={"event": "write_failed", "count": len(batch), "error": str(error), "watcher": self.id},
            )
            applied = await self._apply_in_parts(batch, final=final)
            if applied.written:
                self._failed_writes = 0
            else:
                self._failed_writes += 1
                if self._failed_writes >= FAILED_WRITES_FATAL:
                    self._die(f"{self._failed_writes} group commits in a row wrote nothing: {error}", error)
        else:
            self._failed_writes = 0
        self._health.ok()
        self._settled(batch)
        self._account(batch, applied)

    async def _apply_in_parts(self, batch: list[Outcome], *, final: bool) -> Applied:
        """Write a batch that failed as a whole: halves, then quarters... An outcome that cannot be
        written alone is replaced by a transient failure of its item that says why (no data, no
        children); if even that cannot be written, the item's partition is let go."""
        total = Applied()
        parts = [batch]
        while parts:
            part = parts.pop()
            try:
                _merge(total, await self._apply(part, final=final))
                continue
            except (StaleWrite, DatabaseUnavailable):
                continue  # dropped: delivered again
            except Exception as error:
                if len(part) > 1:
                    middle = len(part) // 2
                    parts += [part[middle:], part[:middle]]
                    continue
                failure = error
            outcome = part[0]
            replacement = self._unwritable(outcome, failure)
            try:
                if replacement is None:
                    raise failure
                _merge(total, await self._apply([replacement], final=final))
                log.warning(
                    "the answer for item %s could not be written (%s: %s); its delivery counts as failed",
                    outcome.item_id,
                    type(failure).__name__,
                    failure,
                    extra={
                        "event": "answer_unwritable",
                        "item": outcome.item_id,
                        "gate": outcome.gate,
                        "error": str(failure),
                        "watcher": self.id,
                    },
                )
            except Exception as error:
                lease = self.owned.get(outcome.partition_id)
                key = lease.key if lease else outcome.partition_id
                log.error(
                    "nothing can be written for item %s of partition %s (%s: %s); letting the partition go",
                    outcome.item_id,
                    key,
                    type(error).__name__,
                    error,
                    exc_info=error,
                    extra={
                        "event": "partition_unwritable",
                        "key": str(key),
                        "item": outcome.item_id,
                        "error": str(error),
                        "watcher": self.id,
                    },
                )
                if lease is not None:
                    self._forget(outcome.partition_id)
                    with contextlib.suppress(Exception):
                        await self._db_call(self._writer, self.store.release, self.id, [lease], kind="released")
        return total

    def _unwritable(self, outcome: Outcome, error: BaseException) -> Outcome | None:
        """A transient failure of the outcome's item saying its answer could not be written."""
        ready = self.inflight.get(outcome.item_id)
        if ready is None:
            return None
        cause = RuntimeError(f"the answer could not be written: {type(error).__name__}: {error}")
        replacement = outcome_of(ready, self.policy, error=cause)
        replacement.n, replacement.attempt = outcome.n, outcome.attempt
        replacement.started_us, replacement.duration_us = outcome.started_us, outcome.duration_us
        return replacement

    def _settled(self, batch: list[Outcome]) -> None:
        """The batch's outcomes are written or given up: their items are no longer in flight here."""
        for outcome in batch:
            self.inflight.pop(outcome.item_id, None)
            self._answered.discard(outcome.item_id)

    def _account(self, batch: list[Outcome], applied: Applied) -> None:
        """Counters, logs and lease bookkeeping after a group commit."""
        self.processed += len(applied.written)
        counts = self.metrics.outcomes
        for outcome in batch:
            if outcome.partition_id in applied.lost:
                continue
            counts[outcome.kind] += 1
            if outcome.kind in (Kind.RETRY, Kind.FAIL):
                self._log_failure(outcome)
        self.metrics.gate_advances += applied.advanced
        for pid, from_gate, to_gate in applied.advances:
            lease = self.owned.get(pid)
            key = lease.key if lease else str(pid)
            log.info(
                "partition %s advanced from gate %s to gate %s",
                key,
                from_gate,
                to_gate,
                extra={"event": "gate_advanced", "key": key, "gate": to_gate, "watcher": self.id},
            )
        if applied.lost or applied.released:
            self._acquire_now = True  # capacity freed: lease more at once
        for pid in applied.lost:
            lease = self.owned.get(pid)
            stale_epochs = {o.epoch for o in batch if o.partition_id == pid}
            if lease is not None and lease.epoch in stale_epochs:  # not a lease we took again since
                log.warning(
                    "lost the lease on partition %s; its late results were discarded",
                    lease.key,
                    extra={"event": "lease_lost", "key": lease.key, "watcher": self.id},
                )
                self._forget(pid)
        for pid in applied.released:
            lease = self.owned.get(pid)
            if lease is not None:
                how = applied.moves.get(pid, "idle")
                event = {"complete": "partition_completed", "fail": "partition_failed"}.get(how, "released")
                text = {"complete": "completed", "fail": "failed"}.get(how, "released (nothing due)")
                log.info(
                    "partition %s %s",
                    lease.key,
                    text,
                    extra={"event": event, "key": lease.key, "watcher": self.id},
                )
            self._forget(pid)

    def _log_failure(self, outcome: Outcome) -> None:
        """One WARNING per retried or failed delivery (rate-limited by the log handler when repetitive)."""
        lease = self.owned.get(outcome.partition_id)
        key = lease.key if lease is not None else None
        retry = outcome.kind == Kind.RETRY
        handler = redact_url(self._handler) if self._handler else None
        log.warning(
            "item %s of partition %s at gate %s, attempt %s %s: %s%s",
            outcome.item_id,
            key,
            outcome.gate,
            outcome.attempt or outcome.attempts,
            f"failed, retrying in {outcome.delay:.3g}s" if retry else "failed for good",
            outcome.error,
            f" (handler {handler})" if handler else "",
            extra={
                "event": "item_retried" if retry else "item_failed",
                "key": key,
                "gate": outcome.gate,
                "item": outcome.item_id,
                "attempt": outcome.attempt or outcome.attempts,
                "error": outcome.error,
                "watcher": self.id,
                "handler": handler,
            },
        )


_FINISHED_EVENTS = {"complete": "partition_completed", "failed": "partition_failed", "cancelled": "partition_cancelled"}


def _merge(total: Applied, applied: Applied) -> None:
    total.written += applied.written
    total.lost |= applied.lost
    total.released |= applied.released
    total.advanced += applied.advanced
    total.advances += applied.advances
    total.moves.update(applied.moves)
