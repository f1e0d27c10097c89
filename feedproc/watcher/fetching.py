"""The poll loop: lease bookkeeping when due, then fetching ready items into the buffer (within a
queue's concurrency limit when it has one), setting aside suspects to deliver alone."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime

from ..core.errors import DatabaseUnavailable
from ..core.records import Lease, ReadyItem, SlotClaim
from .config import COMPACT_AFTER, FAILED_POLLS_FATAL
from .leases import LeaseKeeping

log = logging.getLogger("feedproc.watcher")


class Fetching(LeaseKeeping):
    """The poll loop and the fetch that keeps the buffer full."""

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
                self._health.ok(wrote=False)  # (it may have read only)
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

    async def _fill_buffer(self) -> None:
        if self._isolating:
            return  # a suspect is delivered alone
        if self.processor is None and self.router.spec is None:
            return  # serving a pipeline that was removed: nothing is delivered (nor failed) until one is applied
        settings = self.queue_settings
        if settings.paused or (settings.windows is not None and not settings.is_open(datetime.now(UTC))):
            return  # in-flight items finish; nothing new is fetched
        if self.queue_settings.limited or self.router.limits:
            return await self._fill_within_limit()
        target = self.config.effective_prefetch
        if self._buffer.qsize() > target // 2:  # still half full: fetch later, in a bigger batch
            return
        want = target - self._buffer.qsize() - len(self.busy)
        if want <= 0 or not self.owned or self.stopping:
            return
        self._take(await self._fetch(want))

    async def _fetch(self, want: int, slots: SlotClaim | None = None) -> list[ReadyItem]:
        """Up to `want` ready items of the partitions held (not those in flight here, nor of closed
        or uncharged partitions), recorded in flight; with `slots`, the slot claim of a limited queue."""
        kept = self._kept()
        ready: list[ReadyItem] = await self._db_call(
            self._db,
            self.store.fetch_ready,
            self.id,
            want,
            list(self.inflight),
            slots=slots,
            closed=self._not_now(),
            closed_gates=self._closed_gates(),
            kept=kept,
        )
        self._note_fetch(ready, kept)
        return ready

    async def _fill_within_limit(self) -> None:
        """A queue with a concurrency limit: fetch no more than idle workers can start now (a
        prefetched item would hold a slot while it waits). The same call gives back the slots of
        items answered since the last one and claims the new items' slots (workers wake the poller
        on every answer, so a freed slot is reused or returned at once)."""
        want = (
            0 if self.stopping or self._isolating else self.config.concurrency - len(self.busy) - self._buffer.qsize()
        )
        held, limits = self._held_weight(), self.router.limits
        held_at = self._held_at_gates(limits)
        if (want <= 0 or not self.owned) and (held, held_at) == self._slots_reported:
            return
        claim = SlotClaim(self.config.queue, held, limits, held_at)
        want = max(want, 0) if self.owned else 0
        ready = await self._fetch(want, slots=claim)
        for item in ready:
            if item.gate in limits:
                held_at[item.gate] = held_at.get(item.gate, 0) + item.weight
        self._slots_reported = (held + sum(item.weight for item in ready), held_at)
        self._take(ready)

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

    def _unknown_lease(self, item: ReadyItem, lease: Lease | None) -> None:
        """A fetch found an item of a partition the database says we hold, under an epoch we do not
        know: handed over to us (a steal we asked for) or re-leased. Read the leases now, not at the
        next poll interval, and fetch again."""
        if lease is None or lease.epoch < item.epoch:
            self._maintain_now = True
            self._wake.set()

    def _is_suspect(self, item: ReadyItem) -> bool:
        """An item to deliver alone: its last deliveries were lost with their watcher twice in a row, or
        once when one more loss would use up its attempts. Alone, a loss is surely its own doing."""
        return item.lost >= 2 or (item.lost >= 1 and item.attempts + 1 >= self._policy_of(item).max_attempts)

    def _held_weight(self) -> int:
        """Weight of the items fetched whose processor call has not returned (buffered or running):
        the slots this watcher holds. An answered item's slot is free even before its answer is written."""
        return sum(item.weight for item_id, item in self.inflight.items() if item_id not in self._answered)

    def _held_at_gates(self, limits: dict[int, int]) -> dict[int, int]:
        """`_held_weight` per limited gate."""
        held: dict[int, int] = {}
        if limits:
            for item_id, item in self.inflight.items():
                if item.gate in limits and item_id not in self._answered:
                    held[item.gate] = held.get(item.gate, 0) + item.weight
        return held

    def _not_now(self) -> set[int]:
        """Owned partitions not to fetch from now: outside their windows, or with a charge pending."""
        closed = self._closed()
        return closed | set(self._uncharged) if self._uncharged else closed

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
