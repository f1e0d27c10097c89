"""Accumulators (fan-in): per partition and name, what its answers' `accumulate` numbers came to,
merged by the operation the gate (or queue) declares (`core.fanin`). Read by the item that collects
(its `accumulated`), status, the API and the dashboard; removed with the partition.

Exactly once per answer: the numbers are merged in the transaction that writes the answer, after
its version-fenced item update (`Answers._write_outcomes`, the group commit, and through it pull
workers' and callbacks' answers). An answer that is not written (a lost lease, an item changed
since it was delivered, a second answer of a claim) merges nothing; a transaction that fails
merges nothing either, and its retry writes only what still matches.

No hot row: a batch is merged in Python first, then written as one upsert of a row per
(partition, name), under the partition's lock the answers already hold; a 100,000-item gate answering
at full speed writes each partition's accumulator once per group commit, not once per answer.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.engine import Connection

from ..core.fanin import combine, refusal
from ..core.records import Kind, Outcome
from .base import Q
from .dialect import AccumulatorRow
from .pipelines import PIPELINE_READ_SECONDS, cached_pipeline
from .queues import stored_operations
from .schema import accumulators
from .tolerating import Tolerating

N = accumulators.c
#: The outcomes whose answer is written with its numbers: those of a failure carry none.
_ANSWERED = (Kind.DONE, Kind.MOVE, Kind.LATER)
#: How each operation's numbers combine in the database: a count is a sum of ones.
_COMBINATION = {"sum": "add", "count": "add", "min": "min", "max": "max"}


def accumulated_of(conn: Connection, partition_id: int) -> dict[str, float]:
    """Partition `partition_id`'s accumulator, name by name."""
    rows = conn.execute(select(N.name, N.value).where(N.partition_id == partition_id).order_by(N.name))
    return {name: float(value) for name, value in rows}


class Accumulating(Tolerating):
    """A partition's accumulator."""

    def accumulated(self, partition_id: int) -> dict[str, float]:
        """Partition `partition_id`'s accumulator: name -> value ({} when nothing was accumulated)."""
        with self.read() as conn:
            return self._accumulated(conn, partition_id)

    def _accumulated(self, conn: Connection, partition_id: int) -> dict[str, float]:
        return accumulated_of(conn, partition_id)

    def _operations(self, conn: Connection, queue: str, gate: int) -> dict[str, str]:
        """How answers at `gate` of `queue` merge their numbers: the gate's declaration in the
        queue's pipeline over the queue's own (each read at most once a second, as watchers follow
        a change within a poll interval)."""
        now = time.monotonic()
        seen = self._operations_read.get(queue)
        if seen is None or now - seen[0] >= PIPELINE_READ_SECONDS:
            text = conn.execute(select(Q.accumulate).where(Q.name == queue)).scalar_one_or_none()
            seen = (now, dict(stored_operations(text)))
            self._operations_read[queue] = seen
        spec = cached_pipeline(self, conn, queue)
        settings = spec.gate(gate) if spec is not None else None
        return {**seen[1], **settings.operations} if settings is not None and settings.accumulate else seen[1]

    def _accumulate_refusal(self, conn: Connection, outcome: Outcome, queue: str) -> str | None:
        """Why `outcome`'s accumulate numbers cannot be merged (a name declared nowhere), or None;
        its operations are set for the merge."""
        assert outcome.accumulate is not None
        operations = self._operations(conn, queue, outcome.gate)
        why = refusal(outcome.accumulate, operations, self._gate_label(conn, queue, outcome.gate), queue)
        if why is None:
            outcome.operations = operations
        return why

    def _accumulate(self, conn: Connection, outcomes: Sequence[Outcome]) -> None:
        """Merge the written `outcomes`' accumulate numbers into their partitions' accumulators
        (`accumulator_rows`): one upsert of a row per partition and name."""
        self._upsert_accumulators(conn, *accumulator_rows(outcomes))

    def _upsert_accumulators(self, conn: Connection, rows: list[Row], others: list[Row]) -> None:
        if rows:
            self.dialect.merge_accumulators(conn, rows)
        for row in others:  # rare: each on its own (a statement may not update one row twice)
            self.dialect.merge_accumulators(conn, [row])


#: An accumulator's row to merge: (partition id, name, combination (add, min, max), value).
Row = AccumulatorRow


def accumulator_rows(outcomes: Sequence[Outcome]) -> tuple[list[Row], list[Row]]:
    """What `outcomes` (written answers) merge into their partitions' accumulators, the batch merged
    here first: a row per partition and name, and (rare) the `others` of a name merged two ways in
    one batch (two gates declaring it differently). Names without an operation (`Outcome.operations`)
    and failures' numbers are not merged."""
    merged: dict[tuple[int, str], tuple[str, float]] = {}  # (partition, name) -> (combination, value)
    others: list[Row] = []
    for o in outcomes:
        if o.accumulate is None or o.operations is None or o.kind not in _ANSWERED:
            continue
        for name, number in o.accumulate.items():
            operation = o.operations.get(name)
            if operation is None:
                continue
            combination, step = _COMBINATION[operation], 1.0 if operation == "count" else float(number)
            key = (o.partition_id, name)
            seen = merged.get(key)
            if seen is None:
                merged[key] = (combination, step)
            elif seen[0] == combination:
                merged[key] = (combination, combine(operation, seen[1], step))
            else:
                others.append((o.partition_id, name, combination, step))
    return [(pid, name, how, value) for (pid, name), (how, value) in sorted(merged.items())], others
