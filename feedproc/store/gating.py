"""The gate rules (`core.gates`) applied to the database: items entering a partition (rule 1, a new
partition starts at its lowest gate; rule 4, no item below the current gate) and the settling of a
partition after anything that can drain its gate (rule 3: stay, wait, advance, fail or complete).

Producers (`producing.py`), answers (`answers.py`) and lost deliveries (`leasing.py`) all end here,
under the partition's lock. A gate that tolerates failures (`tolerating.py`) and has more than it
tolerates fails its partition at once: the items still available there are cancelled, saying why.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from sqlalchemy import ColumnElement, Row, and_, delete, exists, func, insert, literal, select, update
from sqlalchemy.engine import Connection

from ..core import gates
from ..core.errors import Refused
from ..core.gates import GateFacts, Move
from ..core.models import NewItem
from .base import (
    ACTIVE_CLAIM,
    CANCELLED,
    COMPLETE,
    FAILED,
    IS_AVAILABLE,
    IS_FAILED,
    NO_LEASE,
    C,
    F,
    I,
    P,
)
from .foundations import db_now
from .hooks import HookOutbox
from .schema import attempts, claims, inflight, items, partitions
from .tolerating import Tolerating

INSERT_CHUNK = 5000  # rows per INSERT statement (and row dicts made at a time, for children)

#: The partition columns `_settle` reads beside its gate facts.
SETTLE_COLUMNS = (P.id, P.key, P.gate, P.sealed, P.manual_checkpoint, P.status, P.queue, P.tolerate, P.lease_owner)
#: Who cancels the items left at a gate whose tolerance was crossed (their delivery records' `watcher`).
TOLERANCE = "tolerance"
#: The `last_error` of those items (a LIKE pattern): `retry KEY` brings them back with the failed ones.
CROSSED = "cancelled: % items failed at gate %, more than the % tolerated"


def gate_facts(pid: Any, gate: Any) -> tuple[ColumnElement[Any], ...]:
    """Columns answering what the gate rules ask of a partition's items at and above `gate`
    (`pid` and `gate` are values, or the partition's own columns to correlate with)."""
    here = and_(I.partition_id == pid, I.gate == gate)
    # Correlated explicitly: in an UPDATE's RETURNING (answers.PG_REFRESH_READY_AT) SQLAlchemy would
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


def earliest_due(pid: Any, gate: Any) -> Any:
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


#: The columns of a child's item row (`_insert_rows`; `collect` too where one collects).
ITEM_COLUMNS = ("partition_id", "gate", "status", "data", "parent_id", "parent_gate", "seq")


def change_items(
    conn: Connection,
    which: ColumnElement[bool],
    *,
    status: str,
    by: str,
    outcome: str,
    error: str,
    claim_state: str,
    **values: Any,
) -> dict[int, int]:
    """Record and change the items `which` selects, in partitions the caller locked: a delivery
    record each (`outcome`, `error`, by `by`), their active claims ended in `claim_state`, their
    `status` and `values` set and their version bumped (an answer on its way is dropped as
    superseded). Returns how many changed per partition."""
    counts: dict[int, int] = {
        int(pid): int(n)
        for pid, n in conn.execute(select(I.partition_id, func.count()).where(which).group_by(I.partition_id))
    }
    if not counts:
        return {}
    # One delivery record per item, written from the rows themselves (no id list in memory).
    columns = ["partition_id", "item_id", "n", "attempt", "gate", "watcher", "started_at", "ended_at", "outcome"]
    conn.execute(
        insert(attempts).from_select(
            [*columns, "error"],
            select(
                I.partition_id,
                I.id,
                I.deliveries + 1,
                I.attempts,
                I.gate,
                literal(by),
                db_now(),
                db_now(),
                literal(outcome),
                literal(error),
            ).where(which),
        )
    )
    conn.execute(
        update(claims)
        .where(C.item_id.in_(select(I.id).where(which).scalar_subquery()), C.state == ACTIVE_CLAIM)
        .values(state=claim_state, ended_at=db_now())
    )
    changes: dict[str, Any] = {
        "status": status,
        "claimed_until": None,
        "deliveries": I.deliveries + 1,  # the record above is numbered as a delivery
        "version": I.version + 1,
        "updated_at": db_now(),
        "progress": None,
        **values,
    }
    conn.execute(update(items).where(which).values(**changes))
    return counts


class GateWriter(Tolerating, HookOutbox):
    """Item insertion and the gate rules, written to a locked partition."""

    def _insert_items(
        self, conn: Connection, pid: int, new_items: Iterable[Any], partition_gate: int | None
    ) -> tuple[int, int]:
        """Insert items in multi-row chunks, refusing any below `partition_gate` (rule 4; None: a new
        partition). Returns (count, the gate a new partition starts at by rule 1)."""
        insert_new = self.dialect.insert_new_items
        count, lowest_per_chunk, gates_, data = 0, [], [], []
        collects: list[int | None] = []
        collecting = False  # a chunk with an item that collects goes in with that column
        for n, value in enumerate(new_items, start=1):
            item = NewItem.coerce(value, where=f"item {n}: ")
            if partition_gate is not None and (reason := gates.check_not_below(item.gate, partition_gate)):
                raise Refused(f"item {n}: {reason}")
            gates_.append(item.gate)
            data.append(item.data)
            collects.append(item.collect)
            collecting = collecting or item.collect is not None
            count += 1
            if len(gates_) >= INSERT_CHUNK:
                lowest_per_chunk.append(gates.initial_gate(gates_))
                insert_new(conn, pid, gates_, data, collects if collecting else None)
                gates_, data, collects, collecting = [], [], [], False
        if gates_:
            lowest_per_chunk.append(gates.initial_gate(gates_))
            insert_new(conn, pid, gates_, data, collects if collecting else None)
        return count, gates.initial_gate(lowest_per_chunk)

    def _insert_rows(self, conn: Connection, rows: Iterable[dict[str, Any]]) -> None:
        """Insert children's item rows, each with every column of `ITEM_COLUMNS` (none NULL) and
        `collect` where a child collects an earlier gate's results,
        INSERT_CHUNK per statement, taking them from `rows` a chunk at a time: an answer's 100,000
        children are never 100,000 row dicts at once (made all at once, with a copy per row for the
        statement, they added 135 MB to a watcher writing 100,000 on SQLite, 91 MB on PostgreSQL; 8
        and 5 MB now)."""
        insert_rows = self.dialect.insert_item_rows
        pending = iter(rows)
        while chunk := list(itertools.islice(pending, INSERT_CHUNK)):
            if any("collect" in row for row in chunk):  # children that collect (fan-in): every row says
                for row in chunk:
                    row.setdefault("collect", None)
            insert_rows(conn, chunk)

    def _facts(self, conn: Connection, row: Row[Any], *, failed_now: bool = True) -> GateFacts:
        """The gate rules' inputs for partition `row` (its `SETTLE_COLUMNS` at least; read from the
        items), with its gate's tolerance and counts when they matter (`gates.counts_matter`:
        `failed_now` says an item may just have failed there)."""
        facts = conn.execute(select(*gate_facts(row.id, row.gate))).one()
        return self._with_tolerance(conn, row, _to_gate_facts(row, facts), failed_now)

    def _with_tolerance(self, conn: Connection, row: Row[Any], facts: GateFacts, failed_now: bool) -> GateFacts:
        if not facts.failed_here:  # the common case: nothing more is read
            return facts
        tolerance = self._tolerance(conn, row.tolerate, row.queue, row.gate)
        if tolerance is None or not gates.counts_matter(
            tolerance, facts.available_here, facts.failed_here, failed_now=failed_now
        ):
            return facts  # the rules decide alike without it: stay while items are available here
        failed, total = self._gate_counts(conn, row.id, row.gate, tolerance)
        return replace(facts, tolerance=tolerance, failed=failed, total=total)

    def _settle(
        self,
        conn: Connection,
        pid: int,
        *,
        checkpoint: bool = False,
        watcher: str | None = None,
        advanced: list[tuple[int, int, int]] | None = None,
        row: Row[Any] | None = None,
        failed_now: bool = True,
    ) -> Move:
        """Apply the gate rules to a (locked) available partition and record what happened.

        Sets `ready_at` (earliest due item at the current gate), moves the gate past drained and
        empty gates, fails or completes the partition. A watcher passing `watcher` also gives up its
        lease when the partition finishes or has nothing to do. Each gate advance appends `pid` to
        `advanced`, when given. `row`: the partition's `SETTLE_COLUMNS` and gate facts, when the
        caller read them already in this transaction. `failed_now=False`: the caller knows no item
        failed in this transaction (a gate's tolerance is then judged only once it drains).
        """
        if row is None:  # the partition and its gate facts in one round trip
            row = conn.execute(select(*SETTLE_COLUMNS, *gate_facts(P.id, P.gate)).where(P.id == pid)).one()
        facts = self._with_tolerance(conn, row, _to_gate_facts(row, row), failed_now)
        outcome = gates.settle(facts, checkpoint=checkpoint)
        if outcome.move is Move.ADVANCE:
            self._event(conn, pid, "gate_advanced", watcher=watcher, detail={"from": row.gate, "to": outcome.gate})
            # The new gate is the lowest one above with available items (GateFacts.next_gate), where
            # the rules keep the partition (STAY): set its ready_at now instead of settling again.
            self._touch(conn, pid, gate=outcome.gate, ready_at=earliest_due(pid, outcome.gate), gate_since=db_now())
            if advanced is not None:
                advanced.append((pid, row.gate, outcome.gate))
        elif outcome.move is Move.STAY:
            conn.execute(update(partitions).where(P.id == pid).values(ready_at=earliest_due(pid, row.gate)))
        if outcome.move in (Move.ADVANCE, Move.STAY):
            if watcher is None:  # a producer made work ready: wake the queue's watchers
                self.dialect.notify_ready(conn, row.queue)
            return Move.STAY
        if watcher:  # WAIT, FAIL or COMPLETE: its lease holder lets it go
            conn.execute(delete(inflight).where(F.partition_id == pid))
        if outcome.move is Move.WAIT:
            self._touch(conn, pid, ready_at=None, **(NO_LEASE if watcher else {}))
            if watcher:
                self._event(conn, pid, "released", watcher=watcher, detail={"gate": row.gate, "reason": "idle"})
        elif outcome.move is Move.FAIL:
            detail: dict[str, Any] = {"gate": row.gate}
            if facts.tolerance is not None:  # failed by crossing the gate's tolerance
                detail.update(self._cross(conn, row, facts, watcher))
            self._touch(conn, pid, status=FAILED, ready_at=None, **NO_LEASE)
            self._event(conn, pid, "failed", watcher=watcher, detail=detail)
            self._call_hooks(conn, pid, row.key, row.queue, FAILED)
            self.dialect.notify_finished(conn, row.key)
        elif outcome.move is Move.COMPLETE:
            self._touch(conn, pid, status=COMPLETE, ready_at=None, **NO_LEASE)
            self._event(conn, pid, "completed", watcher=watcher, detail={"gate": row.gate})
            self._call_hooks(conn, pid, row.key, row.queue, COMPLETE)
            self.dialect.notify_finished(conn, row.key)
        return outcome.move

    def _cross(self, conn: Connection, row: Row[Any], facts: GateFacts, watcher: str | None) -> dict[str, Any]:
        """Partition `row` has more failed items at its gate than the gate tolerates: cancel the
        items still available there, each saying why (in its `last_error` and a delivery record),
        with the claims of pull workers on them; the watcher holding the lease hears at once and
        cancels their calls. Returns what the partition's "failed" event adds."""
        tolerance, where = facts.tolerance, self._gate_label(conn, row.queue, row.gate)
        failed = f"{facts.failed} of {facts.total} items failed at {where}"
        reason = f"cancelled: {failed}, more than the {tolerance} tolerated"
        cancelled = 0
        if facts.available_here:
            left = and_(I.partition_id == row.id, I.gate == row.gate, I.status == IS_AVAILABLE)
            changed = change_items(
                conn,
                left,
                status=CANCELLED,
                by=TOLERANCE,
                outcome="cancelled",
                error=reason,
                claim_state="cancelled",
                last_error=reason,
            )
            cancelled = changed.get(row.id, 0)
            if row.lease_owner is not None and row.lease_owner != watcher:  # its calls of them are cancelled
                self.dialect.notify_wanted(conn, row.lease_owner)
        return {
            "tolerate": str(tolerance),
            "failed": facts.failed,
            "items": facts.total,
            "cancelled": cancelled,
            "error": reason.removeprefix("cancelled: "),
        }
