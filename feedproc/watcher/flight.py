"""The items in flight here, from their fetch to their committed outcome: which are buffered,
running (and their calls, to cancel), answered; the database's record of them (appends to each
partition's in-flight record, slots counted); and the buffer of fetched items waiting for a worker."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter, deque
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
        self.slots_reported: tuple[int, dict[int, int], dict[tuple[str, int], int]] = (0, {}, {})

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

    def held_at_gates(self) -> dict[int, int]:
        """`held_weight` per gate (every gate: a gate's window may open at any time)."""
        held: dict[int, int] = {}
        for item_id, item in self.items.items():
            if item_id not in self._answered:
                held[item.gate] = held.get(item.gate, 0) + item.weight
        return held

    def held_by_group(self) -> dict[tuple[str, int], int]:
        """`held_weight` per (concurrency group, gate), of the items fetched with a group."""
        held: dict[tuple[str, int], int] = {}
        for item_id, item in self.items.items():
            if item.group is not None and item_id not in self._answered:
                held[(item.group, item.gate)] = held.get((item.group, item.gate), 0) + item.weight
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


#: Items a partition is served in its turn before the next partition's. One each spread a watcher's
#: answers over every partition it holds, and its group commits with them (per-partition work for
#: each): SQLite's flat drain fell from 14,500 to 9,500 items/s with 20 partitions. A small
#: partition still waits at most this many items for each partition ahead of it.
TURN = 16


class ReadyBuffer:
    """Fetched items waiting for a worker, served fairly: the partitions of the highest priority
    buffered take turns of `TURN` items each, so a small partition leased beside a big one is not
    served after everything fetched of the big one (a 5-item partition behind a 400-item one of the same
    priority waited for all 400). A partition's own items keep their fetch order (due, then id).

    A partition with as many items handed out (taken, not yet `done`) as its partition limit
    (`limit_by`) waits for one to be done; the others are served meanwhile.

    A stop signal (None, `put(None)`) is served before any item: a worker that takes one exits.
    Dropping an item from the buffer takes it out of flight: it is fetched again when it may be
    delivered."""

    def __init__(self, flight: InFlight) -> None:
        self._flight = flight
        self._limit_of: Callable[[ReadyItem], int | None] | None = None
        self._out: Counter[int] = Counter()  # partition id -> its items handed out, not yet done
        # Partition id -> its limit, for the buffered partitions that have one: read when its first
        # item buffered arrives (`limit_by`), so serving one costs no lookup; empty without limits.
        self._limits: dict[int, int] = {}
        self._items: dict[int, deque[ReadyItem]] = {}  # partition id -> its buffered items, in order
        # Priority -> the partitions of that priority with items buffered, in turn order.
        self._turns: dict[int, deque[int]] = {}
        self._priority: dict[int, int] = {}  # partition id -> the priority its turn is kept under
        self._stops = 0
        self._size = 0
        self._head: int | None = None  # the partition whose turn it is, and the items it was served
        self._served = 0
        self._arrived = asyncio.Event()

    def put(self, item: ReadyItem | None) -> None:
        if item is None:
            self._stops += 1
        else:
            pid = item.partition_id
            queued = self._items.get(pid)
            if queued is None:
                self._items[pid] = queued = deque()
                self._priority[pid] = item.priority
                if self._limit_of is not None and (limit := self._limit_of(item)) is not None:
                    self._limits[pid] = limit
                self._turns.setdefault(item.priority, deque()).append(pid)
            queued.append(item)
            self._size += 1
        self._arrived.set()

    def limit_by(self, limit_of: Callable[[ReadyItem], int | None]) -> None:
        """How many items of an item's partition may be handed out at once (None: any number)."""
        self._limit_of = limit_of

    def done(self, item: ReadyItem) -> None:
        """A worker is done with `item` (delivered, or dropped before): its partition may be served again."""
        pid = item.partition_id
        if self._out[pid] <= 1:
            self._out.pop(pid, None)
        else:
            self._out[pid] -= 1
        if pid in self._limits:
            self._arrived.set()  # it was perhaps at its limit, its next item waiting

    def _servable(self, pid: int) -> bool:
        limit = self._limits.get(pid)
        return limit is None or self._out[pid] < limit

    def servable(self) -> int:
        """Items buffered that workers may take now: not those waiting for their partition's
        limit. What the fetcher tops up (a limited partition's waiting items do not hold up the
        fetching of the others')."""
        waiting = 0
        for pid, limit in self._limits.items():
            waiting += max(0, len(self._items[pid]) - max(0, limit - self._out[pid]))
        return self._size - waiting

    async def get(self) -> ReadyItem | None:
        """The next item (or stop signal), waiting for one."""
        while True:
            try:
                return self.get_nowait()
            except asyncio.QueueEmpty:
                self._arrived.clear()
                await self._arrived.wait()

    def get_nowait(self, like: ReadyItem | None = None) -> ReadyItem | None:
        """The next item: `like`'s partition's next one when it has one (a batch gathers its
        partition's items), else that of the partition whose turn it is. Raises asyncio.QueueEmpty
        when there is none."""
        if self._stops:
            self._stops -= 1
            return None
        if like is not None and like.partition_id in self._items and self._servable(like.partition_id):
            return self._take(like.partition_id, rotate=False)
        for priority in sorted(self._turns, reverse=True) if len(self._turns) > 1 else self._turns:
            turns = self._turns[priority]
            for _ in range(len(turns)):
                if self._servable(turns[0]):
                    return self._take(turns[0], rotate=True)
                turns.rotate(-1)  # at its limit: the next partition's turn
        raise asyncio.QueueEmpty

    def _take(self, pid: int, *, rotate: bool) -> ReadyItem:
        queued = self._items[pid]
        item = queued.popleft()
        self._size -= 1
        self._out[pid] += 1
        if not queued:  # its last: it leaves the turns
            self._forget(pid)
        elif rotate:
            if pid != self._head:  # a new turn
                self._head, self._served = pid, 0
            self._served += 1
            if self._served >= TURN:  # its turn is over: to the back
                self._head = None
                self._turns[self._priority[pid]].rotate(-1)
        return item

    def size(self) -> int:
        """Items buffered (stop signals not counted)."""
        return self._size

    def drop(self, which: Callable[[ReadyItem], bool]) -> None:
        """Forget buffered (never dispatched) items that match `which`; they leave flight."""
        for pid, queued in list(self._items.items()):
            kept: deque[ReadyItem] = deque()
            for item in queued:
                if which(item):
                    self._flight.drop(item.id)
                else:
                    kept.append(item)
            self._size -= len(queued) - len(kept)
            if kept:
                self._items[pid] = kept
            else:
                self._forget(pid)

    def _forget(self, pid: int) -> None:
        """`pid` has nothing buffered any more: it leaves the turns."""
        del self._items[pid]
        self._limits.pop(pid, None)
        priority = self._priority.pop(pid)
        self._turns[priority].remove(pid)
        if not self._turns[priority]:
            del self._turns[priority]

    def drop_partition(self, pid: int) -> None:
        self.drop(lambda item: item.partition_id == pid)

    def drop_all(self) -> None:
        self.drop(lambda item: True)
