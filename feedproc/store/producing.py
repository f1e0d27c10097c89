"""Producers' operations (`Feed`, the CLI): add a partition or items, seal, retry, cancel, checkpoint.

Each locks the partition row it changes, so an item added at the current gate can never race a
gate advance, and ends by settling the partition through the gate rules (`gating.py`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, insert, or_, update
from sqlalchemy.engine import Connection

from ..core import gates
from ..core import windows as timewindows
from ..core.errors import DatabaseRefused, DuplicateKey, InvalidInput, Refused
from ..core.fanin import Tolerance
from ..core.gates import Move
from ..core.models import MAX_INT32, NewItem, check_key, check_queue, shown, uuid7
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
    this_thread,
)
from .foundations import db_now
from .gating import CROSSED, GateWriter
from .schema import items, partitions

NewItems = Iterable[NewItem | tuple[int, bytes] | dict[str, Any]]


class Producing(GateWriter):
    """Adding work and changing a partition's course."""

    def add_partition(
        self,
        key: str,
        new_items: NewItems = (),
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
        connection: Connection | None = None,
    ) -> int:
        """Create a partition with its items in one transaction (or in the caller's `connection`'s,
        `joined`); returns the number of items.

        `weight` is each of its items' share of the queue's concurrency limit, `item_timeout` the
        seconds a processor call may take (overriding the watcher's), `windows` / `window_tz` the
        windows of the day in which its items may be dispatched (see `core/windows.py`), `tolerate`
        the failed items each of its gates lets pass ("5%" or a count; over its pipeline gates')."""
        check_key(key)
        check_queue(queue)
        if isinstance(priority, bool) or not isinstance(priority, int) or not -MAX_INT32 - 1 <= priority <= MAX_INT32:
            raise InvalidInput(
                f"priority must be an integer from {-MAX_INT32 - 1} to {MAX_INT32}, got {shown(priority)}"
            )
        schedule = _schedule_values(weight, item_timeout, windows, window_tz)
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
        priority: int,
        sealed: bool = True,
        manual_checkpoint: bool = False,
        not_before: datetime | None = None,
        source: str = "producer",
        detail: Mapping[str, Any] | None = None,
        **schedule: Any,
    ) -> int:
        """Create partition `key` and its items in the caller's transaction (arguments checked
        already; `schedule` as `_schedule_values` makes it, default when empty); its history's
        "created" entry gets `detail` too. Returns the number of items; IntegrityError when the key
        exists (DatabaseRefused with `unique` once out of the transaction)."""
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
            **(schedule or _schedule_values(1, None, None, None)),
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
                    status=AVAILABLE, attempts=0, next_attempt_at=db_now(), version=I.version + 1, updated_at=db_now()
                )
            ).rowcount
            self._touch(conn, row.id, status=AVAILABLE)
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
            self._touch(conn, row.id, status=CANCELLED, ready_at=None, **NO_LEASE)
            self._event(conn, row.id, "cancelled", detail={"items": count})
            self.dialect.notify_finished(conn, key)
            if row.lease_owner is not None:  # its watcher reads its leases now, and cancels the calls running
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


def _schedule_values(
    weight: int, item_timeout: float | None, windows: str | Sequence[str] | None, window_tz: str | None
) -> dict[str, Any]:
    """Validated scheduling columns of a partition (InvalidInput when malformed)."""
    if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_INT32:
        raise InvalidInput(f"weight must be an integer from 1 to {MAX_INT32}, got {shown(weight)}")
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
