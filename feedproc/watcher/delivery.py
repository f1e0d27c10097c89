"""The delivery pool: workers take buffered items, call the Processor (one item, or a batch of one
partition's), and queue each answer with its record for the group commit; a cancelled call (its
item or partition cancelled) is answered as a transient failure."""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from .. import tracing
from ..core.errors import Accepted, PermanentError, RetryLater, TooManyChildren
from ..core.fanin import refusal
from ..core.models import Item, Response
from ..core.policy import RetryPolicy, outcome_of
from ..core.records import Kind, Lease, Outcome, ProgressReport, QueueSettings, ReadyItem
from ..metrics import WatcherMetrics
from ..processors import HTTPProcessor
from ..processors.pipeline import GateRouter, Route
from ..store import Store
from .calls import Lifecycle, PollSignals
from .config import TRACEBACK_KEPT, WatcherConfig
from .fanin import fan_in
from .flight import CANCELLED_CALL, InFlight, ReadyBuffer, RunningCall
from .isolation import Isolation
from .leases import LeaseBook
from .reports import HeartbeatReports
from .routing import Router
from .writing import Completer

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

log = logging.getLogger("feedproc.watcher")


class DeliveryPool:
    """The workers (`worker`, `concurrency` of them) and what a delivery needs: its lease checked,
    its batch gathered, its timeout, its outcome read from the answer and handed to the completer."""

    def __init__(
        self,
        store: Store,
        config: WatcherConfig,
        watcher_id: str,
        lifecycle: Lifecycle,
        signals: PollSignals,
        router: Router,
        leases: LeaseBook,
        flight: InFlight,
        buffer: ReadyBuffer,
        isolation: Isolation,
        completer: Completer,
        reports: HeartbeatReports,
        metrics: WatcherMetrics,
    ) -> None:
        self._store = store  # read by fan-in items (what they collect), on a thread
        self._config = config
        self._id = watcher_id
        self._life = lifecycle
        self._signals = signals
        self._router = router
        self._leases = leases
        self._flight = flight
        self._buffer = buffer
        self._isolation = isolation
        self._completer = completer
        self._reports = reports
        self._metrics = metrics
        # Answers' accumulate operations per gate, under the router and queue settings they were
        # made from (`_accumulate_refusal`): rebuilt when either is replaced.
        self._operations: tuple[GateRouter, QueueSettings, dict[int, dict[str, str]]] | None = None

    async def worker(self) -> None:
        """Deliver buffered items until this worker's stop signal (None) is taken."""
        carry: ReadyItem | None = None  # taken while gathering a batch, not of it: this worker's next item
        while True:
            item = carry if carry is not None else await self._buffer.get()
            carry = None
            if item is None:
                return
            try:
                lease = self._startable(item)
                if lease is None:
                    continue
                size = self._router.batch_of(item.gate)
                if size == 1:
                    await self.deliver_one(item, lease)
                else:
                    batch, carry, last = await self._gather(item, size)
                    try:
                        if len(batch) == 1:
                            await self.deliver_one(item, lease)
                        else:
                            await self._run_batch(batch, lease)
                    finally:
                        for other in batch[1:]:
                            self._buffer.done(other)
                    if last:
                        return
            finally:
                self._buffer.done(item)  # its partition's limit counts it no more
            if self._buffer.servable() < self._config.effective_prefetch // 2:
                self._signals.wake()

    def _startable(self, item: ReadyItem) -> Lease | None:
        """The lease to deliver `item` under, or None when it must not start now (dropped from
        flight: it is fetched again when it may)."""
        leases = self._leases
        lease = leases.owned.get(item.partition_id)
        if (
            self._life.stopping
            or self._isolation.active
            or lease is None
            or lease.epoch != item.epoch
            or lease.wanted_by
        ):
            self._flight.drop(item.id)
            return None
        if leases.windowed(lease) and leases.opens_at(lease, now := datetime.now(UTC)) != now:  # closed since
            self._flight.drop(item.id)
            return None
        if leases.lease_may_have_expired(item.partition_id):  # paused past the lease? ask first
            self._flight.drop(item.id)
            self._signals.maintain_soon()
            self._signals.wake()
            return None
        return lease

    async def _gather(self, first: ReadyItem, size: int) -> tuple[list[ReadyItem], ReadyItem | None, bool]:
        """A batch led by `first`: the buffered items of the same partition, gate and lease (the
        buffer gives its partition's next one first), up to `batch`, waiting up to `batch_wait` for
        more. Returns the batch, the item taken that does not belong to it (delivered next by this
        worker) and whether this worker's stop signal was taken."""
        batch, cfg, deadline = [first], self._config, None
        loop = asyncio.get_running_loop()
        while len(batch) < size:
            try:
                item = self._buffer.get_nowait(like=first)
            except asyncio.QueueEmpty:
                if cfg.batch_wait <= 0 or self._life.stopping:
                    break
                deadline = deadline if deadline is not None else loop.time() + cfg.batch_wait
                try:
                    async with asyncio.timeout_at(deadline):
                        item = await self._buffer.get()
                except TimeoutError:
                    break
            if item is None:
                return batch, None, True
            if (item.partition_id, item.gate, item.epoch) != (first.partition_id, first.gate, first.epoch):
                return batch, item, False
            batch.append(item)
        return batch, None, False

    async def deliver_one(self, ready: ReadyItem, lease: Lease) -> None:
        """Deliver one item and queue its outcome, with its record, for the next group commit."""
        flight = self._flight
        flight.busy.add(ready.id)
        item = Item(
            ready.id,
            ready.partition,
            ready.queue,
            ready.gate,
            ready.attempts + 1,
            ready.data,
            self._reporter(ready),
            deliveries=ready.deliveries + 1,
        )
        failure: Exception | None = None
        router = self._router.current  # the pipeline version this delivery starts under, kept to its end
        route = router.route(ready.gate)
        collects = router.collects(ready.gate, ready.collect)  # a fan-in item? (None for nearly all)
        timeout = self._timeout_of(lease, route)
        started_us = time.time_ns() // 1000
        started = time.perf_counter_ns()
        task = asyncio.current_task()
        assert task is not None
        flight.call_started(ready.id, RunningCall(ready.partition_id, task, (item,), started_us, started))
        self._reports.started(ProgressReport(ready.id, ready.partition_id, ready.epoch, ready.gate, None, started_us))
        # A transactional processor's transaction: opened before its call, given up by the call if it
        # raises (`call_in_transaction`), else owned here until its answer is written in it.
        transaction: Connection | None = None
        try:
            with tracing.delivery(ready.id, ready.partition, ready.queue, ready.gate, item.attempt) as span:
                result: Response | Exception
                try:
                    if collects is not None:  # what it collects, and the accumulator, read off the loop
                        await fan_in(self._store, self._id, route, collects, (ready,), (item,))
                    if router.transactional(route, ready.gate):
                        opened = await self._open_transaction()
                        given_up = partial(self._store.discard, opened)
                        result = await router.process_in_transaction(route, item, opened, timeout, given_up)
                        transaction = opened
                    else:
                        result = await router.process(route, item, timeout)
                except asyncio.CancelledError:
                    if not flight.was_cancelled(task):
                        raise  # the watcher is stopping
                    result = RetryLater(CANCELLED_CALL)
                    if router.transactional(route, ready.gate):
                        log.info(
                            "the call of item %s was cancelled: its processor's transaction was rolled back",
                            ready.id,
                            extra={"event": "transaction_cancelled", "item": ready.id, "watcher": self._id},
                        )
                except Exception as error:  # a call past its item timeout is a RetryLater, like any transient one
                    result = error
                finally:
                    flight.call_ended(ready.id)
                    self._reports.ended(ready.id)
                elapsed = time.perf_counter_ns() - started
                self._metrics.latency(Router.gate_label(route, ready.gate)).observe(elapsed / 1e9)
                outcome, failure = self._outcome_of(ready, result, route.policy)
                span.outcome(outcome.kind, outcome.error)
        except Exception as error:  # a bug of ours, not the processor's: fail the delivery, transiently
            log.exception(
                "internal error delivering item %s",
                ready.id,
                extra={"event": "internal_error", "key": ready.partition, "item": ready.id, "watcher": self._id},
            )
            failure, elapsed = error, time.perf_counter_ns() - started
            outcome = outcome_of(ready, route.policy, error=error)
        except BaseException:  # the watcher is stopping: the transaction's work is not kept
            if transaction is not None:
                await asyncio.shield(asyncio.to_thread(self._store.discard, transaction))
            raise
        finally:
            flight.busy.discard(ready.id)
        if transaction is not None:
            if outcome.kind in (Kind.RETRY, Kind.FAIL):
                # The processor answered, but not with an answer that can be written (too many
                # children, an accumulate name not declared...): its rows go with it, and its
                # item's failure is written as any is, in the group commit.
                await asyncio.to_thread(self._store.discard, transaction)
            else:
                self._record(ready, item, outcome, failure, started_us, elapsed, route.processor)
                await self._completer.complete_within(transaction, outcome)
                return
        self._queue_outcome(ready, item, outcome, failure, started_us, elapsed, route.processor)
        self._completer.flush_soon()

    async def _open_transaction(self) -> Connection:
        """`Store.transaction()` on a worker thread; one opened for a worker cancelled meanwhile is
        discarded (on SQLite it would hold the database's write lock until collected)."""
        loop = asyncio.get_running_loop()
        opening = loop.run_in_executor(None, self._store.transaction)
        try:
            return await asyncio.shield(opening)
        except asyncio.CancelledError:

            def discard(f: asyncio.Future[Connection]) -> None:
                if not f.cancelled() and f.exception() is None:
                    try:
                        loop.run_in_executor(None, self._store.discard, f.result())
                    except RuntimeError:  # no executor any more (the watcher stopping): here, then
                        self._store.discard(f.result())

            opening.add_done_callback(discard)
            raise

    async def _run_batch(self, batch: list[ReadyItem], lease: Lease) -> None:
        """Deliver a batch in one call (`call_batch`) and queue each item's outcome, with its record.
        Every item's record has the batch's start and duration; failures are each item's own."""
        task = asyncio.current_task()
        assert task is not None
        flight = self._flight
        items = [Item(r.id, r.partition, r.queue, r.gate, r.attempts + 1, r.data, self._reporter(r)) for r in batch]
        for item, r in zip(items, batch, strict=True):
            item.deliveries = r.deliveries + 1
        started_us, started = time.time_ns() // 1000, time.perf_counter_ns()
        call = RunningCall(batch[0].partition_id, task, tuple(items), started_us, started)
        for ready in batch:
            flight.busy.add(ready.id)
            flight.call_started(ready.id, call)
        router = self._router.current
        route = router.route(batch[0].gate)
        collects = router.collects(batch[0].gate, batch[0].collect)
        timeout = self._timeout_of(lease, route)
        for ready in batch:
            self._reports.started(
                ProgressReport(ready.id, ready.partition_id, ready.epoch, ready.gate, None, started_us)
            )
        first = batch[0]
        try:
            with tracing.batch_delivery([r.id for r in batch], first.partition, first.queue, first.gate) as span:
                try:
                    if collects is not None:  # a batch of fan-in items: one partition, one collection
                        await fan_in(self._store, self._id, route, collects, batch, items)
                    results = await router.process_batch(route, items, timeout)
                except asyncio.CancelledError:
                    if not flight.was_cancelled(task):
                        raise  # the watcher is stopping
                    results = [RetryLater(CANCELLED_CALL)] * len(batch)
                except RetryLater as error:  # what it collects could not be given (see `fan_in`)
                    results = [error] * len(batch)
                except Exception as error:  # a bug of ours, not the processor's: every delivery fails, transiently
                    log.exception(
                        "internal error delivering a batch of %d items", len(batch), extra={"watcher": self._id}
                    )
                    results = [error] * len(batch)
                elapsed = time.perf_counter_ns() - started
                outcomes = [
                    self._outcome_of(ready, result, route.policy) for ready, result in zip(batch, results, strict=True)
                ]
                failed = [outcome for outcome, _ in outcomes if outcome.kind in (Kind.RETRY, Kind.FAIL)]
                span.outcome(*((failed[0].kind, failed[0].error) if failed else (outcomes[0][0].kind, None)))
        finally:
            for ready in batch:
                flight.busy.discard(ready.id)
                flight.call_ended(ready.id)
                self._reports.ended(ready.id)
        latency = self._metrics.latency(Router.gate_label(route, first.gate))
        for ready, item, (outcome, failure) in zip(batch, items, outcomes, strict=True):
            latency.observe(elapsed / 1e9)
            self._queue_outcome(ready, item, outcome, failure, started_us, elapsed, route.processor)
        self._completer.flush_soon()

    def _timeout_of(self, lease: Lease, route: Route) -> float | None:
        """How long a call may take: the partition's item timeout, else its gate's, else the watcher's."""
        gate = route.gate.item_timeout if route.gate is not None else None
        return lease.item_timeout or gate or self._config.item_timeout

    def _outcome_of(
        self, ready: ReadyItem, result: Response | Exception, policy: RetryPolicy
    ) -> tuple[Outcome, Exception | None]:
        """An item's outcome from its answer or failure (an answer our rules cannot read is a
        transient failure), by its gate's attempts and backoff (`policy`). More children than
        `max_children` fail the item for good (the HTTP processor refuses them before reading them;
        a Python processor's are counted here, before any is written)."""
        if not isinstance(result, Exception):
            try:
                if len(result.children) > self._config.max_children:
                    raise TooManyChildren(len(result.children), self._config.max_children)
                outcome = outcome_of(ready, policy, response=result)
                if outcome.accumulate is not None and (why := self._accumulate_refusal(outcome)):
                    return outcome_of(ready, policy, error=PermanentError(why)), None
                return outcome, None
            except Exception as error:
                result = error
        if isinstance(result, Accepted):  # the handler answers later, through the API
            outcome = Outcome(
                ready.id,
                ready.version,
                ready.partition_id,
                ready.epoch,
                ready.gate,
                Kind.ACCEPTED,
                delay=result.lease_seconds,
                attempts=ready.attempts,
                token=result.token,
            )
            return outcome, None
        return outcome_of(ready, policy, error=result), result

    def _accumulate_refusal(self, outcome: Outcome) -> str | None:
        """Why `outcome`'s accumulate numbers cannot be merged (a name its gate, under the pipeline
        version followed, and its queue declare no operation for), or None; the operations it is
        merged by are set on it (the store merges by them, in the group commit)."""
        assert outcome.accumulate is not None
        router, queue = self._router.current, self._router.settings
        if self._operations is None or self._operations[0] is not router or self._operations[1] is not queue:
            self._operations = (router, queue, {})
        known = self._operations[2]
        operations = known.get(outcome.gate)
        gate = router.route(outcome.gate).gate if operations is None or outcome.accumulate.keys() - operations else None
        if operations is None:
            declared = queue.operations
            operations = known[outcome.gate] = {**declared, **gate.operations} if gate and gate.accumulate else declared
        if outcome.accumulate.keys() <= operations.keys():  # every answer of a well-declared gate
            outcome.operations = operations
            return None
        label = f"gate {outcome.gate} ({gate.name})" if gate is not None else f"gate {outcome.gate}"
        return refusal(outcome.accumulate, operations, label, self._config.queue)

    def _queue_outcome(
        self,
        ready: ReadyItem,
        item: Item,
        outcome: Outcome,
        failure: BaseException | None,
        started_us: int,
        elapsed: int,
        processor: Any = None,
    ) -> None:
        """Queue a delivery's outcome for the next group commit, with its record: its number,
        attempt, start, duration and (a Python processor's own exception) the end of its traceback;
        the HTTP processor's errors are their own words. A progress report of a "not yet" is kept."""
        self._record(ready, item, outcome, failure, started_us, elapsed, processor)
        self._completer.add(outcome)

    def _record(
        self,
        ready: ReadyItem,
        item: Item,
        outcome: Outcome,
        failure: BaseException | None,
        started_us: int,
        elapsed: int,
        processor: Any = None,
    ) -> None:
        """Complete `outcome` with its delivery's record (`_queue_outcome`); its item's call answered."""
        report = self._reports.take_progress(ready.id)  # its answer is written instead
        outcome.n, outcome.attempt = ready.deliveries + 1, item.attempt
        outcome.started_us, outcome.duration_us = started_us, elapsed // 1000
        if failure is not None and not isinstance(processor, HTTPProcessor):
            text = "".join(traceback.format_exception(failure)).rstrip()
            outcome.detail = text if len(text) <= TRACEBACK_KEPT else "..." + text[-(TRACEBACK_KEPT - 3) :]
        if report is not None and outcome.kind == Kind.LATER and outcome.progress is None:
            outcome.progress = report.fraction
        self._flight.answered(ready.id)

    def _reporter(self, ready: ReadyItem) -> Callable[[float], None]:
        """`item.progress(f)` of one delivery: kept for the next heartbeat (may run on a processor's thread)."""
        reports = self._reports

        def report(fraction: float) -> None:
            reports.progress(ProgressReport(ready.id, ready.partition_id, ready.epoch, ready.gate, fraction))

        return report
