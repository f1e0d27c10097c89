"""A watcher's settings (the `feedproc watch` options) and the tuning constants of its loops."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.models import MAX_CHILDREN, check_queue
from ..core.policy import RetryPolicy

PREFETCH = 200  # ready items kept fetched ahead at least, whatever the concurrency
MAX_PREFETCH = 100_000  # `--prefetch` at most: a fetch's ids travel in one statement
TRACEBACK_KEPT = 4096  # characters of a processor's traceback kept in its delivery record (the end)
FAILED_WRITES_FATAL = 3  # group commits in a row that could write nothing (not an outage): the watcher stops
FAILED_POLLS_FATAL = 5  # poll cycles in a row failing with an error of ours (not an outage): likewise
# A fetch appends to its partitions' in-flight records; every this many fetches of a partition its
# record is rewritten whole from what is in flight here (answered deliveries drop out of it).
COMPACT_AFTER = 32
MAX_BATCH = 1000  # items per batch delivery at most


@dataclass(frozen=True, slots=True)
class WatcherConfig:
    """Settings of one watcher (the `feedproc watch` options)."""

    queue: str = "default"
    concurrency: int = 10
    capacity: int | None = None  # partitions leased at most; default 4 x concurrency (at least 8)
    lease_seconds: float = 30.0
    poll_interval: float = 1.0
    max_attempts: int = 5
    retry_delay: float = 1.0
    max_retry_delay: float = 600.0
    shutdown_grace: float = 30.0
    flush_batch: int = 500  # outcomes per group commit at most
    retention: float | None = None  # delete partitions finished longer ago than this (seconds)
    retention_every: float = 300.0
    steals_per_cycle: int = 16  # partitions asked for per steal request at most (the fair-share deficit bounds it)
    item_timeout: float | None = None  # seconds a processor call may take (a partition may override)
    batch: int = 1  # items of one partition and gate delivered in one call at most (`--batch`)
    batch_wait: float = 0.0  # seconds a batch short of `batch` waits for more items (`--batch-wait`)
    fetch_ahead: int | None = None  # ready items kept fetched ahead (`--prefetch`); default: see `prefetch`
    max_children: int = MAX_CHILDREN  # child items one answer may add (`--max-children`); more fails the item

    def __post_init__(self) -> None:
        check_queue(self.queue)
        for name in ("concurrency", "max_attempts", "flush_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("lease_seconds", "poll_interval"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.retry_delay < 0 or self.shutdown_grace < 0:
            raise ValueError("retry_delay and shutdown_grace must be >= 0")
        if self.item_timeout is not None and self.item_timeout <= 0:
            raise ValueError("item_timeout must be positive")
        if not 1 <= self.batch <= MAX_BATCH:
            raise ValueError(f"batch must be from 1 to {MAX_BATCH}")
        if self.max_children < 0:
            raise ValueError("max_children must be >= 0")
        if self.batch_wait < 0:
            raise ValueError("batch_wait must be >= 0")
        if self.fetch_ahead is not None and not 1 <= self.fetch_ahead <= MAX_PREFETCH:
            raise ValueError(f"prefetch must be from 1 to {MAX_PREFETCH}")

    @property
    def prefetch(self) -> int:
        """Ready items kept fetched ahead: `fetch_ahead` when given, else enough for every worker and
        for four full batches. Far from the database more is needed: a watcher fetches when half is
        left, and its workers must not run dry while a fetch is on its way (40 ms away, a fetch took
        90 ms: 50 workers of 20 ms items did 566 items/s with the default 200, 1,571 with 800)."""
        if self.fetch_ahead is not None:
            return self.fetch_ahead
        return max(4 * self.concurrency, PREFETCH, 4 * self.batch)

    @property
    def max_partitions(self) -> int:
        return self.capacity if self.capacity is not None else max(8, 4 * self.concurrency)

    @property
    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(self.max_attempts, self.retry_delay, self.max_retry_delay, self.poll_interval)
