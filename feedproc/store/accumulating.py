"""Accumulators (fan-in): per partition and name, what its answers' `accumulate` numbers came to,
merged by the operation the gate (or queue) declares (`core.fanin`). Read by the item that collects
(its `accumulated`), status, the API and the dashboard; removed with the partition."""

from __future__ import annotations

from sqlalchemy import select

from .base import StoreBase
from .schema import accumulators

N = accumulators.c


class Accumulating(StoreBase):
    """A partition's accumulator."""

    def accumulated(self, partition_id: int) -> dict[str, float]:
        """Partition `partition_id`'s accumulator: name -> value ({} when nothing was accumulated)."""
        with self.read() as conn:
            rows = conn.execute(select(N.name, N.value).where(N.partition_id == partition_id).order_by(N.name))
            return {name: float(value) for name, value in rows}
