"""The items in flight here, from their fetch to their committed outcome: which are buffered,
running (and their calls, to cancel), answered; the database's record of them (appends to each
partition's in-flight record, slots counted); and the buffer of fetched items waiting for a worker."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from ..core.models import Item
from ..core.records import Outcome, ReadyItem, Unanswered
from .config import COMPACT_AFTER

CANCELLED_CALL = "the call was cancelled: its item or its partition was cancelled (or skipped), or its partition failed"
STOPPED = threading.Event()  # what `item.stop` becomes when its call is cancelled (`item.cancelled`)
STOPPED.set()


class RunningCall(NamedTuple):
    """A processor call under way for an item: its partition, the worker task awaiting it, the Items
    of the call, its start in epoch microseconds and on the perf counter (a tuple: one per delivery)."""

    partition_id: int
    task: asyncio.Task[Any]
    items: tuple[Item, ...]
    started_us: int
    started_ns: int


class InFlight:
    """This watcher's items between their fetch and their written (or dropped) outcome.

    An item stays here from the moment it is fetched until its outcome is committed (or dropped),
    and fetches exclude what is here: this watcher never dispatches an item twice at once."""

    def __init__(self) -> None:
        self.items: dict[int, ReadyItem] = {}  # fetched, not yet committed or dropped
        self.busy: set[int] = set()  # items a worker is processing now
        self._answered: set[int] = set()  # here but their call has returned: no slot held
        # The calls running now, by item; `cancel_calls` cancels those of a cancelled partition, or
        # of skipped or cancelled items.
        self._running: dict[int, RunningCall] = {}
        self._cancelled_calls: set[asyncio.Task[Any]] = set()
        self._appended: Counter[int] = Counter()  # fetches appended to each partition's record since its rewrite
        # Slots the database counts for this watcher (and per limited gate), as last set by a fetch.
        self.slots_reported: tuple[int, dict[int, int]] = (0, {})

    # Items

    def add(self, item: ReadyItem) -> None:
        self.items[item.id] = item

    def drop(self, item_id: int) -> None:
        """`item_id` is no longer in flight (dropped before delivery, or its outcome settled)."""
        self.items.pop(item_id, None)

    def answered(self, item_id: int) -> None:
        """`item_id`'s call returned: its answer waits for the group commit, its slot is free."""
        self._answered.add(item_id)

    def settled(self, item_id: int) -> None:
        """`item_id`'s outcome is written or given up: it is no longer in flight here."""
        self.items.pop(item_id, None)
        self._answered.discard(item_id)

    def delivered(self) -> set[int]:
        """Items whose call runs or has returned (not merely buffered)."""
        return self.busy | self._answered

    def per_partition(self) -> Counter[int]:
        """How many items in flight each partition has."""
        return Counter(item.partition_id for item in self.items.values())

    def held_weight(self) -> int:
        """Weight of the items fetched whose processor call has not returned (buffered or running):
        the slots this watcher holds. An answered item's slot is free even before its answer is written."""
        return sum(item.weight for item_id, item in self.items.items() if item_id not in self._answered)

    def held_at_gates(self, limits: dict[int, int]) -> dict[int, int]:
        """`held_weight` per limited gate."""
        held: dict[int, int] = {}
        if limits:
            for item_id, item in self.items.items():
                if item.gate in limits and item_id not in self._answered:
                    held[item.gate] = held.get(item.gate, 0) + item.weight
        return held

    def entries(self, which: Callable[[ReadyItem], bool]) -> dict[int, list[tuple[int, int]]]:
        """Per partition, the (id, version) of this watcher's items in flight that match `which`."""
        taken: dict[int, list[tuple[int, int]]] = {}
        for item in self.items.values():
            if which(item):
                taken.setdefault(item.partition_id, []).append((item.id, item.version))
        return taken

    def unanswered(
        self,
        which: Callable[[ReadyItem], bool],
        outcome: str,
        reason: str | None = None,
        *,
        answers: Iterable[Outcome] = (),
    ) -> dict[int, list[Unanswered]]:
        """Per partition, this watcher's deliveries in flight that match `which`, as let go of unanswered
        (`Store.release`) with `outcome`: with their start and how long they ran, from their answer
        (among `answers`, those not yet written) when they have one, else up to now (a call still running)."""
        by_item = {o.item_id: o for o in answers}
        now_ns = time.perf_counter_ns()
        given: dict[int, list[Unanswered]] = {}
        for item in self.items.values():
            if not which(item):
                continue
            started_us = duration_us = None
            if (answer := by_item.get(item.id)) is not None:
                started_us, duration_us = answer.started_us, answer.duration_us
            elif (running := self._running.get(item.id)) is not None:
                started_us, duration_us = running.started_us, (now_ns - running.started_ns) // 1000
            delivery = Unanswered(item.id, item.version, outcome, started_us, duration_us, reason)
            given.setdefault(item.partition_id, []).append(delivery)
        return given

    # Calls running

    def call_started(self, item_id: int, call: RunningCall) -> None:
        self._running[item_id] = call

    def call_ended(self, item_id: int) -> None:
        self._running.pop(item_id, None)

    def running_ids(self) -> list[int]:
        """The items whose call runs now."""
        return list(self._running)

    def cancel_calls(self, partition_id: int | None = None, item_ids: Iterable[int] = ()) -> int:
        """Cancel the calls running for the items of a cancelled (or failed) partition, or for
        `item_ids` (items an operator skipped or cancelled): an `async def` processor's call (and the HTTP processor's
        request) gets CancelledError, a plain `def` one sees `item.cancelled`. Their outcomes are
        dropped by the group commit (no lease, or a new item version). Returns how many."""
        named = set(item_ids)
        cancelled = 0
        for item_id, call in list(self._running.items()):
            if call.partition_id != partition_id and item_id not in named:
                continue
            del self._running[item_id]
            for item in call.items:  # no Event per delivery (1.5 us each): the stopped ones share one
                item.stop = STOPPED
            cancelled += 1
            if call.task not in self._cancelled_calls:
                self._cancelled_calls.add(call.task)
                call.task.cancel(CANCELLED_CALL)
        return cancelled

    def was_cancelled(self, task: asyncio.Task[Any]) -> bool:
        """Whether the CancelledError `task` caught is `cancel_calls`' (then it is taken back:
        the worker goes on) rather than the watcher stopping."""
        if task not in self._cancelled_calls:
            return False
        self._cancelled_calls.discard(task)
        task.uncancel()
        return True

    # The database's record of them

    def kept(self) -> dict[int, list[tuple[int, int]]]:
        """What the next fetch rewrites: the in-flight items of partitions whose record is due a rewrite."""
        due = {pid for pid, n in self._appended.items() if n >= COMPACT_AFTER}
        if not due:
            return {}
        taken = self.entries(lambda item: item.partition_id in due)
        return {pid: taken.get(pid, []) for pid in due}

    def note_fetch(self, ready: list[ReadyItem], kept: dict[int, list[tuple[int, int]]]) -> None:
        """Count the appends to each fetched partition's record (a rewrite starts again at 0)."""
        for pid in {item.partition_id for item in ready}:
            self._appended[pid] = 0 if pid in kept else self._appended[pid] + 1

    def forget_partition(self, pid: int) -> None:
        """`pid` is no longer held: its record's appends start again from 0 if it comes back."""
        self._appended.pop(pid, None)


