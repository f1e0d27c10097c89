"""Retention: deleting finished partitions with their items and history, in bounded transactions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Table, and_, delete, func, select

from ..core.hooks import SENT
from .base import CANCELLED, COMPLETE, A, C, E, F, I, P, StoreBase
from .foundations import seconds_from_now
from .schema import attempts, claims, events, hooks, inflight, items, partitions

H = hooks.c


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
        history, and completion hooks sent as long ago, in bounded transactions (never one giant
        delete). Returns what was deleted (with `dry_run`, what would be, and nothing is). Failed
        and pending hooks are kept: an operator retries or looks at them."""
        deleted = {"partitions": 0, "items": 0, "events": 0, "attempts": 0, "claims": 0, "hooks": 0}
        old_hooks = and_(H.status == SENT, H.sent_at < seconds_from_now(-older_than))
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
                deleted["hooks"] = int(conn.execute(select(func.count()).where(old_hooks)).scalar_one())
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
                deleted["hooks"] = self._delete_in_chunks(hooks, H.id, old_hooks, batch)
                return deleted
            for table, row_key, column, key in (
                (items, I.id, I.partition_id, "items"),
                (events, E.id, E.partition_id, "events"),
                (attempts, A.id, A.partition_id, "attempts"),
                (claims, C.token, C.partition_id, "claims"),
            ):
                deleted[key] += self._delete_in_chunks(table, row_key, column.in_(ids), batch)
            with self.write() as conn:
                conn.execute(delete(inflight).where(F.partition_id.in_(ids)))
                deleted["partitions"] += conn.execute(
                    delete(partitions).where(P.id.in_(ids), P.status.in_(list(statuses)))
                ).rowcount

    def _delete_in_chunks(
        self, table: Table, row_key: ColumnElement[Any], where: ColumnElement[bool], batch: int
    ) -> int:
        """Delete `table`'s rows matching `where`, `batch` per transaction; returns how many."""
        removed = 0
        while True:
            with self.write() as conn:
                chunk = self.dialect.deletable(select(row_key).where(where).limit(batch))  # MariaDB: a derived table
                gone = int(conn.execute(delete(table).where(row_key.in_(chunk.scalar_subquery()))).rowcount)
            removed += gone
            if gone < batch:
                return removed
