"""Completion hooks' outbox (`core/hooks.py` says what a hook is).

Written: `_call_hooks` runs in the transaction that finishes a partition (the gate rules completing
or failing it, a cancel) and, when the queue has a hook for that way of finishing, inserts the
hook's row with the partition's summary. The row commits if and only if the finish does: a crash
at any point neither loses a hook nor invents one. A queue without hooks pays one primary-key read
per finished partition.

Delivered: the queue's watchers `claim_hooks` (a claim token and a deadline on the database clock,
`attempts` raised), call them, and write what happened with `hook_sent` / `hook_failed`, fenced by
the claim token: a claim that expired and was taken by another watcher writes nothing, so a hook
is delivered at least once and recorded once. Out of attempts, a hook stays `failed` until
`retry_hooks`.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Collection, Sequence
from typing import Any

from sqlalchemy import ColumnElement, Row, and_, insert, or_, select, update
from sqlalchemy.engine import Connection

from ..core.errors import InvalidInput, NotFound
from ..core.hooks import FAILED, HOOK_OF_STATUS, HOOK_STATES, PENDING, PYTHON, SENT, HookCall
from ..core.models import check_queue
from ..core.redaction import redact_url
from .accumulating import accumulated_of
from .base import CANCELLED, IS_FAILED, I, P, Q, StoreBase, iso
from .base import FAILED as PARTITION_FAILED
from .escaping import storable
from .foundations import db_now, seconds_from_now
from .hook_settings import stored_hooks
from .pipelines import cached_pipeline
from .reading import count_items
from .schema import hooks

H = hooks.c
#: Hook rows a listing returns at most.
MAX_HOOKS_SHOWN = 1000


class HookOutbox(StoreBase):
    """The write side every finish runs: the hooks' rows, in the finishing transaction."""

    def _call_hooks(self, conn: Connection, pid: int, key: str, queue: str, status: str) -> None:
        """Partition `pid` just finished with `status` in this transaction: write the row of the
        queue's hook for it, if it has one."""
        hook = HOOK_OF_STATUS.get(status)
        configured = conn.execute(select(Q.hooks).where(Q.name == queue)).scalar_one_or_none()
        target = stored_hooks(configured).get(hook or "")
        if hook is None or target is None:
            return
        payload = json.dumps(self._summary(conn, pid, status), separators=(",", ":"))
        values = {
            "queue": queue,
            "partition_key": key,
            "hook": hook,
            "target": target,
            "payload": payload,
            "status": PENDING,
            "attempts": 0,
        }
        stamp = db_now()
        conn.execute(insert(hooks).values(next_attempt_at=stamp, created_at=stamp, updated_at=stamp, **values))

    def _summary(self, conn: Connection, pid: int, status: str) -> dict[str, Any]:
        """What a hook is told of partition `pid`: key, queue, status, its items per gate and
        status, its accumulator, its first error and its timings."""
        row = conn.execute(select(P.key, P.queue, P.gate, P.created_at, db_now().label("now")).where(P.id == pid)).one()
        counted = count_items(conn, [pid])[pid]
        spec = cached_pipeline(self, conn, row.queue)
        gates = []
        for gate, by_status in counted["gates"].items():  # every state counted, 0 when none
            named = spec.gate(int(gate)) if spec is not None else None
            gates.append({"gate": int(gate), "name": named.name if named is not None else None, **by_status})
        first = conn.execute(
            select(I.id, I.gate, I.last_error)
            .where(I.partition_id == pid, I.status == IS_FAILED)
            .order_by(I.updated_at, I.id)
            .limit(1)
        ).one_or_none()
        if first is None and status == PARTITION_FAILED:  # no item failed: it passed its deadline, say
            first = conn.execute(
                select(I.id, I.gate, I.last_error)
                .where(I.partition_id == pid, I.status == CANCELLED, I.last_error.is_not(None))
                .order_by(I.id)
                .limit(1)
            ).one_or_none()
        seconds = (row.now - row.created_at).total_seconds() if row.created_at is not None else None
        return {
            "key": row.key,
            "queue": row.queue,
            "status": status,
            "gate": row.gate,
            "items": counted["items"]["total"],
            "gates": gates,
            "accumulated": accumulated_of(conn, pid),
            "first_error": None
            if first is None
            else {"item": int(first.id), "gate": int(first.gate), "error": first.last_error},
            "created_at": iso(row.created_at),
            "finished_at": iso(row.now),
            "seconds": None if seconds is None else round(seconds, 3),
        }


