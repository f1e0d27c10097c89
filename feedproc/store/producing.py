"""Producers' operations (`Feed`, the CLI): add a partition or items, seal, retry, cancel, checkpoint.

Each locks the partition row it changes, so an item added at the current gate can never race a
gate advance, and ends by settling the partition through the gate rules (`gating.py`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, insert, or_, select, update
from sqlalchemy.engine import Connection

from ..core import gates
from ..core import windows as timewindows
from ..core.errors import DatabaseRefused, DuplicateKey, InvalidInput, Refused
from ..core.fanin import Tolerance
from ..core.flow import check_group
from ..core.gates import Move
from ..core.models import NewItem, check_key, check_priority, check_queue, check_weight, shown, uuid7
from .base import (
    AVAILABLE,
    CANCELLED,
    COMPLETE,
    FAILED,
    IS_AVAILABLE,
    IS_FAILED,
    NO_LEASE,
    I,
    P,
    Q,
    this_thread,
)
from .escaping import storable
from .foundations import db_now, seconds_from_now
from .gating import CROSSED, GateWriter, change_items
from .pipelines import cached_pipeline
from .schema import items, partitions

NewItems = Iterable[NewItem | tuple[int, bytes] | dict[str, Any]]
#: A partition's deadline as given: a time, or a duration from now (timedelta or seconds).
Deadline = datetime | timedelta | float | int
#: The last error of a partition past its deadline (its items left unfinished say it).
DEADLINE_EXCEEDED = "deadline exceeded"
#: Who cancels the items of a partition past its deadline (their delivery records' `watcher`).
DEADLINE = "deadline"
#: The longest duration a deadline may be given as (a year): every deadline is a timestamp.
MAX_DEADLINE = 365 * 24 * 3600.0


class Producing(GateWriter):
    """Adding work and changing a partition's course."""

    def add_partition(
        self,
        key: str,
        new_items: NewItems = (),
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
        deadline: Deadline | None = None,
        partition_limit: int | None = None,
        group: str | None = None,
        connection: Connection | None = None,
    ) -> int:
        """Create a partition with its items in one transaction (or in the caller's `connection`'s,
        `joined`); returns the number of items.

        `priority` (higher is leased first) and `weight` left None are the queue's defaults
        (`set_queue`, or its pipeline's), else 0 and 1.
        `weight` is each of its items' share of the queue's concurrency limit, `item_timeout` the
        seconds a processor call may take (overriding the watcher's), `windows` / `window_tz` the
        windows of the day in which its items may be dispatched (see `core/windows.py`), `tolerate`
        the failed items each of its gates lets pass ("5%" or a count; over its pipeline gates').
        `deadline`: when it fails with "deadline exceeded" unless finished, a time or a duration
        (timedelta or seconds) from now on the database's clock (`fail_overdue`). `partition_limit`:
        its items in flight at once at most (besides its queue's and its gates'). `group`: its
        concurrency group (a tenant, a customer), which its queue's group limit and group rate count."""
        check_key(key)
        check_queue(queue)
        if priority is not None:
            check_priority(priority)
        if not_before is not None and not isinstance(not_before, datetime):  # else a driver error, mid-insert
            raise InvalidInput(f"not_before must be a datetime, got {shown(not_before)}")
        schedule = _schedule_values(weight, item_timeout, windows, window_tz)
        if deadline is not None:
            schedule["deadline"] = deadline_value(deadline)
        if partition_limit is not None:
            schedule["partition_limit"] = check_weight(partition_limit, "partition limit")
        if group is not None:
            schedule["concurrency_group"] = check_group(group)
        if tolerate is not None:
            try:
                schedule["tolerate"] = str(Tolerance.parse(tolerate))
            except ValueError as error:
                raise InvalidInput(str(error)) from None
        try:
            with self.write(connection) as conn:
                return self._create_partition(
                    conn,
                    key,
                    new_items,
                    queue=queue,
                    priority=priority,
                    sealed=sealed,
                    manual_checkpoint=manual_checkpoint,
                    not_before=not_before,
                    **schedule,
                )
        except DatabaseRefused as error:
            if error.unique:
                raise DuplicateKey(f"partition {key!r} exists already") from None
            raise

    def _create_partition(
        self,
        conn: Connection,
        key: str,
        new_items: NewItems,
        *,
        queue: str,
        priority: int | None,
        sealed: bool = True,
        manual_checkpoint: bool = False,
        not_before: datetime | None = None,
        source: str = "producer",
        detail: Mapping[str, Any] | None = None,
        **schedule: Any,
    ) -> int:
        """Create partition `key` and its items in the caller's transaction (arguments checked
        already; `schedule` as `_schedule_values` makes it, default when empty); its history's
        "created" entry gets `detail` too. A `priority` or weight left None is the queue's default
        (read here only then). Returns the number of items; IntegrityError when the key exists
        (DatabaseRefused with `unique` once out of the transaction)."""
        schedule = dict(schedule or _schedule_values(None, None, None, None))
        if priority is None or schedule["weight"] is None:
            row = conn.execute(select(Q.default_priority, Q.default_weight).where(Q.name == queue)).first()
            default_priority, default_weight = row if row is not None else (None, None)
            priority = priority if priority is not None else default_priority or 0
            schedule["weight"] = schedule["weight"] or default_weight or 1
        created = insert(partitions).values(
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
            gate_since=db_now(),
            **schedule,
        )
        pid = self.dialect.insert_partition(conn, created)
        count, first_gate = self._insert_items(conn, pid, new_items, partition_gate=None)
        if first_gate != 0:  # inserted at gate 0, where most partitions start
            conn.execute(update(partitions).where(P.id == pid).values(gate=first_gate))
        self._event(conn, pid, "created", detail={"items": count, "gate": first_gate, **(detail or {})})
        self._tally(conn, queue, this_thread(source), {"added": count})
        self._settle(conn, pid, failed_now=False)
        return count

    def add_items(self, key: str, new_items: NewItems, *, connection: Connection | None = None) -> int:
        """Add items to an open partition (not sealed, not finished); returns how many. In the
        caller's transaction on `connection` when given (`joined`)."""
        with self.write(connection) as conn:
            row = self._lock(conn, key)
            if row.status != AVAILABLE:
                raise Refused(f"partition {key!r} is {row.status}: no items can be added")
            if row.sealed:
                raise Refused(f"partition {key!r} is sealed: no items can be added")
            count, _ = self._insert_items(conn, row.id, new_items, partition_gate=row.gate)
            self._event(conn, row.id, "items_added", detail={"items": count})
            self._tally(conn, row.queue, this_thread("producer"), {"added": count})
            self._settle(conn, row.id, failed_now=False)
            return count

    def seal(self, key: str, *, connection: Connection | None = None) -> None:
        """Mark that no more items will be added; a drained, sealed partition completes. In the
        caller's transaction on `connection` when given (`joined`)."""
        with self.write(connection) as conn:
            row = self._lock(conn, key)
            if row.sealed:
                return
            if row.status == CANCELLED:
                raise Refused(f"partition {key!r} is cancelled")
            self._touch(conn, row.id, sealed=True)
            self._event(conn, row.id, "sealed")
            if row.status == AVAILABLE:
                self._settle(conn, row.id, failed_now=False)

    def retry(self, key: str) -> int:
        """Put a failed partition and its failed items back to work; returns the items retried.

        Those are the items at its gate: failed ones, and those cancelled there because the gate's
        failures crossed its tolerance (failures an earlier gate tolerated stay behind)."""
        with self.write() as conn:
            row = self._lock(conn, key)
            if row.status != FAILED:
                raise Refused(f"partition {key!r} is {row.status}, not failed: nothing to retry")
            crossed = and_(I.status == CANCELLED, I.last_error.like(CROSSED))
            count = conn.execute(
                update(items)
                .where(I.partition_id == row.id, I.gate == row.gate, or_(I.status == IS_FAILED, crossed))
                .values(
                    status=AVAILABLE,
                    attempts=0,
                    not_yet=0,
                    next_attempt_at=db_now(),
                    version=I.version + 1,
                    updated_at=db_now(),
                )
            ).rowcount
            self._touch(conn, row.id, status=AVAILABLE, gate_since=db_now())  # its gate's max_time anew
            self._event(conn, row.id, "retried", detail={"items": count})
            self._tally(conn, row.queue, this_thread("producer"), {"added": count})  # back in the backlog
            self._settle(conn, row.id, failed_now=False)
            return count

    def cancel(self, key: str, *, connection: Connection | None = None) -> None:
        """Cancel a partition and its available items (failed items stay failed). Terminal. In the
        caller's transaction on `connection` when given (`joined`)."""
        with self.write(connection) as conn:
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
            self._end(conn, row, CANCELLED, "cancelled", {"items": count})

    def set_priority(self, key: str, priority: int, *, by: str = "python") -> int:
        """Change partition `key`'s priority (higher is leased and claimed first): the next lease
        and claim order follow it, a lease held now is kept. Any status: a finished partition keeps
        it if resubmitted. Recorded in its history (`priority`, with the old value and `by`) unless
        unchanged. Returns the priority it had; NotFound for an unknown key."""
        check_priority(priority)
        by = storable(by, 120)
        with self.write() as conn:
            row = self._lock(conn, key)
            if row.priority != priority:
                self._touch(conn, row.id, priority=priority)
                self._event(conn, row.id, "priority", detail={"priority": priority, "was": row.priority, "by": by})
            return int(row.priority)

    def fail_overdue(self, queue: str) -> list[str]:
        """Fail the unfinished partitions of `queue` past their deadline, or longer at their gate
        than its pipeline gate's `max_time`, on the database's clock; returns their keys. Each
        fails as a cancelled one ends (`cancel`), in a transaction of its own: its items not yet
        finished are cancelled, each with a delivery record and `last_error` ("deadline exceeded",
        "max_time exceeded at gate 1 (ocr)"), pull workers' claims on them end, and the watcher
        holding its lease hears at once and cancels their calls; then it is failed, with its
        `on_fail` hooks, instead of cancelled. When none is due: one read of the deadline index
        (partitions without a deadline are not in it), and one per gate with a `max_time`."""
        due: list[tuple[str, str, ColumnElement[bool]]] = []  # (key, error, what still holds under its lock)
        with self.read() as conn:
            past = P.deadline <= db_now()
            unfinished = and_(P.status == IS_AVAILABLE, P.queue == queue)
            for key in conn.execute(select(P.key).where(past, unfinished).order_by(P.id)).scalars():
                due.append((key, DEADLINE_EXCEEDED, past))
            spec = cached_pipeline(self, conn, queue)
            for gate in spec.gates if spec is not None else ():
                if gate.max_time is None:
                    continue
                error = f"max_time exceeded at {self._gate_label(conn, queue, gate.number)}"
                late = and_(P.gate == gate.number, P.gate_since <= seconds_from_now(-gate.max_time))
                for key in conn.execute(select(P.key).where(late, unfinished).order_by(P.id)).scalars():
                    due.append((key, error, late))
        failed = []
        for key, error, still in due:
            if key in failed:
                continue
            with self.write() as conn:
                row = self._lock(conn, key)
                if row.status != AVAILABLE or conn.execute(select(P.id).where(P.id == row.id, still)).first() is None:
                    continue  # finished (or moved on) meanwhile
                left = and_(I.partition_id == row.id, I.status == IS_AVAILABLE)
                changed = change_items(
                    conn,
                    left,
                    status=CANCELLED,
                    by=DEADLINE,
                    outcome="cancelled",
                    error=error,
                    claim_state="cancelled",
                    last_error=error,
                )
                detail = {"gate": row.gate, "error": error, "cancelled": changed.get(row.id, 0)}
                self._end(conn, row, FAILED, "failed", detail)
                failed.append(key)
        return failed

    def _end(self, conn: Connection, row: Any, status: str, event: str, detail: dict[str, Any]) -> None:
        """End the locked partition `row` as `status` (cancelled by an operator, or failed past its
        deadline): lease dropped, `event` in its history, its hooks called, its waiters woken, and
        the watcher holding its lease told at once, so it cancels the calls still running."""
        self._touch(conn, row.id, status=status, ready_at=None, **NO_LEASE)
        self._event(conn, row.id, event, detail=detail)
        self._call_hooks(conn, row.id, row.key, row.queue, status)
        self.dialect.notify_finished(conn, row.key)
        if row.lease_owner is not None:
            self.dialect.notify_wanted(conn, row.lease_owner)

    def checkpoint(self, key: str) -> int:
        """Advance a manual-checkpoint partition whose gate has drained; returns the new gate."""
        with self.write() as conn:
            row = self._lock(conn, key)
            if not row.manual_checkpoint:
                raise Refused(f"partition {key!r} has no manual checkpoint")
            if row.status != AVAILABLE:
                raise Refused(f"partition {key!r} is {row.status}")
            outcome = gates.settle(self._facts(conn, row, failed_now=False), checkpoint=True)
            if outcome.move is not Move.ADVANCE:
                reason = {
                    Move.STAY: f"gate {row.gate} still has available items",
                    Move.FAIL: f"gate {row.gate} has failed items",
                }.get(outcome.move, f"no gate above {row.gate} holds work")
                raise Refused(f"partition {key!r} cannot be checkpointed: {reason}")
            self._settle(conn, row.id, checkpoint=True, failed_now=False)
            return outcome.gate


