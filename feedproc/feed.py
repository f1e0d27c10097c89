"""`Feed`: the producer API (add partitions and items, seal, retry, cancel, checkpoint, status)."""

from __future__ import annotations

import base64
import functools
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, TypeVar, cast

import tenacity

from .core.errors import (
    DatabaseConflict,
    DatabaseRefusesWrites,
    FeedprocError,
    InvalidAnswer,
    InvalidInput,
    PermanentError,
    RetryLater,
    TooLarge,
    TooManyChildren,
)
from .core.fanin import COLLECT_INLINE_BYTES, PAGE, CollectedResult, result_size
from .core.gate_names import naming
from .core.models import MAX_CHILDREN, NewItem, Response, check_key
from .core.pipelines import PipelineSpec
from .core.policy import RetryPolicy
from .core.records import QueueSettings
from .core.views import (
    Failure,
    HistoryEntry,
    ItemRow,
    ItemView,
    LeaseRow,
    PartitionRow,
    PartitionStatus,
    QueueView,
    RunningItem,
    ScheduleView,
    Summary,
    Throughput,
    Timings,
    WatcherView,
)
from .store import MAX_CLAIM, ClaimAnswer, Store

ItemLike = NewItem | tuple[int, bytes] | dict[str, Any]
F = TypeVar("F", bound=Callable[..., Any])
#: Times a call is run again after the database aborted it in a conflict (DatabaseConflict).
CONFLICT_RETRIES = 4


def retried(call: F) -> F:
    """Run `call` again when that can succeed: up to CONFLICT_RETRIES times, after a short random
    wait, when the database aborted its transaction in a conflict (a serialization failure or a
    deadlock rolled everything back, and running it again is what the database asks for); once, at
    once, when a write was refused as read-only: the store has closed its connections then, and a
    session opened while the database was read-only stays so after it takes writes again
    (PostgreSQL's default_transaction_read_only, SQLite's read-only storage). Tenacity takes over
    only after a failure: its decorator costs 11 us a call, on the worker API's claims too."""
    again = tenacity.retry(
        retry=tenacity.retry_if_exception_type(DatabaseConflict),
        stop=tenacity.stop_after_attempt(CONFLICT_RETRIES),
        wait=tenacity.wait_random_exponential(multiplier=0.05, max=1.0),
        reraise=True,
    )(call)

    @functools.wraps(call)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except DatabaseRefusesWrites:
            return call(*args, **kwargs)
        except DatabaseConflict:
            return again(*args, **kwargs)

    return cast(F, run)


