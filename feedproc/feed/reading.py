"""`Feed`, reading: one partition (status, items, history, timings), the whole (summary, partitions,
queues, schedules), what runs now (running, leases, watchers, throughput) and completion hooks'
deliveries. Each returns a frozen
view of `core.views`, built from the store's rows here; `to_json()` is what the front doors show."""

from __future__ import annotations

from ..core.views import (
    Failure,
    HistoryEntry,
    HookView,
    ItemRow,
    ItemView,
    LeaseRow,
    PartitionRow,
    PartitionStatus,
    QueueView,
    RateView,
    RunningItem,
    ScheduleView,
    Summary,
    Throughput,
    Timings,
    WatcherView,
)
from .base import FeedBase


class Reading(FeedBase):
    """Reads: each a frozen view (`core.views`)."""

    def status(self, key: str, *, history: int = 0) -> PartitionStatus:
        """The status of one partition (its to_json(): the `status KEY --json` object); KeyError if unknown."""
        return PartitionStatus.from_json(self.store.status(key, history=history))

    def partitions(
        self,
        *,
        queue: str | None = None,
        status: str | None = None,
        prefix: str | None = None,
        after: str | None = None,
        limit: int = 50,
        sort: str = "key",
        error: str | None = None,
        offset: int = 0,
    ) -> list[PartitionRow]:
        """Partitions (at most `limit`) filtered by queue, status, key prefix and the text of a failed
        item's error, sorted by `key` (pass the last key as `after` for the next page), `activity`
        (most recently updated first), `priority` (highest first) or `age` (oldest first), the last
        three a page at a time by `offset`."""
        rows = self.store.list_partitions(
            queue=queue, status=status, prefix=prefix, after=after, limit=limit, sort=sort, error=error, offset=offset
        )
        return [PartitionRow.from_json(row) for row in rows]

    def items(
        self, key: str, *, gate: int | None = None, status: str | None = None, after_id: int = 0, limit: int = 1000
    ) -> list[ItemRow]:
        """Items of `key` (id, gate, status, attempts, deliveries, last_error, data as bytes), in id order.

        At most `limit` per call; pass the last id seen as `after_id` for the next page.
        """
        return [
            ItemRow.from_json(i)
            for i in self.store.items(key, gate=gate, status=status, after_id=after_id, limit=limit)
        ]

    def item(self, item_id: int) -> ItemView:
        """One item: its fields, its data (bytes) and its deliveries oldest first (`history`: attempt,
        gate, watcher, start, end, duration, outcome, error with traceback). KeyError if unknown."""
        return ItemView.from_json(self.store.item(item_id))

    def history(self, key: str, *, after: int = 0, limit: int = 100) -> list[HistoryEntry]:
        """A partition's events, oldest first, after the event id `after`."""
        return [HistoryEntry.from_json(h) for h in self.store.history(key, after=after, limit=limit)]

    def wait(self, key: str, timeout: float | None = None) -> PartitionStatus:
        """Block until `key` is complete, failed or cancelled and return its status (as
        `status`). KeyError if unknown; TimeoutError after `timeout` seconds. PostgreSQL wakes the
        waiter by LISTEN/NOTIFY; SQLite and MariaDB/MySQL poll with backoff."""
        from ..wait import wait_final

        return PartitionStatus.from_json(wait_final(self.store, key, timeout))

    def summary(self, *, recent: int = 0) -> Summary:
        """Counts of partitions and items by status (the `status --json` object), with the `recent`
        most recently updated partitions."""
        return Summary.from_json(self.store.summary(recent=recent))

    def partition_counts(self) -> dict[str, int]:
        """Partitions by status (a cheap count for dashboards)."""
        return self.store.partition_counts()

    def queue(self, name: str) -> QueueView:
        """One queue's settings and state (limit, slots in use, windows, next opening)."""
        return QueueView.from_json(self.store.queue(name))

    def queues(self) -> list[QueueView]:
        """Every queue with settings or unfinished partitions, as `queue`."""
        return [QueueView.from_json(q) for q in self.store.queues()]

    def rates(self) -> list[RateView]:
        """Every shared rate (`set_rate`), with the tokens its bucket holds now."""
        return [RateView.from_json(r) for r in self.store.rates()]

    def schedules(self, queue: str | None = None, count: int = 3) -> list[ScheduleView]:
        """Every stored pipeline's schedules (or `queue`'s): cron, zone, key template, last tick and
        key, the next `count` ticks (ISO, UTC) and the key of the next."""
        return [ScheduleView.from_json(s) for s in self.store.schedule_list(queue, count=count)]

    def running(self, *, queue: str | None = None, limit: int = 200) -> list[RunningItem]:
        """Items in flight now (watchers' deliveries and workers' claims), longest running first:
        item, partition, queue, gate, attempt, by, via, started_at, elapsed (seconds) and progress."""
        return [RunningItem.from_json(r) for r in self.store.running(queue=queue, limit=limit)]

    def throughput(self, *, seconds: int = 3600, step: int = 60, queue: str | None = None) -> Throughput:
        """Items added, processed, completed and failed per `step` seconds over the last `seconds`,
        with the backlog at the end of each step (the dashboard's charts)."""
        return Throughput.from_json(self.store.throughput(seconds=seconds, step=step, queue=queue))

    def backlog_by_gate(self, queue: str) -> dict[int, int]:
        """A queue's available items by gate."""
        return self.store.backlog_by_gate(queue)

    def timings(self, key: str) -> Timings:
        """Per gate of a partition: p50/p95 delivery durations and time spent there; the current
        gate's pace and ETA."""
        return Timings.from_json(self.store.timings(key))

    def leases(self, *, limit: int = 500) -> list[LeaseRow]:
        """Partitions leased now, with their owners and lease deadlines."""
        return [LeaseRow.from_json(lease) for lease in self.store.leases(limit=limit)]

    def recent_failures(self, *, limit: int = 20) -> list[Failure]:
        """The most recent item failures, newest first."""
        return [Failure.from_json(f) for f in self.store.recent_failures(limit=limit)]

    def watchers(self) -> list[WatcherView]:
        """The registered watchers, alive or not, with their lease counts."""
        return [WatcherView.from_json(w) for w in self.store.watchers()]

    def gauges(self, queue: str | None = None) -> dict[str, dict[tuple[str, ...], int]]:
        """Per-queue aggregates for Prometheus: partitions by status, backlog, failed items, leases, live watchers."""
        return self.store.queue_gauges(queue)

    def hooks(
        self,
        *,
        status: str | None = None,
        queue: str | None = None,
        key: str | None = None,
        limit: int = 100,
        before: int | None = None,
    ) -> list[HookView]:
        """Completion hooks' deliveries, newest first: of one `status` (pending, sent or failed),
        `queue` or partition `key`; at most `limit` (1 to 1,000), with ids below `before` (pass the
        last id seen for the next page). Without their payloads (`hook` has it)."""
        return [
            HookView.from_json(h)
            for h in self.store.hooks(status=status, queue=queue, key=key, limit=limit, before=before)
        ]

    def hook(self, hook_id: int) -> HookView:
        """One completion hook's delivery with its `payload` (the summary its receiver is sent);
        NotFound (a KeyError) if there is none of that id."""
        return HookView.from_json(self.store.hook(hook_id))
