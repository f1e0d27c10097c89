"""What every part of the watcher is given: its database calls (three threads, the outage they
meet), whether it is stopping (or gave up), and the poller's wake-ups."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import ParamSpec, TypeVar, cast

from tenacity import RetryCallState, wait_random_exponential

from ..core.errors import DatabaseConflict, DatabaseRefusesWrites
from ..store import Store

log = logging.getLogger("feedproc.watcher")
P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _RetryState:
    """The one field of tenacity's RetryCallState that its wait strategies read."""

    attempt_number: int


class Health:
    """Tracks database outages: logs one when it starts and when it ends, not once per attempt.

    An outage in which the database refused to write (read-only, disk full) ends only with a write:
    reads work throughout one, and a loop that only read must not declare it over (the heartbeat
    writes within a third of a lease). A conflict (a deadlock, a serialization failure) is no outage:
    it only lengthens the backoff of the loop that met it."""

    def __init__(self) -> None:
        self.down_since: float | None = None
        self.failures = 0  # consecutive failed calls, for the backoff
        self.error = ""  # what the outage is, as its last failure said
        self._writes_refused = False

    def failed(self, what: str, error: BaseException | None) -> None:
        self.failures += 1
        if isinstance(error, DatabaseConflict):
            return
        self._writes_refused = self._writes_refused or isinstance(error, DatabaseRefusesWrites)
        self.error = str(error)
        if self.down_since is None:
            self.down_since = time.monotonic()
            log.warning(
                "database unavailable (%s): %s; retrying with backoff",
                what,
                error,
                extra={"event": "database_unavailable", "error": str(error)},
            )

    def ok(self, *, wrote: bool = True) -> None:
        """A call succeeded; `wrote`: it wrote (only that ends an outage of refused writes)."""
        if self._writes_refused and not wrote:
            return
        self.failures = 0
        self._writes_refused = False
        if self.down_since is not None:
            log.warning(
                "database reachable again after %.1fs",
                time.monotonic() - self.down_since,
                extra={"event": "database_available"},
            )
            self.down_since = None

    def outage(self) -> str | None:
        """The outage now (what it is, for how long), or None."""
        if self.down_since is None:
            return None
        return f"{self.error} (for {time.monotonic() - self.down_since:.1f}s)"

    def delay(self, cap: float) -> float:
        """Exponential backoff with jitter while the database fails (tenacity's schedule)."""
        wait = wait_random_exponential(multiplier=0.2, max=cap)
        return float(wait(cast(RetryCallState, _RetryState(self.failures))))


class DatabaseCalls:
    """The store, called on one of three threads, and the health of those calls.

    Three threads, three connections: the heartbeat never waits behind anything; flushes (writes)
    and polls (reads, leasing) overlap. That is safe: an item leaves the items in flight only after
    its outcome committed, and each fetch excludes what is in flight when it starts, so a fetch
    either excludes an item or runs after its commit and no longer sees it ready."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.health = Health()
        self.poll = ThreadPoolExecutor(1, thread_name_prefix="feedproc-poll")  #: reads, leasing, fetches
        self.writes = ThreadPoolExecutor(1, thread_name_prefix="feedproc-flush")  #: group commits
        self.heartbeat = ThreadPoolExecutor(1, thread_name_prefix="feedproc-heartbeat")  #: the heartbeat only
        self.hooks = ThreadPoolExecutor(1, thread_name_prefix="feedproc-hooks")  #: completion hooks' outbox

    async def call(self, executor: ThreadPoolExecutor, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)` (a store call) on `executor`'s thread, typed as `fn` is."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, lambda: fn(*args, **kwargs))

    def outage_delay(self, cap: float) -> float:
        """How long to wait before the next try while the database fails (`Health.delay`)."""
        return self.health.delay(cap)

    def shutdown(self) -> None:
        """Let the threads go (calls still queued are dropped)."""
        for executor in (self.poll, self.writes, self.heartbeat, self.hooks):
            executor.shutdown(wait=False, cancel_futures=True)


class PollSignals:
    """What the other parts ask of the poll loop: wake now, do the lease bookkeeping now (a lease may
    be lost, a partition is wanted), or lease more now (work arrived, capacity freed)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()  #: set to wake the poll loop
        self.maintenance_due = True  # lease bookkeeping is due (a lease may be lost, start-up)
        self.leasing_due = False  # lease more now (no other bookkeeping)

    def wake(self) -> None:
        self.event.set()

    def maintain_soon(self) -> None:
        """Do the lease bookkeeping at the poll loop's next turn (without waking it)."""
        self.maintenance_due = True

    def lease_soon(self) -> None:
        """Lease more at the poll loop's next turn (without waking it)."""
        self.leasing_due = True


class Lifecycle:
    """Whether the watcher is stopping, and why it gave up if it did (`fatal`)."""

    def __init__(self, watcher_id: str, signals: PollSignals) -> None:
        self._id = watcher_id
        self._signals = signals
        self._stopping = asyncio.Event()
        self.fatal: str | None = None  # why the watcher gave up (its write path or a task died); None while well

    def stop(self) -> None:
        """No new leases or items from now on; wakes the poll loop to see it."""
        self._stopping.set()
        self._signals.wake()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def wait(self) -> None:
        """Until `stop()` is called."""
        await self._stopping.wait()

    def die(self, reason: str, error: BaseException | None = None) -> None:
        """Give up: record why (`fatal`, shown by /healthz), say so, stop; leases are released on the way out."""
        if self.fatal is None:
            self.fatal = reason
            log.error(
                "watcher cannot go on: %s; releasing its leases and stopping",
                reason,
                exc_info=error,
                extra={"event": "fatal", "error": reason, "watcher": self._id},
            )
        self.stop()
