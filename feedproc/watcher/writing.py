"""The completer: writes finished deliveries in group commits (`Store.apply`, one fenced transaction
per batch). An answer that cannot be written is isolated and replaced by a transient failure; then
counters, logs and lease bookkeeping."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

from .. import tracing
from ..core.errors import DatabaseUnavailable, StaleWrite
from ..core.policy import outcome_of
from ..core.records import GIVEN_BACK, Applied, Kind, Outcome, ReadyItem, tally_outcomes
from ..core.redaction import redact_url
from ..metrics import WatcherMetrics
from .calls import DatabaseCalls, Lifecycle, PollSignals
from .config import FAILED_WRITES_FATAL, WatcherConfig
from .flight import InFlight
from .leases import LeaseBook
from .reports import HeartbeatReports
from .routing import Router

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

log = logging.getLogger("feedproc.watcher")


class Completer:
    """The group-commit writer: outcomes queued by the workers (`add`) are written by `loop`, in
    order, a batch at a time; each written (or given up) outcome leaves the items in flight."""

    def __init__(
        self,
        calls: DatabaseCalls,
        config: WatcherConfig,
        watcher_id: str,
        lifecycle: Lifecycle,
        signals: PollSignals,
        router: Router,
        leases: LeaseBook,
        flight: InFlight,
        reports: HeartbeatReports,
        metrics: WatcherMetrics,
        handler: str | None,
    ) -> None:
        self._calls, self._store = calls, calls.store
        self._config = config
        self._id = watcher_id
        self._life = lifecycle
        self._signals = signals
        self._router = router
        self._leases = leases
        self._flight = flight
        self._reports = reports
        self._metrics = metrics
        self._handler = handler  # the `--handler` URL, named in failures' logs
        self.results: list[Outcome] = []  # answered, not yet written, in the order they came
        #: Called when a group commit finished a partition (its completion hook may be due).
        self.partitions_finished: Callable[[], None] = lambda: None
        #: Called with each group commit's outcomes once written (adaptive concurrency counts them).
        self.written: Callable[[list[Outcome]], None] = lambda batch: None
        self.processed = 0  # outcomes written
        self._ready = asyncio.Event()
        self._closing = False  # stop() was called and the workers are done: flush what is left
        self._failed_writes = 0  # group commits in a row that wrote nothing for reasons other than an outage

    def add(self, outcome: Outcome) -> None:
        """Queue a delivery's outcome for the next group commit (`flush_soon` starts it)."""
        self.results.append(outcome)

    def flush_soon(self) -> None:
        self._ready.set()

    @property
    def unwritten(self) -> int:
        """Outcomes queued, not yet written."""
        return len(self.results)

    def close(self) -> None:
        """The workers are done: write what is left, then `loop` returns."""
        self._closing = True
        self._ready.set()

    async def loop(self) -> None:
        """Write answers as they come; after `close()`, until none is left."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            await self._flush_all(final=self._closing)
            self._signals.wake()
            if self._closing and not self.results:
                return

    async def _flush_all(self, *, final: bool = False) -> None:
        while self.results:
            batch = self._next_batch()
            await self._flush(batch, final=final)
            del self.results[: len(batch)]  # only now: a batch interrupted mid-write stays queued

    def _next_batch(self) -> list[Outcome]:
        """The next group commit: up to `flush_batch` outcomes, and no more children than one answer
        may add (an outcome alone may have that many). Ten fan-outs at the limit in one commit would
        write a million rows, 10-50 s, their partitions' rows locked and the heartbeat waiting."""
        batch = self.results[: self._config.flush_batch]
        children = 0
        for n, outcome in enumerate(batch):
            children += len(outcome.children)
            if children > self._config.max_children and n > 0:
                return batch[:n]
        return batch

    async def _flush(self, batch: list[Outcome], *, final: bool) -> None:
        try:
            applied = await self._apply(batch, final=final)
        except (StaleWrite, DatabaseUnavailable) as error:
            log.error(
                "dropped a batch of %d results: %s; the items will be delivered again",
                len(batch),
                error,
                extra={"event": "write_dropped", "count": len(batch), "error": str(error), "watcher": self._id},
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
                extra={"event": "write_failed", "count": len(batch), "error": str(error), "watcher": self._id},
            )
            applied = await self._apply_in_parts(batch, final=final)
            if applied.written:
                self._failed_writes = 0
            else:
                self._failed_writes += 1
                if self._failed_writes >= FAILED_WRITES_FATAL:
                    self._life.die(f"{self._failed_writes} group commits in a row wrote nothing: {error}", error)
        else:
            self._failed_writes = 0
        self._calls.health.ok()
        self._settled(batch)
        self._account(batch, applied)
        self.written(batch)

    async def complete_within(self, transaction: Connection, outcome: Outcome) -> None:
        """Write a transactional processor's answer in the processor's own transaction, not in a
        group commit, and commit it there if the fence holds (`Store.apply(within=...)`); then the
        bookkeeping of a group commit. Refused, the processor's rows are rolled back with it. An
        answer that cannot be written is replaced, as in a group commit, by a transient failure of
        its item (written in the next group commit, the processor's rows rolled back)."""
        batch = [outcome]
        try:
            with tracing.group_commit(1):
                applied = await asyncio.to_thread(
                    self._store.apply,
                    self._id,
                    batch,
                    idle_after=self._config.lease_seconds / 3,
                    lease_seconds=self._config.lease_seconds,
                    within=transaction,
                )
        except (StaleWrite, DatabaseUnavailable) as error:
            log.error(
                "dropped the answer of item %s written in its processor's transaction: %s; it will be delivered again",
                outcome.item_id,
                error,
                extra={"event": "write_dropped", "count": 1, "error": str(error), "watcher": self._id},
            )
            if isinstance(error, DatabaseUnavailable):
                self._calls.health.failed("write", error)
            self._settled(batch)
            return
        except Exception as error:
            log.error(
                "could not write the answer of item %s in its processor's transaction (%s: %s)",
                outcome.item_id,
                type(error).__name__,
                error,
                exc_info=error,
                extra={"event": "write_failed", "count": 1, "error": str(error), "watcher": self._id},
            )
            replacement = self._unwritable(outcome, error)
            if replacement is None:
                self._settled(batch)
            else:
                self.add(replacement)  # its group commit settles the item
                self.flush_soon()
            return
        self._calls.health.ok()
        if applied.lost or applied.superseded:
            log.warning(
                "the answer of item %s was refused (%s): its processor's transaction was rolled back",
                outcome.item_id,
                "its partition's lease was lost" if applied.lost else "the item was changed meanwhile",
                extra={"event": "transaction_refused", "item": outcome.item_id, "watcher": self._id},
            )
        self._settled(batch)
        self._account(batch, applied)
        self._signals.wake()

    async def _apply(self, batch: list[Outcome], *, final: bool) -> Applied:
        """One group commit, retried with backoff while the database is unavailable."""
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(DatabaseUnavailable),
            wait=wait_exponential(multiplier=0.1, max=5.0),
            # Past a lease length another watcher may own the partitions; the fence would refuse.
            stop=stop_after_delay(self._config.shutdown_grace if final else self._config.lease_seconds),
            before_sleep=lambda state: self._calls.health.failed("write", state.outcome.exception()),  # type: ignore[union-attr]
            reraise=True,
        )
        async for attempt in retrying:
            with attempt, tracing.group_commit(len(batch)):
                applied = await self._calls.call(
                    self._calls.writes,
                    self._store.apply,
                    self._id,
                    batch,
                    idle_after=self._config.lease_seconds / 3,
                    lease_seconds=self._config.lease_seconds,
                )
        return applied

    async def _apply_in_parts(self, batch: list[Outcome], *, final: bool) -> Applied:
        """Write a batch that failed as a whole: halves, then quarters... An outcome that cannot be
        written alone is replaced by a transient failure of its item that says why (no data, no
        children); if even that cannot be written, the item's partition is let go, its deliveries in
        flight charged as failed attempts (a partition that can never be written fails after
        `max_attempts` instead of going round watchers forever)."""
        total = Applied()
        parts = [batch]
        while parts:
            part = parts.pop()
            try:
                _merge(total, await self._apply(part, final=final))
                continue
            except (StaleWrite, DatabaseUnavailable):
                self._metrics.given_up.inc(len(part))
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
                        "watcher": self._id,
                    },
                )
            except Exception as error:
                lease = self._leases.owned.get(outcome.partition_id)
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
                        "watcher": self._id,
                    },
                )
                if lease is not None:
                    pid = outcome.partition_id
                    delivered = partial(_delivered_of, pid, self._flight.delivered())
                    charged = self._flight.unanswered(delivered, GIVEN_BACK, answers=self.results)
                    self._leases.forget(pid)
                    with contextlib.suppress(Exception):
                        await self._calls.call(
                            self._calls.writes,
                            self._store.release,
                            self._id,
                            [lease],
                            kind="released",
                            abandoned=charged,
                            max_attempts=self._config.max_attempts,
                            gate_attempts=self._router.current.attempts,
                            reason="watcher {watcher} could not write the answer of delivery {attempt}: "
                            + f"{type(error).__name__}: {error}",
                        )
        return total

    def _unwritable(self, outcome: Outcome, error: BaseException) -> Outcome | None:
        """A transient failure of the outcome's item saying its answer could not be written."""
        ready = self._flight.items.get(outcome.item_id)
        if ready is None:
            return None
        cause = RuntimeError(f"the answer could not be written: {type(error).__name__}: {error}")
        replacement = outcome_of(ready, self._router.policy_of(ready), error=cause)
        replacement.n, replacement.attempt = outcome.n, outcome.attempt
        replacement.started_us, replacement.duration_us = outcome.started_us, outcome.duration_us
        return replacement

    def _settled(self, batch: list[Outcome]) -> None:
        """The batch's outcomes are written or given up: their items are no longer in flight here."""
        for outcome in batch:
            self._flight.settled(outcome.item_id)

    def _account(self, batch: list[Outcome], applied: Applied) -> None:
        """Counters, logs and lease bookkeeping after a group commit."""
        self.processed += len(applied.written)
        counts: Counter[str] = Counter()
        for outcome in batch:
            if outcome.partition_id in applied.lost:
                continue
            counts[outcome.kind] += 1
            if outcome.kind in (Kind.RETRY, Kind.FAIL):
                self._log_failure(outcome)
        self._metrics.written(counts)
        self._reports.count(tally_outcomes(o for o in batch if o.partition_id not in applied.lost))
        self._metrics.gate_advances.inc(applied.advanced)
        for pid, from_gate, to_gate in applied.advances:
            lease = self._leases.owned.get(pid)
            key = lease.key if lease else str(pid)
            log.info(
                "partition %s advanced from gate %s to gate %s",
                key,
                from_gate,
                to_gate,
                extra={"event": "gate_advanced", "key": key, "gate": to_gate, "watcher": self._id},
            )
        if applied.lost or applied.released:
            self._signals.lease_soon()  # capacity freed: lease more at once (the loop wakes the poller)
        for pid in applied.lost:
            lease = self._leases.owned.get(pid)
            refused = [o for o in batch if o.partition_id == pid]
            self._metrics.fenced.inc(len(refused))
            if lease is not None and lease.epoch in {o.epoch for o in refused}:  # not a lease we took again since
                log.warning(
                    "lost the lease on partition %s; its %d late answers were discarded",
                    lease.key,
                    len(refused),
                    extra={"event": "lease_lost", "key": lease.key, "watcher": self._id, "count": len(refused)},
                )
                self._leases.forget(pid)
        if any(move in ("complete", "fail") for move in applied.moves.values()):
            self.partitions_finished()
        for pid in applied.released:
            lease = self._leases.owned.get(pid)
            if applied.moves.get(pid) == "fail" and (calls := self._flight.cancel_calls(pid)):
                # Failed with items still in flight: its gate's tolerance was crossed, they are cancelled.
                log.info(
                    "partition %s failed: cancelled %d call(s) in progress",
                    lease.key if lease else pid,
                    calls,
                    extra={"event": "calls_cancelled", "key": lease.key if lease else str(pid), "watcher": self._id},
                )
            if lease is not None:
                how = applied.moves.get(pid, "idle")
                event = {"complete": "partition_completed", "fail": "partition_failed"}.get(how, "released")
                text = {"complete": "completed", "fail": "failed"}.get(how, "released (nothing due)")
                log.info(
                    "partition %s %s",
                    lease.key,
                    text,
                    extra={"event": event, "key": lease.key, "watcher": self._id},
                )
            self._leases.forget(pid)

    def _log_failure(self, outcome: Outcome) -> None:
        """One WARNING per retried or failed delivery (rate-limited by the log handler when repetitive)."""
        lease = self._leases.owned.get(outcome.partition_id)
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
                "watcher": self._id,
                "handler": handler,
            },
        )


def _delivered_of(pid: int, delivered: set[int], item: ReadyItem) -> bool:
    """An item of partition `pid` among `delivered` (not a buffered one: those were never delivered)."""
    return item.partition_id == pid and item.id in delivered


def _merge(total: Applied, applied: Applied) -> None:
    total.written += applied.written
    total.lost |= applied.lost
    total.released |= applied.released
    total.advanced += applied.advanced
    total.advances += applied.advances
    total.moves.update(applied.moves)
