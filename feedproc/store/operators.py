"""Operators' reads across partitions: for `feedproc status`, `feedproc serve` (HTTP API, dashboard)
and the watchers' /healthz and /metrics. Every one is bounded: a capped page (keyset cursor), or an
aggregate with one row per queue and status.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Select, case, exists, func, select
from sqlalchemy.engine import Connection

from ..core.errors import InvalidInput
from .base import IS_AVAILABLE, IS_FAILED, I, P, W, iso
from .escaping import storable
from .foundations import db_now
from .reading import MAX_PAGE, add_count, count_items, count_partitions, zero_counts
from .schema import hooks, items, partitions
from .tolerating import Tolerating

#: How a page of partitions may be ordered: by key (keyset pages), or by activity, priority or age.
PARTITION_SORTS: dict[str, tuple[Any, ...]] = {
    "key": (P.key,),
    # Leased partitions first (their lease is renewed while they are worked on: processing items
    # writes nothing to the partition row), then the last changed.
    "activity": (
        case((P.lease_expires_at > P.updated_at, P.lease_expires_at), else_=P.updated_at).desc(),
        P.id.desc(),
    ),
    "priority": (P.priority.desc(), P.created_at, P.id),
    "age": (P.created_at, P.id),
}


class Operators(Tolerating):
    """Summaries, pages of partitions, failures, leases, watchers and gauges."""

    def ping(self) -> None:
        """Raise DatabaseUnavailable or SchemaMissing unless the database answers (schema included)."""
        with self.read() as conn:
            conn.execute(select(P.id).limit(1)).all()

    def summary(self, *, recent: int = 0) -> dict[str, Any]:
        """Counts of partitions and items by status (the `status --json` object)."""
        with self.read() as conn:
            totals = zero_counts(total=True)
            for status, n in conn.execute(select(I.status, func.count()).group_by(I.status)):
                add_count(totals, status, n)
            result: dict[str, Any] = {"partitions": count_partitions(conn), "items": totals}
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
                        "updated_at": iso(r.updated_at),
                    }
                    for r in rows
                ]
                result["watchers"] = _watchers(conn)
            return result

    def partition_counts(self) -> dict[str, int]:
        """Partitions by status (reads the partitions' status index only: cheap enough to poll)."""
        with self.read() as conn:
            return count_partitions(conn)

    def watchers(self) -> list[dict[str, Any]]:
        """Registered watchers with their liveness and lease counts."""
        with self.read() as conn:
            return _watchers(conn)

    def list_partitions(
        self,
        *,
        queue: str | None = None,
        status: str | None = None,
        prefix: str | None = None,
        after: str | None = None,
        limit: int = 50,
        sort: str = "key",
        error: str | None = None,
        offset: int = 0,
    ) -> list[dict[str, Any]]:
        """Partitions a page at a time, with their item counts in total and per gate (the `status`
        object's `items` and `gates`), their `tolerate` and the failures their gates tolerated
        (`tolerated`, without the counts of items that reached each gate). In key order by default
        (keyset: pass the last key as `after`); `sort` also takes `activity` (last updated first),
        `priority` (highest first, then oldest) and `age` (oldest first), paged by `offset`.
        `error` keeps partitions with a failed item whose error contains that text."""
        limit = max(1, min(limit, MAX_PAGE))
        if sort not in PARTITION_SORTS:
            raise InvalidInput(f"sort must be one of {', '.join(PARTITION_SORTS)}, got {sort!r}")
        if error is not None and (len(error) > 200 or any(c in error for c in "\x00\r\n")):
            raise InvalidInput("error text must be at most 200 characters on one line, without NUL")
        if not 0 <= offset <= 1_000_000:
            raise InvalidInput(f"offset must be between 0 and 1000000, got {offset}")
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
            P.tolerate,
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
        if error:
            error = storable(error)  # as the errors it looks for were stored
            pattern = "%" + error.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            query = query.where(
                exists().where(I.partition_id == P.id, I.status == IS_FAILED, I.last_error.ilike(pattern, escape="\\"))
            )
        query = query.order_by(*PARTITION_SORTS[sort])
        if sort != "key":
            query = query.offset(offset)
        with self.read() as conn:
            rows = conn.execute(query.limit(limit)).all()
            counts = count_items(conn, [r.id for r in rows])
            tolerated = {r.id: self._tolerated(conn, r, counts[r.id]["gates"], exact=False) for r in rows}
        return [
            {
                "key": r.key,
                "queue": r.queue,
                "status": r.status,
                "gate": r.gate,
                "priority": r.priority,
                "sealed": bool(r.sealed),
                "manual_checkpoint": bool(r.manual_checkpoint),
                "lease": {"owner": r.lease_owner, "expires_at": iso(r.lease_expires_at)} if r.lease_owner else None,
                "created_at": iso(r.created_at),
                "updated_at": iso(r.updated_at),
                **counts[r.id],
                "tolerate": r.tolerate,
                "tolerated": tolerated[r.id],
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
            {"key": r.key, "queue": r.queue, "gate": r.gate, "failed_at": iso(r.updated_at), "error": r.error}
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
                "expires_at": iso(r.lease_expires_at),
                "wanted_by": r.wanted_by,
            }
            for r in rows
        ]

    def queue_gauges(self, queue: str | None = None) -> dict[str, dict[tuple[str, ...], int]]:
        """Aggregates for /metrics, one row per queue (and status): partitions by status, backlog
        (available items of available partitions), failed items, leases held, live watchers,
        completion hooks by status."""
        only: Callable[[Any, Select[Any]], Select[Any]] = (
            (lambda column, q: q.where(column == queue)) if queue is not None else (lambda column, q: q)
        )
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
            # A count over every hook's row: at most one per finished partition, and cleanup deletes
            # sent ones as it deletes partitions, so it reads fewer rows than the partitions' count above.
            hooks_by_status = conn.execute(
                only(
                    hooks.c.queue,
                    select(hooks.c.queue, hooks.c.status, func.count()).group_by(hooks.c.queue, hooks.c.status),
                )
            ).all()
        return {
            "partitions": {(q, st): n for q, st, n in partitions_by_status},
            "backlog": {(q,): n for q, n in backlog},
            "failed_items": {(q,): n for q, n in failed},
            "leases": {(q,): n for q, n in leased},
            "watchers": {(q,): n for q, n in alive},
            "hooks": {(q, st): n for q, st, n in hooks_by_status},
        }


def _watchers(conn: Connection) -> list[dict[str, Any]]:
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
            W.revision,
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
            "started_at": iso(r.started_at),
            "heartbeat_at": iso(r.heartbeat_at),
            "alive": bool(r.alive),
            "leases": r.leases,
            "revision": r.revision,
        }
        for r in rows
    ]