class Hooks(HookOutbox):
    """Claiming, recording, listing and retrying hooks' deliveries."""

    def hooks_due(self, queue: str | None, *, python_hooks: Collection[str] = ()) -> bool:
        """Whether `queue` (None: any queue) has a hook `claim_hooks` would claim now: a read, so a
        watcher of a queue without hooks due looks once per poll interval without a write lock."""
        with self.single() as conn:
            return conn.execute(select(H.id).where(*_due(queue, python_hooks)).limit(1)).first() is not None

    def claim_hooks(
        self,
        watcher_id: str,
        queue: str | None,
        *,
        python_hooks: Collection[str] = (),
        limit: int = 16,
        claim_seconds: float = 30.0,
    ) -> list[HookCall]:
        """Claim up to `limit` of `queue`'s (None: any queue's) hooks due now (pending, next attempt reached, no live
        claim) for `claim_seconds`: HTTP hooks, and Python hooks of the names in `python_hooks`
        (those this watcher has a callable for). Each claim raises the hook's `attempts`."""
        token = secrets.token_hex(16)
        due = (
            select(H.id)
            .where(*_due(queue, python_hooks))
            .order_by(H.next_attempt_at, H.id)
            .limit(limit)
            .with_for_update(skip_locked=True)  # SQLite renders none: its write transaction holds the lock
        )
        with self.write() as conn:
            ids = list(conn.execute(due).scalars())
            if not ids:
                return []
            conn.execute(
                update(hooks)
                .where(H.id.in_(ids))
                .values(
                    claim=token,
                    claimed_by=storable(watcher_id, 120),
                    claimed_until=seconds_from_now(claim_seconds),
                    attempts=H.attempts + 1,
                    updated_at=db_now(),
                )
            )
            rows = conn.execute(
                select(H.id, H.queue, H.partition_key, H.hook, H.target, H.payload, H.attempts)
                .where(H.claim == token)
                .order_by(H.id)
            ).all()
        return [
            HookCall(int(r.id), r.queue, r.partition_key, r.hook, r.target, r.payload, int(r.attempts), token)
            for r in rows
        ]

    def hook_sent(self, call: HookCall, *, response_status: int | None = None) -> bool:
        """Record `call` delivered. False (nothing written) when its claim is no longer the row's."""
        with self.write() as conn:
            return bool(
                conn.execute(
                    update(hooks)
                    .where(H.id == call.id, H.claim == call.claim, H.status == PENDING)
                    .values(
                        status=SENT,
                        claim=None,
                        claimed_until=None,
                        response_status=response_status,
                        last_error=None,
                        sent_at=db_now(),
                        updated_at=db_now(),
                    )
                ).rowcount
            )

    def hook_failed(
        self,
        call: HookCall,
        error: str,
        *,
        retry_in: float | None,
        response_status: int | None = None,
    ) -> bool:
        """Record a failed attempt of `call`: pending again in `retry_in` seconds, or `failed` for
        good when `retry_in` is None (out of attempts). False when its claim is no longer the row's."""
        values: dict[str, Any] = {
            "claim": None,
            "claimed_until": None,
            "last_error": storable(error[:2000]),
            "response_status": response_status,
            "updated_at": db_now(),
        }
        if retry_in is None:
            values["status"] = FAILED
        else:
            values["next_attempt_at"] = seconds_from_now(max(retry_in, 0.0))
        with self.write() as conn:
            return bool(
                conn.execute(
                    update(hooks).where(H.id == call.id, H.claim == call.claim, H.status == PENDING).values(**values)
                ).rowcount
            )

    def hooks(
        self,
        *,
        status: str | None = None,
        queue: str | None = None,
        key: str | None = None,
        limit: int = 100,
        before: int | None = None,
    ) -> list[dict[str, Any]]:
        """Hooks' deliveries, newest first: of one `status` (pending, sent, failed), `queue` or
        partition `key`; at most `limit` (up to 1,000), with ids below `before` (the next page)."""
        if status is not None and status not in HOOK_STATES:
            raise InvalidInput(f"status must be one of {', '.join(HOOK_STATES)}, got {status!r}")
        if queue is not None:
            check_queue(queue)
        if not 1 <= limit <= MAX_HOOKS_SHOWN:
            raise InvalidInput(f"limit must be 1 to {MAX_HOOKS_SHOWN}, got {limit}")
        query = select(hooks, (H.claimed_until > db_now()).label("claimed")).order_by(H.id.desc()).limit(limit)
        for column, value in ((H.status, status), (H.queue, queue), (H.partition_key, key)):
            if value is not None:
                query = query.where(column == value)
        if before is not None:
            query = query.where(H.id < before)
        with self.read() as conn:
            return [_shown(row) for row in conn.execute(query).all()]

    def hook(self, hook_id: int) -> dict[str, Any]:
        """One hook's delivery, with its payload; NotFound if there is none of that id."""
        with self.read() as conn:
            row = conn.execute(
                select(hooks, (H.claimed_until > db_now()).label("claimed")).where(H.id == hook_id)
            ).one_or_none()
        if row is None:
            raise NotFound(f"no hook {hook_id}")
        return {**_shown(row), "payload": json.loads(row.payload)}

    def retry_hooks(self, ids: Sequence[int] = (), *, failed: bool = False, queue: str | None = None) -> int:
        """Make hooks pending again with fresh attempts, due now: those of `ids` that are failed,
        or with `failed=True` every failed one (of `queue`). Returns how many. A sent or pending
        hook is left alone (NotFound for an id that does not exist)."""
        if not ids and not failed:
            raise InvalidInput("give hook ids, or failed=True for every failed hook")
        where = [H.status == FAILED]
        if ids:
            where.append(H.id.in_(sorted(set(ids))))
        if queue is not None:
            check_queue(queue)
            where.append(H.queue == queue)
        with self.write() as conn:
            if ids:
                known = set(conn.execute(select(H.id).where(H.id.in_(sorted(set(ids))))).scalars())
                if missing := sorted(set(ids) - known):
                    raise NotFound(f"no hook {missing[0]}")
            return int(
                conn.execute(
                    update(hooks)
                    .where(and_(*where))
                    .values(
                        status=PENDING,
                        attempts=0,
                        next_attempt_at=db_now(),
                        claim=None,
                        claimed_until=None,
                        updated_at=db_now(),
                    )
                ).rowcount
            )


