"""The lease book: the partitions this watcher holds — the heartbeat that renews them, reading them
back, leasing more, asking for and handing over partitions (fair shares), time windows, and charging
the deliveries a dead watcher left."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import ParamSpec

from ..core import windows
from ..core.errors import WatcherGone
from ..core.records import Lease
from ..metrics import WatcherMetrics
from .calls import DatabaseCalls, Lifecycle, PollSignals
from .config import WatcherConfig
from .flight import InFlight, ReadyBuffer
from .reports import HeartbeatReports
from .routing import Router

log = logging.getLogger("feedproc.watcher")
P = ParamSpec("P")
_FINISHED_EVENTS = {"complete": "partition_completed", "failed": "partition_failed", "cancelled": "partition_cancelled"}


class LeaseBook:
    """The leases this watcher holds (`owned`): renewed, reconciled with the database, handed over.

    Letting a partition go (`forget`) drops its buffered items and its in-flight record's count."""

    def __init__(
        self,
        calls: DatabaseCalls,
        config: WatcherConfig,
        watcher_id: str,
        lifecycle: Lifecycle,
        signals: PollSignals,
        router: Router,
        flight: InFlight,
        buffer: ReadyBuffer,
        reports: HeartbeatReports,
        metrics: WatcherMetrics,
    ) -> None:
        self._calls, self._store = calls, calls.store
        self._config = config
        self._id = watcher_id
        self._life = lifecycle
        self._signals = signals
        self._router = router
        self._flight = flight
        self._buffer = buffer
        self._reports = reports
        self._metrics = metrics
        self.owned: dict[int, Lease] = {}
        self._valid_until: dict[int, float] = {}  # partition -> monotonic time its lease surely lasts
        self._given_up: dict[tuple[int, int], None] = {}  # (partition, epoch) leases let go, oldest first
        self._uncharged: dict[int, Lease] = {}  # taken over with deliveries left unanswered, not yet charged
        self._last_renewal = time.monotonic()
        self._last_steal = -math.inf  # steals may be asked for at once
        self._share: int | None = None  # the queue's fair share of partitions (None: alone), and when read
        self._share_read_at = -math.inf
        self._fresh: set[int] = set()  # partitions leased since the fetcher last asked (`take_fresh`)

    @property
    def heartbeat_age(self) -> float:
        """Seconds since the leases were last renewed (or the watcher started)."""
        return time.monotonic() - self._last_renewal

    async def register(self, executor: ThreadPoolExecutor) -> None:
        """Record this watcher (host, pid, queue, capacity) so others count it for fair shares."""
        cfg = self._config
        await self._calls.call(
            executor,
            self._store.register_watcher,
            self._id,
            host=socket.gethostname(),
            pid=os.getpid(),
            queue=cfg.queue,
            concurrency=cfg.concurrency,
            capacity=cfg.effective_max_partitions,
            lease_seconds=cfg.lease_seconds,
            slots=0,  # slots are only ever claimed under the queue's lock, by the fetch (`Fetcher._fill_within_limit`)
        )
        self._flight.slots_reported = (0, {}, {})
        self._signals.wake()  # a limited queue: claim what is still running at once

    def forget(self, pid: int) -> None:
        """Stop holding partition `pid` (released, handed over or lost); drop its buffered items."""
        self._valid_until.pop(pid, None)
        self._flight.forget_partition(pid)
        lease = self.owned.pop(pid, None)
        if lease is not None:
            self._given_up[(pid, lease.epoch)] = None
            while len(self._given_up) > 10_000:
                self._given_up.pop(next(iter(self._given_up)))
        self._buffer.drop_partition(pid)

    async def heartbeat_loop(self) -> None:
        """Renew the watcher and its leases every `lease_seconds / 3` (on the heartbeat's own thread),
        writing the reports collected since the last beat."""
        cfg, health = self._config, self._calls.health
        interval = cfg.lease_seconds / 3
        delay = interval
        while True:
            await asyncio.sleep(delay)
            delay = interval
            reports, tally = self._reports.take()
            try:
                beat = partial(self._store.heartbeat, tally=tally, queue=cfg.queue)
                await self.refresh(self._calls.heartbeat, beat, self._id, cfg.lease_seconds, list(reports.values()))
            except WatcherGone:
                log.warning("this watcher's registration was reaped; registering again")
                with contextlib.suppress(Exception):
                    await self.register(self._calls.heartbeat)
                continue
            except Exception as error:
                self._reports.give_back(reports, tally)  # kept for the next beat
                health.failed("heartbeat", error)
                delay = health.delay(interval)  # retry sooner: renew before the leases expire
                if time.monotonic() - self._last_renewal > cfg.lease_seconds and self.owned:
                    log.warning(
                        "could not renew leases for %gs: assuming all %d are lost",
                        cfg.lease_seconds,
                        len(self.owned),
                    )
                    for lease in self._reconcile([], dict(self.owned)):
                        log.warning(
                            "lost the lease on partition %s; no longer dispatching it",
                            lease.key,
                            extra={"event": "lease_lost", "key": lease.key, "watcher": self._id},
                        )
                continue
            health.ok()
            self._last_renewal = time.monotonic()

    async def refresh(
        self, executor: ThreadPoolExecutor, fn: Callable[P, list[Lease]], *args: P.args, **kwargs: P.kwargs
    ) -> list[Lease]:
        """Ask the database which leases this watcher holds (`fn`) and reconcile with `owned`.

        Returns stray leases: held in the database but already given up here (to be released)."""
        before = dict(self.owned)
        started = time.monotonic()
        leases = await self._calls.call(executor, fn, *args, **kwargs)
        lost = self._reconcile(leases, before)
        self._note_deadlines(leases, started)
        if lost:
            await self._tell_lost(executor, lost)
        return [lease for lease in leases if (lease.partition_id, lease.epoch) in self._given_up]

    async def _tell_lost(self, executor: ThreadPoolExecutor, lost: list[Lease]) -> None:
        """Say why leases went: the partition finished or was cancelled, or this watcher's group commit
        released it as the heartbeat read (INFO), or another watcher has it (WARNING)."""
        try:
            statuses = await self._calls.call(executor, self._store.partition_statuses, [x.partition_id for x in lost])
        except Exception:  # only the wording depends on it
            statuses = {}
        for lease in lost:
            event = _FINISHED_EVENTS.get(statuses.get(lease.partition_id, ""))
            finished = statuses.get(lease.partition_id)
            # A failed partition may have had items in flight too: its gate's tolerance was crossed.
            if finished in ("cancelled", "failed") and (calls := self._flight.cancel_calls(lease.partition_id)):
                log.info(
                    "partition %s %s: cancelled %d call(s) in progress",
                    lease.key,
                    "was cancelled" if finished == "cancelled" else "failed",
                    calls,
                    extra={"event": "calls_cancelled", "key": lease.key, "watcher": self._id},
                )
            if event is not None:
                log.info(
                    "partition %s is %s; no longer dispatching it",
                    lease.key,
                    statuses[lease.partition_id],
                    extra={"event": event, "key": lease.key, "watcher": self._id},
                )
            elif statuses.get(lease.partition_id) == "released":  # by this watcher's own group commit
                log.info(
                    "partition %s released",
                    lease.key,
                    extra={"event": "released", "key": lease.key, "watcher": self._id},
                )
            else:
                log.warning(
                    "lost the lease on partition %s; no longer dispatching it",
                    lease.key,
                    extra={"event": "lease_lost", "key": lease.key, "watcher": self._id},
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
                self.forget(pid)
        for pid, lease in current.items():
            if (pid, lease.epoch) in self._given_up:
                continue
            if pid not in self.owned and not self._life.stopping:
                log.info(
                    "received partition %s", lease.key, extra={"event": "stolen", "key": lease.key, "watcher": self._id}
                )
                self._metrics.stolen.inc()
            self.owned[pid] = lease
            if lease.wanted_by:
                self._buffer.drop_partition(pid)
        return lost

    def _note_deadlines(self, leases: list[Lease], read_at: float) -> None:
        """Remember, on our monotonic clock, until when each lease is surely still ours: what the
        database said it had left, counted from before we asked."""
        for lease in leases:
            held = self.owned.get(lease.partition_id)
            if held is not None and held.epoch == lease.epoch:
                self._valid_until[lease.partition_id] = read_at + lease.remaining

    def lease_may_have_expired(self, pid: int) -> bool:
        """True when this watcher cannot be sure it still holds `pid` (e.g. it was paused past its
        lease): then it must not start another item of it until the leases are read again."""
        margin = min(1.0, self._config.lease_seconds / 10)
        return time.monotonic() >= self._valid_until.get(pid, 0.0) - margin

    def windowed(self, lease: Lease) -> bool:
        """Whether `lease`'s partition or its queue has time windows at all (most have none)."""
        return lease.windows is not None or self._router.settings.windows is not None

    def opens_at(self, lease: Lease, now: datetime) -> datetime:
        """When `lease`'s partition may next be dispatched: `now` if its windows and its queue's are
        open (windows that never overlap: look again in an hour)."""
        queue = self._router.settings
        if lease.windows is None and queue.windows is None:
            return now
        own = (windows.parse_windows(lease.windows), windows.zone(lease.window_tz))
        opens = windows.next_dispatch((own, (queue.parsed, queue.zone)), now)
        return opens if opens is not None else now + timedelta(hours=1)

    def closed(self) -> set[int]:
        """Owned partitions outside their time windows now."""
        now = datetime.now(UTC)
        return {pid for pid, lease in self.owned.items() if self.opens_at(lease, now) != now}

    def not_now(self) -> set[int]:
        """Owned partitions not to fetch from now: outside their windows, or with a charge pending."""
        closed = self.closed()
        return closed | set(self._uncharged) if self._uncharged else closed

    @property
    def charges_pending(self) -> bool:
        """Partitions taken over whose unanswered deliveries are not charged yet (`charge_lost`)."""
        return bool(self._uncharged)

    async def defer_closed(self) -> None:
        """Release partitions whose window is closed (once their items in flight are done) until it opens."""
        now = datetime.now(UTC)
        busy = self._flight.per_partition()
        closed = [(lease, opens) for lease in self.owned.values() if (opens := self.opens_at(lease, now)) != now]
        closed = [(lease, opens) for lease, opens in closed if not busy[lease.partition_id]]
        if closed:
            deferred = await self._calls.call(self._calls.poll, self._store.defer, self._id, closed)
            log.info("deferred %d partitions until their time window opens", deferred)
            for lease, _ in closed:
                self.forget(lease.partition_id)

    async def lease_more(self, *, steal: bool) -> None:
        """Lease ready partitions up to capacity; with `steal`, when none is free, ask for a fair share."""
        cfg = self._config
        if self._life.stopping or not self._router.settings.is_open(datetime.now(UTC)):
            return  # a closed queue: lease nothing until its window opens
        room = cfg.effective_max_partitions - len(self.owned)
        if room > 0 and (share := await self._fair_share()) is not None:
            # Beside other watchers, lease no more than a fair share: partitions freed by a watcher
            # that left spread over the rest as they poll, instead of going to the first poller and
            # being handed on by steals (rebalancing without hand-overs where none are needed).
            room = min(room, share - len(self.owned))
        if room > 0:
            started = time.monotonic()
            gained = await self._calls.call(
                self._calls.poll,
                self._store.acquire,
                self._id,
                cfg.queue,
                room,
                cfg.lease_seconds,
                aging=self._router.settings.aging,
            )
            self._fresh.update(lease.partition_id for lease in gained)
            for lease in gained:
                self.owned[lease.partition_id] = lease
                log.info(
                    "leased partition %s",
                    lease.key,
                    extra={"event": "leased", "key": lease.key, "watcher": self._id},
                )
                if lease.pending is not None:
                    self._uncharged[lease.partition_id] = lease
            self._note_deadlines(gained, started)
            if self._uncharged:
                await self.charge_lost()
            if steal and not gained and time.monotonic() - self._last_steal >= max(1.0, cfg.poll_interval):
                self._last_steal = time.monotonic()
                marked = await self._calls.call(
                    self._calls.poll,
                    self._store.request_steals,
                    self._id,
                    cfg.queue,
                    capacity=cfg.effective_max_partitions,
                    most=cfg.steals_per_cycle,
                )
                if marked:
                    log.info("asked for %d partitions toward a fair share", marked)
                    self._metrics.steal_requests.inc(marked)

    def take_fresh(self) -> set[int]:
        """The partitions leased since the last call: their items are fetched at once, first, not
        once the buffer runs low, so a new partition is not served after everything buffered."""
        fresh, self._fresh = self._fresh, set()
        return fresh

    async def _fair_share(self) -> int | None:
        """The queue's fair share per watcher (`Store.fair_share`), read at most once a second."""
        now = time.monotonic()
        if now - self._share_read_at >= 1.0:
            self._share = await self._calls.call(self._calls.poll, self._store.fair_share, self._config.queue)
            self._share_read_at = now
        return self._share

    async def charge_lost(self) -> None:
        """Charge the deliveries that partitions taken over had unanswered, before fetching from them
        (a partition stays out of fetches until its charge is written)."""
        for pid, lease in list(self._uncharged.items()):
            # By epoch, not identity: a read of the leases (the heartbeat's, the next maintenance's)
            # replaces the Lease held with an equal one, and the charge must survive that.
            held = self.owned.get(pid)
            if held is None or held.epoch != lease.epoch:
                self._uncharged.pop(pid, None)
                continue
            charged = await self._calls.call(
                self._calls.poll,
                self._store.charge_lost,
                self._id,
                lease,
                max_attempts=self._config.max_attempts,
                gate_attempts=self._router.current.attempts,
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
                        "watcher": self._id,
                    },
                )
            if any(c["failed"] for c in charged):
                self._signals.maintain_soon()  # the partition may have failed with it: read the leases again

    async def hand_over_wanted(self) -> None:
        busy = self._flight.per_partition()
        for pid, lease in list(self.owned.items()):
            if lease.wanted_by and not busy[pid]:
                thief = await self._calls.call(
                    self._calls.poll, self._store.hand_over, self._id, lease, self._config.lease_seconds
                )
                if thief:
                    log.info(
                        "handed partition %s over to %s",
                        lease.key,
                        thief,
                        extra={"event": "handed_over", "key": lease.key, "watcher": self._id},
                    )
                    self._metrics.handed_over.inc()
                    self.forget(pid)
