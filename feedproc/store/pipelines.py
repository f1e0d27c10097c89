"""Pipelines: a queue's stored pipeline (`core.pipelines`), versioned, and its schedules' state.

`apply_pipeline` stores a checked spec as JSON and raises its version when it differs from the one
stored (applying the same file twice changes nothing); watchers read `pipeline_version` once per
poll interval (one primary-key read) and the whole spec only when the version moved. The
schedules' rows (`feedproc_schedules`) are kept in step in the same transaction: a new schedule
starts counting ticks from the moment it is applied (nothing is back-filled), a removed one's row
goes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from typing import cast

from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Connection

from ..core.errors import InvalidInput
from ..core.models import check_queue
from ..core.pipelines import PipelineSpec, from_mapping
from ..core.policy import RetryPolicy
from .base import StoreBase
from .escaping import storable
from .foundations import db_now
from .hook_settings import write_hooks, write_queue_values
from .schema import items, partitions, pipelines, schedules

PL, SC = pipelines.c, schedules.c

PIPELINE_READ_SECONDS = 1.0  # how long pull claims and settles go by a pipeline read (`cached_pipeline`)
#: (queue, gate) -> the retry policy of that gate's items
GatePolicies = Callable[[str, int], RetryPolicy]


class Pipelines(StoreBase):
    """Stored pipelines and their schedules' rows."""

    def apply_pipeline(self, spec: PipelineSpec, *, by: str = "python") -> PipelineSpec:
        """Store `spec` as its queue's pipeline. Returns it with its version: the stored one when
        nothing changed, else one more (1 for a queue's first). Running watchers follow it within a
        poll interval; items in flight finish under the version they started with."""
        text = json.dumps(spec.to_mapping(), sort_keys=True, separators=(",", ":"))
        self._pipelines_read.pop(spec.queue, None)  # this store's own claims follow at once
        with self.write() as conn:
            row = conn.execute(
                select(PL.version, PL.spec).where(PL.queue == spec.queue).with_for_update()
            ).one_or_none()
            if row is not None and row.spec == text:
                return spec.with_version(int(row.version))
            version = 1 if row is None else int(row.version) + 1
            values = {"version": version, "spec": text, "updated_at": db_now(), "updated_by": storable(by, 120)}
            if row is None:
                conn.execute(insert(pipelines).values(queue=spec.queue, **values))
            else:
                conn.execute(update(pipelines).where(PL.queue == spec.queue).values(**values))
            self._keep_schedules(conn, spec)
            if spec.hooks:  # the pipeline's hooks replace the queue's
                write_hooks(conn, spec.queue, dict(spec.hooks), replace=True)
            defaults = {"default_priority": spec.priority, "default_weight": spec.weight}
            given = {name: value for name, value in defaults.items() if value is not None}
            if given:  # the pipeline's defaults replace the queue's (one without them leaves them)
                write_queue_values(conn, spec.queue, given)
            self.dialect.notify_ready(conn, spec.queue)  # watchers of the queue look again now
            return spec.with_version(version)

    def _keep_schedules(self, conn: Connection, spec: PipelineSpec) -> None:
        names = [schedule.name for schedule in spec.schedules]
        gone = delete(schedules).where(SC.queue == spec.queue)
        conn.execute(gone.where(SC.name.not_in(names)) if names else gone)
        have = set(conn.execute(select(SC.name).where(SC.queue == spec.queue)).scalars())
        for name in names:
            if name not in have:
                conn.execute(insert(schedules).values(queue=spec.queue, name=name, last_tick=db_now()))

    def remove_pipeline(self, queue: str) -> bool:
        """Remove a queue's pipeline (and its schedules): its watchers fall back to their own
        processor and settings. Returns whether there was one."""
        check_queue(queue)
        self._pipelines_read.pop(queue, None)
        with self.write() as conn:
            conn.execute(delete(schedules).where(SC.queue == queue))
            done = conn.execute(delete(pipelines).where(PL.queue == queue)).rowcount
            self.dialect.notify_ready(conn, queue)
            return bool(done)

    def pipeline(self, queue: str) -> PipelineSpec | None:
        """A queue's stored pipeline with its version, or None."""
        check_queue(queue)
        with self.read() as conn:
            return self._pipeline(conn, queue)

    def _pipeline(self, conn: Connection, queue: str) -> PipelineSpec | None:
        row = conn.execute(select(PL.version, PL.spec).where(PL.queue == queue)).one_or_none()
        return None if row is None else _spec(row.spec, int(row.version), queue)

    def _claims_pipeline(self, conn: Connection, queue: str) -> PipelineSpec | None:
        """The pipeline pull claims of `queue` go by (its gate limits and windows): `cached_pipeline`."""
        return cached_pipeline(self, conn, queue)

    def _gate_policies(self, conn: Connection, queues: Iterable[str], policy: RetryPolicy) -> GatePolicies:
        """The attempts and backoff of each (queue, gate): the gate's settings in its queue's stored
        pipeline over `policy` (one read for all `queues`; `policy` itself where none is set, or
        where the stored pipeline cannot be read)."""
        wanted = sorted(set(queues))
        rows = conn.execute(select(PL.queue, PL.version, PL.spec).where(PL.queue.in_(wanted))).all() if wanted else []
        specs = {}
        for row in rows:
            try:
                specs[row.queue] = _spec(row.spec, int(row.version), row.queue)
            except InvalidInput:
                continue

        def policy_of(queue: str, gate: int) -> RetryPolicy:
            spec = specs.get(queue)
            settings = spec.gate(gate) if spec is not None else None
            return settings.policy(policy) if settings is not None else policy

        return policy_of

    def pipelines(self) -> list[PipelineSpec]:
        """Every stored pipeline, by queue."""
        with self.read() as conn:
            rows = conn.execute(select(PL.queue, PL.version, PL.spec).order_by(PL.queue)).all()
        return [_spec(row.spec, int(row.version), row.queue) for row in rows]

    def pipeline_version(self, queue: str) -> int:
        """The version of a queue's pipeline (0: none): what a watcher polls."""
        with self.single() as conn:
            version = conn.execute(select(PL.version).where(PL.queue == queue)).scalar_one_or_none()
        return 0 if version is None else int(version)

    def gate_numbers(self, queue: str) -> dict[str, int]:
        """Gate name -> number in a queue's pipeline (empty without one)."""
        spec = self.pipeline(queue)
        return spec.names if spec is not None else {}

    def queue_of(self, key: str) -> str | None:
        """The queue of partition `key`, if it exists."""
        with self.read() as conn:
            queue = conn.execute(select(partitions.c.queue).where(partitions.c.key == key)).scalar_one_or_none()
        return cast(str | None, queue)

    def queue_of_item(self, item_id: int) -> str | None:
        """The queue of item `item_id`'s partition, if the item exists (one join, no history read)."""
        with self.read() as conn:
            queue = conn.execute(
                select(partitions.c.queue)
                .select_from(partitions.join(items, items.c.partition_id == partitions.c.id))
                .where(items.c.id == item_id)
            ).scalar_one_or_none()
        return cast(str | None, queue)

    def queues_of_items(self, item_ids: Iterable[int]) -> dict[int, str]:
        """The queue of each of `item_ids` that exists, in one query (one join)."""
        wanted = sorted(set(item_ids))
        if not wanted:
            return {}
        with self.read() as conn:
            rows = conn.execute(
                select(items.c.id, partitions.c.queue)
                .select_from(partitions.join(items, items.c.partition_id == partitions.c.id))
                .where(items.c.id.in_(wanted))
            ).all()
        return {int(item_id): str(queue) for item_id, queue in rows}