def _due(queue: str | None, python_hooks: Collection[str]) -> list[ColumnElement[bool]]:
    """A hook of `queue` (None: any) due now, unclaimed (or its claim expired), that this watcher
    can call: an HTTP one, or a Python one of a name in `python_hooks`. Read by the outbox's index
    on (status, next_attempt_at): only pending hooks are in its range, however many were sent."""
    deliverable = H.target != PYTHON
    if python_hooks:
        deliverable = or_(deliverable, H.hook.in_(sorted(python_hooks)))
    return [
        *([H.queue == queue] if queue is not None else []),
        H.status == PENDING,
        H.next_attempt_at <= db_now(),
        or_(H.claimed_until.is_(None), H.claimed_until < db_now()),
        deliverable,
    ]


def _shown(row: Row[Any]) -> dict[str, Any]:
    return {
        "id": int(row.id),
        "queue": row.queue,
        "key": row.partition_key,
        "hook": row.hook,
        "target": row.target if row.target == PYTHON else redact_url(row.target),
        "status": row.status,
        "attempts": int(row.attempts),
        "claimed": bool(row.claimed) and row.status == PENDING,
        "next_attempt_at": iso(row.next_attempt_at) if row.status == PENDING else None,
        "last_error": row.last_error,
        "response_status": row.response_status,
        "created_at": iso(row.created_at),
        "sent_at": iso(row.sent_at),
    }