class ReadyBuffer:
    """Fetched items waiting for a worker (None: a worker's stop signal). Dropping an item from it
    takes it out of flight: it is fetched again when it may be delivered."""

    def __init__(self, flight: InFlight) -> None:
        self._flight = flight
        self._queue: asyncio.Queue[ReadyItem | None] = asyncio.Queue()

    def put(self, item: ReadyItem | None) -> None:
        self._queue.put_nowait(item)

    async def get(self) -> ReadyItem | None:
        return await self._queue.get()

    def get_nowait(self) -> ReadyItem | None:
        """The next item; raises asyncio.QueueEmpty when there is none."""
        return self._queue.get_nowait()

    def size(self) -> int:
        return self._queue.qsize()

    def drop(self, which: Callable[[ReadyItem], bool]) -> None:
        """Forget buffered (never dispatched) items that match `which`."""
        kept: list[ReadyItem | None] = []
        while not self._queue.empty():
            item = self._queue.get_nowait()
            if item is not None and which(item):
                self._flight.drop(item.id)
            else:
                kept.append(item)
        for item in kept:
            self._queue.put_nowait(item)

    def drop_partition(self, pid: int) -> None:
        self.drop(lambda item: item.partition_id == pid)

    def drop_all(self) -> None:
        self.drop(lambda item: True)
