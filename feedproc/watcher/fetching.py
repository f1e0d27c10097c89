"""The fetcher: the poll loop — lease bookkeeping when due, then fetching ready items into the
buffer (within a queue's concurrency limit when it has one), setting suspects aside to deliver alone."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from ..core.errors import DatabaseUnavailable
from ..core.records import Fetched, Lease, ReadyItem, SlotClaim
from .adaptive import AdaptiveConcurrency
from .calls import DatabaseCalls, Lifecycle, PollSignals
from .config import FAILED_POLLS_FATAL, WatcherConfig
from .flight import InFlight, ReadyBuffer
from .isolation import Isolation
from .leases import LeaseBook
from .routing import Router

log = logging.getLogger("feedproc.watcher")


class Fetcher:
    """The poll loop and the fetch that keeps the buffer full. `maintain` is the lease bookkeeping
    done once per poll interval, or at once when asked (`PollSignals`)."""

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
        buffer: ReadyBuffer,
        isolation: Isolation,
        adaptive: AdaptiveConcurrency,
        maintain: Callable[[], Awaitable[None]],
    ) -> None:
        self._calls, self._store = calls, calls.store
        self._config = config
        self._id = watcher_id
        self._life = lifecycle
        self._signals = signals
        self._router = router
        self._leases = leases
        self._flight = flight
        self._buffer = buffer
        self._isolation = isolation
        self._adaptive = adaptive
        self._maintain = maintain
        self._failed_polls = 0
        self._after = 0  # the last partition the previous fetch served: the next goes on after it
        self._token_at: float | None = None  # (monotonic) when a dry rate bucket has a token again
        self._tokens = TokensAhead()  # a queue's rate, taken ahead of its fetches

    async def poll_loop(self) -> None:
        """Fetch whenever woken (a flush landed, the buffer ran low); do the lease bookkeeping
        (learn steal requests, hand over, lease more, steal) once per poll interval or when due."""
        cfg, health, signals = self._config, self._calls.health, self._signals
        next_maintenance = 0.0
        while not self._life.stopping:
            signals.event.clear()  # before the work: a wake-up arriving during it is kept, not lost
            delay = cfg.poll_interval
            try:
                if signals.maintenance_due or time.monotonic() >= next_maintenance:
                    signals.maintenance_due = signals.leasing_due = False
                    await self._maintain()
                    next_maintenance = time.monotonic() + cfg.poll_interval
                elif signals.leasing_due:  # the latency path: one statement, then the fetch below
                    signals.leasing_due = False
                    await self._leases.lease_more(steal=False)
                await self._fill_buffer()
                health.ok(wrote=False)  # (it may have read only)
                self._failed_polls = 0
                due = next_maintenance if self._token_at is None else min(next_maintenance, self._token_at)
                delay = max(0.0, due - time.monotonic())
            except DatabaseUnavailable as error:
                health.failed("poll", error)
                delay = health.delay(5.0)
            except Exception as error:  # a bug of ours, or a database error that is not an outage
                self._failed_polls += 1
                log.error(
                    "poll failed (%s: %s)",
                    type(error).__name__,
                    error,
                    exc_info=error,
                    extra={"event": "poll_failed", "error": str(error), "watcher": self._id},
                )
                if self._failed_polls >= FAILED_POLLS_FATAL:
                    self._life.die(
                        f"{self._failed_polls} polls in a row failed: {type(error).__name__}: {error}", error
                    )
                    return
                signals.maintain_soon()
                delay = health.delay(5.0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(signals.event.wait(), timeout=delay)

    async def _fill_buffer(self) -> None:
        await self._adaptive.send()  # push-backs seen since the last poll; the windows, once a poll interval
        await self._give_back_tokens()
        fresh = self._leases.take_fresh()
        if fresh:  # the next fetch starts with the partitions just leased
            self._after = min(fresh) - 1
        if self._isolation.active:
            return  # a suspect is delivered alone
        if self._router.serves_nothing:
            return  # serving a pipeline that was removed: nothing is delivered (nor failed) until one is applied
        settings = self._router.settings
        if settings.paused or (settings.windows is not None and not settings.is_open(datetime.now(UTC))):
            return  # in-flight items finish; nothing new is fetched
        self._token_at = None
        if settings.limited or self._router.current.limits or self._flow_controlled or self._adaptive.widths:
            return await self._fill_within_limit()
        target = self._config.effective_prefetch
        buffered = self._buffer.servable()
        if buffered > target // 2 and not fresh:  # still half full: fetch later, in a bigger batch
            return
        want = target - buffered - len(self._flight.busy)
        if fresh:  # new partitions: their items now, even into a full buffer (it serves them in turn)
            want = max(want, target // 4)
        if want <= 0 or not self._leases.owned or self._life.stopping:
            return
        if settings.rate is None:
            self._take(await self._fetch(want))
            return
        # A queue with nothing but a rate: tokens taken for the fetch (and a few fetches ahead while
        # they are plenty), what it leaves kept for the next one, given back once a second.
        calls, queue, tokens = self._calls, self._config.queue, self._tokens
        if tokens.held < want:
            granted, retry_in = await calls.call(
                calls.poll, self._store.take_tokens, queue, settings.rate, want - tokens.held, ahead=3 * want
            )
            tokens.add(granted)
            if retry_in is not None:
                self._token_at = time.monotonic() + retry_in
        ready = await self._fetch(min(want, tokens.held)) if tokens.held else []
        tokens.use(len(ready))
        self._take(ready)

    async def _fetch(self, want: int, slots: SlotClaim | None = None) -> list[ReadyItem]:
        """Up to `want` ready items of the partitions held (not those in flight here, nor of closed
        or uncharged partitions), recorded in flight; with `slots`, the slot claim of a limited queue."""
        kept = self._flight.kept()
        ready = await self._calls.call(
            self._calls.poll,
            self._store.fetch_ready,
            self._id,
            want,
            list(self._flight.items),
            slots=slots,
            closed=self._leases.not_now() | self._at_partition_limit(),
            closed_gates=self._router.closed_gates(),
            kept=kept,
            after=self._after,
            aging=self._router.settings.aging,
        )
        if ready:
            self._after = ready[-1].partition_id
        self._flight.note_fetch(ready, kept)
        return ready

    async def _give_back_tokens(self) -> None:
        """Tokens taken ahead and not used within a second (or of a rate since changed) go back."""
        tokens, rate = self._tokens, self._router.settings.rate
        if tokens.held and tokens.rate is not None and (tokens.stale or rate != tokens.rate):
            count, tokens.held = tokens.held, 0
            calls = self._calls
            await calls.call(calls.poll, self._store.give_back_tokens, self._config.queue, tokens.rate, count)
        tokens.rate = rate

    @property
    def _flow_controlled(self) -> bool:
        """Group limits or rates apply that the slot claim's fetch decides, item by item: the queue's
        group limit and group rate, its pipeline gates' group limits and rates. (A queue's own rate
        alone is taken ahead of an ordinary fetch; with any of these, the claim takes it too.)"""
        settings = self._router.settings
        return bool(settings.group_limit or settings.group_rate or self._router.current.flow.any)

    def _at_partition_limit(self) -> set[int]:
        """Partitions with as many items in flight here (buffered or running) as their partition
        limit: not fetched from, so a limited partition's backlog does not pile up in the buffer."""
        here: dict[int, tuple[int, int]] = {}  # partition id -> (items in flight, a gate of theirs)
        for item in self._flight.items.values():
            count, _ = here.get(item.partition_id, (0, 0))
            here[item.partition_id] = (count + 1, item.gate)
        owned, limit_of = self._leases.owned, self._router.partition_limit
        return {
            pid
            for pid, (count, gate) in here.items()
            if (limit := limit_of(owned.get(pid), gate)) is not None and count >= limit
        }

    async def _fill_within_limit(self) -> None:
        """A queue with a concurrency limit: fetch no more than idle workers can start now (a
        prefetched item would hold a slot while it waits). The same call gives back the slots of
        items answered since the last one and claims the new items' slots (workers wake the poller
        on every answer, so a freed slot is reused or returned at once)."""
        flight, owned = self._flight, self._leases.owned
        stopped = self._life.stopping or self._isolation.active
        # Idle workers' worth of items: each call carries up to a batch (a batch of one would go alone).
        capacity = self._config.concurrency * self._router.largest_batch
        want = 0 if stopped else capacity - len(flight.busy) - self._buffer.servable()
        held, limits = flight.held_weight(), self._router.current.limits
        held_at, by_group = flight.held_at_gates(), flight.held_by_group()
        if (want <= 0 or not owned) and (held, held_at, by_group) == flight.slots_reported:
            return
        claim = SlotClaim(self._config.queue, held, limits, held_at, self._router.current.flow, by_group)
        want = max(want, 0) if owned else 0
        ready = await self._fetch(want, slots=claim)
        for item in ready:
            held_at[item.gate] = held_at.get(item.gate, 0) + item.weight
            if item.group is not None:
                by_group[(item.group, item.gate)] = by_group.get((item.group, item.gate), 0) + item.weight
        flight.slots_reported = (held + sum(item.weight for item in ready), held_at, by_group)
        if isinstance(ready, Fetched) and ready.retry_in is not None:
            self._token_at = time.monotonic() + ready.retry_in  # look again once a token is there
        self._take(ready)

    def _take(self, ready: list[ReadyItem]) -> None:
        """Put freshly fetched items in flight: into the buffer, or aside as suspects."""
        owned, flight = self._leases.owned, self._flight
        for item in ready:
            lease = owned.get(item.partition_id)
            if item.id in flight.items or lease is None or lease.epoch != item.epoch or lease.wanted_by:
                self._unknown_lease(item, lease)
                continue  # (a limited queue: its slot stays counted until the next fetch sets the count again)
            flight.add(item)
            if item.lost and self._is_suspect(item):  # `lost` is 0 but after a watcher died
                self._isolation.set_aside(item)
            else:
                self._buffer.put(item)

    def _unknown_lease(self, item: ReadyItem, lease: Lease | None) -> None:
        """A fetch found an item of a partition the database says we hold, under an epoch we do not
        know: handed over to us (a steal we asked for) or re-leased. Read the leases now, not at the
        next poll interval, and fetch again."""
        if lease is None or lease.epoch < item.epoch:
            self._signals.maintain_soon()
            self._signals.wake()

    def _is_suspect(self, item: ReadyItem) -> bool:
        """An item to deliver alone: its last deliveries were lost with their watcher twice in a row, or
        once when one more loss would use up its attempts. Alone, a loss is surely its own doing."""
        return item.lost >= 2 or (item.lost >= 1 and item.attempts + 1 >= self._router.policy_of(item).max_attempts)


class TokensAhead:
    """Tokens of a queue's rate taken ahead of its fetches and not used yet (spent already: any
    window of T seconds still starts at most rate x T + burst items), kept a second at most."""

    KEPT = 1.0  # seconds

    def __init__(self) -> None:
        self.held = 0
        self.rate: float | str | None = None  # the rate they were taken of
        self._since = 0.0

    def add(self, count: int) -> None:
        if count and not self.held:
            self._since = time.monotonic()
        self.held += count

    def use(self, count: int) -> None:
        self.held = max(0, self.held - count)

    @property
    def stale(self) -> bool:
        return time.monotonic() - self._since > self.KEPT
