"""Delivery: workers take buffered items, call the Processor, and queue each answer with its record
for the next group commit; suspects are delivered alone."""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from datetime import UTC, datetime
from typing import Any

from .. import tracing
from ..core.models import Item
from ..core.policy import outcome_of
from ..core.records import Kind, Lease, ProgressReport, ReadyItem
from ..processors import HTTPProcessor, call_processor
from .config import PREFETCH, TRACEBACK_KEPT
from .leases import Leasing

log = logging.getLogger("feedproc.watcher")


class Delivering(Leasing):
    """Workers and the isolation loop."""

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

    def _reporter(self, ready: ReadyItem) -> Any:
        """`item.progress(f)` of one delivery: kept for the next heartbeat (may run on a processor's thread)."""

        def report(fraction: float) -> None:
            self._progress[ready.id] = ProgressReport(ready.id, ready.partition_id, ready.epoch, ready.gate, fraction)

        return report

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