class Feed:
    """A handle on one feedproc database: `url`, else $FEEDPROC_DATABASE_URL, else sqlite:///feedproc.db.

    >>> feed = Feed("sqlite:///feedproc.db")
    >>> feed.migrate()
    >>> feed.add_partition("upload-42", items=[(0, b'{"file": "a.pdf"}')], priority=5)
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        pool_size: int = 5,
        policy: RetryPolicy | None = None,
        table_prefix: str | None = None,
    ) -> None:
        url = url or os.environ.get("FEEDPROC_DATABASE_URL") or "sqlite:///feedproc.db"
        # table_prefix: whose tables in that database (else $FEEDPROC_TABLE_PREFIX, else feedproc_)
        self.store = Store(url, pool_size=pool_size, table_prefix=table_prefix)
        self.policy = policy or RetryPolicy()  # pull workers' retries: attempts and backoff
        self._twins: list[Feed] = []

    @staticmethod
    def check_url(url: str) -> None:
        """Raise InvalidInput, one line naming the problem (its password hidden), unless `url` is a
        database URL feedproc can use: `sqlite:///PATH`, `postgresql://...` or `mysql://...`."""
        from .store.dialects import normalize_url

        normalize_url(url)

    def check_schema(self) -> None:
        """Raise SchemaMissing unless the database holds this version's schema."""
        self.store.check_schema()

    def ping(self) -> None:
        """Raise DatabaseUnavailable unless the database answers a trivial query now."""
        self.store.ping()

    def close(self) -> None:
        """Release the database connections (and those of its twins)."""
        for twin in self._twins:
            twin.close()
        self.store.close()

    def twin(self, *, pool_size: int = 1) -> Feed:
        """Another handle on the same database and tables, with a pool of its own (a health check
        must not queue for a connection behind busy reads); closed with this one."""
        twin = Feed(self.store.url, pool_size=pool_size, policy=self.policy, table_prefix=self.store.table_prefix)
        self._twins.append(twin)
        return twin

    def __enter__(self) -> Feed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def migrate(self) -> tuple[str | None, str | None]:
        """Create or upgrade the schema (idempotent); the revisions before (None: none) and after."""
        return self.store.migrate()

    @retried
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
        tolerate: str | int | None = None,
    ) -> int:
        """Create partition `key` with `items` ((gate, bytes) pairs) in one transaction.

        Sealed unless `sealed=False`. Raises DuplicateKey if `key` exists, InvalidInput for bad
        input; nothing is written then. Returns the number of items added. Scheduling controls:
        `weight` (share of the queue's concurrency limit per item in flight), `item_timeout`
        (seconds a processor call may take), `windows` (e.g. "22:00-06:00") in `window_tz`.
        `tolerate`: failed items each of its gates lets pass without failing it, `"5%"` of the
        gate's items or a count (over its queue's pipeline gates' own `tolerate`).
        """
        with self.gate_naming(queue=queue):  # {"gate": "ocr"}
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
                tolerate=tolerate,
            )

    @retried
    def add_items(self, key: str, items: Iterable[ItemLike]) -> int:
        """Add items to an open partition; refused if it is sealed or finished, or a gate is too low.
        A gate may be given by its name in the partition's queue's pipeline."""
        with self.gate_naming(key=key):
            return self.store.add_items(key, items)

    def gate_naming(
        self, *, queue: str | None = None, key: str | None = None, item: int | None = None
    ) -> AbstractContextManager[None]:
        """A block within which gate names (`{"gate": "ocr"}`, `check_gate("ocr")`) are those of
        `queue`'s pipeline, or of the queue of partition `key`, or of item `item`'s: for a front door
        that checks items or answers before it hands them over. The pipeline is read only if a name
        is met."""
        if queue is not None:
            return naming(lambda: self.store.gate_numbers(queue), f"queue {queue!r}")
        if item is not None:
            return naming(lambda: self._names_of_item(item), f"the queue of item {item}")
        assert key is not None, "gate_naming needs a queue, a key or an item"
        return naming(lambda: self._names_of_partition(key), f"the queue of partition {key!r}")

    def _names_of_item(self, item_id: int) -> dict[str, int]:
        queue = self.store.queue_of_item(item_id)
        return self.store.gate_numbers(queue) if queue is not None else {}

    def _names_of_partition(self, key: str) -> dict[str, int]:
        queue = self.store.queue_of(key)
        return self.store.gate_numbers(queue) if queue is not None else {}

    def queue_of(self, key: str) -> str | None:
        """The queue of partition `key` (None when there is no such partition)."""
        return self.store.queue_of(check_key(key))

    def queues_of_items(self, item_ids: Iterable[int]) -> dict[int, str]:
        """The queue of each of `item_ids` that exists (one query): for a front door that lets a
        token work on some queues only."""
        return self.store.queues_of_items(item_ids)

    # ------------------------------------------------------------ pipelines

    @retried
    def apply_pipeline(self, spec: PipelineSpec, *, by: str = "python") -> PipelineSpec:
        """Store `spec` as its queue's pipeline (see `core.pipelines`); returns it with its version,
        unchanged when the stored one is the same. Running watchers follow it within a poll interval."""
        return self.store.apply_pipeline(spec, by=by)

    def pipeline(self, queue: str) -> PipelineSpec | None:
        """A queue's stored pipeline, or None."""
        return self.store.pipeline(queue)

    def pipelines(self) -> list[PipelineSpec]:
        """Every stored pipeline."""
        return self.store.pipelines()

    @retried
    def remove_pipeline(self, queue: str) -> bool:
        """Remove a queue's pipeline and its schedules; returns whether it had one."""
        return self.store.remove_pipeline(queue)

    def gate_names(self, queue: str) -> dict[int, str]:
        """Gate number -> name in a queue's pipeline (empty without one): for showing gates."""
        spec = self.store.pipeline(queue)
        return spec.numbers if spec is not None else {}

    @retried
    def fire_schedules(self, queue: str, now: datetime | None = None) -> list[str]:
        """Create the partitions of `queue`'s schedules whose tick is due at `now` (None: the
        database's clock), each tick's once however many callers; returns the keys created."""
        return self.store.fire_schedules(queue, now)

    def schedules(self, queue: str | None = None, count: int = 3) -> list[ScheduleView]:
        """Every stored pipeline's schedules (or `queue`'s): cron, zone, key template, last tick and
        key, the next `count` ticks (ISO, UTC) and the key of the next."""
        return [ScheduleView.from_json(s) for s in self.store.schedule_list(queue, count=count)]

    @retried
    def seal(self, key: str) -> None:
        """Declare that no more items will be added to `key`."""
        self.store.seal(key)

    @retried
    def retry(self, key: str) -> int:
        """Put a failed partition and its failed items (attempts reset) back to work."""
        return self.store.retry(key)

    def retry_failed(
        self, *, queue: str | None = None, prefix: str | None = None, error: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """Retry failed partitions in bulk: up to `limit` (at most 500) of them, filtered as in
        `partitions`, each in its own transaction. Returns `{"key", "retried": items}` per partition;
        one that stopped being failed meanwhile is left out."""
        from .core.errors import Refused

        limit = max(1, min(limit, 500))
        done = []
        for partition in self.partitions(status="failed", queue=queue, prefix=prefix, error=error, limit=limit):
            try:
                done.append({"key": partition.key, "retried": self.retry(partition.key)})
            except Refused:
                continue
        return done

    @retried
    def cancel(self, key: str) -> None:
        """Cancel `key` and its available items; refused for a complete partition."""
        self.store.cancel(key)

    @retried
    def act_on_items(
        self,
        action: str,
        *,
        ids: Sequence[int] | None = None,
        key: str | None = None,
        gate: int | None = None,
        by: str = "python",
    ) -> dict[str, Any]:
        """Retry (due now, attempts reset), skip (complete without processing) or cancel items:
        those named by `ids`, or every failed or available item of partition `key` (at `gate`).
        Recorded in each item's deliveries and the partition's history with `by`; a call in
        progress for a skipped or cancelled item is cancelled. Refused (nothing changes) when a
        named item is not failed or available, or its partition is finished."""
        return self.store.act_on_items(action, ids=ids, key=key, gate=gate, by=by)

    @retried
    def checkpoint(self, key: str) -> int:
        """Advance a manual-checkpoint partition whose gate has drained; returns its new gate."""
        return self.store.checkpoint(key)

    @retried
    def cleanup(self, older_than: float, *, include_failed: bool = False, dry_run: bool = False) -> dict[str, int]:
        """Delete complete and cancelled (and, if asked, failed) partitions last changed more than
        `older_than` seconds ago, with their items and history, in bounded batches; with
        `dry_run`, count what would go and delete nothing."""
        statuses = ("complete", "cancelled", "failed") if include_failed else ("complete", "cancelled")
        return self.store.cleanup(older_than, statuses=statuses, dry_run=dry_run)

    def status(self, key: str, *, history: int = 0) -> PartitionStatus:
        """The status of one partition (the `status KEY --json` object); KeyError if unknown."""
        return PartitionStatus.from_json(self.store.status(key, history=history))

    @retried
    def set_queue(
        self,
        name: str,
        *,
        limit: int | None = None,
        windows: str | Sequence[str] | None = None,
        window_tz: str | None = None,
        clear_windows: bool = False,
        mode: str | None = None,
        paused: bool | None = None,
        accumulate: Mapping[str, str] | None = None,
        by: str = "python",
    ) -> QueueSettings:
        """Store a queue's global concurrency limit (sum of weights in flight across all watchers
        and workers; < 1 means none), its windows of the day and/or its mode ("push": watchers
        deliver its items; "pull": workers claim them) and/or whether it is `paused` (nothing new is
        dispatched or claimed, fleet-wide; in-flight items finish) and/or how answers' `accumulate`
        numbers merge in its partitions ({"pages": "sum"}: sum, min, max or count; a pipeline gate's
        own declaration wins for its answers; {} removes it); arguments left None keep their
        value. `by` is recorded with a pause. InvalidInput naming a bad value: nothing changes."""
        return self.store.set_queue(
            name,
            limit=limit,
            windows=windows,
            window_tz=window_tz,
            clear_windows=clear_windows,
            mode=mode,
            paused=paused,
            accumulate=accumulate,
            by=by,
        )

    def queue(self, name: str) -> QueueView:
        """One queue's settings and state (limit, slots in use, windows, next opening)."""
        return QueueView.from_json(self.store.queue(name))

    def queues(self) -> list[QueueView]:
        """Every queue with settings or unfinished partitions, as `queue`."""
        return [QueueView.from_json(q) for q in self.store.queues()]

    def wait(self, key: str, timeout: float | None = None) -> PartitionStatus:
        """Block until `key` is complete, failed or cancelled and return its status dict (as
        `status`). KeyError if unknown; TimeoutError after `timeout` seconds. PostgreSQL wakes the
        waiter by LISTEN/NOTIFY; SQLite and MariaDB/MySQL poll with backoff."""
        from .wait import wait_final

        return PartitionStatus.from_json(wait_final(self.store, key, timeout))

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

    def summary(self, *, recent: int = 0) -> Summary:
        """Counts of partitions and items by status (the `status --json` object), with the `recent`
        most recently updated partitions."""
        return Summary.from_json(self.store.summary(recent=recent))

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

    def partition_counts(self) -> dict[str, int]:
        """Partitions by status (a cheap count for dashboards)."""
        return self.store.partition_counts()

    def history(self, key: str, *, after: int = 0, limit: int = 100) -> list[HistoryEntry]:
        """A partition's events, oldest first, after the event id `after`."""
        return [HistoryEntry.from_json(h) for h in self.store.history(key, after=after, limit=limit)]

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

    # ------------------------------------------------------------ pull workers

    @retried
    def claim(
        self, queue: str, worker: str, *, max_items: int = 10, lease_seconds: float = 60.0
    ) -> list[dict[str, Any]]:
        """Claim up to `max_items` ready items of pull-mode `queue` for `worker`, each held for
        `lease_seconds` unless heartbeats extend it. Each is a dict: id, partition, queue, gate,
        attempt, data (bytes), token, lease_expires_at. Only items at their partition's current
        gate, in priority order; [] when none is ready. Refused unless the queue is in pull mode."""
        check_claim(worker, max_items, lease_seconds)
        claimed = self.store.claim(queue, worker, max_items, lease_seconds, self.policy)
        if any("collects" in entry for entry in claimed):
            self._fan_in(claimed)
        return claimed

    def _fan_in(self, claimed: list[dict[str, Any]]) -> None:
        """Give each claimed fan-in item what it collects: `collected` ({"gate", "count", "failed"}
        with its `results` inline, or `pages`: {"after", "until"}, the bounds of its results' pages,
        which the API makes a `results_url`) and `accumulated`. Inline results of one claim come to
        COLLECT_INLINE_BYTES at most in all: past that, the items' results travel by pages."""
        budget = COLLECT_INLINE_BYTES
        for entry in claimed:
            if "collects" not in entry:
                continue
            partition_id, what = entry.pop("collects")
            gathered = self.store.gather(partition_id, what, inline_bytes=budget)
            collection = gathered.collection
            collected: dict[str, Any] = {
                "gate": what.name or what.gate,
                "count": collection.count,
                "failed": collection.failed,
            }
            if gathered.results is not None:
                collected["results"] = [row.to_json() for row in gathered.results]
                budget -= sum(map(result_size, gathered.results))
            else:
                collected["pages"] = {"after": collection.first - 1, "until": collection.last}
            entry["collected"] = collected
            entry["accumulated"] = gathered.accumulated

    def collected_page(
        self, item_id: int, token: str, *, after: int | None = None, until: int | None = None, limit: int = PAGE
    ) -> tuple[list[CollectedResult], int | None, int]:
        """A page of the results item `item_id` collects, for the holder of its delivery's `token`
        (a watcher's collecting delivery, a pull worker's claim, a 202's): the results with ids
        above `after` up to `until` (the bounds the delivery was given; the whole collection
        without them), at most `limit`; with the `after` of the next page (None: that was the
        last) and `until`. NotFound for a token no delivery of the item has; StaleClaim once the
        delivery ended (the answer was written, it expired, it was cancelled)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= PAGE:
            raise InvalidInput(f"limit must be an integer from 1 to {PAGE}, got {limit!r}")
        # The bounds come with the URLs a delivery is given: counting (an index range as large as
        # the collection) only for a request without them.
        collection = self.store.collected_by(item_id, token, counted=after is None or until is None)
        start = collection.first - 1 if after is None else after
        last = collection.last if until is None else until
        rows = self.store.collected_page(collection.partition_id, collection.gate, start, last, limit)
        more = bool(rows) and rows[-1].id < last
        return rows, (rows[-1].id if more else None), last

    @retried
    def heartbeat(
        self, item_id: int, token: str, *, progress: float | None = None, lease_seconds: float | None = None
    ) -> str:
        """Extend a claim (by its lease, or `lease_seconds`) and keep `progress` (0..1); returns the
        new expiry (ISO 8601). StaleClaim when the token no longer holds the item, with its `reason`."""
        if progress is not None and (isinstance(progress, bool) or not 0 <= progress <= 1):
            raise InvalidInput(f"progress must be a number from 0 to 1, got {progress!r}")
        if lease_seconds is not None:
            check_claim("-", 1, lease_seconds)
        return self.store.heartbeat_claim(item_id, token, progress=progress, lease_seconds=lease_seconds)

    def answer(
        self, item_id: int, token: str, answer: Mapping[str, Any] | Response, *, max_children: int = MAX_CHILDREN
    ) -> dict[str, Any]:
        """Answer a claimed item: a Response, or an answer object of the handler contract (done /
        gate / data or data_base64 / items / retry_after / progress / Go Feed's complete and
        response, or `error`: {"message", "no_retry"} or a message). A failure is retried with
        backoff or, with no_retry or out of attempts, fails the item. Returns what became of it.
        InvalidInput for a malformed answer, TooLarge for one with more than `max_children`
        children and StaleClaim for a token that no longer holds the item: nothing changes then."""
        (result,) = self.answer_many([(item_id, token, answer)], max_children=max_children)
        if isinstance(result, Exception):
            raise result
        return result

    @retried
    def answer_many(
        self, answers: Sequence[tuple[int, str, Mapping[str, Any] | Response]], *, max_children: int = MAX_CHILDREN
    ) -> list[dict[str, Any] | FeedprocError]:
        """`answer` for many claimed items in one transaction: each one's result, or the error that
        refused it alone (InvalidInput, TooLarge, StaleClaim, NotFound); the others are written."""
        results: list[dict[str, Any] | FeedprocError | None] = [None] * len(answers)
        valid: list[tuple[int, ClaimAnswer]] = []
        for n, (item_id, token, answer) in enumerate(answers):
            try:
                if isinstance(answer, Response):
                    if len(answer.children) > max_children:
                        raise TooManyChildren(len(answer.children), max_children)
                    valid.append((n, (item_id, token, answer, None)))
                    continue
                with self.gate_naming(item=item_id):  # {"gate": "rank"}: the item's queue's pipeline
                    valid.append((n, (item_id, token, read_worker_answer(answer, max_children), None)))
            except TooManyChildren as refused:  # refused, as any request over a limit: the sender hears why
                results[n] = TooLarge(str(refused))
            except (PermanentError, RetryLater) as reported:
                valid.append((n, (item_id, token, None, reported)))
            except InvalidInput as invalid:
                results[n] = invalid
        written = self.store.answer_claims([a for _, a in valid], self.policy) if valid else []
        for (n, _), result in zip(valid, written, strict=True):
            if isinstance(result, InvalidAnswer):
                results[n] = InvalidInput(str(result))
            elif isinstance(result, FeedprocError) or not isinstance(result, Exception):
                results[n] = result
            else:
                raise result
        return [r for r in results if r is not None]

    @retried
    def release(self, item_id: int, token: str) -> None:
        """Hand a claimed item back unanswered (ready again at once, no attempt counted)."""
        self.store.release_claim(item_id, token)

    @retried
    def expire_claims(self, queue: str | None = None) -> int:
        """Settle claims that ran out without an answer (each counts an attempt); how many."""
        return self.store.expire_claims(queue, self.policy)

    def listen_ready(self, on_ready: Callable[[], Any]) -> Callable[[], None] | None:
        """Call `on_ready()` (on a thread of its own) whenever a queue may have new work, until the
        returned stop function is called; None where the database cannot notify (SQLite, MariaDB/MySQL)."""
        if not self.store.postgres:
            return None
        from .store.notify import Listener

        listener = Listener(self.store.engine, None, on_ready)
        listener.start()
        return listener.stop


def check_claim(worker: str, max_items: int, lease_seconds: float) -> None:
    """InvalidInput unless a claim's arguments are usable."""
    if not isinstance(worker, str) or not 1 <= len(worker) <= 120:
        raise InvalidInput("worker must be a name of 1 to 120 characters")
    if isinstance(max_items, bool) or not isinstance(max_items, int) or not 1 <= max_items <= MAX_CLAIM:
        raise InvalidInput(f"max must be an integer from 1 to {MAX_CLAIM}, got {max_items!r}")
    if isinstance(lease_seconds, bool) or not isinstance(lease_seconds, int | float) or not 1 <= lease_seconds <= 86400:
        raise InvalidInput(f"lease_seconds must be from 1 to 86400, got {lease_seconds!r}")


def read_worker_answer(answer: Mapping[str, Any], max_children: int = MAX_CHILDREN) -> Response:
    """A worker's answer object as a Response; raises the failure it reports (RetryLater, or
    PermanentError for `no_retry`), InvalidInput when it is malformed and TooManyChildren when it
    has more than `max_children` children (counted before any is read)."""
    from .processors.answers import answer_from_object

    fields = dict(answer)
    raw = _base64_field(fields, "data")
    raw_result = _base64_field(fields, "result")  # a result that is not JSON (a Python processor's bytes)
    error = fields.get("error")
    if isinstance(error, str):  # a plain message: a transient failure
        fields["error"] = {"message": error}
    retry_after = fields.get("retry_after")
    after = retry_after if isinstance(retry_after, int | float) and not isinstance(retry_after, bool) else None
    try:
        response = answer_from_object(fields, after if isinstance(fields.get("error"), dict) else None, max_children)
    except InvalidAnswer as invalid:
        raise InvalidInput(str(invalid)) from None
    if raw is not None:
        response.data = raw  # data that is not JSON, as a handler's request carries it
    if raw_result is not None:
        response.result = raw_result
    return response


def _base64_field(fields: dict[str, Any], name: str) -> bytes | None:
    """`fields[name + "_base64"]` taken out and decoded (None when absent); InvalidInput when it is
    not base64, or comes with `name` itself."""
    raw = fields.pop(f"{name}_base64", None)
    if raw is None:
        return None
    if name in fields or not isinstance(raw, str):
        raise InvalidInput(f"{name}_base64 must be a base64 string, and not given with {name}")
    try:
        return base64.b64decode(raw, validate=True)
    except ValueError:
        raise InvalidInput(f"{name}_base64 is not valid base64") from None
