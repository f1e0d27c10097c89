"""Holding partitions: the heartbeat, reading the leases back, leasing more, asking for and handing
over partitions (fair shares), time windows, and charging the deliveries a dead watcher left."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from ..core import windows
from ..core.errors import WatcherGone
from ..core.records import GIVEN_BACK, Lease
from .routing import Routing

log = logging.getLogger("feedproc.watcher")
# Seconds between a watcher's looks at claims that expired and at items an operator skipped or
# cancelled while in flight: two reads on the thread that fetches, so not at every maintenance.
CLAIM_CHECK_EVERY = 1.0
_FINISHED_EVENTS = {"complete": "partition_completed", "failed": "partition_failed", "cancelled": "partition_cancelled"}


class LeaseKeeping(Routing):
    """Leases: what this watcher holds, renewed, reconciled with the database, handed over."""

    async def _heartbeat_loop(self) -> None:
        interval = self.config.lease_seconds / 3
        delay = interval
        while True:
            await asyncio.sleep(delay)
            delay = interval
            reports, self._progress = self._progress, {}
            for item_id, started in self._unannounced.items():  # still running at this beat
                report = reports.get(item_id)
                reports[item_id] = started if report is None else replace(report, started_us=started.started_us)
            self._unannounced = {}
            tally, self._tally = self._tally, Counter()
            try:
                beat = partial(self.store.heartbeat, tally=tally, queue=self.config.queue)
                await self._refresh_leases(self._hb, beat, self.id, self.config.lease_seconds, list(reports.values()))
            except WatcherGone:
                log.warning("this watcher's registration was reaped; registering again")
                with contextlib.suppress(Exception):
                    await self._register(self._hb)
                continue
            except Exception as error:
                self._progress = {**reports, **self._progress}  # keep them for the next beat; newer win
                self._tally.update(tally)
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
        """Say why leases went: the partition finished or was cancelled, or this watcher's group commit
        released it as the heartbeat read (INFO), or another watcher has it (WARNING)."""
        try:
            statuses = await self._db_call(executor, self.store.partition_statuses, [x.partition_id for x in lost])
        except Exception:  # only the wording depends on it
            statuses = {}
        for lease in lost:
            event = _FINISHED_EVENTS.get(statuses.get(lease.partition_id, ""))
            finished = statuses.get(lease.partition_id)
            # A failed partition may have had items in flight too: its gate's tolerance was crossed.
            if finished in ("cancelled", "failed") and (calls := self._cancel_calls(lease.partition_id)):
                log.info(
                    "partition %s %s: cancelled %d call(s) in progress",
                    lease.key,
                    "was cancelled" if finished == "cancelled" else "failed",
                    calls,
                    extra={"event": "calls_cancelled", "key": lease.key, "watcher": self.id},
                )
            if event is not None:
                log.info(
                    "partition %s is %s; no longer dispatching it",
                    lease.key,
                    statuses[lease.partition_id],
                    extra={"event": event, "key": lease.key, "watcher": self.id},
                )
            elif statuses.get(lease.partition_id) == "released":  # by this watcher's own group commit
                log.info(
                    "partition %s released",
                    lease.key,
                    extra={"event": "released", "key": lease.key, "watcher": self.id},
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
                self.metrics.stolen.inc()
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
            await self._follow_pipeline()
        lowered = settings.limited and (not self.queue_settings.limited or settings.limit < self.queue_settings.limit)
        if lowered or (settings.paused and not self.queue_settings.paused):
            # A limit set or lowered, or the queue paused, while items wait in the buffer: give them
            # back (fetched again through the slot claim, or once resumed) instead of dispatching them.
            self._drop_buffered(lambda item: True)
            if settings.paused:
                log.info(
                    "queue %s is paused: in-flight items finish, nothing new starts",
                    cfg.queue,
                    extra={"event": "queue_paused", "watcher": self.id},
                )
        self.queue_settings = settings
        if self._uncharged:  # a takeover whose charge failed: charged before its partition is deferred or handed on
            await self._charge_lost()
        await self._defer_closed()
        stray = await self._refresh_leases(self._db, self.store.owned, self.id)
        if stray:
            await self._release_stray(stray)
        await self._hand_over_wanted()
        await self._lease_more(steal=True)
        if time.monotonic() >= self._next_claim_check:  # not at every maintenance: they share the poll thread
            self._next_claim_check = time.monotonic() + CLAIM_CHECK_EVERY
            await self._expire_claims()
            await self._cancel_finished_calls()

    async def _release_stray(self, stray: list[Lease]) -> None:
        """Let go of leases given up here that the database still gives this watcher (assumed lost
        while it could not renew them). Deliveries still under way under them are given back: their
        answers will be refused, so each is charged and recorded now, in the release."""
        held = {(lease.partition_id, lease.epoch) for lease in stray}
        delivered = self.busy | self._answered
        given = self._unanswered(
            lambda item: (item.partition_id, item.epoch) in held and item.id in delivered, GIVEN_BACK
        )
        await self._db_call(
            self._db,
            self.store.release,
            self.id,
            stray,
            kind="released",
            abandoned=given,
            max_attempts=self.config.max_attempts,
            gate_attempts=self.router.attempts,
            reason="watcher {watcher} gave its lease up during delivery {attempt}: it could not renew it in time",
        )

    async def _cancel_finished_calls(self) -> None:
        """Cancel the calls of running items an operator skipped or cancelled meanwhile."""
        if not self._running:
            return
        try:
            done = await self._db_call(self._db, self.store.finished_items, list(self._running))
        except Exception as error:  # looked at again at the next maintenance
            log.warning("could not read the states of the items in progress: %s", error)
            return
        if done and (calls := self._cancel_calls(item_ids=done)):
            log.info(
                "cancelled %d call(s) of items skipped or cancelled by an operator",
                calls,
                extra={"event": "calls_cancelled", "watcher": self.id},
            )

    async def _expire_claims(self) -> None:
        """Settle the claims of this queue that ran out: handlers that answered 202 and never
        answered (each counts an attempt), or pull workers gone silent. Cheap when there are none."""
        try:
            expired = await self._db_call(self._db, self.store.expire_claims, self.config.queue, self.policy)
        except Exception as error:  # settled at a later maintenance
            log.warning("could not settle expired claims: %s", error)
            return
        if expired:
            log.info("settled %d expired claim(s)", expired, extra={"event": "claims_expired", "watcher": self.id})

    async def _lease_more(self, *, steal: bool) -> None:
        """Lease ready partitions up to capacity; with `steal`, when none is free, ask for a fair share."""
        cfg = self.config
        if self.stopping or not self.queue_settings.is_open(datetime.now(UTC)):
            return  # a closed queue: lease nothing until its window opens
        room = cfg.effective_max_partitions - len(self.owned)
        if room > 0 and (share := await self._fair_share()) is not None:
            # Beside other watchers, lease no more than a fair share: partitions freed by a watcher
            # that left spread over the rest as they poll, instead of going to the first poller and
            # being handed on by steals (rebalancing without hand-overs where none are needed).
            room = min(room, share - len(self.owned))
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
                    capacity=cfg.effective_max_partitions,
                    most=cfg.steals_per_cycle,
                )
                if marked:
                    log.info("asked for %d partitions toward a fair share", marked)
                    self.metrics.steal_requests.inc(marked)

    async def _fair_share(self) -> int | None:
        """The queue's fair share per watcher (`Store.fair_share`), read at most once a second."""
        now = time.monotonic()
        if now - self._share_read_at >= 1.0:
            self._share = await self._db_call(self._db, self.store.fair_share, self.config.queue)
            self._share_read_at = now
        return self._share

    async def _charge_lost(self) -> None:
        """Charge the deliveries that partitions taken over had unanswered, before fetching from them
        (a partition stays out of fetches until its charge is written)."""
        for pid, lease in list(self._uncharged.items()):
            # By epoch, not identity: a read of the leases (the heartbeat's, the next maintenance's)
            # replaces the Lease held with an equal one, and the charge must survive that.
            held = self.owned.get(pid)
            if held is None or held.epoch != lease.epoch:
                self._uncharged.pop(pid, None)
                continue
            charged = await self._db_call(
                self._db,
                self.store.charge_lost,
                self.id,
                lease,
                max_attempts=self.config.max_attempts,
                gate_attempts=self.router.attempts,
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
                    self.metrics.handed_over.inc()
                    self._forget(pid)
