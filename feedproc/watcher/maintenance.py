"""Maintenance: the lease bookkeeping the poll loop does once per poll interval (queue settings and
pipeline, charges, closed windows, reading the leases back, strays, hand-overs, leasing more,
expired claims, partitions past their deadline, calls of items cancelled meanwhile), and the loops
of their own: schedules, retention."""

from __future__ import annotations

import asyncio
import logging
import time

from ..core.errors import DatabaseUnavailable
from ..core.records import GIVEN_BACK, Lease
from .calls import DatabaseCalls, Lifecycle
from .config import WatcherConfig
from .flight import InFlight
from .leases import LeaseBook
from .routing import Router
from .writing import Completer

log = logging.getLogger("feedproc.watcher")
# Seconds between a watcher's looks at claims that expired, at partitions past their deadline and
# at items an operator skipped or cancelled while in flight: reads on the thread that fetches, so
# not at every maintenance.
CLAIM_CHECK_EVERY = 1.0


class Maintenance:
    """What keeps the watcher's view of its queue and leases current; `maintain` runs on the poll
    loop (the poll thread), the schedule and retention loops on threads of their own."""

    def __init__(
        self,
        calls: DatabaseCalls,
        config: WatcherConfig,
        watcher_id: str,
        lifecycle: Lifecycle,
        router: Router,
        leases: LeaseBook,
        flight: InFlight,
        completer: Completer,
    ) -> None:
        self._calls, self._store = calls, calls.store
        self._config = config
        self._id = watcher_id
        self._life = lifecycle
        self._router = router
        self._leases = leases
        self._flight = flight
        self._completer = completer
        self._next_claim_check = 0.0  # monotonic time of the next look at expired claims and finished items

    async def maintain(self) -> None:
        """The poll loop's bookkeeping, once per poll interval or when asked (`PollSignals`)."""
        leases = self._leases
        await self._router.refresh()
        if (
            leases.charges_pending
        ):  # a takeover whose charge failed: charged before its partition is deferred or handed on
            await leases.charge_lost()
        await leases.defer_closed()
        stray = await leases.refresh(self._calls.poll, self._store.owned, self._id)
        if stray:
            await self._release_stray(stray)
        await leases.hand_over_wanted()
        await leases.lease_more(steal=True)
        if time.monotonic() >= self._next_claim_check:  # not at every maintenance: they share the poll thread
            self._next_claim_check = time.monotonic() + CLAIM_CHECK_EVERY
            await self._expire_claims()
            await self._fail_overdue()
            await self._cancel_finished_calls()

    async def _release_stray(self, stray: list[Lease]) -> None:
        """Let go of leases given up here that the database still gives this watcher (assumed lost
        while it could not renew them). Deliveries still under way under them are given back: their
        answers will be refused, so each is charged and recorded now, in the release."""
        held = {(lease.partition_id, lease.epoch) for lease in stray}
        delivered = self._flight.delivered()
        given = self._flight.unanswered(
            lambda item: (item.partition_id, item.epoch) in held and item.id in delivered,
            GIVEN_BACK,
            answers=self._completer.results,
        )
        await self._calls.call(
            self._calls.poll,
            self._store.release,
            self._id,
            stray,
            kind="released",
            abandoned=given,
            max_attempts=self._config.max_attempts,
            gate_attempts=self._router.current.attempts,
            reason="watcher {watcher} gave its lease up during delivery {attempt}: it could not renew it in time",
        )

    async def _cancel_finished_calls(self) -> None:
        """Cancel the calls of running items an operator skipped or cancelled meanwhile."""
        running = self._flight.running_ids()
        if not running:
            return
        try:
            done = await self._calls.call(self._calls.poll, self._store.finished_items, running)
        except Exception as error:  # looked at again at the next maintenance
            log.warning("could not read the states of the items in progress: %s", error)
            return
        if done and (calls := self._flight.cancel_calls(item_ids=done)):
            log.info(
                "cancelled %d call(s) of items skipped or cancelled by an operator",
                calls,
                extra={"event": "calls_cancelled", "watcher": self._id},
            )

    async def _fail_overdue(self) -> None:
        """Fail this queue's partitions past their deadline; the calls of their items running here are
        cancelled next (`_cancel_finished_calls`: their items are cancelled). One indexed read when
        none is due (partitions without a deadline are not in the index)."""
        try:
            failed = await self._calls.call(self._calls.poll, self._store.fail_overdue, self._config.queue)
        except Exception as error:  # looked at again at the next maintenance
            log.warning("could not fail the partitions past their deadline: %s", error)
            return
        for key in failed:
            log.info(
                "partition %s failed: deadline exceeded",
                key,
                extra={"event": "deadline_exceeded", "key": key, "watcher": self._id},
            )

    async def _expire_claims(self) -> None:
        """Settle the claims of this queue that ran out: handlers that answered 202 and never
        answered (each counts an attempt), or pull workers gone silent. Cheap when there are none."""
        try:
            expired = await self._calls.call(
                self._calls.poll, self._store.expire_claims, self._config.queue, self._router.policy
            )
        except Exception as error:  # settled at a later maintenance
            log.warning("could not settle expired claims: %s", error)
            return
        if expired:
            log.info("settled %d expired claim(s)", expired, extra={"event": "claims_expired", "watcher": self._id})

    async def schedule_loop(self) -> None:
        """Start the partitions of the pipeline's schedules as their ticks come due (every watcher of
        the queue looks; the store makes each tick's partition once)."""
        while True:
            spec = self._router.current.spec
            if spec is not None and spec.schedules and not self._life.stopping:
                try:
                    # (a Python Pipeline's schedules run once applied: the stored rows keep their ticks)
                    created = await asyncio.to_thread(self._store.fire_schedules, self._config.queue)
                    for key in created:
                        log.info(
                            "schedule started partition %s",
                            key,
                            extra={"event": "scheduled", "key": key, "watcher": self._id},
                        )
                except DatabaseUnavailable as error:  # an outage: said once, by the loops' health
                    self._calls.health.failed("schedules", error)
                except Exception as error:  # looked at again next time
                    log.warning("could not start scheduled partitions: %s", error)
            await asyncio.sleep(min(self._config.poll_interval, 5.0))

    async def retention_loop(self, older_than: float) -> None:
        """Delete old finished partitions now and then (bounded batches, on a thread of its own)."""
        while True:
            try:
                deleted = await asyncio.to_thread(self._store.cleanup, older_than)
                if deleted["partitions"]:
                    log.info("retention: deleted %s", deleted)
            except DatabaseUnavailable as error:  # an outage: said once, by the loops' health
                self._calls.health.failed("retention", error)
            except Exception as error:
                log.warning("retention cleanup failed: %s", error)
            await asyncio.sleep(self._config.retention_every)
