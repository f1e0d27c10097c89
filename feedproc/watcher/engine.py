"""The watcher: leases partitions, dispatches their ready items to a Processor, writes the answers.

The `Watcher` builds its parts, each an object owning its state, and wires them: the `Router`
(pipeline and queue settings followed), the `LeaseBook` (leases held, the heartbeat), `InFlight`
(items from fetch to written outcome) and the `ReadyBuffer`, the `Fetcher` (the poll loop),
`Maintenance` (the poll loop's bookkeeping, schedules, retention), `Isolation` (suspects delivered
alone), the `DeliveryPool` (workers), the `Completer` (group commits) and the `HookSender`
(completion hooks from the outbox). They share only what
`calls` gives them: database calls and their health, the lifecycle, the poll loop's wake-ups.

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
import os
import socket
import uuid
import warnings
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..core.errors import DatabaseUnavailable, InvalidInput
from ..core.records import ABANDONED, GIVEN_BACK, Lease, QueueSettings, ReadyItem
from ..metrics import WatcherMetrics
from ..processors import HTTPOptions, HTTPProcessor
from ..processors.pipeline import GateRouter, HookFunction, Pipeline
from ..processors.transactional import AnyProcessor, check_transactional, is_transactional
from ..store import Store
from ..store.notify import Listener
from .adaptive import AdaptiveConcurrency
from .calls import DatabaseCalls, Lifecycle, PollSignals
from .config import WatcherConfig
from .delivery import DeliveryPool
from .fetching import Fetcher
from .flight import InFlight, ReadyBuffer
from .hooks import HookSender, HookSettings
from .isolation import Isolation
from .leases import LeaseBook
from .maintenance import Maintenance
from .reports import HeartbeatReports
from .routing import Router
from .writing import Completer

log = logging.getLogger("feedproc.watcher")


class Watcher:
    """One watcher process's engine. `await watcher.run()` until `watcher.stop()` is called.

    `Watcher(store, processor, config)`, or `Watcher.connect(url, ...)`. `processor`: the watcher's
    own (`--handler`/`--processor`), a Python `Pipeline`, or None (the queue's pipeline routes every
    gate); `http_options` make the HTTP processors of a stored pipeline's gates. `hooks`: the
    functions of the queue's `python` completion hooks (a `Pipeline`'s own are taken too);
    `hook_secret` signs HTTP hooks (default: $FEEDPROC_HOOK_SECRET)."""

    def __init__(
        self,
        store: Store,
        processor: AnyProcessor | None,
        config: WatcherConfig | None = None,
        *,
        http_options: HTTPOptions | Mapping[str, Any] | None = None,
        hooks: Mapping[str, HookFunction] | None = None,
        hook_secret: str | None = None,
    ) -> None:
        self.store = store
        self._owns_store = False  # True when connect() made the store
        self.config = config = config or WatcherConfig()
        if config.batch > 1 and getattr(processor, "request", "json") == "raw":
            raise ValueError("a raw-request HTTPProcessor sends one item per request: batch must be 1")
        if isinstance(processor, HTTPProcessor) and is_transactional(processor, 0):
            raise InvalidInput("an HTTP processor cannot be transactional: only a Python processor on this database")
        check_transactional(processor, config.batch)
        self.id = f"{socket.gethostname()[:60]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._calls = calls = DatabaseCalls(store)
        self._signals = signals = PollSignals()
        self._life = life = Lifecycle(self.id, signals)
        self._flight = flight = InFlight()
        self._buffer = buffer = ReadyBuffer(flight)
        reports = HeartbeatReports()
        self._router = router = Router(calls, config, self.id, processor, _http_options(http_options, config), buffer)
        # prometheus-client metrics in a registry of this watcher's own, served by /metrics
        self.metrics = WatcherMetrics(config.queue, leases_held=lambda: len(leases.owned))
        self._leases = leases = LeaseBook(
            calls, config, self.id, life, signals, router, flight, buffer, reports, self.metrics
        )
        buffer.limit_by(lambda item: router.partition_limit(leases.owned.get(item.partition_id), item.gate))
        handler = processor.url if isinstance(processor, HTTPProcessor) else None
        self._completer = completer = Completer(
            calls, config, self.id, life, signals, router, leases, flight, reports, self.metrics, handler
        )
        self._isolation = isolation = Isolation(calls, self.id, life, signals, leases, flight, buffer, completer)
        self._pool = DeliveryPool(
            store,
            config,
            self.id,
            life,
            signals,
            router,
            leases,
            flight,
            buffer,
            isolation,
            completer,
            reports,
            self.metrics,
        )
        self._maintenance = maintenance = Maintenance(calls, config, self.id, life, router, leases, flight, completer)
        adaptive = AdaptiveConcurrency(
            calls,
            config.queue,
            self.id,
            flight,
            config.poll_interval,
            window_opened=buffer.drop_all,
            batched=lambda gate: router.batch_of(gate) > 1,
        )
        completer.written = adaptive.note
        self.metrics.follow_windows(lambda: adaptive.widths)
        self._fetcher = Fetcher(
            calls,
            config,
            self.id,
            life,
            signals,
            router,
            leases,
            flight,
            buffer,
            isolation,
            adaptive,
            maintenance.maintain,
        )
        functions = {**(processor.hook_functions if isinstance(processor, Pipeline) else {}), **(hooks or {})}
        secret = hook_secret if hook_secret is not None else os.environ.get("FEEDPROC_HOOK_SECRET") or None
        hook_calls = self.metrics.hooks
        self._hooks = HookSender(
            store,
            HookSettings.of(config),
            self.id,
            executor=calls.hooks,
            stopping=lambda: life.stopping,
            functions=functions,
            secret=secret,
            counted=lambda outcome: hook_calls.labels(config.queue, outcome).inc(),
            outage=lambda error: calls.health.failed("hooks", error),
        )
        completer.partitions_finished = self._hooks.wake  # its answers finished one: its hook is due now

    # What the rest of feedproc (the CLI, the probes, the tests) reads of a watcher

    @property
    def processor(self) -> AnyProcessor | None:
        """The watcher's own processor; None: the queue's pipeline routes every gate."""
        return self._router.processor

    @property
    def http_options(self) -> HTTPOptions:
        """What the HTTP processors of a stored pipeline's gates are made with."""
        return self._router.http_options

    @property
    def router(self) -> GateRouter:
        """The pipeline version followed now (each gate's processor and settings)."""
        return self._router.current

    @property
    def queue_settings(self) -> QueueSettings:
        """The queue's settings as last read (limit, pause, windows)."""
        return self._router.settings

    @property
    def owned(self) -> dict[int, Lease]:
        """The leases held, by partition id."""
        return self._leases.owned

    @property
    def inflight(self) -> dict[int, ReadyItem]:
        """Items fetched whose outcome is not yet written (or dropped), by id."""
        return self._flight.items

    @property
    def busy(self) -> set[int]:
        """Ids of the items a worker is processing now."""
        return self._flight.busy

    @property
    def processed(self) -> int:
        """Outcomes written so far."""
        return self._completer.processed

    @property
    def fatal(self) -> str | None:
        """Why the watcher gave up (its write path or a task died); None while well."""
        return self._life.fatal

    async def deliver_hooks(self) -> int:
        """Call the queue's completion hooks due now, once each, and wait for them (the watcher
        calls them on its own as well); returns how many were called."""
        return await self._hooks.deliver_due()

    def stop(self) -> None:
        """Ask the watcher to stop: no new leases or items; in-flight items get `shutdown_grace`."""
        self._life.stop()

    @property
    def stopping(self) -> bool:
        return self._life.stopping

    @property
    def database_outage(self) -> str | None:
        """The database outage this watcher is waiting out (what it is, for how long), or None. The
        database may answer a ping meanwhile: a read-only one does, and refuses every write."""
        return self._calls.health.outage()

    @property
    def heartbeat_age(self) -> float:
        """Seconds since the leases were last renewed (or the watcher started)."""
        return self._leases.heartbeat_age

    @classmethod
    def connect(
        cls,
        url: str,
        processor: AnyProcessor | None,
        config: WatcherConfig | None = None,
        *,
        table_prefix: str | None = None,
        http_options: HTTPOptions | Mapping[str, Any] | None = None,
        listen_url: str | None = None,
    ) -> Watcher:
        """A watcher of the database at `url` (the tables under `table_prefix`, else
        $FEEDPROC_TABLE_PREFIX, else `feedproc_`) on a connection pool of its own, closed by
        `close()`: what `feedproc watch` runs. Notifications come over `listen_url` when given (a
        direct connection beside a pooler: `store/pooling.py`). Raises SchemaMissing unless the
        schema is this version's."""
        # Four connections serve the poll, the group commit and the heartbeat; no ping before each
        # checkout on the hot path (a lost connection is an outage the loops retry).
        # A transactional processor holds a connection per item it runs: one more each.
        config = config or WatcherConfig()
        extra = config.concurrency if check_transactional(processor, config.batch) else 0
        store = Store(url, pool_size=4 + extra, pre_ping=False, table_prefix=table_prefix, listen_url=listen_url)
        try:
            store.check_schema()
        except BaseException:
            store.close()
            raise
        watcher = cls(store, processor, config, http_options=http_options)
        watcher._owns_store = True
        return watcher

    def close(self) -> None:
        """Release the connections `connect()` opened (after `run()` has returned); a store passed
        to the constructor stays open: its owner closes it."""
        if self._owns_store:
            self.store.close()

    async def run(self) -> None:
        """Run until `stop()`; then finish or abandon in-flight items, release leases and exit."""
        cfg = self.config
        # Plain-`def` processors run in the default executor: give it a thread per concurrent item.
        asyncio.get_running_loop().set_default_executor(
            ThreadPoolExecutor(cfg.concurrency + 2, thread_name_prefix="feedproc-process")
        )
        await self._router.start()  # its own processor: fails the start
        await self._start_up()
        log.info(
            "watcher %s on queue %r: concurrency %d, up to %d partitions, lease %gs",
            self.id,
            cfg.queue,
            cfg.concurrency,
            cfg.effective_max_partitions,
            cfg.lease_seconds,
        )
        listener = None
        if self.store.listen_dsn is not None:
            loop = asyncio.get_running_loop()
            listener = Listener(
                self.store.listen_dsn,
                self.store.table_prefix,
                cfg.queue,
                lambda: loop.call_soon_threadsafe(self._work_arrived),
                watcher_id=self.id,
                on_wanted=lambda: loop.call_soon_threadsafe(self._partitions_wanted),
            )
            listener.start()
        workers = [asyncio.create_task(self._pool.worker(), name=f"worker-{n}") for n in range(cfg.concurrency)]
        helpers = [
            asyncio.create_task(self._leases.heartbeat_loop(), name="heartbeat"),
            asyncio.create_task(self._fetcher.poll_loop(), name="poll"),
        ]
        helpers.append(asyncio.create_task(self._isolation.loop(self._pool.deliver_one), name="isolation"))
        helpers.append(asyncio.create_task(self._maintenance.schedule_loop(), name="schedules"))
        helpers.append(asyncio.create_task(self._hooks.loop(), name="hooks"))
        if cfg.retention:
            helpers.append(asyncio.create_task(self._maintenance.retention_loop(cfg.retention), name="retention"))
        flusher = asyncio.create_task(self._completer.loop(), name="flush")
        for task in [*workers, *helpers, flusher]:
            task.add_done_callback(self._task_ended)
        try:
            await self._life.wait()
        finally:
            if listener is not None:
                await asyncio.to_thread(listener.stop)
            await self._shutdown(workers, helpers, flusher)

    async def _start_up(self) -> None:
        """Read the queue's settings and pipeline and register this watcher, waiting out a database
        that is unavailable meanwhile (with backoff, as the running loops do) until `stop()`: a
        watcher started during a blip (a reset storm, a failover) waits for it instead of exiting."""
        calls, router = self._calls, self._router
        while True:
            try:
                await router.read_settings()
                await router.follow_pipeline()
                code = router.code_pipeline
                if code is not None and (code.spec.limits or code.spec.flow.any):  # the row gate slots lock
                    await calls.call(calls.poll, self.store.set_queue, self.config.queue, by=self.id)
                await self._leases.register(calls.poll)
                calls.health.ok()
                return
            except DatabaseUnavailable as error:
                calls.health.failed("start", error)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._life.wait(), timeout=calls.outage_delay(5.0))
                if self.stopping:
                    raise

    def _task_ended(self, task: asyncio.Task[Any]) -> None:
        """A task of the watcher ended. Before stop() that is a bug of ours: say so and give up."""
        if self.stopping or task.cancelled():
            return
        error = task.exception()
        reason = (
            f"{task.get_name()} task died: {type(error).__name__}: {error}" if error else f"{task.get_name()} ended"
        )
        self._life.die(reason, error)

    async def _shutdown(
        self, workers: list[asyncio.Task[Any]], helpers: list[asyncio.Task[Any]], flusher: asyncio.Task[Any]
    ) -> None:
        calls, flight, completer, leases = self._calls, self._flight, self._completer, self._leases
        self._life.stop()
        self._buffer.drop_all()
        for _ in workers:  # each worker finishes its current item, then takes a sentinel and exits
            self._buffer.put(None)
        if self.busy:
            log.info("stopping: waiting up to %gs for %d in-flight items", self.config.shutdown_grace, len(self.busy))
        _, unfinished = await asyncio.wait(workers, timeout=self.config.shutdown_grace)
        # Still running past the grace: abandoned, each charged and recorded with how long it ran. Taken
        # now: cancelling the calls below takes them out of `busy`.
        busy = set(self.busy)
        abandoned = flight.unanswered(lambda item: item.id in busy, ABANDONED, answers=completer.results)
        if busy:
            log.warning("abandoned %d items still running after the grace period; they will be redelivered", len(busy))
        for task in [*unfinished, *helpers]:
            task.cancel()
        await asyncio.gather(*workers, *helpers, return_exceptions=True)
        # Let the flusher write every answer that arrived (it may be waiting out a database blip);
        # only past the grace period are unwritten answers given up (their items are redelivered).
        completer.close()
        try:
            await asyncio.wait_for(asyncio.shield(flusher), timeout=max(self.config.shutdown_grace, 1.0))
        except TimeoutError:
            log.warning("gave up writing %d answers on stop; those items will be delivered again", completer.unwritten)
            flusher.cancel()
            await asyncio.gather(flusher, return_exceptions=True)
        except Exception as error:
            log.error("writing answers on stop failed: %s", error)
        if completer.results:  # answers that could not be written in time: given back, on record as such
            unwritten = {o.item_id for o in completer.results}
            reason = "watcher {watcher} stopped before the answer of delivery {attempt} was written"
            which = lambda item: item.id in unwritten  # noqa: E731
            for pid, given in flight.unanswered(which, GIVEN_BACK, reason, answers=completer.results).items():
                abandoned.setdefault(pid, []).extend(given)
        try:
            # A lease taken by a poll that was cancelled mid-call is in the database, not in `owned`:
            # this read queues behind that call on the same thread, so it sees it.
            for lease in await calls.call(calls.poll, self.store.owned, self.id):
                leases.owned.setdefault(lease.partition_id, lease)
        except Exception:  # the release below says what went wrong, if anything
            pass
        try:
            released = await calls.call(
                calls.poll,
                self.store.release,
                self.id,
                list(leases.owned.values()),
                abandoned=abandoned,
                max_attempts=self.config.max_attempts,
                gate_attempts=self._router.current.attempts,
            )
            await calls.call(calls.poll, self.store.unregister_watcher, self.id)
            log.info(
                "stopped: released %d partitions",
                released,
                extra={"event": "stopped", "count": released, "watcher": self.id},
            )
        except Exception as error:  # the leases will expire on their own
            log.warning(
                "could not release leases on stop (%s); they expire after %gs", error, self.config.lease_seconds
            )
        await self._router.close()
        calls.shutdown()

    def _work_arrived(self) -> None:
        """A notification: new work in our queue (or a partition handed over to us). Lease it now, not
        at the next poll. Holding nothing, read the leases too: a handed-over partition is found by a
        fetch (see `Fetcher._unknown_lease`), and a watcher holding nothing does not fetch."""
        if self._leases.owned:
            self._signals.lease_soon()
        else:
            self._signals.maintain_soon()
        self._signals.wake()

    def _partitions_wanted(self) -> None:
        """A notification: another watcher asked for partitions of ours. Read the leases and hand
        them over (once their items in flight are done) now, not at the next poll."""
        self._signals.maintain_soon()
        self._signals.wake()


def _http_options(given: HTTPOptions | Mapping[str, Any] | None, config: WatcherConfig) -> HTTPOptions:
    """`given`, else the defaults with the watcher's `max_children`; a mapping (the old, untyped
    form) is taken as HTTPOptions' fields, with a DeprecationWarning."""
    if isinstance(given, HTTPOptions):
        return given
    if given is not None:
        warnings.warn("http_options as a mapping is deprecated: pass an HTTPOptions", DeprecationWarning, stacklevel=3)
    return HTTPOptions(**{"max_children": config.max_children, **(given or {})})
