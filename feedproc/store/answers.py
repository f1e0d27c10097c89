"""Answers: a watcher's batch of outcomes written in one fenced transaction (a group commit), the
delivery records they leave, and the settling of the partitions they touched.

The statements that differ between the databases are the dialect's (`dialect/`: `lock_held_leases`,
`complete_items`, `update_items`, `refresh_ready_at`, ...), built once: a statement built per call
costs more Python than the database spends running it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, insert, select, tuple_, update
from sqlalchemy.engine import Connection

from ..core.errors import StaleWrite
from ..core.gates import Move
from ..core.models import truncate_error
from ..core.records import RECORD_OUTCOMES, Applied, Kind, Outcome
from .accumulating import Accumulating, Row, accumulator_rows
from .base import AVAILABLE, COMPLETE, FAILED, IS_AVAILABLE, NO_LEASE, A, F, I, P, event, translated_errors
from .escaping import storable
from .foundations import WRITE_OPTION, db_now, seconds_from_now
from .gating import GateWriter
from .lifecycle import keep_origins
from .schema import attempts, claims, inflight, items

# A claimed item falls due this long after its claim ends, not at once: time for a watcher's sweep
# (once a second) or the queue's next claim to settle the expiry (an attempt counted, the retry's
# backoff) before any fetch could deliver it again uncharged.
SETTLE_GRACE = 3.0

RECORDS_KEPT = 10  # per item, the first and the last this many delivery records are kept
RECORD_ERROR_LIMIT = 4096  # characters of a delivery record's error (with its traceback): its end

#: An answer's row as `Dialect.update_items` writes it (`_write_outcomes` makes them): what the item
#: becomes (status, gate, data, attempts, error or clearing it, due in `delay` seconds, progress) and
#: its delivery (started and duration in microseconds), guarded by its version; `not_yet`, its "not
#: yet" answers at its gate (None keeps the count: a failure or a completion does not change it). Answers that carry a
#: `result` (fan-in: what the item produced, kept apart from its data) add a "result" to every row of
#: their batch; a result replaces the item's previous one, an answer without one keeps it (as `data`).
OUTCOME_COLUMNS = (
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
    "not_yet",
    "started",
    "duration",
)


def with_results(rows: list[dict[str, Any]]) -> bool:
    """Whether any of the outcome rows carries a result (then every row has a "result" key)."""
    return "result" in rows[0]


class Answers(GateWriter, Accumulating):
    """The group commit of a watcher's answers."""

    def apply(
        self,
        watcher_id: str,
        outcomes: Sequence[Outcome],
        *,
        idle_after: float = 10.0,
        lease_seconds: float | None = None,
        within: Connection | None = None,
    ) -> Applied:
        """Write a batch of outcomes in one fenced transaction (a group commit).

        Outcomes of partitions no longer leased to `watcher_id` under the epoch they were
        dispatched with are dropped (reported in `Applied.lost`). Then the touched partitions are
        settled by the gate rules; partitions that finish, go idle, or have nothing due within
        `idle_after` seconds are released. A group commit that took longer than a third of
        `lease_seconds` (the heartbeat's interval) renews the leases it wrote under before it commits.

        `within`: a transaction of `transaction()` in which a transactional processor wrote its own
        rows ("complete in your transaction"); the outcomes are written in it and it is committed
        only if every one is accepted: their leases held and not expired on the database's clock,
        their items' versions unchanged. Otherwise it is rolled back, the processor's rows with it
        (the outcomes in `Applied.lost` or `Applied.superseded`). The connection is closed either way.
        """
        if within is not None:
            return self._apply_within(within, watcher_id, outcomes, idle_after, lease_seconds)
        try:
            return self._apply_once(watcher_id, outcomes, idle_after, lease_seconds)
        except StaleWrite:
            # An item changed under its lease since it was fetched: an operator retried, skipped or
            # cancelled it (items of a leased partition change only so). Its answer is dropped,
            # the others are written; the common path reads no versions.
            current = self._versions([o.item_id for o in outcomes])
            kept = [o for o in outcomes if current.get(o.item_id) == o.version]
            applied = self._apply_once(watcher_id, kept, idle_after, lease_seconds) if kept else Applied()
            applied.superseded = [o.item_id for o in outcomes if current.get(o.item_id) != o.version]
            return applied

    def transaction(self) -> Connection:
        """A connection of this store's pool in a write transaction begun for a transactional
        processor: its statements, then its answer by `apply(within=...)`, which commits or rolls
        back and closes it (`discard` when no answer is written). On SQLite it holds the database's
        write lock from here (BEGIN IMMEDIATE): a deferred transaction could not upgrade later."""
        conn = self.engine.connect()
        try:
            with translated_errors():
                conn.execution_options(**{WRITE_OPTION: True})
                conn.begin()
                conn.exec_driver_sql("SELECT 1")  # begun on the database now (SQLite's lock, a broken link)
        except BaseException:
            conn.close()
            raise
        return conn

    @staticmethod
    def discard(conn: Connection) -> None:
        """Roll back and close a `transaction()` whose answer is not written: a failure, a cancelled
        or timed-out call. Errors are swallowed (a broken connection is rolled back by the database)."""
        with contextlib.suppress(Exception):
            conn.rollback()
        with contextlib.suppress(Exception):
            conn.close()

    def _apply_within(
        self,
        conn: Connection,
        watcher_id: str,
        outcomes: Sequence[Outcome],
        idle_after: float,
        lease_seconds: float | None,
    ) -> Applied:
        try:
            with translated_errors():
                applied = self._apply_once(watcher_id, outcomes, idle_after, lease_seconds, within=conn)
                if applied.lost:  # all or nothing: the processor's rows go with a refused answer
                    conn.rollback()
                    applied.written, applied.released, applied.moves = [], set(), {}
                    applied.advanced, applied.advances = 0, []
                    applied.lost = {o.partition_id for o in outcomes}
                else:
                    conn.commit()
        except StaleWrite:  # an operator changed the item since it was fetched: the answer is dropped
            self.discard(conn)
            return Applied(superseded=[o.item_id for o in outcomes])
        except BaseException:
            self.discard(conn)
            raise
        conn.close()
        return applied

    def _versions(self, ids: list[int]) -> dict[int, int]:
        with self.read() as conn:
            return dict(conn.execute(select(I.id, I.version).where(I.id.in_(ids))).all())

    def _apply_once(
        self,
        watcher_id: str,
        outcomes: Sequence[Outcome],
        idle_after: float,
        lease_seconds: float | None,
        within: Connection | None = None,
    ) -> Applied:
        applied = Applied()
        if not outcomes:
            return applied
        began = time.monotonic()
        with self.write() if within is None else contextlib.nullcontext(within) as conn:
            pids = sorted({o.partition_id for o in outcomes})
            # In a processor's transaction, possibly long, the lease must not have ended meanwhile
            # either: on SQLite, whose lock it held, no one could take the partition over, yet the
            # watcher was told (by its own clock) that it may have; on the others the row lock is
            # taken only now, at the end, so that the processor's time does not hold it.
            lock = self.dialect.lock_held_leases if within is None else self.dialect.lock_live_leases
            held = lock(conn, pids, watcher_id)
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
                if lease_seconds is not None and time.monotonic() - began > lease_seconds / 3:
                    self._renew(conn, sorted({o.partition_id for o in kept}), watcher_id, lease_seconds)
            applied.written = [o.item_id for o in kept]
        return applied

    def _renew(self, conn: Connection, pids: list[int], watcher_id: str, lease_seconds: float) -> None:
        """Renew the leases this transaction wrote under, on the statement's clock (PostgreSQL's
        now() is the transaction's start). A long write (a fan-out of 100,000 children: 1-5 s) holds
        their rows locked, so the watcher's heartbeat waits behind it, and the leases could end
        meanwhile: a watcher polling the moment it commits would take them over. The rows are locked
        and fenced here: this watcher is their owner (the ones settled and released stay released)."""
        self.dialect.renew_written_leases(conn, pids, watcher_id, lease_seconds)

    def _write_outcomes(self, conn: Connection, kept: list[Outcome], watcher_id: str) -> None:
        """Update the answered items (version-guarded), merge their accumulate numbers, add their
        children, record each delivery that did not complete its item (the completing one is recorded
        on the item row) and failures."""
        rows, completed, history, records, trimmed = [], [], [], [], []
        origins: list[int] = []  # items whose answer moves them or replaces their data (`keep_origins`)
        results = False  # whether any answer carries a result (fan-in): then every row has one
        narrow_done = self.dialect.writes_done_narrowly  # the common answer by `complete_items`
        accepted = [o for o in kept if o.kind == Kind.ACCEPTED]
        if accepted:
            kept = [o for o in kept if o.kind != Kind.ACCEPTED]
        accumulating = []  # answers carrying accumulate numbers (rare beside the rest)
        later: list[Row] = []  # accumulator rows merged after the item updates (see accumulating.py)
        for o in kept:
            if o.accumulate is not None:
                accumulating.append(o)
            if (o.kind == Kind.MOVE and (o.new_gate is None or o.new_gate <= o.gate)) or any(
                c.gate < o.gate for c in o.children
            ):
                raise ValueError(f"outcome for item {o.item_id} would place an item below gate {o.gate}")
            failure = o.kind in (Kind.RETRY, Kind.FAIL)
            error = truncate_error(storable(o.error or "failed")) if failure else None
            if narrow_done and o.kind == Kind.DONE and o.data is None and o.result is None:
                completed.append(o)
            else:
                if o.kind == Kind.MOVE or (o.data is not None and not failure):
                    origins.append(o.item_id)
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
                        "not_yet": 0 if o.kind == Kind.MOVE else o.not_yet,
                        "started": o.started_us,
                        "duration": o.duration_us,
                    }
                )
                results = results or o.result is not None
            if o.kind != Kind.DONE:
                records.append(
                    {
                        "partition_id": o.partition_id,
                        "item_id": o.item_id,
                        "n": o.n,
                        "attempt": o.attempt,
                        "gate": o.gate,
                        "watcher": watcher_id,
                        "started_at": from_micros(o.started_us),
                        "duration": None if o.duration_us is None else o.duration_us / 1e6,
                        "outcome": RECORD_OUTCOMES[o.kind],
                        "error": _record_error(o) if failure else None,
                    }
                )
                if o.n > 2 * RECORDS_KEPT:  # keep the first and the last RECORDS_KEPT of each item
                    trimmed.append((o.item_id, o.n - RECORDS_KEPT))
            if failure:
                assert error is not None
                detail = {"gate": o.gate, "attempts": o.attempts, "error": error[:500]}
                if o.kind == Kind.RETRY:
                    detail["retry_in"] = round(o.delay, 3)
                kind = "item_failed" if o.kind == Kind.FAIL else "item_retried"
                history.append(event(o.partition_id, kind, item_id=o.item_id, watcher=watcher_id, detail=detail))
        matched = 0
        if completed:
            merged: list[Row] = []
            if accumulating:  # merged by the same statement (rows and others: see below)
                merged, later = accumulator_rows(accumulating)
                accumulating = []
            matched += self.dialect.complete_items(conn, completed, watcher_id, merged)
        if rows:
            if origins:  # before the data or gate they were added with is replaced
                keep_origins(conn, origins)
            if results:  # every row then has one (None keeps the item's)
                by_id: dict[Any, bytes | None] = {o.item_id: o.result for o in kept}
                for row in rows:
                    row["result"] = by_id[row["id"]]
            matched += self.dialect.update_items(conn, rows, watcher_id)
        if accepted:
            matched += self._accept(conn, accepted, watcher_id)
        if matched != len(kept) + len(accepted):
            raise StaleWrite(
                f"only {matched} of {len(kept) + len(accepted)} item updates matched their expected version"
            )
        if accumulating:  # exactly once: the answers this transaction wrote, their versions matched
            self._accumulate(conn, accumulating)
        elif later:
            self._upsert_accumulators(conn, [], later)
        if any(o.children for o in kept):
            self._insert_rows(conn, _child_rows(kept))
        self.dialect.insert_stamped(conn, attempts, records, ("ended_at",))
        if trimmed:
            conn.execute(delete(attempts).where(tuple_(A.item_id, A.n).in_([tuple_(i, n) for i, n in trimmed])))
        self._events(conn, history)

    def _accept(self, conn: Connection, accepted: list[Outcome], watcher_id: str) -> int:
        """Items whose handler answered 202: each is claimed for its answer, as a pull worker's
        item is (`pulling.py`), under the token its request carried, until the lease it asked for
        ends; until then no one delivers it. Returns how many matched their version."""
        matched = 0
        for o in accepted:
            claim = (
                update(items)
                .where(I.id == o.item_id, I.version == o.version, I.status == IS_AVAILABLE)
                .values(
                    claimed_until=seconds_from_now(o.delay),
                    next_attempt_at=seconds_from_now(o.delay + SETTLE_GRACE),
                    version=I.version + 1,
                    updated_at=db_now(),
                )
            )
            version = self.dialect.bump_version(conn, claim, o.version)
            if version is None:
                continue
            matched += 1
            queue, weight = conn.execute(select(P.queue, P.weight).where(P.id == o.partition_id)).one()
            # A collecting delivery's claim (`collecting.py`) under the same token becomes this one:
            # the handler reads the results it was sent the URL of until it answers.
            conn.execute(delete(claims).where(claims.c.token == o.token, claims.c.state == "collecting"))
            conn.execute(
                insert(claims).values(
                    token=o.token,
                    item_id=o.item_id,
                    partition_id=o.partition_id,
                    queue=queue,
                    worker=watcher_id,
                    gate=o.gate,
                    version=version,
                    weight=weight,
                    lease_seconds=o.delay,
                    state="active",
                    callback=True,
                    claimed_at=from_micros(o.started_us) or db_now(),
                    expires_at=seconds_from_now(o.delay),
                )
            )
        return matched

    def _settle_after_answers(
        self,
        conn: Connection,
        kept: list[Outcome],
        watcher_id: str,
        idle_after: float,
        advanced: list[tuple[int, int, int]],
    ) -> dict[int, Move]:
        """Settle the partitions a batch touched, cheaply: one statement refreshes each one's
        `ready_at`; partitions whose gate drained, or where an item failed (which may cross the
        gate's tolerance), go through the full gate rules, and partitions with nothing due for
        `idle_after` seconds are released, so that a watcher full of waiting partitions does not
        starve partitions with work ready elsewhere."""
        pids = sorted({o.partition_id for o in kept})
        failing = {o.partition_id for o in kept if o.kind == Kind.FAIL}
        rows = self.dialect.refresh_ready_at(conn, pids, idle_after)
        carries_facts = self.dialect.ready_at_rows_carry_settle_facts
        moves: dict[int, Move] = {}
        idle = []
        for row in rows:
            # Where the refresh returned what _settle reads, it reads nothing more; else it reads it itself.
            known = row if carries_facts else None
            if row.ready_at is None:
                moves[row.id] = self._settle(conn, row.id, watcher=watcher_id, advanced=advanced, row=known)
                continue
            # Items remain at the gate: only a failure crossing its tolerance changes anything, and
            # a gate with no tolerance costs nothing more (the pipeline's is cached).
            if row.id in failing and self._tolerance(conn, row.tolerate, row.queue, row.gate) is not None:
                move = self._settle(conn, row.id, watcher=watcher_id, advanced=advanced, row=known)
                if move is not Move.STAY:
                    moves[row.id] = move
                    continue
            if row.idle:
                idle.append(row.id)
                moves[row.id] = Move.WAIT
        if idle:
            self._touch(conn, idle, **NO_LEASE)
            conn.execute(delete(inflight).where(F.partition_id.in_(idle)))
            self._events(
                conn, [event(pid, "released", watcher=watcher_id, detail={"reason": "nothing due"}) for pid in idle]
            )
        return moves


def _child_rows(outcomes: Iterable[Outcome]) -> Iterator[dict[str, Any]]:
    """The item rows of the outcomes' children, made one at a time as they are inserted."""
    for o in outcomes:
        for n, c in enumerate(o.children):
            row = {
                "partition_id": o.partition_id,
                "gate": c.gate,
                "status": AVAILABLE,
                "data": c.data,
                "parent_id": o.item_id,
                "parent_gate": o.gate,
                "seq": n,
            }
            if c.collect is not None:  # a fan-out's own fan-in item
                row["collect"] = c.collect
            yield row


def _record_error(o: Outcome) -> str:
    """A delivery record's error: the outcome's full detail (traceback included), its last 4 KB."""
    text = storable(o.detail or o.error or "failed")
    return text if len(text) <= RECORD_ERROR_LIMIT else "..." + text[-(RECORD_ERROR_LIMIT - 3) :]


def from_micros(micros: int | None) -> datetime | None:
    return None if micros is None else datetime.fromtimestamp(micros / 1e6, UTC)
