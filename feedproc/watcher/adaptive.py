"""Adaptive concurrency, the watcher's part: what its deliveries saw at each gate (handlers pushing
back with 429, 503 or a timeout; answers that succeeded) reported to the database, where each
gate's fleet-wide window shrinks and grows (`store.flow.AdaptiveWindows`), and the windows known,
which the fetcher treats as gate limits.

A push-back of a delivery that started before this watcher learned of the gate's last cut is not
reported: it answers to the old, larger window (as TCP cuts once per round trip, not once per loss).
Successes are reported only at gates that have a window; with none, nothing is written at all.
Gates delivered in batches are left alone: their handler's load is bounded by the batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from ..core.flow import GateReport
from ..core.records import Kind, Outcome
from .calls import DatabaseCalls
from .flight import InFlight

log = logging.getLogger("feedproc.watcher")

#: Seconds between two reads of the windows, at least (a bench's poll interval of 0.1 s read them
#: ten times a second per watcher, for nothing while no handler pushes back).
READ_EVERY = 1.0


class AdaptiveConcurrency:
    """Per gate: the fleet's window (`widths`), and what to report of it (`note`, then `send`)."""

    def __init__(
        self,
        calls: DatabaseCalls,
        queue: str,
        watcher_id: str,
        flight: InFlight,
        poll_interval: float,
        window_opened: Callable[[], None] = lambda: None,
        batched: Callable[[int], bool] = lambda gate: False,
    ) -> None:
        self._calls, self._queue, self._id, self._flight = calls, queue, watcher_id, flight
        self._window_opened = window_opened  # the buffer's items are given back: fetched again within it
        # A gate delivered in batches is not windowed: a window counts items, and would split the
        # batch a handler pushed back on into smaller calls, not fewer.
        self._batched = batched
        # Windows opened by other watchers are learned within a second (at most once a poll interval):
        # a watcher that meets push-backs itself learns at once, from its report's answer.
        self._read_every = max(poll_interval, READ_EVERY)
        self.widths: dict[int, float] = {}
        self._cut_seen: dict[int, int] = {}  # gate -> epoch microseconds when its last cut became known here
        self._pushbacks: dict[int, int] = {}
        self._successes: dict[int, int] = {}
        self._read_due = 0.0  # (monotonic) the next read of the windows

    @property
    def limits(self) -> dict[int, int]:
        """The windows as gate limits: whole, at least 1."""
        return {gate: max(1, int(width)) for gate, width in self.widths.items()}

    def note(self, outcomes: Iterable[Outcome]) -> None:
        """Count a group commit's outcomes: push-backs of deliveries started under the current
        window, and successes at gates with a window."""
        for outcome in outcomes:
            gate = outcome.gate
            if outcome.pushback is not None and not self._batched(gate):
                if (outcome.started_us or 0) >= self._cut_seen.get(gate, 0):
                    self._pushbacks[gate] = self._pushbacks.get(gate, 0) + 1
            elif gate in self.widths and outcome.kind in (Kind.DONE, Kind.MOVE, Kind.LATER):
                self._successes[gate] = self._successes.get(gate, 0) + 1

    async def send(self) -> None:
        """Report what was noted (one transaction), or once a poll interval read the windows, and
        learn the windows from the answer."""
        if self._pushbacks or self._successes:
            running = self._running_at_gates()
            reports = {
                gate: GateReport(
                    self._pushbacks.get(gate, 0),
                    self._successes.get(gate, 0),
                    running.get(gate, 0),
                    self.widths.get(gate),
                )
                for gate in {*self._pushbacks, *self._successes}
            }
            self._pushbacks, self._successes = {}, {}
            calls = self._calls
            self._learn(await calls.call(calls.poll, calls.store.adapt, self._id, self._queue, reports))
        elif time.monotonic() >= self._read_due:
            calls = self._calls
            self._learn(await calls.call(calls.poll, calls.store.gate_windows, self._queue))
        else:
            return
        self._read_due = time.monotonic() + self._read_every

    def _running_at_gates(self) -> dict[int, int]:
        """Calls running now per gate (not what is buffered: a first window starts from what runs)."""
        running: dict[int, int] = {}
        items = self._flight.items
        for item_id in self._flight.busy:
            if (item := items.get(item_id)) is not None:
                running[item.gate] = running.get(item.gate, 0) + 1
        return running

    def _learn(self, widths: dict[int, float]) -> None:
        now_us = time.time_ns() // 1000
        opened = False
        for gate, width in widths.items():
            if gate not in self.widths or width < self.widths[gate]:
                self._cut_seen[gate] = now_us  # cut: what was started before answers to the old window
                opened = opened or gate not in self.widths
        for gate in set(self.widths) - set(widths):
            self._cut_seen.pop(gate, None)
            log.info(
                "queue %s gate %s: concurrency window grown past the fleet's, removed",
                self._queue,
                gate,
                extra={"event": "window_removed", "gate": gate, "watcher": self._id},
            )
        self.widths = widths
        if opened:
            self._window_opened()
