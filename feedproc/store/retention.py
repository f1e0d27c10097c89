"""Retention: deleting finished partitions with their items and history, in bounded transactions."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, func, select

from .base import CANCELLED, COMPLETE, A, C, E, F, I, P, StoreBase
from .foundations import seconds_from_now
from .schema import attempts, claims, events, inflight, items, partitions


class Retention(StoreBase):
    """`feedproc cleanup`."""

    def cleanup(
        self,
        older_than: float,
        *,
        statuses: Sequence[str] = (COMPLETE, CANCELLED),
        batch: int = 5000,
        partitions_per_batch: int = 100,
        dry_run: bool = False,
    ) -> dict[str, int]:
        """Delete partitions finished more than `older_than` seconds ago, with their items and
        history, in bounded transactions (never one giant delete). Returns what was deleted (with
        `dry_run`, what would be, and nothing is)."""
        deleted = {"partitions": 0, "items": 0, "events": 0, "attempts": 0, "claims": 0}
        if dry_run:  # what would go: counted, not loaded
            old = select(P.id).where(P.status.in_(list(statuses)), P.updated_at < seconds_from_now(-older_than))
            with self.read() as conn:
                for table, column, key in (
                    (partitions, P.id, "partitions"),
                    (items, I.partition_id, "items"),
                    (events, E.partition_id, "events"),
                    (attempts, A.partition_id, "attempts"),
                    (claims, C.partition_id, "claims"),
                ):
                    query = select(func.count()).select_from(table).where(column.in_(old.scalar_subquery()))
                    deleted[key] = int(conn.execute(query).scalar_one())
            return deleted
        while True:
            with self.write() as conn:
                ids = list(
                    conn.execute(
                        select(P.id)
                        .where(P.status.in_(list(statuses)), P.updated_at < seconds_from_now(-older_than))
                        .order_by(P.updated_at)
                        .limit(partitions_per_batch)
                    ).scalars()
                )
            if not ids:
                return deleted
            for table, row_key, column, key in (
                (items, I.id, I.partition_id, "items"),
                (events, E.id, E.partition_id, "events"),
                (attempts, A.id, A.partition_id, "attempts"),
                (claims, C.token, C.partition_id, "claims"),
            ):
                while True:
                    with self.write() as conn:
                        chunk = select(row_key).where(column.in_(ids)).limit(batch)
                        chunk = self.dialect.deletable(chunk)  # MariaDB/MySQL: through a derived table
                        removed = conn.execute(delete(table).where(row_key.in_(chunk.scalar_subquery()))).rowcount
                    deleted[key] += removed
                    if removed < batch:
                        break
            with self.write() as conn:
                conn.execute(delete(inflight).where(F.partition_id.in_(ids)))
                deleted["partitions"] += conn.execute(
                    delete(partitions).where(P.id.in_(ids), P.status.in_(list(statuses)))
                ).rowcount
