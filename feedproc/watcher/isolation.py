"""Isolation: an item whose last deliveries were lost with their watcher (a *suspect*) is delivered
alone — nothing else in flight here — so an item that kills its watcher is the one charged, and
fails after `max_attempts` instead of taking watchers down forever."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable

from ..core.records import Lease, ReadyItem
from .calls import DatabaseCalls, Lifecycle, PollSignals
from .flight import InFlight, ReadyBuffer
from .leases import LeaseBook
from .writing import Completer

log = logging.getLogger("feedproc.watcher")

#: Delivers one item under its lease and queues its outcome (`DeliveryPool.deliver_one`).
Deliver = Callable[[ReadyItem, Lease], Awaitable[None]]


class Isolation:
    """Suspects set aside by the fetcher, delivered one at a time by `loop`. While one is (`active`),
    nothing else is fetched or started."""

    def __init__(
        self,
        calls: DatabaseCalls,
        watcher_id: str,
        lifecycle: Lifecycle,
        signals: PollSignals,
        leases: LeaseBook,
        flight: InFlight,
        buffer: ReadyBuffer,
        completer: Completer,
    ) -> None:
        self._calls = calls
        self._id = watcher_id
        self._life = lifecycle
        self._signals = signals
        self._leases = leases
        self._flight = flight
        self._buffer = buffer
        self._completer = completer
        self._suspects: deque[ReadyItem] = deque()  # fetched items to deliver alone (see `Fetcher._is_suspect`)
        self._found = asyncio.Event()
        self.active = False  # delivering a suspect alone: nothing else is fetched or started

    def set_aside(self, item: ReadyItem) -> None:
        """A fetched item (in flight) to deliver alone."""
        self._suspects.append(item)
        self._found.set()

    async def loop(self, deliver: Deliver) -> None:
        """Deliver suspects alone: stop starting anything else, let what runs finish and its answers
        be written, record the suspect as the only delivery in flight here, deliver it, write its answer."""
        flight = self._flight
        while True:
            await self._found.wait()
            self._found.clear()
            while self._suspects and not self._life.stopping:
                self.active = True
                self._buffer.drop_all()  # taken, never started: fetched again afterwards
                await self._until_quiet()
                item = self._suspects.popleft()
                lease = self._leases.owned.get(item.partition_id)
                if lease is None or lease.epoch != item.epoch or self._life.stopping:
                    flight.drop(item.id)
                    continue
                try:
                    alone = await self._calls.call(self._calls.poll, self._calls.store.isolate, self._id, item)
                except Exception as error:
                    log.warning(
                        "could not deliver item %s alone (%s); it will be fetched again",
                        item.id,
                        error,
                        extra={"event": "isolation_failed", "item": item.id, "error": str(error), "watcher": self._id},
                    )
                    alone = False
                if not alone:
                    flight.drop(item.id)
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
                        "watcher": self._id,
                    },
                )
                await deliver(item, lease)
                await self._until_quiet()
            self.active = False
            self._signals.wake()

    async def _until_quiet(self) -> None:
        """Wait until nothing is being delivered and every answer is written (suspects set aside)."""
        flight = self._flight
        while not self._life.stopping and (
            flight.busy or self._completer.unwritten or len(flight.items) > len(self._suspects)
        ):
            self._completer.flush_soon()
            await asyncio.sleep(0.01)
