"""`Feed`, producing: partitions and items added, sealed; the pipelines that name a queue's gates and
schedule its partitions."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any, overload

from sqlalchemy.engine import Connection

from ..core.models import AddedPartition
from ..core.pipelines import PipelineSpec
from ..store import generated_key
from .base import FeedBase, ItemLike, retried


class Producing(FeedBase):
    """Adding work: partitions, items, pipelines and their schedules."""

    @overload
    def add_partition(
        self,
        key: str,
        items: Iterable[ItemLike] = (),
        *,
        queue: str = "default",
        priority: int | None = None,
        sealed: bool = True,
        manual_checkpoint: bool = False,
        not_before: datetime | None = None,
        weight: int | None = None,
        item_timeout: float | None = None,
        windows: str | Sequence[str] | None = None,
        window_tz: str | None = None,
        tolerate: str | int | None = None,
        deadline: datetime | timedelta | float | None = None,
        partition_limit: int | None = None,
        group: str | None = None,
        connection: Connection | None = None,
    ) -> int: ...

    @overload
    def add_partition(
        self,
        key: None = None,
        items: Iterable[ItemLike] = (),
        *,
        queue: str = "default",
        priority: int | None = None,
        sealed: bool = True,
        manual_checkpoint: bool = False,
        not_before: datetime | None = None,
        weight: int | None = None,
        item_timeout: float | None = None,
        windows: str | Sequence[str] | None = None,
        window_tz: str | None = None,
        tolerate: str | int | None = None,
        deadline: datetime | timedelta | float | None = None,
        partition_limit: int | None = None,
        group: str | None = None,
        connection: Connection | None = None,
    ) -> AddedPartition: ...

    def add_partition(
        self,
        key: str | None = None,
        items: Iterable[ItemLike] = (),
        *,
        queue: str = "default",
        priority: int | None = None,
        sealed: bool = True,
        manual_checkpoint: bool = False,
        not_before: datetime | None = None,
        weight: int | None = None,
        item_timeout: float | None = None,
        windows: str | Sequence[str] | None = None,
        window_tz: str | None = None,
        tolerate: str | int | None = None,
        deadline: datetime | timedelta | float | None = None,
        partition_limit: int | None = None,
        group: str | None = None,
        connection: Connection | None = None,
    ) -> int | AddedPartition:
        """Create partition `key` with `items` ((gate, bytes) pairs) in one transaction.

        Sealed unless `sealed=False`. Raises DuplicateKey if `key` exists, InvalidInput for bad
        input; nothing is written then. Returns the number of items added. `priority`: a signed
        64-bit integer, higher leased and claimed first. Scheduling controls: `weight` (share of
        the queue's concurrency limit per item in flight), `item_timeout` (seconds a processor
        call may take), `windows` (e.g. "22:00-06:00") in `window_tz`.
        `tolerate`: failed items each of its gates lets pass without failing it, `"5%"` of the
        gate's items or a count (over its queue's pipeline gates' own `tolerate`). A `priority` or
        `weight` left None is the queue's default (`set_queue`, or its pipeline's), else 0 and 1.
        `deadline`: a time, or a duration from now (timedelta or seconds, on the database's clock),
        after which the partition, unless finished, fails with "deadline exceeded": a watcher of its
        queue cancels its unfinished items and their calls, within a second or so.
        `partition_limit`: its items in flight at once at most, fleet-wide (its queue's and its
        pipeline gates' `partition_limit` hold too: the smallest wins). `group`: its concurrency
        group (a tenant, a customer): its queue's and its gates' `group_limit` and the queue's
        `group_rate` hold for all of a group's partitions together.

        `connection`: write in the caller's transaction on it instead (from `Feed.begin()`):
        nothing is committed unless the caller commits, and a rollback leaves no trace. A refusal
        (DuplicateKey, InvalidInput) undoes only this call (a savepoint) and is not retried.

        With `key=None` a key is generated (a UUIDv7: keys sort by creation) and the call returns
        an `AddedPartition`, the key with the number of items: a caller with a key of its own keeps
        the `int` it always had, and one without one cannot miss the key it needs to follow it.
        """
        with self.gate_naming(queue=queue):  # {"gate": "ocr"}
            options: dict[str, Any] = {
                "queue": queue,
                "priority": priority,
                "sealed": sealed,
                "manual_checkpoint": manual_checkpoint,
                "not_before": not_before,
                "weight": weight,
                "item_timeout": item_timeout,
                "windows": windows,
                "window_tz": window_tz,
                "tolerate": tolerate,
                "deadline": deadline,
                "partition_limit": partition_limit,
                "group": group,
            }
            if key is not None:
                return self._add_partition(key, items, options, connection=connection)
            generated = generated_key()  # once, outside the retries: a retry adds the same partition
            return AddedPartition(generated, self._add_partition(generated, items, options, connection=connection))

    @retried
    def _add_partition(
        self, key: str, items: Iterable[ItemLike], options: dict[str, Any], *, connection: Connection | None = None
    ) -> int:
        return self.store.add_partition(key, items, **options, connection=connection)

    @retried
    def add_items(self, key: str, items: Iterable[ItemLike], *, connection: Connection | None = None) -> int:
        """Add items to an open partition; refused if it is sealed or finished, or a gate is too low.
        A gate may be given by its name in the partition's queue's pipeline (read as committed: not
        for a partition the caller's `connection` created and has not committed yet).
        `connection`: in the caller's transaction, as `add_partition`'s."""
        with self.gate_naming(key=key):
            return self.store.add_items(key, items, connection=connection)

    @retried
    def seal(self, key: str, *, connection: Connection | None = None) -> None:
        """Declare that no more items will be added to `key`. `connection`: in the caller's
        transaction, as `add_partition`'s."""
        self.store.seal(key, connection=connection)

    def begin(self) -> AbstractContextManager[Connection]:
        """A transaction of the caller's on this feed's database, for its own statements and for
        `add_partition`, `add_items`, `seal` and `cancel` given `connection=`: committed when the
        `with` block ends, rolled back when it raises (on SQLite it begins with BEGIN IMMEDIATE,
        as feedproc's own writes do). Its statements raise SQLAlchemy's errors, as the caller's."""
        return self.store.caller_write()

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