def cached_pipeline(store: StoreBase, conn: Connection, queue: str) -> PipelineSpec | None:
    """The pipeline pull claims of `queue` go by (its gate limits and windows), and the gate rules
    (its gates' tolerated failures): read at most once a second per store, as watchers follow a
    change within a poll interval (a read per claim cost 1.5% of the pull benchmark's drain on
    PostgreSQL, with no pipeline at all). None when there is none, or when the stored one cannot be
    read (written by a newer feedproc): claims then go by the queue's own settings rather than
    stop, and its gates tolerate nothing."""
    now = time.monotonic()
    seen = store._pipelines_read.get(queue)
    if seen is not None and now - seen[0] < PIPELINE_READ_SECONDS:
        return cast(PipelineSpec | None, seen[1])
    row = conn.execute(select(PL.version, PL.spec).where(PL.queue == queue)).one_or_none()
    try:
        spec = None if row is None else _spec(row.spec, int(row.version), queue)
    except InvalidInput:
        spec = None
    store._pipelines_read[queue] = (now, spec)
    return spec


def _spec(text: str, version: int, queue: str) -> PipelineSpec:
    try:
        return from_mapping(json.loads(text), source=f"stored pipeline of queue {queue!r}", version=version)
    except (ValueError, InvalidInput) as error:  # written by a newer feedproc, or by hand
        raise InvalidInput(f"the stored pipeline of queue {queue!r} cannot be read: {error}") from None
