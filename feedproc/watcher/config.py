"""A watcher's settings (the `feedproc watch` options) and the tuning constants of its loops."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

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


#: Fields renamed to their `feedproc watch` option's name: old -> new. The old names are still taken
#: (and read) with a DeprecationWarning for one release.
RENAMED = {"capacity": "max_partitions", "fetch_ahead": "prefetch"}
#: Each field is set by the `feedproc watch` option of the same name (`--max-partitions` sets
#: `max_partitions`, env FEEDPROC_MAX_PARTITIONS), in seconds where it is a time, except these:
#: tuning only Python sets (None), and an option counting in another unit, which its name says.
OPTIONS_OTHERWISE: dict[str, str | None] = {
    "flush_batch": None,
    "retention_every": None,
    "steals_per_cycle": None,
    "batch_wait": "--batch-wait-ms",
}


def option_of(field: str) -> str | None:
    """The `feedproc watch` option that sets WatcherConfig's `field` (None: Python only)."""
    return OPTIONS_OTHERWISE.get(field, "--" + field.replace("_", "-"))


def current_names(settings: Mapping[str, Any]) -> dict[str, Any]:
    """`settings` with any field given by its old name (`RENAMED`) under its new one, with a
    DeprecationWarning; TypeError when both names are given."""
    out = dict(settings)
    for old, new in RENAMED.items():
        if old in out:
            warnings.warn(
                f"WatcherConfig({old}=...) is deprecated: use {new}= (the --{new.replace('_', '-')} option's name)",
                DeprecationWarning,
                stacklevel=3,
            )
            if new in out:
                raise TypeError(f"WatcherConfig got both {old}= and {new}=: give {new}= only")
            out[new] = out.pop(old)
    return out


@dataclass(frozen=True, slots=True)
class WatcherConfig:
    """Settings of one watcher: each field is the `feedproc watch` option of the same name (see
    `option_of`), times in seconds."""

    queue: str = "default"
    concurrency: int = 10
    max_partitions: int | None = None  # partitions leased at most; default 4 x concurrency (at least 8)
    lease_seconds: float = 30.0
    poll_interval: float = 1.0
    max_attempts: int = 5
    max_not_yet: int = 1000  # "not yet" answers of one item at one gate before it fails
    retry_delay: float = 1.0
    max_retry_delay: float = 600.0
    shutdown_grace: float = 30.0
    flush_batch: int = 500  # outcomes per group commit at most
    retention: float | None = None  # delete partitions finished longer ago than this (seconds)
    retention_every: float = 300.0
    steals_per_cycle: int = 16  # partitions asked for per steal request at most (the fair-share deficit bounds it)
    item_timeout: float | None = None  # seconds a processor call may take (a partition may override)
    batch: int = 1  # items of one partition and gate delivered in one call at most
    batch_wait: float = 0.0  # seconds a batch short of `batch` waits for more items (`--batch-wait-ms`: ms)
    prefetch: int | None = None  # ready items kept fetched ahead; default: see `effective_prefetch`
    max_children: int = MAX_CHILDREN  # child items one answer may add; more fails the item
    hook_attempts: int = 25  # calls of a completion hook before it fails for good
    hook_timeout: float = 10.0  # seconds one call of a completion hook may take
    hook_max_delay: float = 60.0  # longest wait between a hook's attempts (doubling from 1 s)

    def __post_init__(self) -> None:
        check_queue(self.queue)
        for name in ("concurrency", "max_attempts", "max_not_yet", "flush_batch", "hook_attempts"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        for name in ("lease_seconds", "poll_interval", "hook_timeout", "hook_max_delay"):
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
        if self.prefetch is not None and not 1 <= self.prefetch <= MAX_PREFETCH:
            raise ValueError(f"prefetch must be from 1 to {MAX_PREFETCH}")

    @property
    def effective_prefetch(self) -> int:
        """Ready items kept fetched ahead: `prefetch` when given, else enough for every worker and
        for four full batches. Far from the database more is needed: a watcher fetches when half is
        left, and its workers must not run dry while a fetch is on its way (40 ms away, a fetch took
        90 ms: 50 workers of 20 ms items did 566 items/s with the default 200, 1,571 with 800)."""
        if self.prefetch is not None:
            return self.prefetch
        return max(4 * self.concurrency, PREFETCH, 4 * self.batch)

    @property
    def effective_max_partitions(self) -> int:
        """Partitions leased at most: `max_partitions` when given, else 4 x concurrency (at least 8)."""
        return self.max_partitions if self.max_partitions is not None else max(8, 4 * self.concurrency)

    @property
    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            self.max_attempts, self.retry_delay, self.max_retry_delay, self.poll_interval, self.max_not_yet
        )

    @property
    def capacity(self) -> int | None:
        """Deprecated: `max_partitions`."""
        warnings.warn("WatcherConfig.capacity is deprecated: use max_partitions", DeprecationWarning, stacklevel=2)
        return self.max_partitions

    @property
    def fetch_ahead(self) -> int | None:
        """Deprecated: `prefetch`."""
        warnings.warn("WatcherConfig.fetch_ahead is deprecated: use prefetch", DeprecationWarning, stacklevel=2)
        return self.prefetch


def _taking_old_names(init: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(init)
    def init_taking_old_names(self: WatcherConfig, *args: Any, **settings: Any) -> None:
        init(self, *args, **current_names(settings))

    return init_taking_old_names


WatcherConfig.__init__ = _taking_old_names(WatcherConfig.__init__)  # type: ignore[method-assign]
