"""Pull workers: claims on the items of pull-mode queues, their heartbeats and answers, and the
expiry of claims whose worker went silent.

A claim is a lease on one item, on the database clock, held by a token. It holds while its row is
`active` and unexpired and the item's version is the claim's: every other change of an item (a
cancel, a partition retry, a watcher's answer) bumps its version and so supersedes the claim. An
answer goes through the watchers' writer (`Answers._write_outcomes`) and the gate rules
(`_settle`) in one transaction that holds the partition's lock, so the barrier is checked where
the gate advances, exactly as for a watcher's group commit. Items are claimed only at their
partition's current gate, never in a partition a watcher holds a lease on, and never while
another claim holds them (`feedproc_items.claimed_until`).

A claim that expires is a delivery that failed: it counts an attempt and is retried with backoff
(or fails the item when its attempts run out), with a delivery record naming the worker.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, insert, literal, select, text, update
from sqlalchemy.engine import Connection

from ..core import windows as timewindows
from ..core.errors import InvalidAnswer, NotFound, Refused, RetryLater, StaleClaim
from ..core.models import Response
from ..core.policy import RetryPolicy, outcome_of, validate
from ..core.records import Kind, Outcome, ReadyItem, tally_outcomes
from .answers import SETTLE_GRACE, Answers
from .base import ACTIVE_CLAIM, AVAILABLE, CANCELLED, IS_AVAILABLE, C, I, P, iso
from .dialects import db_now, pg_bigint_array, seconds_from_now, stored_bytes
from .pipelines import Pipelines
from .queues import Queues
from .schema import claims, items, partitions

MAX_CLAIM = 1000  # items per claim call (and answers per call), at most
#: A worker's answer: item id, claim token, and the Response or the failure it reported.
ClaimAnswer = tuple[int, str, Response | None, BaseException | None]
EXPIRED_PER_SWEEP = 200  # expired claims settled per transaction

# The next `:max` claimable items of a queue on PostgreSQL: its partitions in lease order (priority,
# then age), each one's items at its current gate in due order, locked with SKIP LOCKED so that
# concurrent claimers never wait for each other nor take the same item. There is deliberately no
# ORDER BY over the join: the nested loop yields the partitions in order, and the LIMIT stops it as
# soon as it has enough (an outer sort would walk and lock every ready partition's items first).
_PG_CANDIDATES = text(
    """
    SELECT i.id, i.version, i.partition_id, p.key, p.queue, i.gate, i.attempts, i.data, p.weight,
           i.deliveries, i.lost, p.windows, p.window_tz, p.rank
    FROM (SELECT id, key, queue, gate, weight, windows, window_tz,
                 row_number() OVER (ORDER BY priority DESC, created_at, id) AS rank
          FROM feedproc_partitions
          WHERE queue = :queue AND status = 'available' AND ready_at IS NOT NULL AND ready_at <= now()
            AND (not_before IS NULL OR not_before <= now())
            AND (lease_owner IS NULL OR lease_expires_at < now())
            AND gate <> ALL(CAST(:blocked AS int[]))
          ORDER BY priority DESC, created_at, id) AS p
    CROSS JOIN LATERAL (
        SELECT id, version, partition_id, gate, attempts, data, deliveries, lost, next_attempt_at
        FROM feedproc_items
        WHERE partition_id = p.id AND gate = p.gate AND status = 'available' AND next_attempt_at <= now()
          AND claimed_until IS NULL
        ORDER BY next_attempt_at, id
        LIMIT :max
        FOR UPDATE SKIP LOCKED
    ) AS i
    LIMIT :max
    """
)
# A partition of `:queue` whose items workers may claim now (not leased by a live watcher).
_CLAIMABLE_PARTITION = (
    P.queue == bindparam("queue"),
    P.status == IS_AVAILABLE,
    P.ready_at.is_not(None),
    P.ready_at <= db_now(),
    (P.not_before.is_(None)) | (P.not_before <= db_now()),
    (P.lease_owner.is_(None)) | (P.lease_expires_at < db_now()),
)
# SQLite's twin: its write transaction holds the database's lock, so a plain ordered join does.
_CANDIDATES = (
    select(
        I.id,
        I.version,
        I.partition_id,
        P.key,
        P.queue,
        I.gate,
        I.attempts,
        I.data,
        P.weight,
        I.deliveries,
        I.lost,
        P.windows,
        P.window_tz,
        P.priority,
    )
    .select_from(partitions.join(items, (I.partition_id == P.id) & (I.gate == P.gate)))
    .where(
        *_CLAIMABLE_PARTITION,
        I.status == IS_AVAILABLE,
        I.next_attempt_at <= db_now(),
        I.claimed_until.is_(None),
    )
    .order_by(P.priority.desc(), P.created_at, P.id, I.next_attempt_at, I.id)
    .limit(bindparam("max"))
)
# Partitions at a gate in `:blocked` (full, or outside its windows) are left out: read on, they would
# use up the claim's `:max`. A statement of its own, for claims of queues with such gates only.
_NOT_BLOCKED = P.gate.not_in(bindparam("blocked", expanding=True))
_CANDIDATES_UNBLOCKED = _CANDIDATES.where(_NOT_BLOCKED)
# MariaDB/MySQL's twin, in steps, all plain reads but the last: it has no LATERAL, and InnoDB locks
# every row a locking read reads before its sort and LIMIT (a locking ordered join would lock every
# claimable item of the queue, and concurrent claimers would skip them all). First the partitions in
# lease order that have a claimable item (`_MYSQL_CLAIMABLE_PARTITIONS`), then each one's claimable
# items walked in due order in one UNION ALL (`_mysql_claimable`), then those items locked by id with
# SKIP LOCKED, their conditions checked again on the locked rows (`_MYSQL_LOCK_ITEMS`: a version
# changed since the walk means the item changed, and it is left out).
_CLAIMABLE_ITEM = (
    I.status == IS_AVAILABLE,
    I.next_attempt_at <= db_now(),
    I.claimed_until.is_(None),
)
_MYSQL_CLAIMABLE_PARTITIONS = (
    select(P.id, P.gate)
    .where(
        *_CLAIMABLE_PARTITION,
        # One claimable item at least: a scalar subquery probing feedproc_items_by_gate per
        # partition (MariaDB would make an EXISTS a semi-join that reads every item of the table).
        select(literal(1))
        .where(
            I.partition_id == P.id, I.gate == P.gate, *_CLAIMABLE_ITEM, I.id.not_in(bindparam("seen", expanding=True))
        )
        .limit(1)
        .scalar_subquery()
        .is_not(None),
    )
    .order_by(P.priority.desc(), P.created_at, P.id)
    .limit(bindparam("max"))
)
_MYSQL_CLAIMABLE_PARTITIONS_UNBLOCKED = _MYSQL_CLAIMABLE_PARTITIONS.where(_NOT_BLOCKED)
_MYSQL_LOCK_ITEMS = (
    select(I.id, I.version)
    .where(I.id.in_(bindparam("ids", expanding=True)), *_CLAIMABLE_ITEM)
    .with_hint(items, "FORCE INDEX (PRIMARY)", "mysql")  # by id only, whatever the table's size
    .with_hint(items, "FORCE INDEX (PRIMARY)", "mariadb")
    .with_for_update(skip_locked=True)
)
# What `claim` reads back on MariaDB/MySQL, which has no UPDATE ... RETURNING.
_MYSQL_CLAIMED = select(I.id, I.version, I.claimed_until).where(I.id.in_(bindparam("ids", expanding=True)))
#: Rounds of the MariaDB/MySQL claim's steps before settling for fewer items than asked: each round
#: walks on past the items that concurrent claimers locked meanwhile, twice as far as the one before.
CLAIM_ROUNDS = 4


def _mysql_claimable(parts: Sequence[Any], limit: int, seen: Sequence[int]) -> str:
    """The first `limit` claimable items of partitions `parts` (id, gate; in lease order), in claim
    order, with what `claim` returns of them: one index walk per partition (feedproc_items_by_gate,
    in due order, stopping at the limit), the rows joined once the items are chosen. Numbers only are
    written into the text."""
    skip = f" AND c.id NOT IN ({','.join(map(str, map(int, seen)))})" if seen else ""
    walks = " UNION ALL ".join(
        f"(SELECT c.id, {n} AS n, c.next_attempt_at AS due FROM feedproc_items AS c"
        f" WHERE c.partition_id = {int(p.id)} AND c.gate = {int(p.gate)} AND c.status = 'available'"
        f" AND c.next_attempt_at <= UTC_TIMESTAMP(6) AND c.claimed_until IS NULL{skip}"
        f" ORDER BY c.next_attempt_at, c.id LIMIT {int(limit)})"
        for n, p in enumerate(parts)
    )
    return (
        'SELECT i.id, i.version, i.partition_id, p."key", p.queue, i.gate, i.attempts, i.data, p.weight,'
        " i.deliveries, i.lost, p.windows, p.window_tz"
        f" FROM (SELECT u.id, u.n, u.due FROM ({walks}) AS u ORDER BY u.n, u.due, u.id LIMIT {int(limit)}) AS t"
        " JOIN feedproc_items AS i ON i.id = t.id JOIN feedproc_partitions AS p ON p.id = i.partition_id"
        " ORDER BY t.n, t.due, t.id"
    )


_CLAIM_COLUMNS = (
    C.token,
    C.item_id,
    C.partition_id,
    C.queue,
    C.worker,
    C.gate,
    C.version,
    C.weight,
    C.lease_seconds,
    C.state,
    C.claimed_at,
    C.expires_at,
    (C.expires_at > db_now()).label("live"),
)


# The same reads and the claims' end on PostgreSQL, with arrays instead of one bound parameter per
# value (an answer batch of 100: 1.9 and 2.2 ms for the expanded IN lists, measured with engine events).
_PG_CLAIMS_OF = text(
    """
    SELECT token, item_id, partition_id, queue, worker, gate, version, weight, lease_seconds, state,
           claimed_at, expires_at, expires_at > now() AS live
    FROM feedproc_claims WHERE token = ANY(CAST(:tokens AS varchar[]))
    """
)
_PG_ITEMS_OF = text(
    """
    SELECT i.id, i.version, i.partition_id, i.gate, i.status, i.attempts, i.deliveries, i.lost, p.key, p.queue,
           p.status AS partition_status
    FROM feedproc_items AS i JOIN feedproc_partitions AS p ON p.id = i.partition_id
    WHERE i.id = ANY(CAST(:ids AS bigint[]))
    """
)
_PG_END_CLAIMS = text(
    "UPDATE feedproc_claims SET state = :state, ended_at = now() WHERE token = ANY(CAST(:tokens AS varchar[]))"
)


class Pulling(Answers, Queues, Pipelines):
    """Claims: `claim`, `heartbeat_claim`, `answer_claim`, `expire_claims`."""

    def claim(
        self, queue: str, worker: str, max_items: int, lease_seconds: float, policy: RetryPolicy
    ) -> list[dict[str, Any]]:
        """Claim up to `max_items` ready items of pull-mode `queue` for `worker`, each for
        `lease_seconds`: a dict per item (id, partition, queue, gate, attempt, data as bytes, token,
        lease_expires_at). Claims that expired in the queue are settled first (`expire_claims`).
        Refused unless the queue is in pull mode; [] when nothing is ready or its window is closed.
        Claims count against the queue's limit and its pipeline's gate limits, as watchers' slots do,
        and take nothing of a gate that is full or outside its windows."""
        self.expire_claims(queue, policy)
        with self.write() as conn:
            settings = self._queue(conn, queue)
            spec = self._claims_pipeline(conn, queue)
            gate_limits = spec.limits if spec is not None else {}
            if settings.limited or gate_limits:  # claims count against the limits: one claimer at a time decides
                settings = self._queue(conn, queue, lock=True)
            if settings.mode != "pull":
                raise Refused(f"queue {queue!r} is not in pull mode (feedproc queue set {queue} --mode pull)")
            now = datetime.now(UTC)
            if not settings.is_open(now):
                return []
            room = None
            if settings.limited:
                room = settings.limit - self._slots_in_use(conn, queue)
                if room <= 0:
                    return []
            gate_room: dict[int, int] = {}
            if gate_limits:
                used = self._gate_slots_in_use(conn, queue)
                gate_room = {gate: limit - used.get(gate, 0) for gate, limit in gate_limits.items()}
            blocked = {gate for gate, free in gate_room.items() if free <= 0}
            blocked.update(spec.closed_gates(now) if spec is not None else ())
            if self.mysql:
                rows = _claimable_mysql(conn, queue, max_items, sorted(blocked))
            elif self.postgres:
                params = {"queue": queue, "max": max_items, "blocked": pg_bigint_array(sorted(blocked))}
                rows = list(conn.execute(_PG_CANDIDATES, params).all())
            elif blocked:
                params = {"queue": queue, "max": max_items, "blocked": sorted(blocked)}
                rows = list(conn.execute(_CANDIDATES_UNBLOCKED, params))
            else:
                rows = list(conn.execute(_CANDIDATES, {"queue": queue, "max": max_items}))
            if self.postgres:
                rows.sort(key=lambda r: (r.rank, r.id))  # see _PG_CANDIDATES: no sort in the database
            chosen: list[Any] = []
            for row in rows:
                if row.windows and not timewindows.is_open(
                    timewindows.parse_windows(row.windows), timewindows.zone(row.window_tz), now
                ):
                    continue
                if row.gate in gate_room:
                    # As a watcher's fetch counts it: a partition heavier than the gate's limit takes
                    # the whole gate (it runs alone), and one that does not fit now is not overtaken.
                    weight = min(row.weight, gate_limits[row.gate])
                    if weight > gate_room[row.gate]:
                        gate_room[row.gate] = 0
                        continue
                    gate_room[row.gate] -= weight
                if room is not None:
                    if row.weight > room:
                        break
                    room -= row.weight
                chosen.append(row)
            if not chosen:
                return []
            ids = [r.id for r in chosen]
            claiming = (
                update(items)
                .where(I.id.in_(ids))
                .values(
                    claimed_until=seconds_from_now(lease_seconds),
                    next_attempt_at=seconds_from_now(lease_seconds + SETTLE_GRACE),  # not due for anyone meanwhile
                    version=I.version + 1,
                )
            )
            if self.mysql:  # no UPDATE ... RETURNING: read back (the rows are locked by this transaction)
                conn.execute(claiming)
                claimed = conn.execute(_MYSQL_CLAIMED, {"ids": ids}).all()
            else:
                claimed = conn.execute(claiming.returning(I.id, I.version, I.claimed_until)).all()
            held = {r.id: (r.version, r.claimed_until) for r in claimed}
            tokens = {r.id: secrets.token_urlsafe(24) for r in chosen}
            conn.execute(
                insert(claims).values(claimed_at=db_now(), expires_at=seconds_from_now(lease_seconds)),
                [
                    {
                        "token": tokens[r.id],
                        "item_id": r.id,
                        "partition_id": r.partition_id,
                        "queue": queue,
                        "worker": worker,
                        "gate": r.gate,
                        "version": held[r.id][0],
                        "weight": r.weight,
                        "lease_seconds": float(lease_seconds),
                        "state": "active",
                    }
                    for r in chosen
                ],
            )
            return [
                {
                    "id": r.id,
                    "partition": r.key,
                    "queue": r.queue,
                    "gate": r.gate,
                    "attempt": r.attempts + 1,
                    "data": stored_bytes(r.data),
                    "token": tokens[r.id],
                    "lease_expires_at": iso(held[r.id][1]),
                }
                for r in chosen
            ]

    def heartbeat_claim(
        self, item_id: int, token: str, *, progress: float | None = None, lease_seconds: float | None = None
    ) -> str:
        """Extend a claim by its lease (or `lease_seconds`) from now, keeping `progress` (0..1) when
        given; the new expiry (ISO 8601). StaleClaim (409) when the token no longer holds the item."""
        with self.write() as conn:
            claim, _ = self._held(conn, item_id, token)
            seconds = claim.lease_seconds if lease_seconds is None else float(lease_seconds)
            until = seconds_from_now(seconds)
            conn.execute(update(claims).where(C.token == token).values(expires_at=until, lease_seconds=seconds))
            values: dict[str, Any] = {
                "claimed_until": until,
                "next_attempt_at": seconds_from_now(seconds + SETTLE_GRACE),
            }
            if progress is not None:
                values["progress"] = progress
            conn.execute(update(items).where(I.id == item_id).values(**values))
            expires = conn.execute(select(C.expires_at).where(C.token == token)).scalar_one()
            return iso(expires) or ""

    def answer_claim(
        self,
        item_id: int,
        token: str,
        policy: RetryPolicy,
        *,
        response: Response | None = None,
        error: BaseException | None = None,
    ) -> dict[str, Any]:
        """Write a worker's answer (a Response, or the failure it reported) for a claimed item, then
        apply the gate rules to its partition, in one transaction. Returns what became of the item
        (`outcome`: done, move, later, retry or fail). StaleClaim (409) when the token no longer
        holds the item, NotFound for an unknown token, InvalidAnswer for an answer that breaks the
        rules for it (a gate below the item's, say): nothing is written then."""
        (result,) = self.answer_claims([(item_id, token, response, error)], policy)
        if isinstance(result, Exception):
            raise result
        return result

    def answer_claims(self, answers: Sequence[ClaimAnswer], policy: RetryPolicy) -> list[dict[str, Any] | Exception]:
        """`answer_claim` for many answers in one transaction (a worker's group commit): each
        answer's result, or the error that refused it alone (StaleClaim, NotFound, InvalidAnswer).
        A failure is retried or failed by its gate's attempts and backoff in the queue's pipeline,
        else by `policy`."""
        results: list[dict[str, Any] | Exception] = []
        with self.write() as conn:
            found = {c.token: c for c in self._claims_of(conn, sorted({a[1] for a in answers}))}
            pids = sorted({c.partition_id for c in found.values()})
            conn.execute(select(P.id).where(P.id.in_(pids)).order_by(P.id).with_for_update()).all()
            rows = {r.id: r for r in self._items_of(conn, [c.item_id for c in found.values()])}
            # A "done" answer's outcome does not depend on its gate's attempts and backoff: read the
            # pipelines of the queues with other answers alone (none in the common case: no read).
            others = {
                found[token].queue
                for _, token, response, error in answers
                if token in found and (error is not None or response is None or not response.done)
            }
            policy_of = self._gate_policies(conn, others, policy)
            done: list[tuple[Any, Any, Outcome]] = []
            used: set[str] = set()
            for item_id, token, response, error in answers:
                claim = found.get(token)
                if claim is None or claim.item_id != item_id:
                    results.append(NotFound(f"item {item_id} has no claim with this token"))
                    continue
                item = rows.get(item_id)
                refusal = _refusal(item_id, claim, item, answered=token in used)
                if refusal is not None:
                    results.append(refusal)
                    continue
                ready = _ready(item, claim)
                try:
                    if response is not None:
                        validate(ready, response)  # the worker hears why; nothing is written for it
                except InvalidAnswer as invalid:
                    results.append(invalid)
                    continue
                outcome = outcome_of(ready, policy_of(claim.queue, claim.gate), response=response, error=error)
                used.add(token)
                done.append((claim, item, outcome))
                results.append(
                    {"id": item_id, "outcome": str(outcome.kind), "attempts": outcome.attempts, "error": outcome.error}
                )
            if done:
                self._finish(conn, done, "answered")
                for pid in sorted({claim.partition_id for claim, _, _ in done}):
                    self._settle(conn, pid)
        return results

    def release_claim(self, item_id: int, token: str) -> None:
        """Hand a claimed item back unanswered (a worker stopping): it is ready again at once and
        no attempt is counted. StaleClaim when the token no longer holds it."""
        with self.write() as conn:
            claim, _ = self._held(conn, item_id, token)
            conn.execute(
                update(items)
                .where(I.id == item_id)
                .values(claimed_until=None, next_attempt_at=db_now(), version=I.version + 1)
            )
            self._end_claims(conn, [token], "released")
            self._settle(conn, claim.partition_id)

    def expire_claims(self, queue: str | None, policy: RetryPolicy, *, limit: int = EXPIRED_PER_SWEEP) -> int:
        """Settle up to `limit` claims (of `queue`, or every queue) that ran out without an answer:
        each counts an attempt and is retried with backoff, or fails its item when its attempts
        run out (its gate's attempts in the queue's pipeline, else `policy`'s). Returns how many were settled."""
        query = select(*_CLAIM_COLUMNS).where(C.state == ACTIVE_CLAIM, C.expires_at < db_now())
        if queue is not None:
            query = query.where(C.queue == queue)
        query = query.order_by(C.expires_at).limit(limit)
        with self.read() as conn:  # the common case, none: a read, not a write transaction
            if conn.execute(query.with_only_columns(C.token)).first() is None:
                return 0
        with self.write() as conn:
            found = conn.execute(query.with_for_update(skip_locked=True)).all()
            if not found:
                return 0
            pids = sorted({c.partition_id for c in found})
            conn.execute(select(P.id).where(P.id.in_(pids)).order_by(P.id).with_for_update()).all()
            rows = {r.id: r for r in conn.execute(_item_rows([c.item_id for c in found])).all()}
            policy_of = self._gate_policies(conn, {c.queue for c in found}, policy)
            finished: list[tuple[Any, Any, Outcome]] = []
            for claim in found:
                item = rows.get(claim.item_id)
                reason = _stale_reason(claim, item, live=False)
                if reason != "expired" or item is None:
                    self._end_claims(conn, [claim.token], reason or "superseded")
                    continue
                seconds = f"{claim.lease_seconds:g}"
                late = RetryLater(f"claim by worker {claim.worker} expired: no answer or heartbeat within {seconds}s")
                outcome = outcome_of(_ready(item, claim), policy_of(claim.queue, claim.gate), error=late)
                finished.append((claim, item, outcome))
            if finished:
                self._finish(conn, finished, "expired")
                for pid in sorted({claim.partition_id for claim, _, _ in finished}):
                    self._settle(conn, pid)
            return len(found)

    # ------------------------------------------------------------ helpers

    def _held(self, conn: Connection, item_id: int, token: str) -> tuple[Any, Any]:
        """The claim `token` on `item_id` and the item, the partition locked; raises NotFound for
        an unknown token and StaleClaim when it no longer holds the item."""
        claim = conn.execute(select(*_CLAIM_COLUMNS).where(C.token == token)).one_or_none()
        if claim is None or claim.item_id != item_id:
            raise NotFound(f"item {item_id} has no claim with this token")
        conn.execute(select(P.id).where(P.id == claim.partition_id).with_for_update()).all()
        item = conn.execute(_item_rows([item_id])).one_or_none()
        refusal = _refusal(item_id, claim, item)
        if refusal is not None:
            raise refusal
        return claim, item

    def _finish(self, conn: Connection, done: Sequence[tuple[Any, Any, Outcome]], state: str) -> None:
        """Write the outcomes of ending claims (the watchers' writer: version-guarded, children
        exactly once, delivery records) and end the claims in `state`."""
        now_us = int(datetime.now(UTC).timestamp() * 1e6)
        by_worker: dict[str, list[Outcome]] = {}
        for claim, item, outcome in done:
            started = int(claim.claimed_at.timestamp() * 1e6)
            outcome.n, outcome.attempt = item.deliveries + 1, item.attempts + 1
            outcome.started_us, outcome.duration_us = started, max(now_us - started, 0)
            if outcome.kind in (Kind.RETRY, Kind.FAIL):
                outcome.detail = outcome.error
            by_worker.setdefault(claim.worker, []).append(outcome)
        for worker, outcomes in by_worker.items():
            self._write_outcomes(conn, outcomes, worker)  # which clears the items' claimed_until
        for (queue, worker), outcomes in _by_queue_and_worker(done).items():
            self._tally(conn, queue, worker, tally_outcomes(outcomes))
        self._end_claims(conn, [claim.token for claim, _, _ in done], state)

    def _end_claims(self, conn: Connection, tokens: list[str], state: str) -> None:
        if self.postgres:
            conn.execute(_PG_END_CLAIMS, {"tokens": tokens, "state": state})
        else:
            conn.execute(update(claims).where(C.token.in_(tokens)).values(state=state, ended_at=db_now()))

    def _claims_of(self, conn: Connection, tokens: list[str]) -> list[Any]:
        if self.postgres:
            return list(conn.execute(_PG_CLAIMS_OF, {"tokens": tokens}))
        return list(conn.execute(select(*_CLAIM_COLUMNS).where(C.token.in_(tokens))))

    def _items_of(self, conn: Connection, ids: list[int]) -> list[Any]:
        if self.postgres:
            return list(conn.execute(_PG_ITEMS_OF, {"ids": pg_bigint_array(ids)}))
        return list(conn.execute(_item_rows(ids)))


def _claimable_mysql(conn: Connection, queue: str, max_items: int, blocked: Sequence[int]) -> list[Any]:
    """Up to `max_items` claimable items of `queue` in claim order, at gates not `blocked`, locked
    (MariaDB/MySQL: see `_mysql_claimable`). Items other claimers locked are skipped; each round past
    them walks twice as far (the extra items it locks stay untouched until the commit)."""
    rows: list[Any] = []
    seen: list[int] = []
    for n in range(CLAIM_ROUNDS):
        want = max_items - len(rows)
        walk = min(want << n, MAX_CLAIM)  # (a partition a branch of the UNION at most)
        if blocked:
            params = {"queue": queue, "max": walk, "seen": seen, "blocked": list(blocked)}
            parts = conn.execute(_MYSQL_CLAIMABLE_PARTITIONS_UNBLOCKED, params).all()
        else:
            parts = conn.execute(_MYSQL_CLAIMABLE_PARTITIONS, {"queue": queue, "max": walk, "seen": seen}).all()
        if not parts:
            break
        found = conn.exec_driver_sql(_mysql_claimable(parts, walk, seen)).all()
        if not found:
            break
        locked = {(r.id, r.version) for r in conn.execute(_MYSQL_LOCK_ITEMS, {"ids": [r.id for r in found]})}
        rows += [r for r in found if (r.id, r.version) in locked][:want]
        # Each of the partitions had one at least: fewer than walked for means they were all walked.
        if len(found) < walk or len(rows) >= max_items:
            break
        seen += [r.id for r in found]
    return rows


def _by_queue_and_worker(done: Sequence[tuple[Any, Any, Outcome]]) -> dict[tuple[str, str], list[Outcome]]:
    grouped: dict[tuple[str, str], list[Outcome]] = {}
    for claim, _, outcome in done:
        grouped.setdefault((claim.queue, claim.worker), []).append(outcome)
    return grouped


def _item_rows(ids: list[int]) -> Any:
    return (
        select(
            I.id,
            I.version,
            I.partition_id,
            I.gate,
            I.status,
            I.attempts,
            I.deliveries,
            I.lost,
            P.key,
            P.queue,
            P.status.label("partition_status"),
        )
        .select_from(items.join(partitions, P.id == I.partition_id))
        .where(I.id.in_(ids))
    )


def _refusal(item_id: int, claim: Any, item: Any | None, *, answered: bool = False) -> StaleClaim | None:
    """The StaleClaim refusing `claim` on `item` (None: it holds). `answered`: earlier in this batch."""
    reason = "superseded" if answered else _stale_reason(claim, item, live=bool(claim.live))
    if reason is None:
        return None
    said = {
        "expired": f"the claim on item {item_id} expired",
        "cancelled": f"item {item_id} was cancelled",
        "superseded": f"item {item_id} changed since it was claimed (retried, or delivered elsewhere)",
    }[reason]
    if answered or claim.state == "answered":
        said = f"item {item_id} was answered already with this token"
    return StaleClaim(said, reason)


def _stale_reason(claim: Any, item: Any | None, *, live: bool) -> str | None:
    """Why `claim` no longer holds `item` ("expired", "cancelled", "superseded"), or None."""
    if item is None or item.status == CANCELLED or item.partition_status == CANCELLED:
        return "cancelled"
    if claim.state in ("cancelled", "superseded", "expired"):
        return str(claim.state)
    if claim.state == "released":
        return "superseded"
    if claim.state != "active" or item.version != claim.version or item.status != AVAILABLE:
        return "superseded"
    if item.partition_status != AVAILABLE:  # failed meanwhile: answers wait for its retry
        return "superseded"
    if not live:
        return "expired"
    return None


def _ready(item: Any, claim: Any) -> ReadyItem:
    """The item as the rules of `core.policy` see a delivery of it (a claim has no lease epoch)."""
    return ReadyItem(
        item.id,
        item.version,
        item.partition_id,
        item.key,
        item.queue,
        0,
        item.gate,
        item.attempts,
        b"",
        claim.weight,
        item.deliveries,
        item.lost,
    )