def generated_key() -> str:
    """A new partition key for a producer that gave none: a UUIDv7 of this moment (`core.models.uuid7`)."""
    return uuid7(time.time_ns() // 1_000_000, os.urandom(10))


def deadline_value(deadline: Deadline) -> Any:
    """A deadline as the partition row stores it: a time in UTC (one without a zone is UTC), or
    a duration as the database clock's now plus it. InvalidInput for anything else."""
    if isinstance(deadline, datetime):
        return deadline.replace(tzinfo=UTC) if deadline.tzinfo is None else deadline.astimezone(UTC)
    if isinstance(deadline, timedelta):
        deadline = deadline.total_seconds()
    if isinstance(deadline, bool) or not isinstance(deadline, int | float) or not 0 < deadline <= MAX_DEADLINE:
        raise InvalidInput(
            f"deadline must be a datetime, or a duration of more than 0 and at most a year, got {shown(deadline)}"
        )
    return seconds_from_now(float(deadline))


def _schedule_values(
    weight: int | None, item_timeout: float | None, windows: str | Sequence[str] | None, window_tz: str | None
) -> dict[str, Any]:
    """Validated scheduling columns of a partition (InvalidInput when malformed); a weight left None
    stays None (the queue's default)."""
    if weight is not None:
        check_weight(weight)
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
