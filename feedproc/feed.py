"""`Feed`: the producer API (add partitions and items, seal, retry, cancel, checkpoint, status)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from .core.models import NewItem
from .core.records import QueueSettings
from .store import Store

ItemLike = NewItem | tuple[int, bytes] | dict[str, Any]


class Feed:
    """A handle on one feedproc database.

    >>> feed = Feed("sqlite:///feedproc.db")
    >>> feed.migrate()
    >>> feed.add_partition("upload-42", items=[(0, b'{"file": "a.pdf"}')], priority=5)
    """

    def __init__(self, url: str = "sqlite:///feedproc.db", *, pool_size: int = 5) -> None:
        self.store = Store(url, pool_size=pool_size)

    def check_schema(self) -> None:
        """Raise SchemaMissing unless the database holds this version's schema."""
        self.store.check_schema()

    def ping(self) -> None:
        """Raise DatabaseUnavailable unless the database answers a trivial query now."""
        self.store.ping()

    def close(self) -> None:
        """Release the database connections."""
        self.store.close()

    def __enter__(self) -> Feed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def migrate(self) -> None:
        """Create or upgrade the schema (idempotent)."""
        self.store.migrate()

    def add_partition(
        self,
        key: str,
        items: Iterable[ItemLike] = (),
        *,
        queue: str = "default",
        priority: int = 0,
        sealed: bool = True,
        manual_checkpoint: bool = False,
        not_before: datetime | None = None,
        weight: int = 1,
        item_timeout: float | None = None,
        windows: str | Sequence[str] | None = None,
        window_tz: str | None = None,
    ) -> int:
        """Create partition `key` with `items` ((gate, bytes) pairs) in one transaction.

        Sealed unless `sealed=False`. Raises DuplicateKey if `key` exists, InvalidInput for bad
        input; nothing is written then. Returns the number of items added. Scheduling controls:
        `weight` (share of the queue's concurrency limit per item in flight), `item_timeout`
        (seconds a processor call may take), `windows` (e.g. "22:00-06:00") in `window_tz`.
        """
        return self.store.add_partition(
            key,
            items,
            queue=queue,
            priority=priority,
            sealed=sealed,
            manual_checkpoint=manual_checkpoint,
            not_before=not_before,
            weight=weight,
            item_timeout=item_timeout,
            windows=windows,
            window_tz=window_tz,
        )

    def add_items(self, key: str, items: Iterable[ItemLike]) -> int:
        """Add items to an open partition; refused if it is sealed or finished, or a gate is too low."""
        return self.store.add_items(key, items)

    def seal(self, key: str) -> None:
        """Declare that no more items will be added to `key`."""
        self.store.seal(key)

    def retry(self, key: str) -> int:
        """Put a failed partition and its failed items (attempts reset) back to work."""
        return self.store.retry(key)

    def cancel(self, key: str) -> None:
        """Cancel `key` and its available items; refused for a complete partition."""
        self.store.cancel(key)

    def checkpoint(self, key: str) -> int:
        """Advance a manual-checkpoint partition whose gate has drained; returns its new gate."""
        return self.store.checkpoint(key)

    def cleanup(self, older_than: float, *, include_failed: bool = False) -> dict[str, int]:
        """Delete complete and cancelled (and, if asked, failed) partitions last changed more than
        `older_than` seconds ago, with their items and history, in bounded batches."""
        statuses = ("complete", "cancelled", "failed") if include_failed else ("complete", "cancelled")
        return self.store.cleanup(older_than, statuses=statuses)

    def status(self, key: str, *, history: int = 0) -> dict[str, Any]:
        """The status of one partition (the `status KEY --json` object); KeyError if unknown."""
        return self.store.status(key, history=history)

    def set_queue(
        self,
        name: str,
        *,
        limit: int | None = None,
        windows: str | Sequence[str] | None = None,
        window_tz: str | None = None,
        clear_windows: bool = False,
    ) -> QueueSettings:
        """Store a queue's global concurrency limit (sum of weights in flight across all watchers; < 1
        means none) and/or its windows of the day; arguments left None keep their value."""
        return self.store.set_queue(
            name, limit=limit, windows=windows, window_tz=window_tz, clear_windows=clear_windows
        )

    def queue(self, name: str) -> dict[str, Any]:
        """One queue's settings and state (limit, slots in use, windows, next opening)."""
        return self.store.queue(name)

    def queues(self) -> list[dict[str, Any]]:
        """Every queue with settings or unfinished partitions, as `queue`."""
        return self.store.queues()

    def wait(self, key: str, timeout: float | None = None) -> dict[str, Any]:
        """Block until `key` is complete, failed or cancelled and return its status dict (as
        `status`). KeyError if unknown; TimeoutError after `timeout` seconds. PostgreSQL wakes the
        waiter by LISTEN/NOTIFY; SQLite polls with backoff."""
        from .wait import wait_final

        return wait_final(self.store, key, timeout)

    def items(
        self, key: str, *, gate: int | None = None, status: str | None = None, after_id: int = 0, limit: int = 1000
    ) -> list[dict[str, Any]]:
        """Items of `key` (id, gate, status, attempts, deliveries, last_error, data as bytes), in id order.

        At most `limit` per call; pass the last id seen as `after_id` for the next page.
        """
        return self.store.items(key, gate=gate, status=status, after_id=after_id, limit=limit)

    def item(self, item_id: int) -> dict[str, Any]:
        """One item: its fields, its data (bytes) and its deliveries oldest first (`history`: attempt,
        gate, watcher, start, end, duration, outcome, error with traceback). KeyError if unknown."""
        return self.store.item(item_id)

    def summary(self, *, recent: int = 0) -> dict[str, Any]:
        """Counts of partitions and items by status (the `status --json` object), with the `recent`
        most recently updated partitions."""
        return self.store.summary(recent=recent)

    def partitions(
        self,
        *,
        queue: str | None = None,
        status: str | None = None,
        prefix: str | None = None,
        after: str | None = None,
        limit: int = 50,
    ) -> list[dict[str, Any]]:
        """Partitions by key (at most `limit`, after the key `after`), filtered by queue, status and key prefix."""
        return self.store.list_partitions(queue=queue, status=status, prefix=prefix, after=after, limit=limit)

    def partition_counts(self) -> dict[str, int]:
        """Partitions by status (a cheap count for dashboards)."""
        return self.store.partition_counts()

    def history(self, key: str, *, after: int = 0, limit: int = 100) -> list[dict[str, Any]]:
        """A partition's events, oldest first, after the event id `after`."""
        return self.store.history(key, after=after, limit=limit)

    def leases(self, *, limit: int = 500) -> list[dict[str, Any]]:
        """Partitions leased now, with their owners and lease deadlines."""
        return self.store.leases(limit=limit)

    def recent_failures(self, *, limit: int = 20) -> list[dict[str, Any]]:
        """The most recent item failures, newest first."""
        return self.store.recent_failures(limit=limit)

    def watchers(self) -> list[dict[str, Any]]:
        """The registered watchers, alive or not, with their lease counts."""
        return self.store.watchers()

    def gauges(self, queue: str | None = None) -> dict[str, dict[tuple[str, ...], int]]:
        """Per-queue aggregates for Prometheus: partitions by status, backlog, failed items, leases, live watchers."""
        return self.store.queue_gauges(queue)
