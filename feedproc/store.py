"""All of feedproc's SQL, behind one small interface.

Two kinds of caller use the store:

* producers (`Feed`, the CLI): add partitions and items, seal, retry, cancel, checkpoint, read status;
* watchers: register and heartbeat, lease / renew / steal / hand over / release partitions, fetch
  ready items, and apply a batch of answers;
* scheduling controls (their own section): queue settings, the slot claim of a limited queue,
  progress reports, and deferring partitions whose time window is closed.

Every write a watcher makes is **fenced**: it first locks the partition rows it writes (PostgreSQL
`FOR UPDATE`; SQLite serialises writers with `BEGIN IMMEDIATE`) and keeps only those still leased to
it under the same lease epoch, in the same transaction as the write. Producers lock the partition
row too, so an item added at the current gate can never race a gate advance.

Dialect differences are confined to `dialects.py` (time on the database clock, engine set-up) and
to `_fetch_ready_pg` / `_fetch_ready_sqlite` below.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    Row,
    and_,
    bindparam,
    case,
    exists,
    func,
    insert,
    literal,
    literal_column,
    or_,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy import delete as sa_delete
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, ProgrammingError
from sqlalchemy.sql import ColumnElement, Select

from .core import gates
from .core import windows as timewindows
from .core.errors import (
    DatabaseUnavailable,
    DuplicateKey,
    InvalidInput,
    NotFound,
    Refused,
    SchemaMissing,
    StaleWrite,
    WatcherGone,
)
from .core.gates import GateFacts, Move
from .core.models import MAX_PAGE, NewItem, Status, check_key, check_queue, truncate_error
from .core.records import (
    RECORD_OUTCOMES,
    Applied,
    Kind,
    Lease,
    Outcome,
    ProgressReport,
    QueueSettings,
    ReadyItem,
    SlotClaim,
    decode_inflight,
    encode_inflight,
)
from .dialects import (
    WRITE_OPTION,
    DriverStatement,
    db_now,
    is_postgres,
    make_engine,
    pg_bigint_array,
    seconds_from_now,
    seconds_until,
)
from .notify import notify_finished, notify_ready, notify_wanted
from .schema import attempts, events, inflight, items, partitions, queues, watchers

P, I, W, E, Q = partitions.c, items.c, watchers.c, events.c, queues.c  # noqa: E741 - column namespaces, read as table initials
A, F = attempts.c, inflight.c
AVAILABLE, COMPLETE, FAILED, CANCELLED = (s.value for s in Status)
# Status tests in WHERE clauses are SQL literals, not bound parameters: the partial indexes are
# defined on `status = 'failed'` (and the partitions' on their own status), and once psycopg
# prepares a statement PostgreSQL may switch to a generic plan, which can use a partial index only
# if the condition is literal.
IS_AVAILABLE: ColumnElement[str] = literal_column("'available'")
IS_FAILED: ColumnElement[str] = literal_column("'failed'")
# A partition no watcher holds: every release writes these three together (with version and updated_at).
LEASE_CLEARED: dict[str, None] = {"lease_owner": None, "lease_expires_at": None, "wanted_by": None}
INSERT_CHUNK = 5000  # rows per INSERT statement
RECORDS_KEPT = 10  # per item, the first and the last this many delivery records are kept
RECORD_ERROR_LIMIT = 4096  # characters of a delivery record's error (with its traceback): its end
FAILED_ITEMS_SHOWN = 100


# ---------------------------------------------------------------- the store


class Store:
    """feedproc's database access. Thread-safe: each call takes its own pooled connection."""

    def __init__(self, url: str, *, pool_size: int = 5, pre_ping: bool = True) -> None:
        self.url = url
        self.engine = make_engine(url, pool_size=pool_size, pre_ping=pre_ping)
        self.postgres = is_postgres(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    # ------------------------------------------------------------ transactions and errors

    @contextmanager
    def _tx(self, *, write: bool) -> Iterator[Connection]:
        with _translated_errors(), self.engine.connect() as conn:
            if write:
                conn = conn.execution_options(**{WRITE_OPTION: True})
            with conn.begin():
                yield conn

    def write(self) -> Any:
        """A write transaction (SQLite: BEGIN IMMEDIATE)."""
        return self._tx(write=True)

    @contextmanager
    def single(self) -> Iterator[Connection]:
        """A connection for ONE statement that is its own transaction. On PostgreSQL it runs in
        autocommit mode: one round trip instead of three (BEGIN, the statement, COMMIT), which is
        what a watcher's latency path is made of. Elsewhere, an ordinary write transaction."""
        if not self.postgres:
            with self._tx(write=True) as conn:
                yield conn
            return
        with _translated_errors(), self.engine.connect() as conn:
            yield conn.execution_options(isolation_level="AUTOCOMMIT")

    def read(self) -> Any:
        """A read-only transaction."""
        return self._tx(write=False)

    # ------------------------------------------------------------ schema

    def migrate(self) -> None:
        """Create or upgrade the schema to the newest revision (idempotent)."""
        from alembic import command

        config = _alembic_config(self.url)
        with _translated_errors(), self.engine.begin() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, "head")

    def schema_revision(self) -> str | None:
        """The schema revision in the database, or None when it has no feedproc schema."""

        try:
            with self.read() as conn:
                version: str | None = conn.execute(text("SELECT version_num FROM feedproc_version")).scalar()
                return version
        except SchemaMissing:
            return None

    def check_schema(self) -> None:
        """Raise SchemaMissing unless the database is at the newest schema revision."""
        from alembic.script import ScriptDirectory

        head = ScriptDirectory.from_config(_alembic_config(self.url)).get_current_head()
        current = self.schema_revision()
        if current != head:
            state = "has no feedproc schema" if current is None else f"is at schema {current}, not {head}"
            raise SchemaMissing(f"the database {state}: run `feedproc migrate`")

    # ------------------------------------------------------------ producers

    def add_partition(
        self,
        key: str,
        new_items: Iterable[NewItem | tuple[int, bytes] | dict[str, Any]] = (),
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
        """Create a partition with its items in one transaction; returns the number of items.

        `weight` is each of its items' share of the queue's concurrency limit, `item_timeout` the
        seconds a processor call may take (overriding the watcher's), `windows` / `window_tz` the
        windows of the day in which its items may be dispatched (see `windows.py`)."""
        check_key(key)
        check_queue(queue)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise InvalidInput(f"priority must be an integer, got {priority!r}")
        schedule = _schedule_values(weight, item_timeout, windows, window_tz)
        try:
            with self.write() as conn:
                pid = conn.execute(
                    insert(partitions)
                    .values(
                        key=key,
                        queue=queue,
                        status=AVAILABLE,
                        gate=0,
                        priority=priority,
                        sealed=sealed,
                        manual_checkpoint=manual_checkpoint,
                        not_before=not_before,
                        created_at=db_now(),
                        updated_at=db_now(),
                        **schedule,
                    )
                    .returning(P.id)
                ).scalar_one()
                count, lowest = self._insert_items(conn, pid, new_items, partition_gate=None)
                if count and lowest != 0:  # inserted at gate 0, where most partitions start
                    conn.execute(update(partitions).where(P.id == pid).values(gate=lowest))
                self._event(conn, pid, "created", detail={"items": count, "gate": lowest if count else 0})
                self._settle(conn, pid)
                return count
        except IntegrityError as error:
            if _is_unique_violation(error):
                raise DuplicateKey(f"partition {key!r} exists already") from error
            raise

    def add_items(self, key: str, new_items: Iterable[NewItem | tuple[int, bytes] | dict[str, Any]]) -> int:
        """Add items to an open partition (not sealed, not finished); returns how many."""
        with self.write() as conn:
            row = self._lock(conn, key)
            if row.status != AVAILABLE:
                raise Refused(f"partition {key!r} is {row.status}: no items can be added")
            if row.sealed:
                raise Refused(f"partition {key!r} is sealed: no items can be added")
            count, _ = self._insert_items(conn, row.id, new_items, partition_gate=row.gate)
            self._event(conn, row.id, "items_added", detail={"items": count})
            self._settle(conn, row.id)
            return count

    def seal(self, key: str) -> None:
        """Mark that no more items will be added; a drained, sealed partition completes."""
        with self.write() as conn:
            row = self._lock(conn, key)
            if row.sealed:
                return
            if row.status == CANCELLED:
                raise Refused(f"partition {key!r} is cancelled")
            self._touch(conn, row.id, sealed=True)
            self._event(conn, row.id, "sealed")
            if row.status == AVAILABLE:
                self._settle(conn, row.id)

    def retry(self, key: str) -> int:
        """Put a failed partition and its failed items back to work; returns the items retried."""
        with self.write() as conn:
            row = self._lock(conn, key)
            if row.status != FAILED:
                raise Refused(f"partition {key!r} is {row.status}, not failed: nothing to retry")
            count = conn.execute(
                update(items)
                .where(I.partition_id == row.id, I.status == IS_FAILED)
                .values(
                    status=AVAILABLE, attempts=0, next_attempt_at=db_now(), version=I.version + 1, updated_at=db_now()
                )
            ).rowcount
            self._touch(conn, row.id, status=AVAILABLE)
            self._event(conn, row.id, "retried", detail={"items": count})
            self._settle(conn, row.id)
            return int(count)

    def cancel(self, key: str) -> None:
        """Cancel a partition and its available items (failed items stay failed). Terminal."""
        with self.write() as conn:
            row = self._lock(conn, key)
            if row.status == CANCELLED:
                return
            if row.status == COMPLETE:
                raise Refused(f"partition {key!r} is complete and cannot be cancelled")
            count = conn.execute(
                update(items)
                .where(I.partition_id == row.id, I.status == IS_AVAILABLE)
                .values(status=CANCELLED, version=I.version + 1, updated_at=db_now())
            ).rowcount
            self._touch(conn, row.id, status=CANCELLED, ready_at=None, **LEASE_CLEARED)
            self._event(conn, row.id, "cancelled", detail={"items": count})
            notify_finished(conn, key)

    def checkpoint(self, key: str) -> int:
        """Advance a manual-checkpoint partition whose gate has drained; returns the new gate."""
        with self.write() as conn:
            row = self._lock(conn, key)
            if not row.manual_checkpoint:
                raise Refused(f"partition {key!r} has no manual checkpoint")
            if row.status != AVAILABLE:
                raise Refused(f"partition {key!r} is {row.status}")
            facts = self._facts(conn, row)
            outcome = gates.settle(facts, checkpoint=True)
            if outcome.move is not Move.ADVANCE:
                reason = {
                    Move.STAY: f"gate {row.gate} still has available items",
                    Move.FAIL: f"gate {row.gate} has failed items",
                }.get(outcome.move, f"no gate above {row.gate} holds work")
                raise Refused(f"partition {key!r} cannot be checkpointed: {reason}")
            self._settle(conn, row.id, checkpoint=True)
            return outcome.gate

    def cleanup(
        self,
        older_than: float,
        *,
        statuses: Sequence[str] = (COMPLETE, CANCELLED),
        batch: int = 5000,
        partitions_per_batch: int = 100,
    ) -> dict[str, int]:
        """Delete partitions finished more than `older_than` seconds ago, with their items and
        history, in bounded transactions (never one giant delete). Returns what was deleted."""
        deleted = {"partitions": 0, "items": 0, "events": 0, "attempts": 0}
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
            for table, column, key in (
                (items, I.partition_id, "items"),
                (events, E.partition_id, "events"),
                (attempts, A.partition_id, "attempts"),
            ):
                while True:
                    with self.write() as conn:
                        chunk = select(table.c.id).where(column.in_(ids)).limit(batch).scalar_subquery()
                        removed = conn.execute(sa_delete(table).where(table.c.id.in_(chunk))).rowcount
                    deleted[key] += removed
                    if removed < batch:
                        break
            with self.write() as conn:
                conn.execute(sa_delete(inflight).where(F.partition_id.in_(ids)))
                deleted["partitions"] += conn.execute(
                    sa_delete(partitions).where(P.id.in_(ids), P.status.in_(list(statuses)))
                ).rowcount

    # ------------------------------------------------------------ reading

    def status(self, key: str, *, history: int = 0) -> dict[str, Any]:
        """One partition as the `status KEY --json` object; NotFound if unknown."""
        with self.read() as conn:
            row = conn.execute(select(partitions).where(P.key == key)).one_or_none()
            if row is None:
                raise NotFound(f"no partition {key!r}")
            totals = {s: 0 for s in ("total", *(st.value for st in Status))}
            per_gate: dict[str, dict[str, int]] = {}
            counts = conn.execute(
                select(I.gate, I.status, func.count())
                .where(I.partition_id == row.id)
                .group_by(I.gate, I.status)
                .order_by(I.gate)
            )
            for gate, status, n in counts:
                per_gate.setdefault(str(gate), {st.value: 0 for st in Status})[status] = n
                totals[status] += n
                totals["total"] += n
            failed = conn.execute(
                select(I.id, I.gate, I.attempts, I.last_error)
                .where(I.partition_id == row.id, I.status == IS_FAILED)
                .order_by(I.id)
                .limit(FAILED_ITEMS_SHOWN)
            ).all()
            result = {
                "key": row.key,
                "queue": row.queue,
                "status": row.status,
                "gate": row.gate,
                "priority": row.priority,
                "sealed": bool(row.sealed),
                "manual_checkpoint": bool(row.manual_checkpoint),
                "not_before": _iso(row.not_before),
                "created_at": _iso(row.created_at),
                "updated_at": _iso(row.updated_at),
                "lease": {
                    "owner": row.lease_owner,
                    "expires_at": _iso(row.lease_expires_at),
                    "wanted_by": row.wanted_by,
                }
                if row.lease_owner
                else None,
                "items": totals,
                "gates": per_gate,
                "failed_items": [
                    {"id": f.id, "gate": f.gate, "attempts": f.attempts, "last_error": f.last_error} for f in failed
                ],
            }
            result.update(self._schedule_status(conn, row, per_gate))
            if history:
                result["history"] = self._history(conn, row.id, history)
            return result

    def items(
        self, key: str, *, gate: int | None = None, status: str | None = None, after_id: int = 0, limit: int = 1000
    ) -> list[dict[str, Any]]:
        """Items of one partition in id order, a page at a time (keyset: pass the last id as `after_id`)."""
        limit = max(1, min(limit, 10_000))
        with self.read() as conn:
            pid = conn.execute(select(P.id).where(P.key == key)).scalar_one_or_none()
            if pid is None:
                raise NotFound(f"no partition {key!r}")
            query = select(I.id, I.gate, I.status, I.attempts, I.deliveries, I.last_error, I.data).where(
                I.partition_id == pid, I.id > after_id
            )
            if gate is not None:
                query = query.where(I.gate == gate)
            if status is not None:
                query = query.where(I.status == status)
            rows = conn.execute(query.order_by(I.id).limit(limit)).all()
            return [
                {
                    "id": r.id,
                    "gate": r.gate,
                    "status": r.status,
                    "attempts": r.attempts,
                    "deliveries": r.deliveries,
                    "last_error": r.last_error,
                    "data": r.data,
                }
                for r in rows
            ]

    def item(self, item_id: int) -> dict[str, Any]:
        """One item with its data (bytes) and its deliveries, oldest first (`history`); NotFound if unknown.

        Each delivery: `n` (the item's delivery number), `attempt` (as its processor saw it), `gate`,
        `watcher`, `started_at`, `ended_at`, `duration` (seconds), `outcome` (done, moved, not yet,
        retry, failed, lost) and `error` (with a traceback for a Python processor's exception). Per
        item the first and the last few deliveries are kept (`RECORDS_KEPT` each)."""
        if isinstance(item_id, bool) or not isinstance(item_id, int) or not 0 < item_id < 2**63:
            raise InvalidInput(f"item id must be a positive integer, got {item_id!r}")
        with self.read() as conn:
            row = conn.execute(
                select(
                    I.id,
                    P.key,
                    P.queue,
                    I.gate,
                    I.status,
                    I.attempts,
                    I.deliveries,
                    I.last_error,
                    I.data,
                    I.parent_id,
                    I.progress,
                    I.started_at,
                    I.duration,
                    I.delivered_by,
                    I.created_at,
                    I.updated_at,
                )
                .select_from(items.join(partitions, P.id == I.partition_id))
                .where(I.id == item_id)
            ).one_or_none()
            if row is None:
                raise NotFound(f"no item {item_id}")
            records = conn.execute(
                select(A.n, A.attempt, A.gate, A.watcher, A.started_at, A.ended_at, A.duration, A.outcome, A.error)
                .where(A.item_id == item_id)
                .order_by(A.n, A.id)
            ).all()
        history = [
            {
                "n": r.n,
                "attempt": r.attempt,
                "gate": r.gate,
                "watcher": r.watcher,
                "started_at": _iso(r.started_at),
                "ended_at": _iso(r.ended_at),
                "duration": r.duration,
                "outcome": r.outcome,
                "error": r.error,
            }
            for r in records
        ]
        if row.status == COMPLETE and row.delivered_by is not None:  # the completing delivery: on the item row
            history.append(
                {
                    "n": row.deliveries,
                    "attempt": row.attempts + 1,
                    "gate": row.gate,
                    "watcher": row.delivered_by,
                    "started_at": _iso(row.started_at),
                    "ended_at": _iso(row.updated_at),
                    "duration": row.duration,
                    "outcome": "done",
                    "error": None,
                }
            )
        return {
            "id": row.id,
            "partition": row.key,
            "queue": row.queue,
            "gate": row.gate,
            "status": row.status,
            "attempts": row.attempts,
            "deliveries": row.deliveries,
            "last_error": row.last_error,
            "parent": row.parent_id,
            "progress": row.progress,
            "created_at": _iso(row.created_at),
            "updated_at": _iso(row.updated_at),
            "data": row.data,
            "history": history,
        }

    def summary(self, *, recent: int = 0) -> dict[str, Any]:
        """Counts of partitions and items by status (the `status --json` object)."""
        with self.read() as conn:
            parts = {s.value: 0 for s in Status}
            for status, n in conn.execute(select(P.status, func.count()).group_by(P.status)):
                parts[status] = n
            totals = {"total": 0, **{s.value: 0 for s in Status}}
            for status, n in conn.execute(select(I.status, func.count()).group_by(I.status)):
                totals[status] = n
                totals["total"] += n
            result: dict[str, Any] = {"partitions": parts, "items": totals}
            if recent:
                rows = conn.execute(
                    select(P.key, P.queue, P.status, P.gate, P.priority, P.lease_owner, P.updated_at)
                    .order_by(P.updated_at.desc(), P.id.desc())
                    .limit(recent)
                ).all()
                result["recent"] = [
                    {
                        "key": r.key,
                        "queue": r.queue,
                        "status": r.status,
                        "gate": r.gate,
                        "priority": r.priority,
                        "owner": r.lease_owner,
                        "updated_at": _iso(r.updated_at),
                    }
                    for r in rows
                ]
                result["watchers"] = self._watchers(conn)
            return result

    def watchers(self) -> list[dict[str, Any]]:
        """Registered watchers with their liveness and lease counts."""
        with self.read() as conn:
            return self._watchers(conn)

    def _watchers(self, conn: Connection) -> list[dict[str, Any]]:
        held = select(func.count()).where(P.lease_owner == W.id, P.status == IS_AVAILABLE).scalar_subquery()
        rows = conn.execute(
            select(
                W.id,
                W.host,
                W.pid,
                W.queue,
                W.concurrency,
                W.started_at,
                W.heartbeat_at,
                (W.expires_at > db_now()).label("alive"),
                held.label("leases"),
            )
            .order_by(W.started_at)
            .limit(1000)
        ).all()
        return [
            {
                "id": r.id,
                "host": r.host,
                "pid": r.pid,
                "queue": r.queue,
                "concurrency": r.concurrency,
                "started_at": _iso(r.started_at),
                "heartbeat_at": _iso(r.heartbeat_at),
                "alive": bool(r.alive),
                "leases": r.leases,
            }
            for r in rows
        ]

    def _history(self, conn: Connection, pid: int, limit: int) -> list[dict[str, Any]]:
        rows = conn.execute(
            select(E.id, E.kind, E.item_id, E.watcher, E.detail, E.at)
            .where(E.partition_id == pid)
            .order_by(E.id.desc())
            .limit(limit)
        ).all()
        return [
            {
                "at": _iso(r.at),
                "kind": r.kind,
                "item": r.item_id,
                "watcher": r.watcher,
                "detail": json.loads(r.detail) if r.detail else None,
            }
            for r in reversed(rows)
        ]

    # ------------------------------------------------------------ operators: HTTP API, dashboard, metrics (issue 6)
    # Reads for `feedproc serve` and the watchers' /healthz and /metrics. Every one is bounded: a
    # capped page (keyset cursor), or an aggregate with one row per queue/status.

    def ping(self) -> None:
        """Raise DatabaseUnavailable or SchemaMissing unless the database answers (schema included)."""
        with self.read() as conn:
            conn.execute(select(P.id).limit(1)).all()

    def list_partitions(
        self,
        *,
        queue: str | None = None,
        status: str | None = None,
        prefix: str | None = None,
        after: str | None = None,
        limit: int = 50,
    ) -> list[dict[str, Any]]:
        """Partitions in key order, a page at a time (keyset: pass the last key as `after`), with
        their item counts in total and per gate (the `status` object's `items` and `gates`)."""
        limit = max(1, min(limit, MAX_PAGE))
        query = select(
            P.id,
            P.key,
            P.queue,
            P.status,
            P.gate,
            P.priority,
            P.sealed,
            P.manual_checkpoint,
            P.lease_owner,
            P.lease_expires_at,
            P.created_at,
            P.updated_at,
        )
        if queue is not None:
            query = query.where(P.queue == queue)
        if status is not None:
            query = query.where(P.status == status)
        if prefix:
            # substr, not LIKE: exact and case-sensitive on both databases; `>=` lets the key index start there.
            query = query.where(P.key >= prefix, func.substr(P.key, 1, len(prefix)) == prefix)
        if after is not None:
            query = query.where(P.key > after)
        with self.read() as conn:
            rows = conn.execute(query.order_by(P.key).limit(limit)).all()
            counts = self._item_counts(conn, [r.id for r in rows])
        return [
            {
                "key": r.key,
                "queue": r.queue,
                "status": r.status,
                "gate": r.gate,
                "priority": r.priority,
                "sealed": bool(r.sealed),
                "manual_checkpoint": bool(r.manual_checkpoint),
                "lease": {"owner": r.lease_owner, "expires_at": _iso(r.lease_expires_at)} if r.lease_owner else None,
                "created_at": _iso(r.created_at),
                "updated_at": _iso(r.updated_at),
                **counts[r.id],
            }
            for r in rows
        ]

    def _item_counts(self, conn: Connection, pids: list[int]) -> dict[int, dict[str, Any]]:
        """{partition id: {"items": totals, "gates": {gate: counts}}} for a page of partitions."""
        result: dict[int, dict[str, Any]] = {
            pid: {"items": {"total": 0, **{s.value: 0 for s in Status}}, "gates": {}} for pid in pids
        }
        if pids:
            rows = conn.execute(
                select(I.partition_id, I.gate, I.status, func.count())
                .where(I.partition_id.in_(pids))
                .group_by(I.partition_id, I.gate, I.status)
                .order_by(I.partition_id, I.gate)
            )
            for pid, gate, status, n in rows:
                entry = result[pid]
                entry["gates"].setdefault(str(gate), {s.value: 0 for s in Status})[status] = n
                entry["items"][status] += n
                entry["items"]["total"] += n
        return result

    def partition_counts(self) -> dict[str, int]:
        """Partitions by status (reads the partitions' status index only: cheap enough to poll)."""
        counts = {s.value: 0 for s in Status}
        with self.read() as conn:
            for status, n in conn.execute(select(P.status, func.count()).group_by(P.status)):
                counts[status] = n
        return counts

    def history(self, key: str, *, after: int = 0, limit: int = 100) -> list[dict[str, Any]]:
        """A partition's history, oldest first, a page at a time (keyset: pass the last `id` as `after`)."""
        limit = max(1, min(limit, MAX_PAGE))
        with self.read() as conn:
            pid = conn.execute(select(P.id).where(P.key == key)).scalar_one_or_none()
            if pid is None:
                raise NotFound(f"no partition {key!r}")
            rows = conn.execute(
                select(E.id, E.kind, E.item_id, E.watcher, E.detail, E.at)
                .where(E.partition_id == pid, E.id > after)
                .order_by(E.id)
                .limit(limit)
            ).all()
        return [
            {
                "id": r.id,
                "at": _iso(r.at),
                "kind": r.kind,
                "item": r.item_id,
                "watcher": r.watcher,
                "detail": json.loads(r.detail) if r.detail else None,
            }
            for r in rows
        ]

    def recent_failures(self, *, limit: int = 20) -> list[dict[str, Any]]:
        """The most recently failed partitions, each with the error of one of its failed items."""
        limit = max(1, min(limit, MAX_PAGE))
        first_error = (
            select(I.last_error)
            .where(I.partition_id == P.id, I.status == IS_FAILED)
            .order_by(I.id)
            .limit(1)
            .scalar_subquery()
        )
        with self.read() as conn:
            rows = conn.execute(
                select(P.key, P.queue, P.gate, P.updated_at, first_error.label("error"))
                .where(P.status == IS_FAILED)
                .order_by(P.updated_at.desc(), P.id.desc())
                .limit(limit)
            ).all()
        return [
            {"key": r.key, "queue": r.queue, "gate": r.gate, "failed_at": _iso(r.updated_at), "error": r.error}
            for r in rows
        ]

    def leases(self, *, limit: int = 500) -> list[dict[str, Any]]:
        """Partitions leased now (at most `limit`), by owner then key."""
        limit = max(1, min(limit, 5000))
        with self.read() as conn:
            rows = conn.execute(
                select(P.key, P.queue, P.gate, P.lease_owner, P.lease_expires_at, P.wanted_by)
                .where(P.lease_owner.is_not(None), P.status == IS_AVAILABLE)
                .order_by(P.lease_owner, P.key)
                .limit(limit)
            ).all()
        return [
            {
                "key": r.key,
                "queue": r.queue,
                "gate": r.gate,
                "owner": r.lease_owner,
                "expires_at": _iso(r.lease_expires_at),
                "wanted_by": r.wanted_by,
            }
            for r in rows
        ]

    def queue_gauges(self, queue: str | None = None) -> dict[str, dict[tuple[str, ...], int]]:
        """Aggregates for /metrics, one row per queue (and status): partitions by status, backlog
        (available items of available partitions), failed items, leases held, live watchers."""

        def only(column: Any, query: Select[Any]) -> Select[Any]:
            return query.where(column == queue) if queue is not None else query

        with self.read() as conn:
            partitions_by_status = conn.execute(
                only(P.queue, select(P.queue, P.status, func.count()).group_by(P.queue, P.status))
            ).all()
            backlog = conn.execute(
                only(
                    P.queue,
                    select(P.queue, func.count())
                    .select_from(items.join(partitions, I.partition_id == P.id))
                    .where(I.status == IS_AVAILABLE, P.status == IS_AVAILABLE)
                    .group_by(P.queue),
                )
            ).all()
            failed = conn.execute(
                only(
                    P.queue,
                    select(P.queue, func.count())
                    .select_from(items.join(partitions, I.partition_id == P.id))
                    .where(I.status == IS_FAILED)
                    .group_by(P.queue),
                )
            ).all()
            leased = conn.execute(
                only(
                    P.queue,
                    select(P.queue, func.count())
                    .where(P.lease_owner.is_not(None), P.status == IS_AVAILABLE, P.lease_expires_at > db_now())
                    .group_by(P.queue),
                )
            ).all()
            alive = conn.execute(
                only(W.queue, select(W.queue, func.count()).where(W.expires_at > db_now()).group_by(W.queue))
            ).all()
        return {
            "partitions": {(q, st): n for q, st, n in partitions_by_status},
            "backlog": {(q,): n for q, n in backlog},
            "failed_items": {(q,): n for q, n in failed},
            "leases": {(q,): n for q, n in leased},
            "watchers": {(q,): n for q, n in alive},
        }

    # ------------------------------------------------------------ watchers: membership

    def register_watcher(
        self,
        watcher_id: str,
        *,
        host: str,
        pid: int,
        queue: str,
        concurrency: int,
        capacity: int,
        lease_seconds: float,
        slots: int = 0,
    ) -> None:
        with self.write() as conn:
            conn.execute(
                insert(watchers).values(
                    id=watcher_id,
                    host=host[:255],
                    pid=pid,
                    queue=queue,
                    concurrency=concurrency,
                    capacity=capacity,
                    started_at=db_now(),
                    heartbeat_at=db_now(),
                    expires_at=seconds_from_now(lease_seconds),
                    slots=slots,
                )
            )

    def unregister_watcher(self, watcher_id: str) -> None:
        with self.write() as conn:
            conn.execute(sa_delete(watchers).where(W.id == watcher_id))

    def heartbeat(self, watcher_id: str, lease_seconds: float, progress: Sequence[ProgressReport] = ()) -> list[Lease]:
        """Renew the watcher and all its leases; returns the leases it still holds. `progress`
        reports of items in flight are stored in the same transaction, fenced by lease epoch."""
        with self.write() as conn:
            alive = conn.execute(
                update(watchers)
                .where(W.id == watcher_id)
                .values(heartbeat_at=db_now(), expires_at=seconds_from_now(lease_seconds))
            ).rowcount
            if not alive:  # reaped while we were stalled: come back
                raise WatcherGone(watcher_id)
            conn.execute(
                update(partitions)
                .where(P.lease_owner == watcher_id, P.status == IS_AVAILABLE)
                .values(lease_expires_at=seconds_from_now(lease_seconds))
            )
            # Forget watchers that have been dead for a while (their leases expire on their own).
            conn.execute(sa_delete(watchers).where(W.expires_at < seconds_from_now(-10 * lease_seconds)))
            leases = self._owned(conn, watcher_id)
            if progress:  # the renewal above locked this watcher's partition rows: the fence holds
                self._store_progress(conn, leases, progress)
            return leases

    def partition_statuses(self, pids: Sequence[int]) -> dict[int, str]:
        """The status of each of these partitions (a watcher telling why a lease went)."""
        if not pids:
            return {}
        with self.read() as conn:
            return dict(conn.execute(select(P.id, P.status).where(P.id.in_(sorted(pids)))).all())

    def owned(self, watcher_id: str) -> list[Lease]:
        """The partitions currently leased to a watcher (with any steal request on them)."""
        with self.single() as conn:
            return self._owned(conn, watcher_id)

    def _owned(self, conn: Connection, watcher_id: str) -> list[Lease]:
        rows = conn.execute(
            select(P.id, P.key, P.lease_epoch, P.wanted_by, *_LEASE_SCHEDULE, _REMAINING)
            .where(P.lease_owner == watcher_id, P.status == IS_AVAILABLE)
            .order_by(P.id)
        )
        return [_lease(r, r.wanted_by) for r in rows]

    # ------------------------------------------------------------ watchers: leasing

    def acquire(self, watcher_id: str, queue: str, limit: int, lease_seconds: float) -> list[Lease]:
        """Lease up to `limit` partitions of `queue` that have work ready: highest priority, then
        oldest, first; unleased ones and ones whose lease expired (a takeover)."""
        if limit <= 0:
            return []
        if self.postgres:  # one statement, one round trip: the path from a notification to dispatch
            with self.single() as conn:
                params = {"queue": queue, "limit": limit, "watcher": watcher_id, "seconds": float(lease_seconds)}
                return [_lease(r, None) for r in conn.execute(_PG_ACQUIRE, params)]
        with self.write() as conn:
            now = db_now()
            candidates = conn.execute(
                select(P.id, P.lease_owner)
                .where(
                    P.queue == queue,
                    P.status == IS_AVAILABLE,
                    P.ready_at.is_not(None),
                    P.ready_at <= now,
                    or_(P.not_before.is_(None), P.not_before <= now),
                    or_(P.lease_owner.is_(None), P.lease_expires_at < now),
                )
                .order_by(P.priority.desc(), P.created_at, P.id)
                .limit(limit)
                .with_for_update(skip_locked=True)
            ).all()
            if not candidates:
                return []
            ids = [c.id for c in candidates]
            conn.execute(
                update(partitions)
                .where(P.id.in_(ids))
                .values(
                    lease_owner=watcher_id,
                    lease_epoch=P.lease_epoch + 1,
                    lease_expires_at=seconds_from_now(lease_seconds),
                    wanted_by=None,
                    version=P.version + 1,
                    updated_at=db_now(),
                )
            )
            self._events(
                conn,
                [
                    {
                        "partition_id": c.id,
                        "kind": "expired" if c.lease_owner else "leased",
                        "watcher": watcher_id,
                        "detail": json.dumps({"previous": c.lease_owner}) if c.lease_owner else None,
                    }
                    for c in candidates
                ],
            )
            rows = conn.execute(
                select(
                    P.id,
                    P.key,
                    P.lease_epoch,
                    *_LEASE_SCHEDULE,
                    _REMAINING,
                    F.watcher.label("pending_watcher"),
                    F.entries.label("pending_entries"),
                )
                .select_from(partitions.outerjoin(inflight, and_(F.partition_id == P.id, F.epoch < P.lease_epoch)))
                .where(P.id.in_(ids))
                .order_by(P.id)
            )
            return [_lease(r, None) for r in rows]

    def request_steals(self, watcher_id: str, queue: str, *, capacity: int, most: int) -> int:
        """Ask overloaded watchers to hand over partitions, toward a fair share for this one.

        Fair share = ceil(partitions with work in the queue / live watchers of the queue). A
        watcher below it marks at most `most` partitions of the busiest watcher above it as wanted;
        the owner hands them over once their in-flight items have finished. Returns how many
        partitions were marked.
        """
        with self.write() as conn:
            now = db_now()
            live = conn.execute(select(func.count()).where(W.queue == queue, W.expires_at > now)).scalar_one()
            active = conn.execute(
                select(func.count()).where(P.queue == queue, P.status == IS_AVAILABLE, P.ready_at.is_not(None))
            ).scalar_one()
            if live < 2 or active == 0:
                return 0
            share = math.ceil(active / live)
            held = dict(
                conn.execute(
                    select(P.lease_owner, func.count())
                    .where(
                        P.queue == queue, P.status == IS_AVAILABLE, P.lease_owner.is_not(None), P.lease_expires_at > now
                    )
                    .group_by(P.lease_owner)
                ).all()
            )
            pending = conn.execute(
                select(func.count()).where(P.wanted_by == watcher_id, P.status == IS_AVAILABLE)
            ).scalar_one()
            mine = held.pop(watcher_id, 0) + pending
            room = min(share, capacity) - mine
            if room <= 0 or not held:
                return 0
            victim, victim_count = max(held.items(), key=lambda kv: kv[1])
            # Only from a watcher above its share, and never so far that the two would swap roles.
            take = min(most, room, victim_count - share, (victim_count - mine) // 2)
            if take <= 0:
                return 0
            chosen = (
                select(P.id)
                .where(
                    P.lease_owner == victim, P.status == IS_AVAILABLE, P.wanted_by.is_(None), P.ready_at.is_not(None)
                )
                .order_by(P.priority, P.created_at.desc())
                .limit(take)
            )
            if self.postgres:
                chosen = chosen.with_for_update(skip_locked=True)
            ids = list(conn.execute(chosen).scalars())
            if not ids:
                return 0
            marked = conn.execute(
                update(partitions)
                .where(P.id.in_(ids), P.wanted_by.is_(None), P.lease_owner == victim)
                .values(wanted_by=watcher_id, version=P.version + 1)
            ).rowcount
            if marked:
                notify_wanted(conn, victim)
            return int(marked)

    def hand_over(self, watcher_id: str, lease: Lease, lease_seconds: float) -> str | None:
        """Give a wanted partition to the watcher that asked for it (if still alive).

        Returns the new owner, or None when the request was void (the thief is gone: the request is
        cleared and the partition stays with this watcher) or the lease was no longer ours.
        """
        with self.write() as conn:
            row = conn.execute(
                select(P.wanted_by, P.lease_epoch)
                .where(P.id == lease.partition_id, P.lease_owner == watcher_id)
                .with_for_update()
            ).one_or_none()
            if row is None or row.lease_epoch != lease.epoch or row.wanted_by is None:
                return None
            thief_alive = conn.execute(
                select(func.count()).where(W.id == row.wanted_by, W.expires_at > db_now())
            ).scalar_one()
            if not thief_alive:
                conn.execute(update(partitions).where(P.id == lease.partition_id).values(wanted_by=None))
                return None
            conn.execute(
                update(partitions)
                .where(P.id == lease.partition_id)
                .values(
                    lease_owner=row.wanted_by,
                    lease_epoch=P.lease_epoch + 1,
                    wanted_by=None,
                    lease_expires_at=seconds_from_now(lease_seconds),
                    version=P.version + 1,
                    updated_at=db_now(),
                )
            )
            self._event(conn, lease.partition_id, "stolen", watcher=row.wanted_by, detail={"from": watcher_id})
            conn.execute(sa_delete(inflight).where(F.partition_id == lease.partition_id))  # nothing was in flight
            notify_ready(conn, conn.execute(select(P.queue).where(P.id == lease.partition_id)).scalar_one())
            thief: str | None = row.wanted_by
            return thief

    def release(
        self,
        watcher_id: str,
        leases: Sequence[Lease],
        *,
        kind: str = "yielded",
        abandoned: dict[int, list[tuple[int, int]]] | None = None,
        max_attempts: int = 5,
    ) -> int:
        """Give up leases at once (shutdown: `yielded`), so others need not wait for expiry.

        `abandoned`: per partition, the (item id, version) of deliveries still running that the
        watcher gives up on; each is charged as a lost delivery now."""
        if not leases:
            return 0
        with self.write() as conn:
            pairs = [(lease.partition_id, lease.epoch) for lease in leases]
            ids = list(
                conn.execute(
                    select(P.id)
                    .where(tuple_(P.id, P.lease_epoch).in_(pairs), P.lease_owner == watcher_id)
                    .with_for_update()
                ).scalars()
            )
            if not ids:
                return 0
            for pid in ids:
                if abandoned and abandoned.get(pid):
                    reason = (
                        "watcher {watcher} stopped during delivery {attempt}: still running after the shutdown grace"
                    )
                    self._charge(conn, pid, watcher_id, encode_inflight(abandoned[pid]), max_attempts, reason)
            conn.execute(sa_delete(inflight).where(F.partition_id.in_(ids)))
            conn.execute(
                update(partitions)
                .where(P.id.in_(ids), P.lease_owner == watcher_id)
                .values(**LEASE_CLEARED, version=P.version + 1, updated_at=db_now())
            )
            self._events(conn, [{"partition_id": pid, "kind": kind, "watcher": watcher_id} for pid in ids])
            for queue in set(conn.execute(select(P.queue).where(P.id.in_(ids))).scalars()):
                notify_ready(conn, queue)  # another watcher can take them at once
            return len(ids)

    # ------------------------------------------------------------ watchers: lost deliveries

    def charge_lost(self, watcher_id: str, lease: Lease, *, max_attempts: int) -> list[dict[str, Any]]:
        """Count the deliveries a partition's previous lease holder left unanswered (`lease.pending`,
        read when `watcher_id` took the partition over) as failed attempts, before anything of it is
        fetched again. Returns what was charged (item, gate, attempt, error, failed) for the logs.

        A delivery lost while the item was delivered alone (isolated) counts fully: an item whose
        processing kills its watcher fails after `max_attempts`. One lost among others counts too,
        but never fails the item (it stops at max_attempts - 1): the item that killed the watcher
        may have been another one; the watcher delivers such suspects alone (see `isolate`)."""
        if lease.pending is None:
            return []
        with self.write() as conn:
            held = conn.execute(
                select(P.id)
                .where(
                    P.id == lease.partition_id,
                    P.lease_owner == watcher_id,
                    P.lease_epoch == lease.epoch,
                    P.status == IS_AVAILABLE,
                )
                .with_for_update()
            ).first()
            if held is None:
                return []
            row = conn.execute(
                select(F.watcher, F.entries)
                .where(F.partition_id == lease.partition_id, F.epoch < lease.epoch)
                .with_for_update()
            ).first()
            conn.execute(sa_delete(inflight).where(F.partition_id == lease.partition_id, F.epoch < lease.epoch))
            if row is None:
                return []
            reason = "watcher {watcher} died or stalled during delivery {attempt}"
            charged = self._charge(conn, lease.partition_id, row.watcher, row.entries, max_attempts, reason)
            if charged:
                self._settle(conn, lease.partition_id, watcher=watcher_id)
            return charged

    def _charge(
        self, conn: Connection, pid: int, watcher: str, entries: str, max_attempts: int, reason: str
    ) -> list[dict[str, Any]]:
        """Charge the unanswered deliveries among `entries` (items still available, same version)."""
        wanted = decode_inflight(entries)
        if not wanted:
            return []
        rows = conn.execute(
            select(I.id, I.version, I.gate, I.attempts, I.deliveries)
            .where(I.id.in_(sorted(wanted)), I.partition_id == pid, I.status == IS_AVAILABLE)
            .order_by(I.id)
        ).all()
        charged, updates, records = [], [], []
        for r in rows:
            version, alone = wanted[r.id]
            if r.version != version:
                continue  # answered since it was taken
            attempt = r.attempts + 1
            counted = attempt if alone else max(r.attempts, min(attempt, max_attempts - 1))
            failed = alone and attempt >= max_attempts
            error = reason.format(watcher=watcher, attempt=attempt) + (" (delivered alone)" if alone else "")
            charged.append({"item": r.id, "gate": r.gate, "attempt": attempt, "error": error, "failed": failed})
            updates.append(
                {
                    "b_id": r.id,
                    "b_version": r.version,
                    "b_attempts": counted,
                    "b_status": FAILED if failed else AVAILABLE,
                    "b_error": error,
                }
            )
            records.append(
                {
                    "partition_id": pid,
                    "item_id": r.id,
                    "n": r.deliveries + 1,
                    "attempt": attempt,
                    "gate": r.gate,
                    "watcher": watcher,
                    "outcome": "lost",
                    "error": error,
                }
            )
        if updates:
            conn.execute(_CHARGE_LOST, updates)
            conn.execute(insert(attempts).values(ended_at=db_now()), records)
            self._events(
                conn,
                [
                    {
                        "partition_id": pid,
                        "item_id": c["item"],
                        "watcher": watcher,
                        "kind": "item_failed" if c["failed"] else "item_lost",
                        "detail": json.dumps({"gate": c["gate"], "attempts": c["attempt"], "error": c["error"]}),
                    }
                    for c in charged
                ],
            )
        return charged

    def isolate(self, watcher_id: str, item: ReadyItem) -> bool:
        """Record that `item` alone is in flight at `watcher_id` (which has nothing else in flight):
        if the watcher dies now, the item is charged a full attempt. False when the lease is gone."""
        with self.write() as conn:
            conn.execute(sa_delete(inflight).where(F.watcher == watcher_id))
            held = conn.execute(
                select(P.id).where(
                    P.id == item.partition_id,
                    P.lease_owner == watcher_id,
                    P.lease_epoch == item.epoch,
                    P.status == IS_AVAILABLE,
                )
            ).first()
            if held is None:
                return False
            entries = "=" + encode_inflight([(item.id, item.version)], alone=True)
            params = {"pid": item.partition_id, "watcher": watcher_id, "epoch": item.epoch, "entries": entries}
            conn.execute(_SQLITE_MARK_INFLIGHT, params)  # standard SQL upsert: both databases
            return True

    # ------------------------------------------------------------ watchers: items

    def fetch_ready(
        self,
        watcher_id: str,
        limit: int,
        exclude: Iterable[int] = (),
        *,
        slots: SlotClaim | None = None,
        closed: Iterable[int] = (),
        kept: dict[int, list[tuple[int, int]]] | None = None,
    ) -> list[ReadyItem]:
        """Items at the current gate of this watcher's partitions (not wanted by a thief) that are due,
        skipping `exclude` (items already in flight here): partitions by priority then age, items in
        the order they became ready. Partitions in `closed` (outside their time windows) are skipped.

        With `slots` (the watcher's queue has a concurrency limit) the fetch is also the slot claim:
        see `_fetch_within_limit`.

        The items returned are recorded as in flight (`feedproc_inflight`) before they are returned,
        appended to what the partition's record holds, or, for the partitions in `kept` (partition id
        -> (item id, version) of the items still in flight from earlier fetches), replacing it with
        those and these: a watcher that takes a partition over charges whatever is still there."""
        excluded, shut, kept = sorted(set(exclude)), sorted(set(closed)), kept or {}
        if slots is not None:
            return self._fetch_within_limit(watcher_id, limit, excluded, slots, shut, kept)
        if limit <= 0:
            return []
        if self.postgres:
            with self.single() as conn:
                return self._fetch_ready_pg(conn, watcher_id, limit, excluded, shut, kept)
        with self.write() as conn:
            return self._fetch_ready_sqlite(conn, watcher_id, limit, excluded, shut, kept)

    def _mark_inflight(
        self, conn: Connection, watcher_id: str, found: list[ReadyItem], kept: dict[int, list[tuple[int, int]]]
    ) -> list[ReadyItem]:
        """Record `found` (and `kept`) as in flight, per partition; the items of partitions whose
        record a newer lease holds are dropped (PostgreSQL; SQLite's write lock rules that out)."""
        if not found:
            return found
        taken: dict[int, list[tuple[int, int]]] = {}
        epochs: dict[int, int] = {}
        for item in found:
            taken.setdefault(item.partition_id, []).append((item.id, item.version))
            epochs[item.partition_id] = item.epoch
        pids = sorted(taken)
        entries = [
            "=" + encode_inflight([*kept[pid], *taken[pid]]) if pid in kept else encode_inflight(taken[pid])
            for pid in pids
        ]
        if not self.postgres:
            rows = [
                {"pid": pid, "watcher": watcher_id, "epoch": epochs[pid], "entries": e}
                for pid, e in zip(pids, entries, strict=True)
            ]
            conn.execute(_SQLITE_MARK_INFLIGHT, rows)
            return found
        params = {
            "watcher": watcher_id,
            "pids": pg_bigint_array(pids),
            "epochs": pg_bigint_array(epochs[pid] for pid in pids),
            "entries": entries,
        }
        marked = {row[0] for row in _PG_MARK_INFLIGHT.rows(conn, params)}
        return found if len(marked) == len(pids) else [item for item in found if item.partition_id in marked]

    def _leased_for_dispatch(self, watcher_id: str) -> Any:
        return select(P.id, P.key, P.queue, P.lease_epoch, P.gate, P.priority, P.created_at, P.weight).where(
            P.lease_owner == watcher_id,
            P.status == IS_AVAILABLE,
            P.wanted_by.is_(None),
            P.lease_expires_at > db_now(),
            P.ready_at <= db_now(),
        )

    def _ready_items_of(self, partition: Any, excluded: list[int], columns: tuple[Any, ...] | None = None) -> Any:
        columns = columns or (I.id, I.version, I.gate, I.attempts, I.data, I.next_attempt_at, I.deliveries, I.lost)
        query = select(*columns).where(
            I.partition_id == partition.c.id,
            I.gate == partition.c.gate,
            I.status == IS_AVAILABLE,
            I.next_attempt_at <= db_now(),
        )
        if excluded and self.postgres:  # one array parameter, however many items are in flight
            query = query.where(I.id != func.all(bindparam("excluded", excluded, type_=ARRAY(BigInteger()))))
        elif excluded:
            query = query.where(I.id.not_in(bindparam("excluded", excluded, expanding=True)))
        return query

    def _fetch_ready_pg(
        self,
        conn: Connection,
        watcher_id: str,
        limit: int,
        excluded: list[int],
        closed: list[int],
        kept: dict[int, list[tuple[int, int]]],
    ) -> list[ReadyItem]:
        params = {"watcher": watcher_id, "excluded": pg_bigint_array(excluded), "limit": limit}
        params["closed"] = pg_bigint_array(closed)
        # fetchall and positional rows: the columns are ReadyItem's fields, in order.
        found = [ReadyItem(*row) for row in _PG_FETCH_READY.rows(conn, params)]
        return self._mark_inflight(conn, watcher_id, found, kept)

    def _fetch_ready_sqlite(
        self,
        conn: Connection,
        watcher_id: str,
        limit: int,
        excluded: list[int],
        closed: list[int],
        kept: dict[int, list[tuple[int, int]]],
    ) -> list[ReadyItem]:
        # SQLite has no LATERAL; it is in-process, so one short query per partition costs little.
        owned = conn.execute(
            self._leased_for_dispatch(watcher_id).order_by(P.priority.desc(), P.created_at, P.id)
        ).all()
        found: list[ReadyItem] = []
        for p in owned:
            if p.id in closed:
                continue
            alias = partitions.alias("p")
            query = (
                self._ready_items_of(alias, excluded)
                .where(alias.c.id == p.id)
                .order_by(I.next_attempt_at, I.id)
                .limit(limit - len(found))
            )
            found += [
                ReadyItem(
                    r.id,
                    r.version,
                    p.id,
                    p.key,
                    p.queue,
                    p.lease_epoch,
                    r.gate,
                    r.attempts,
                    r.data,
                    p.weight,
                    r.deliveries,
                    r.lost,
                )
                for r in conn.execute(query)
            ]
            if len(found) >= limit:
                break
        return self._mark_inflight(conn, watcher_id, found, kept)

    def apply(self, watcher_id: str, outcomes: Sequence[Outcome], *, idle_after: float = 10.0) -> Applied:
        """Write a batch of outcomes in one fenced transaction (a group commit).

        Outcomes of partitions no longer leased to `watcher_id` under the epoch they were
        dispatched with are dropped (reported in `Applied.lost`). Then the touched partitions are
        settled by the gate rules; partitions that finish, go idle, or have nothing due within
        `idle_after` seconds are released.
        """
        applied = Applied()
        if not outcomes:
            return applied
        with self.write() as conn:
            pids = sorted({o.partition_id for o in outcomes})
            if self.postgres:
                params = {"pids": pg_bigint_array(pids), "watcher": watcher_id}
                held = dict(conn.execute(_PG_LOCK_HELD_LEASES, params).all())
            else:
                held = dict(conn.execute(_LOCK_HELD_LEASES, {"pids": pids, "watcher": watcher_id}).all())
            kept = [o for o in outcomes if held.get(o.partition_id) == o.epoch]
            applied.lost = {o.partition_id for o in outcomes if held.get(o.partition_id) != o.epoch}
            if kept:
                self._write_outcomes(conn, kept, watcher_id)
                advanced: list[tuple[int, int, int]] = []
                for pid, move in self._settle_after_answers(conn, kept, watcher_id, idle_after, advanced).items():
                    if move in (Move.COMPLETE, Move.FAIL, Move.WAIT):
                        applied.released.add(pid)
                        applied.moves[pid] = move.value
                applied.advanced = len(advanced)
                applied.advances = advanced
            applied.written = [o.item_id for o in kept]
        return applied

    def _write_outcomes(self, conn: Connection, kept: list[Outcome], watcher_id: str) -> None:
        """Update the answered items (version-guarded), add their children, record each delivery that
        did not complete its item (the completing one is recorded on the item row) and failures."""
        rows: list[dict[str, Any]] = []
        completed, children, history, records, trimmed = [], [], [], [], []
        for o in kept:
            if (o.kind == Kind.MOVE and (o.new_gate is None or o.new_gate <= o.gate)) or any(
                c.gate < o.gate for c in o.children
            ):
                raise ValueError(f"outcome for item {o.item_id} would place an item below gate {o.gate}")
            failure = o.kind in (Kind.RETRY, Kind.FAIL)
            error = truncate_error(o.error or "failed") if failure else None
            if self.postgres and o.kind == Kind.DONE and o.data is None:
                completed.append(o)  # the common answer: a narrow statement of its own
            else:
                rows.append(
                    {
                        "id": o.item_id,
                        "version": o.version,
                        "status": COMPLETE if o.kind == Kind.DONE else FAILED if o.kind == Kind.FAIL else AVAILABLE,
                        "gate": o.new_gate if o.kind == Kind.MOVE else o.gate,
                        "data": None if failure else o.data,
                        "attempts": 0 if o.kind == Kind.MOVE else o.attempts,
                        "error": error,
                        "clear": o.kind in (Kind.DONE, Kind.MOVE),
                        "delay": float(o.delay),
                        "progress": o.progress,
                        "started": o.started_us,
                        "duration": o.duration_us,
                    }
                )
            if o.kind != Kind.DONE:
                records.append(
                    {
                        "partition_id": o.partition_id,
                        "item_id": o.item_id,
                        "n": o.n,
                        "attempt": o.attempt,
                        "gate": o.gate,
                        "watcher": watcher_id,
                        "started_at": _from_micros(o.started_us),
                        "duration": None if o.duration_us is None else o.duration_us / 1e6,
                        "outcome": RECORD_OUTCOMES[o.kind],
                        "error": _record_error(o) if failure else None,
                    }
                )
                if o.n > 2 * RECORDS_KEPT:  # keep the first and the last RECORDS_KEPT of each item
                    trimmed.append((o.item_id, o.n - RECORDS_KEPT))
            children += [
                {
                    "partition_id": o.partition_id,
                    "gate": c.gate,
                    "status": AVAILABLE,
                    "data": c.data,
                    "parent_id": o.item_id,
                    "parent_gate": o.gate,
                    "seq": n,
                }
                for n, c in enumerate(o.children)
            ]
            if failure:
                assert error is not None
                detail = {"gate": o.gate, "attempts": o.attempts, "error": error[:500]}
                if o.kind == Kind.RETRY:
                    detail["retry_in"] = round(o.delay, 3)
                history.append(
                    {
                        "partition_id": o.partition_id,
                        "item_id": o.item_id,
                        "watcher": watcher_id,
                        "kind": "item_failed" if o.kind == Kind.FAIL else "item_retried",
                        "detail": json.dumps(detail),
                    }
                )
        matched = 0
        if completed:
            params = {
                "id": pg_bigint_array(o.item_id for o in completed),
                "version": pg_bigint_array(o.version for o in completed),
                "started": _micros_array(o.started_us for o in completed),
                "duration": _micros_array(o.duration_us for o in completed),
                "watcher": watcher_id,
            }
            matched += _PG_COMPLETE_ITEMS.run(conn, params)
        if rows and self.postgres:
            columns: dict[str, Any] = {c: [r[c] for r in rows] for c in _OUTCOME_COLUMNS}
            matched += conn.execute(_PG_UPDATE_ITEMS, {**columns, "watcher": watcher_id}).rowcount
        elif rows:
            for r in rows:
                r["started"] = _from_micros(r["started"])
                r["duration"] = None if r["duration"] is None else r["duration"] / 1e6
            matched += conn.execute(
                _UPDATE_ITEM, [{"b_watcher": watcher_id, **{f"b_{k}": v for k, v in r.items()}} for r in rows]
            ).rowcount
        if matched != len(kept):
            raise StaleWrite(f"only {matched} of {len(kept)} item updates matched their expected version")
        if children:
            self._insert_rows(conn, children)
        if records:
            conn.execute(insert(attempts).values(ended_at=db_now()), records)
        if trimmed:
            conn.execute(sa_delete(attempts).where(tuple_(A.item_id, A.n).in_([tuple_(i, n) for i, n in trimmed])))
        self._events(conn, history)

    def _settle_after_answers(
        self,
        conn: Connection,
        kept: list[Outcome],
        watcher_id: str,
        idle_after: float,
        advanced: list[tuple[int, int, int]],
    ) -> dict[int, Move]:
        """Settle the partitions a batch touched, cheaply: one statement refreshes each one's
        `ready_at`; partitions whose gate drained go through the full gate rules, and partitions
        with nothing due for `idle_after` seconds are released, so that a watcher full of waiting
        partitions does not starve partitions with work ready elsewhere."""
        pids = sorted({o.partition_id for o in kept})
        refresh = _PG_REFRESH_READY_AT if self.postgres else _REFRESH_READY_AT
        rows = conn.execute(refresh, {"pids": pids, "idle_after": float(idle_after)}).all()
        moves: dict[int, Move] = {}
        idle = []
        for row in rows:
            if row.ready_at is None:
                known = row if self.postgres else None
                moves[row.id] = self._settle(conn, row.id, watcher=watcher_id, advanced=advanced, row=known)
            elif row.idle:
                idle.append(row.id)
                moves[row.id] = Move.WAIT
        if idle:
            conn.execute(
                update(partitions)
                .where(P.id.in_(idle))
                .values(**LEASE_CLEARED, version=P.version + 1, updated_at=db_now())
            )
            conn.execute(sa_delete(inflight).where(F.partition_id.in_(idle)))
            self._events(
                conn,
                [
                    {
                        "partition_id": pid,
                        "kind": "released",
                        "watcher": watcher_id,
                        "detail": json.dumps({"reason": "nothing due"}),
                    }
                    for pid in idle
                ],
            )
        return moves

    # ------------------------------------------------------------ scheduling controls (issue 7)
    #
    # Queue settings (concurrency limit, windows) live in feedproc_queues; a queue without a row has
    # neither. The limit is arbitrated here: slots are the weights of the items each live watcher has
    # in flight (feedproc_watchers.slots), set under the queue row's lock in the transaction that
    # fetches the items (to what the watcher still runs plus what it takes), so answered items' slots
    # come back with the watcher's next fetch and a dead watcher's stop counting when it expires.

    def set_queue(
        self,
        name: str,
        *,
        limit: int | None = None,
        windows: str | Sequence[str] | None = None,
        window_tz: str | None = None,
        clear_windows: bool = False,
    ) -> QueueSettings:
        """Create or change a queue's settings; arguments left None keep their current value.
        A limit < 1 means no limit. Returns the settings now stored."""
        check_queue(name)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise InvalidInput(f"limit must be an integer, got {limit!r}")
        parsed = timewindows.parse_windows(windows) if windows is not None else None
        if window_tz is not None:
            timewindows.zone(window_tz)
        with self.write() as conn:
            current = self._queue(conn, name, lock=True)
            values: dict[str, Any] = {
                "concurrency_limit": current.limit if limit is None else max(limit, 0),
                "windows": current.windows,
                "window_tz": current.window_tz,
            }
            if clear_windows:
                values.update(windows=None, window_tz=None)
            if parsed is not None:
                values["windows"] = timewindows.format_windows(parsed)
            if window_tz is not None:
                if values["windows"] is None:
                    raise InvalidInput("a time zone applies to windows: give --window too")
                values["window_tz"] = None if window_tz.upper() in ("UTC", "Z") else window_tz
            exists_already = conn.execute(select(Q.name).where(Q.name == name)).first() is not None
            if exists_already:
                conn.execute(update(queues).where(Q.name == name).values(updated_at=db_now(), **values))
            else:
                conn.execute(insert(queues).values(name=name, updated_at=db_now(), **values))
            notify_ready(conn, name)  # a raised limit or an opened window: watchers look again
            return self._queue(conn, name)

    def queue_settings(self, name: str) -> QueueSettings:
        """A queue's settings (defaults when it has no row): read by watchers once per poll interval."""
        with self.single() as conn:
            return self._queue(conn, name)

    def queues(self) -> list[dict[str, Any]]:
        """Every queue with settings or partitions: its limit, slots in use, windows and whether open."""
        now = _utcnow()
        with self.read() as conn:
            names = set(conn.execute(select(Q.name)).scalars()) | set(
                conn.execute(select(P.queue).where(P.status == IS_AVAILABLE).distinct()).scalars()
            )
            return [self._queue(conn, name).describe(now, self._slots_in_use(conn, name)) for name in sorted(names)]

    def queue(self, name: str) -> dict[str, Any]:
        """One queue's settings and state (as in `queues`)."""
        check_queue(name)
        with self.read() as conn:
            return self._queue(conn, name).describe(_utcnow(), self._slots_in_use(conn, name))

    def _queue(self, conn: Connection, name: str, *, lock: bool = False) -> QueueSettings:
        query = select(Q.concurrency_limit, Q.windows, Q.window_tz).where(Q.name == name)
        if lock and self.postgres:
            query = query.with_for_update()
        row = conn.execute(query).one_or_none()
        if row is None:
            return QueueSettings(name)
        return QueueSettings(name, row.concurrency_limit, row.windows, row.window_tz)

    def _slots_in_use(self, conn: Connection, queue: str) -> int:
        """Weights in flight for `queue`: the slots of its live watchers."""
        return int(
            conn.execute(
                select(func.coalesce(func.sum(W.slots), 0)).where(W.queue == queue, W.expires_at > db_now())
            ).scalar_one()
        )

    def _fetch_within_limit(
        self,
        watcher_id: str,
        want: int,
        excluded: list[int],
        claim: SlotClaim,
        closed: list[int],
        kept: dict[int, list[tuple[int, int]]],
    ) -> list[ReadyItem]:
        """Fetch ready items only as far as the queue's concurrency limit allows, and take their slots,
        in one write transaction under the queue row's lock (SQLite: BEGIN IMMEDIATE).

        Free = limit - slots of the queue's other live watchers - `claim.held` (the weight this
        watcher still has in flight, which it knows exactly). Items are taken in dispatch order while
        their weights fit (a weight above the limit counts as the limit, so such an item runs alone);
        the watcher's row is then set to held + taken. A dead watcher's slots stop counting when its
        registration expires."""
        with self.write() as conn:
            settings = self._queue(conn, claim.queue, lock=True)
            taken: list[ReadyItem] = []
            if not settings.limited:  # the limit was lifted meanwhile
                self._set_slots(conn, watcher_id, 0)
                if want > 0:
                    fetch = self._fetch_ready_pg if self.postgres else self._fetch_ready_sqlite
                    taken = fetch(conn, watcher_id, want, excluded, closed, kept)
                return taken
            others = int(
                conn.execute(
                    select(func.coalesce(func.sum(W.slots), 0)).where(
                        W.queue == claim.queue, W.expires_at > db_now(), W.id != watcher_id
                    )
                ).scalar_one()
            )
            free = settings.limit - others - claim.held
            if free > 0 and want > 0:
                fetch = self._fetch_ready_pg if self.postgres else self._fetch_ready_sqlite
                for item in fetch(conn, watcher_id, min(want, free), excluded, closed, kept):
                    weight = min(item.weight, settings.limit)
                    if weight > free:
                        break  # strict dispatch order: a heavy item is not overtaken by lighter ones
                    free -= weight
                    taken.append(replace(item, weight=weight))
            self._set_slots(conn, watcher_id, claim.held + sum(item.weight for item in taken))
            return taken

    def defer(self, watcher_id: str, deferred: Sequence[tuple[Lease, datetime]]) -> int:
        """Give up leased partitions whose time window is closed until it opens: the lease is
        released (fenced by epoch) and `ready_at` moved to the opening, so no watcher leases them
        before then. Returns how many were deferred."""
        if not deferred:
            return 0
        with self.write() as conn:
            opens = {lease.partition_id: (lease.epoch, when) for lease, when in deferred}
            held = conn.execute(
                select(P.id, P.lease_epoch)
                .where(P.id.in_(sorted(opens)), P.lease_owner == watcher_id, P.status == IS_AVAILABLE)
                .order_by(P.id)
                .with_for_update()
            ).all()
            done = 0
            for row in held:
                epoch, when = opens[row.id]
                if row.lease_epoch != epoch:
                    continue
                opening = literal(when, partitions.c.ready_at.type)
                conn.execute(
                    update(partitions)
                    .where(P.id == row.id)
                    .values(
                        **LEASE_CLEARED,
                        ready_at=case((P.ready_at.is_(None), None), (P.ready_at > opening, P.ready_at), else_=opening),
                        version=P.version + 1,
                        updated_at=db_now(),
                    )
                )
                detail = {"reason": "window closed", "opens_at": _iso(when)}
                self._event(conn, row.id, "deferred", watcher=watcher_id, detail=detail)
                conn.execute(sa_delete(inflight).where(F.partition_id == row.id))  # nothing was in flight
                done += 1
            return done

    def _set_slots(self, conn: Connection, watcher_id: str, slots: int) -> None:
        done = conn.execute(update(watchers).where(W.id == watcher_id).values(slots=max(slots, 0)))
        if done.rowcount == 0:  # reaped: its slots would go uncounted; claim none until it registers again
            raise WatcherGone(watcher_id)

    def _store_progress(self, conn: Connection, leases: list[Lease], reports: Sequence[ProgressReport]) -> None:
        """Write progress reports of items still available at the gate they were dispatched at, in
        partitions still leased under the epoch they were dispatched with (others are dropped)."""
        epochs = {lease.partition_id: lease.epoch for lease in leases}
        rows = [
            {"b_id": r.item_id, "b_gate": r.gate, "b_progress": r.fraction}
            for r in reports
            if epochs.get(r.partition_id) == r.epoch
        ]
        if rows:
            conn.execute(
                update(items)
                .where(I.id == bindparam("b_id"), I.gate == bindparam("b_gate"), I.status == IS_AVAILABLE)
                .values(progress=bindparam("b_progress")),
                rows,
            )

    def _schedule_status(self, conn: Connection, row: Row[Any], counts: dict[str, dict[str, int]]) -> dict[str, Any]:
        """The additive `status KEY` keys of issue 7: `schedule` (weight, item timeout, windows and
        when the next one opens, the queue's limit) and `progress` (per gate done / total and the
        mean progress of items in flight)."""
        now = _utcnow()
        queue = self._queue(conn, row.queue)
        own = timewindows.parse_windows(row.windows)
        own_tz = timewindows.zone(row.window_tz)
        schedule: dict[str, Any] = {
            "weight": row.weight,
            "item_timeout": row.item_timeout,
            "windows": row.windows,
            "timezone": row.window_tz or "UTC",
            "queue": queue.describe(now, self._slots_in_use(conn, row.queue)),
        }
        opens = timewindows.next_dispatch(((own, own_tz), (queue.parsed, queue.zone)), now)
        schedule["window_open"] = opens == now
        schedule["next_window_opens_at"] = None if opens in (now, None) else _iso(opens)
        if opens is None:
            schedule["windows_never_overlap"] = True  # the partition's and the queue's
        reported = conn.execute(
            select(I.gate, func.count(I.progress), func.avg(I.progress))
            .where(I.partition_id == row.id, I.status == IS_AVAILABLE, I.progress.is_not(None))
            .group_by(I.gate)
        ).all()
        in_flight = {gate: (n, float(mean)) for gate, n, mean in reported}
        per_gate, done_all, total_all = {}, 0, 0
        for gate, by_status in counts.items():  # the per-gate counts `status` read already
            total = sum(by_status.values())
            done = total - by_status.get(AVAILABLE, 0)
            n, mean = in_flight.get(int(gate), (0, None))
            per_gate[gate] = {"done": done, "total": total, "in_flight": n, "mean_progress": mean}
            done_all, total_all = done_all + done, total_all + total
        return {"schedule": schedule, "progress": {"done": done_all, "total": total_all, "gates": per_gate}}

    # ------------------------------------------------------------ the gate rules, applied

    def _facts(self, conn: Connection, row: Row[Any]) -> GateFacts:
        """The gate rules' inputs for partition `row` (read from the items)."""
        facts = conn.execute(select(*_gate_facts(row.id, row.gate))).one()
        return _to_gate_facts(row, facts)

    def _settle(
        self,
        conn: Connection,
        pid: int,
        *,
        checkpoint: bool = False,
        watcher: str | None = None,
        advanced: list[tuple[int, int, int]] | None = None,
        row: Row[Any] | None = None,
    ) -> Move:
        """Apply the gate rules to a (locked) available partition and record what happened.

        Sets `ready_at` (earliest due item at the current gate), moves the gate past drained and
        empty gates, fails or completes the partition. A watcher passing `watcher` also gives up its
        lease when the partition finishes or has nothing to do. Each gate advance appends `pid` to
        `advanced`, when given. `row`: the partition's `_SETTLE_COLUMNS` and gate facts, when the
        caller read them already in this transaction.
        """
        if row is None:  # the partition and its gate facts in one round trip
            row = conn.execute(select(*_SETTLE_COLUMNS, *_gate_facts(P.id, P.gate)).where(P.id == pid)).one()
        outcome = gates.settle(_to_gate_facts(row, row), checkpoint=checkpoint)
        if outcome.move is Move.ADVANCE:
            self._event(conn, pid, "gate_advanced", watcher=watcher, detail={"from": row.gate, "to": outcome.gate})
            # The new gate is the lowest one above with available items (GateFacts.next_gate), where
            # the rules keep the partition (STAY): set its ready_at now instead of settling again.
            self._touch(conn, pid, gate=outcome.gate, ready_at=_earliest_due(pid, outcome.gate))
            if advanced is not None:
                advanced.append((pid, row.gate, outcome.gate))
        elif outcome.move is Move.STAY:
            conn.execute(update(partitions).where(P.id == pid).values(ready_at=_earliest_due(pid, row.gate)))
        if outcome.move in (Move.ADVANCE, Move.STAY):
            if watcher is None:  # a producer made work ready: wake the queue's watchers
                notify_ready(conn, row.queue)
            return Move.STAY
        if watcher and outcome.move in (Move.WAIT, Move.FAIL, Move.COMPLETE):
            conn.execute(sa_delete(inflight).where(F.partition_id == pid))  # its lease holder lets it go
        if outcome.move is Move.WAIT:
            self._touch(conn, pid, ready_at=None, **(LEASE_CLEARED if watcher else {}))
            if watcher:
                self._event(conn, pid, "released", watcher=watcher, detail={"gate": row.gate, "reason": "idle"})
        elif outcome.move is Move.FAIL:
            self._touch(conn, pid, status=FAILED, ready_at=None, **LEASE_CLEARED)
            self._event(conn, pid, "failed", watcher=watcher, detail={"gate": row.gate})
            notify_finished(conn, row.key)
        elif outcome.move is Move.COMPLETE:
            self._touch(conn, pid, status=COMPLETE, ready_at=None, **LEASE_CLEARED)
            self._event(conn, pid, "completed", watcher=watcher, detail={"gate": row.gate})
            notify_finished(conn, row.key)
        return outcome.move

    # ------------------------------------------------------------ helpers

    def _lock(self, conn: Connection, key: str) -> Row[Any]:
        row = conn.execute(select(partitions).where(P.key == key).with_for_update()).one_or_none()
        if row is None:
            raise NotFound(f"no partition {key!r}")
        return row

    def _touch(self, conn: Connection, pid: int, **values: Any) -> None:
        conn.execute(update(partitions).where(P.id == pid).values(version=P.version + 1, updated_at=db_now(), **values))

    def _insert_items(
        self, conn: Connection, pid: int, new_items: Iterable[Any], partition_gate: int | None
    ) -> tuple[int, int]:
        """Insert items in multi-row chunks; returns (count, lowest gate)."""
        count, lowest, gates_, data = 0, None, [], []
        for n, value in enumerate(new_items, start=1):
            item = NewItem.coerce(value, where=f"item {n}: ")
            if partition_gate is not None and (reason := gates.check_not_below(item.gate, partition_gate)):
                raise Refused(f"item {n}: {reason}")
            lowest = item.gate if lowest is None else min(lowest, item.gate)
            gates_.append(item.gate)
            data.append(item.data)
            count += 1
            if len(gates_) >= INSERT_CHUNK:
                self._insert_new(conn, pid, gates_, data)
                gates_, data = [], []
        if gates_:
            self._insert_new(conn, pid, gates_, data)
        return count, lowest if lowest is not None else 0

    def _insert_new(self, conn: Connection, pid: int, gates_: list[int], data: list[bytes]) -> None:
        """Insert a producer's items (no parent) of partition `pid`."""
        if self.postgres:  # one statement, two arrays (the gates as a text literal: see pg_bigint_array)
            conn.execute(_PG_INSERT_NEW_ITEMS, {"pid": pid, "gate": pg_bigint_array(gates_), "data": data})
        else:
            rows = zip(gates_, data, strict=True)
            self._insert_rows(conn, [{"partition_id": pid, "gate": g, "status": AVAILABLE, "data": d} for g, d in rows])

    def _insert_rows(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        """Insert item rows (partition_id, gate, status, data[, parent_id, parent_gate, seq])."""
        rows = [{"parent_id": None, "parent_gate": None, "seq": None, **row} for row in rows]
        if self.postgres:
            # One statement for the whole chunk: arrays in, unnest, one row each.
            conn.execute(_PG_INSERT_ITEMS, {column: [row[column] for row in rows] for column in _ITEM_COLUMNS})
        else:
            # SQLite's executemany runs in C against a local file: as fast as it gets there.
            conn.execute(insert(items).values(next_attempt_at=db_now(), created_at=db_now(), updated_at=db_now()), rows)

    def _event(
        self,
        conn: Connection,
        pid: int,
        kind: str,
        *,
        item_id: int | None = None,
        watcher: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        self._events(
            conn,
            [
                {
                    "partition_id": pid,
                    "kind": kind,
                    "item_id": item_id,
                    "watcher": watcher,
                    "detail": json.dumps(detail) if detail is not None else None,
                }
            ],
        )

    def _events(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        if rows:
            conn.execute(
                insert(events).values(at=db_now()),
                [{"item_id": None, "watcher": None, "detail": None, **row} for row in rows],
            )


# The ready items of a watcher's partitions, in dispatch order, in one statement: for each leased
# partition LATERAL walks feedproc_items_by_gate in due order (ids only: an index-only scan,
# stopped at `limit`); the best `limit` overall are then joined back to their rows for the data.
# Items in flight here are skipped with `NOT IN (SELECT unnest(...))`, which PostgreSQL runs as one
# hashed subplan: `<> ALL(array)` compares each candidate with every excluded id (2-10x slower
# with a few hundred in flight).
_PG_FETCH_READY = DriverStatement(
    """
    SELECT i.id, i.version, best.pid, best.key, best.queue, best.lease_epoch, i.gate, i.attempts, i.data, best.weight,
           i.deliveries, i.lost
    FROM (
        SELECT ready.id, ready.next_attempt_at, p.id AS pid, p.key, p.queue, p.lease_epoch, p.priority, p.created_at,
               p.weight
        FROM feedproc_partitions AS p
        CROSS JOIN LATERAL (
            SELECT c.id, c.next_attempt_at
            FROM feedproc_items AS c
            WHERE c.partition_id = p.id AND c.gate = p.gate AND c.status = 'available'
              AND c.next_attempt_at <= now()
              AND c.id NOT IN (SELECT unnest(CAST(:excluded AS bigint[])))
            ORDER BY c.next_attempt_at, c.id
            LIMIT :limit) AS ready
        WHERE p.lease_owner = :watcher AND p.status = 'available' AND p.wanted_by IS NULL
          AND p.lease_expires_at > now() AND p.ready_at <= now()
          AND p.id NOT IN (SELECT unnest(CAST(:closed AS bigint[])))
        ORDER BY p.priority DESC, p.created_at, p.id, ready.next_attempt_at, ready.id
        LIMIT :limit) AS best
    JOIN feedproc_items AS i ON i.id = best.id
    ORDER BY best.priority DESC, best.created_at, best.pid, best.next_attempt_at, best.id
    """
)
# What a fetch took, recorded as in flight before anything of it is delivered: one row per
# partition (what is still in flight there from earlier fetches, plus these), unless a newer lease
# wrote that row meanwhile; only the partitions returned may be delivered. A row per partition and
# fetch, not per item: marking each item row cost as much as completing it (28 against 25 us per
# item, measured on 30,000 items in batches of 200); and a statement of its own, with the entries
# encoded here as runs of ids: built inside the fetch statement (a CTE and an aggregate), the
# record cost 8 us of database CPU per item. It commits without waiting for its WAL flush: a record
# lost in a database crash means a delivery not charged, nothing worse.
# A fetch appends its runs to the partition's record, so what is still in flight from earlier fetches
# is not sent again; now and then a watcher rewrites the record whole (entries starting with "="),
# leaving out what was answered meanwhile. A record of an older lease is always replaced. (A first
# record keeps its "=", which decoding ignores.)
_APPEND_OR_REPLACE = """CASE
            WHEN f.epoch = excluded.epoch AND substr(excluded.entries, 1, 1) <> '='
                THEN f.entries || ',' || excluded.entries
            ELSE ltrim(excluded.entries, '=') END"""
_PG_MARK_INFLIGHT = DriverStatement(
    f"""
    INSERT INTO feedproc_inflight AS f (partition_id, watcher, epoch, entries)
    SELECT m.pid, :watcher, m.epoch, m.entries
    FROM (SELECT set_config('synchronous_commit', 'off', true)) AS durability,
         unnest(CAST(:pids AS bigint[]), CAST(:epochs AS bigint[]), CAST(:entries AS text[])) AS m(pid, epoch, entries)
    ORDER BY m.pid
    ON CONFLICT (partition_id) DO UPDATE
        SET watcher = excluded.watcher, epoch = excluded.epoch, entries = {_APPEND_OR_REPLACE}
        WHERE f.epoch <= excluded.epoch
    RETURNING f.partition_id
    """
)
# `acquire` on PostgreSQL: pick, lease and log in one statement (data-modifying CTEs share one
# snapshot and commit together). RETURNING sees the new epoch; `c.lease_owner` is the previous owner.
_PG_ACQUIRE = text(
    """
    WITH candidates AS (
        SELECT id, lease_owner FROM feedproc_partitions
        WHERE queue = :queue AND status = 'available' AND ready_at IS NOT NULL AND ready_at <= now()
          AND (not_before IS NULL OR not_before <= now())
          AND (lease_owner IS NULL OR lease_expires_at < now())
        ORDER BY priority DESC, created_at, id
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    ), leased AS (
        UPDATE feedproc_partitions AS p SET
            lease_owner = :watcher,
            lease_epoch = p.lease_epoch + 1,
            lease_expires_at = now() + CAST(:seconds AS double precision) * interval '1 second',
            wanted_by = NULL,
            version = p.version + 1,
            updated_at = now()
        FROM candidates AS c
        WHERE p.id = c.id
        RETURNING p.id, p.key, p.lease_epoch, p.weight, p.item_timeout, p.windows, p.window_tz,
                  EXTRACT(EPOCH FROM (p.lease_expires_at - now())) AS remaining, c.lease_owner AS previous
    ), logged AS (
        INSERT INTO feedproc_events (partition_id, item_id, kind, watcher, detail, at)
        SELECT id, NULL, CASE WHEN previous IS NULL THEN 'leased' ELSE 'expired' END, :watcher,
               CASE WHEN previous IS NULL THEN NULL ELSE '{"previous": ' || to_json(previous)::text || '}' END, now()
        FROM leased
    )
    SELECT l.id, l.key, l.lease_epoch, l.weight, l.item_timeout, l.windows, l.window_tz, l.remaining,
           f.watcher AS pending_watcher, f.entries AS pending_entries
    FROM leased AS l LEFT JOIN feedproc_inflight AS f ON f.partition_id = l.id AND f.epoch < l.lease_epoch
    ORDER BY l.id
    """
)
_OUTCOME_COLUMNS = (
    "id",
    "version",
    "status",
    "gate",
    "data",
    "attempts",
    "error",
    "clear",
    "delay",
    "progress",
    "started",
    "duration",
)
# One statement per batch of answers on PostgreSQL: the outcomes arrive as arrays. The version
# match is the guard (every change of an item's status bumps its version, so an item dispatched
# while available is still available if its version is unchanged). There is deliberately no
# `status = 'available'` term: before the table has statistics PostgreSQL would read every
# available item through the items' index and hash them all, per batch (O(backlog));
# `id = ANY(...)` instead makes it look up the batch's own rows.
_PG_UPDATE_ITEMS = text(
    """
    UPDATE feedproc_items AS i SET
        status = v.status,
        gate = v.gate,
        data = COALESCE(v.data, i.data),
        attempts = v.attempts,
        last_error = CASE WHEN v.error IS NOT NULL THEN v.error WHEN v.clear THEN NULL ELSE i.last_error END,
        next_attempt_at = now() + v.delay * interval '1 second',
        progress = v.progress,  -- kept only by a 'not yet' answer that carries it
        deliveries = i.deliveries + 1,
        lost = 0,
        started_at = to_timestamp(v.started / 1e6),
        duration = v.duration / 1e6,
        delivered_by = :watcher,
        version = i.version + 1,
        updated_at = now()
    FROM unnest(CAST(:id AS bigint[]), CAST(:version AS bigint[]), CAST(:status AS varchar[]),
                CAST(:gate AS integer[]), CAST(:data AS bytea[]), CAST(:attempts AS integer[]),
                CAST(:error AS text[]), CAST(:clear AS boolean[]), CAST(:delay AS double precision[]),
                CAST(:progress AS double precision[]), CAST(:started AS bigint[]),
                CAST(:duration AS bigint[]))
        AS v(id, version, status, gate, data, attempts, error, clear, delay, progress, started, duration)
    WHERE i.id = ANY(CAST(:id AS bigint[])) AND i.id = v.id AND i.version = v.version
    """
)


@contextmanager
def _translated_errors() -> Iterator[None]:
    """Re-raise the driver errors feedproc names (database unavailable, schema missing, ...) as
    its own; any other error as it is."""
    try:
        yield
    except (OperationalError, ProgrammingError) as error:
        translated = _translate(error)
        if translated is None:
            raise
        raise translated from error


def _gate_facts(pid: Any, gate: Any) -> tuple[Any, ...]:
    """Columns answering what the gate rules ask of a partition's items at and above `gate`
    (`pid` and `gate` are values, or the partition's own columns to correlate with)."""
    here = and_(I.partition_id == pid, I.gate == gate)
    # Correlated explicitly: in an UPDATE's RETURNING (see _REFRESH_READY_AT) SQLAlchemy would
    # otherwise give each subquery a FROM of its own and ask about every partition.
    return (
        exists().where(here, I.status == IS_AVAILABLE).correlate(partitions).label("available_here"),
        exists().where(here, I.status == IS_FAILED).correlate(partitions).label("failed_here"),
        select(func.min(I.gate))
        .where(I.partition_id == pid, I.gate > gate, I.status == IS_AVAILABLE)
        .correlate(partitions)
        .scalar_subquery()
        .label("next_gate"),
    )


_SETTLE_COLUMNS = (P.id, P.key, P.gate, P.sealed, P.manual_checkpoint, P.status, P.queue)


def _earliest_due(pid: Any, gate: Any) -> Any:
    """When the first available item of partition `pid` at `gate` is due (a partition's ready_at)."""
    return (
        select(func.min(I.next_attempt_at))
        .where(I.partition_id == pid, I.gate == gate, I.status == IS_AVAILABLE)
        .scalar_subquery()
    )


def _to_gate_facts(partition: Row[Any], facts: Row[Any]) -> GateFacts:
    """The gate rules' inputs: a partition row (gate, sealed, manual_checkpoint) and its gate facts."""
    return GateFacts(
        partition.gate,
        bool(facts.available_here),
        bool(facts.failed_here),
        facts.next_gate,
        bool(partition.sealed),
        bool(partition.manual_checkpoint),
    )


# Statements of `Store.apply`, built once (a statement built per call costs more Python than the
# database spends running it). The partitions a batch answers for, locked, with their epochs: the fence.
# On PostgreSQL the lock also turns sequential scans off for the rest of the transaction, in the
# same round trip (set_config(..., true) is SET LOCAL as a function; it runs whenever a lease is
# held, the only case in which more statements follow). The batch statements find their rows by
# key (`id = ANY(...)`), but on a small or never-analyzed table the planner prices a hash join over
# a sequential scan below a few hundred index look-ups, and each batch then reads the whole table:
# O(table) per batch (measured: 30,000 items, 200 answers: 12 ms instead of 6).
_PG_LOCK_HELD_LEASES = text(
    """
    SELECT p.id, p.lease_epoch
    FROM (SELECT set_config('enable_seqscan', 'off', true)) AS planner, feedproc_partitions AS p
    WHERE p.id = ANY(CAST(:pids AS bigint[])) AND p.lease_owner = :watcher AND p.status = 'available'
    ORDER BY p.id
    FOR UPDATE OF p
    """
)
_LOCK_HELD_LEASES = (
    select(P.id, P.lease_epoch)
    .where(P.id.in_(bindparam("pids", expanding=True)), P.lease_owner == bindparam("watcher"), P.status == IS_AVAILABLE)
    .order_by(P.id)
    .with_for_update()
)
# Each answered partition's ready_at, from the earliest available item at its gate (NULL: drained).
_REFRESH_READY_AT = (
    update(partitions)
    .where(P.id.in_(bindparam("pids", expanding=True)))
    .values(
        ready_at=select(func.min(I.next_attempt_at))
        .where(I.partition_id == P.id, I.gate == P.gate, I.status == IS_AVAILABLE)
        .scalar_subquery()
    )
    .returning(P.id, P.ready_at, (P.ready_at > seconds_from_now(bindparam("idle_after", type_=Float()))).label("idle"))
)
# PostgreSQL: also what _settle reads, for the partitions whose gate drained (ready_at NULL), so it
# needs no query of its own for them. (SQLite renders RETURNING columns unqualified, which would
# turn the facts' correlated subqueries into questions about the items' own columns.)
_PG_REFRESH_READY_AT = _REFRESH_READY_AT.returning(*_SETTLE_COLUMNS, *_gate_facts(P.id, P.gate))
# The same update for the common answer, "done" without new data: four arrays instead of twelve, all
# bound as text literals (pg_bigint_array): the start time and duration in microseconds, because
# formatting floats cost 1 us each (2.9 us of watcher CPU per item, sampled with py-spy).
# `attempts` stays: a complete item's failed deliveries at its gate, as the contract defines them.
_PG_COMPLETE_ITEMS = DriverStatement(
    """
    UPDATE feedproc_items AS i SET
        status = 'complete',
        last_error = NULL,
        next_attempt_at = now(),
        progress = NULL,
        deliveries = i.deliveries + 1,
        lost = 0,
        started_at = to_timestamp(v.started / 1e6),
        duration = v.duration / 1e6,
        delivered_by = :watcher,
        version = i.version + 1,
        updated_at = now()
    FROM unnest(CAST(:id AS bigint[]), CAST(:version AS bigint[]), CAST(:started AS bigint[]),
                CAST(:duration AS bigint[])) AS v(id, version, started, duration)
    WHERE i.id = ANY(CAST(:id AS bigint[])) AND i.id = v.id AND i.version = v.version
    """
)
# The general update, one row per execution (SQLite runs executemany in-process).
_UPDATE_ITEM = (
    update(items)
    .where(I.id == bindparam("b_id"), I.version == bindparam("b_version"), I.status == IS_AVAILABLE)
    .values(
        status=bindparam("b_status"),
        gate=bindparam("b_gate"),
        data=func.coalesce(bindparam("b_data", type_=items.c.data.type), I.data),
        attempts=bindparam("b_attempts"),
        last_error=case(
            (bindparam("b_error", type_=items.c.last_error.type).is_not(None), bindparam("b_error")),
            (bindparam("b_clear", type_=Boolean()).is_(True), None),
            else_=I.last_error,
        ),
        next_attempt_at=seconds_from_now(bindparam("b_delay")),
        progress=bindparam("b_progress", type_=items.c.progress.type),  # kept only by a "not yet" answer with it
        deliveries=I.deliveries + 1,
        lost=0,
        started_at=bindparam("b_started", type_=items.c.started_at.type),
        duration=bindparam("b_duration", type_=items.c.duration.type),
        delivered_by=bindparam("b_watcher"),
        version=I.version + 1,
        updated_at=db_now(),
    )
)
_ITEM_COLUMNS = ("partition_id", "gate", "status", "data", "parent_id", "parent_gate", "seq")
# A producer's new items of one partition: the partition once, the gates and data as arrays.
_PG_INSERT_NEW_ITEMS = text(
    """
    INSERT INTO feedproc_items (partition_id, gate, status, data, next_attempt_at, created_at, updated_at)
    SELECT :pid, u.gate, 'available', u.data, now(), now(), now()
    FROM unnest(CAST(:gate AS integer[]), CAST(:data AS bytea[])) WITH ORDINALITY AS u(gate, data, n)
    ORDER BY u.n
    """
)
_PG_INSERT_ITEMS = text(
    """
    INSERT INTO feedproc_items
        (partition_id, gate, status, data, parent_id, parent_gate, seq, next_attempt_at, created_at, updated_at)
    SELECT u.partition_id, u.gate, u.status, u.data, u.parent_id, u.parent_gate, u.seq, now(), now(), now()
    FROM unnest(CAST(:partition_id AS bigint[]), CAST(:gate AS integer[]), CAST(:status AS varchar[]),
                CAST(:data AS bytea[]), CAST(:parent_id AS bigint[]), CAST(:parent_gate AS integer[]),
                CAST(:seq AS integer[]))
        WITH ORDINALITY AS u(partition_id, gate, status, data, parent_id, parent_gate, seq, n)
    ORDER BY u.n
    """
)


# A lost delivery charged (version-guarded: an item answered meanwhile is left alone).
_CHARGE_LOST = (
    update(items)
    .where(I.id == bindparam("b_id"), I.version == bindparam("b_version"), I.status == IS_AVAILABLE)
    .values(
        status=bindparam("b_status"),
        attempts=bindparam("b_attempts"),
        lost=I.lost + 1,
        deliveries=I.deliveries + 1,
        last_error=bindparam("b_error"),
        next_attempt_at=db_now(),
        progress=None,
        version=I.version + 1,
        updated_at=db_now(),
    )
)
# SQLite's twin of the marking in _PG_FETCH_READY (the fetch runs in a write transaction there);
# `isolate` uses it on both databases.
_SQLITE_MARK_INFLIGHT = text(
    f"""
    INSERT INTO feedproc_inflight AS f (partition_id, watcher, epoch, entries)
    VALUES (:pid, :watcher, :epoch, :entries)
    ON CONFLICT (partition_id) DO UPDATE
        SET watcher = excluded.watcher, epoch = excluded.epoch, entries = {_APPEND_OR_REPLACE}
        WHERE f.epoch <= excluded.epoch
    """
)

_LEASE_SCHEDULE = (P.weight, P.item_timeout, P.windows, P.window_tz)
_REMAINING = seconds_until(P.lease_expires_at).label("remaining")


def _lease(row: Row[Any], wanted_by: str | None) -> Lease:
    entries = getattr(row, "pending_entries", None)
    return Lease(
        row.id,
        row.key,
        row.lease_epoch,
        wanted_by,
        float(row.remaining or 0.0),
        row.weight,
        row.item_timeout,
        row.windows,
        row.window_tz,
        (row.pending_watcher, entries) if entries else None,
    )


def _schedule_values(
    weight: int, item_timeout: float | None, windows: str | Sequence[str] | None, window_tz: str | None
) -> dict[str, Any]:
    """Validated scheduling columns of a partition (InvalidInput when malformed)."""
    if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
        raise InvalidInput(f"weight must be an integer >= 1, got {weight!r}")
    if item_timeout is not None and (isinstance(item_timeout, bool) or not 0 < item_timeout < math.inf):
        raise InvalidInput(f"item timeout must be a positive, finite number of seconds, got {item_timeout!r}")
    parsed = timewindows.parse_windows(windows)
    timewindows.zone(window_tz)
    if window_tz is not None and not parsed:
        raise InvalidInput("a time zone applies to windows: give --window too")
    return {
        "weight": weight,
        "item_timeout": float(item_timeout) if item_timeout is not None else None,
        "windows": timewindows.format_windows(parsed),
        "window_tz": window_tz if parsed and window_tz and window_tz.upper() not in ("UTC", "Z") else None,
    }


# ---------------------------------------------------------------- module helpers


def _record_error(o: Outcome) -> str:
    """A delivery record's error: the outcome's full detail (traceback included), its last 4 KB."""
    text = o.detail or o.error or "failed"
    return text if len(text) <= RECORD_ERROR_LIMIT else "..." + text[-(RECORD_ERROR_LIMIT - 3) :]


def _from_micros(micros: int | None) -> datetime | None:
    return None if micros is None else datetime.fromtimestamp(micros / 1e6, UTC)


def _micros_array(values: Iterable[int | None]) -> str:
    """`pg_bigint_array` for values that may be missing (outcomes written without a record)."""
    values = list(values)
    if None not in values:
        return "{" + ",".join(map(str, values)) + "}"
    return "{" + ",".join("NULL" if v is None else str(int(v)) for v in values) + "}"


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _is_unique_violation(error: IntegrityError) -> bool:
    text = str(error.orig).lower()
    return "unique" in text or "duplicate key" in text


def _translate(error: DBAPIError) -> Exception | None:
    """Map a driver error to what a user should hear; None for errors that are our own bugs."""
    text = str(error.orig or error)
    if "no such table" in text or type(error.orig).__name__ == "UndefinedTable":
        return SchemaMissing("the database has no feedproc schema: run `feedproc migrate`")
    if isinstance(error, OperationalError):
        first_line = text.strip().splitlines()[0] if text.strip() else type(error.orig).__name__
        return DatabaseUnavailable(f"database unavailable: {first_line}")
    return None


def migrations_path() -> Path:
    """Where the alembic revisions are: inside the installed package, or beside it in a checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_migrations", here.parent / "migrations"):
        if (candidate / "env.py").exists():
            return candidate
    raise RuntimeError("feedproc's migrations are missing from this installation")


def _alembic_config(url: str) -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_path()))
    config.set_main_option("sqlalchemy.url", str(url).replace("%", "%%"))
    return config
