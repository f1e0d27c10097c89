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
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..core.errors import DatabaseUnavailable
from ..core.records import ABANDONED, GIVEN_BACK
from ..processors import HTTPOptions, ProcessorLike
from ..processors.pipeline import close_processors
from ..store import Store
from ..store.notify import Listener
from .config import WatcherConfig
from .delivery import Delivering
from .fetching import Fetching
from .writing import Writing

log = logging.getLogger("feedproc.watcher")


class Watcher(Fetching, Delivering, Writing):
    """One watcher process's engine. `await watcher.run()` until `watcher.stop()` is called.

    `Watcher(store, processor, config)` (see `WatcherState`), or `Watcher.connect(url, ...)`."""

    @classmethod
    def connect(
        cls,
        url: str,
        processor: ProcessorLike | None,
        config: WatcherConfig | None = None,
        *,
        table_prefix: str | None = None,
        http_options: HTTPOptions | Mapping[str, Any] | None = None,
    ) -> Watcher:
        """A watcher of the database at `url` (the tables under `table_prefix`, else
        $FEEDPROC_TABLE_PREFIX, else `feedproc_`) on a connection pool of its own, closed by
        `close()`: what `feedproc watch` runs. Raises SchemaMissing unless the schema is this version's."""
        # Four connections serve the poll, the group commit and the heartbeat; no ping before each
        # checkout on the hot path (a lost connection is an outage the loops retry).
        store = Store(url, pool_size=4, pre_ping=False, table_prefix=table_prefix)
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
        await self.router.start(self._started_processors, strict=True)  # its own processor: fails the start
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
        if self.store.dialect.notifies:
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
        helpers.append(asyncio.create_task(self._schedule_loop(), name="schedules"))
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

    async def _start_up(self) -> None:
        """Read the queue's settings and pipeline and register this watcher, waiting out a database
        that is unavailable meanwhile (with backoff, as the running loops do) until `stop()`: a
        watcher started during a blip (a reset storm, a failover) waits for it instead of exiting."""
        cfg = self.config
        while True:
            try:
                self.queue_settings = await self._db_call(self._db, self.store.queue_settings, cfg.queue)
                await self._follow_pipeline()
                if self.code_pipeline is not None and self.code_pipeline.spec.limits:  # the row gate slots lock
                    await self._db_call(self._db, self.store.set_queue, cfg.queue, by=self.id)
                await self._register(self._db)
                self._health.ok()
                return
            except DatabaseUnavailable as error:
                self._health.failed("start", error)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), timeout=self._outage_delay(5.0))
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
        self._die(reason, error)

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
        # Still running past the grace: abandoned, each charged and recorded with how long it ran. Taken
        # now: cancelling the calls below takes them out of `busy`.
        busy = set(self.busy)
        abandoned = self._unanswered(lambda item: item.id in busy, ABANDONED)
        if busy:
            log.warning("abandoned %d items still running after the grace period; they will be redelivered", len(busy))
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
        if self.results:  # answers that could not be written in time: given back, on record as such
            unwritten = {o.item_id for o in self.results}
            reason = "watcher {watcher} stopped before the answer of delivery {attempt} was written"
            for pid, given in self._unanswered(lambda item: item.id in unwritten, GIVEN_BACK, reason).items():
                abandoned.setdefault(pid, []).extend(given)
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
                gate_attempts=self.router.attempts,
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
        await close_processors([*self.router.processors, *self._retired])
        for executor in (self._db, self._writer, self._hb):
            executor.shutdown(wait=False, cancel_futures=True)

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

    async def _retention_loop(self, older_than: float) -> None:
        """Delete old finished partitions now and then (bounded batches, on a thread of its own)."""
        while True:
            try:
                deleted = await asyncio.to_thread(self.store.cleanup, older_than)
                if deleted["partitions"]:
                    log.info("retention: deleted %s", deleted)
            except DatabaseUnavailable as error:  # an outage: said once, by the loops' health
                self._health.failed("retention", error)
            except Exception as error:
                log.warning("retention cleanup failed: %s", error)
            await asyncio.sleep(self.config.retention_every)
