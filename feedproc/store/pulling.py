"""Pull workers: claims on the items of pull-mode queues, their heartbeats and answers, and the
expiry of claims whose worker went silent.

A claim is a lease on one item, on the database clock, held by a token. It holds while its row is
`active` and unexpired and the item's version is the claim's: every other change of an item (a
cancel, a partition retry, a watcher's answer) bumps its version and so supersedes the claim. An
answer goes through the watchers' writer (`Answers._write_outcomes`) and the gate rules
(`_settle`) in one transaction that holds the partition's lock, so the barrier is checked where
the gate advances, exactly as for a watcher's group commit. Items are claimed only at their
partition's current gate, never in a partition a watcher holds a lease on, and never while
another claim holds them (`feedproc_items.claimed_until`); which items those are is the dialect's
`find_claimable` (`claimable.py` says in what order).

A claim that expires is a delivery that failed: it counts an attempt and is retried with backoff
(or fails the item when its attempts run out), with a delivery record naming the worker.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.engine import Connection

from ..core import windows as timewindows
from ..core.errors import InvalidAnswer, NotFound, PermanentError, Refused, RetryLater, StaleClaim
from ..core.flow import Room
from ..core.models import Response
from ..core.pipelines import collects
from ..core.policy import RetryPolicy, outcome_of, validate
from ..core.records import Kind, Outcome, ReadyItem, tally_outcomes
from . import flow
from .answers import SETTLE_GRACE, Answers
from .base import ACTIVE_CLAIM, AVAILABLE, CANCELLED, C, I, P, iso
from .claimable import ALL_PRIORITIES
from .escaping import storable
from .foundations import db_now, seconds_from_now, stored_bytes
from .pipelines import Pipelines
from .queues import Queues
from .schema import claims, items, partitions

#: A worker's answer: item id, claim token, and the Response or the failure it reported.
ClaimAnswer = tuple[int, str, Response | None, BaseException | None]
EXPIRED_PER_SWEEP = 200  # expired claims settled per transaction
WORKER_LIMIT = 120  # characters of a worker's name that its claims keep (feedproc_claims.worker)

#: A claim as `claim`, answers and expiry read it (`Dialect.claims_of`).
CLAIM_COLUMNS = (
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


class Pulling(Answers, Queues, Pipelines):
    """Claims: `claim`, `heartbeat_claim`, `answer_claim`, `expire_claims`."""

    def claim(
        self,
        queue: str,
        worker: str,
        max_items: int,
        lease_seconds: float,
        policy: RetryPolicy,
        priorities: tuple[int, int] = ALL_PRIORITIES,
    ) -> list[dict[str, Any]]:
        """Claim up to `max_items` ready items of pull-mode `queue` for `worker`, each for
        `lease_seconds`: a dict per item (id, partition, queue, gate, attempt, deliveries, data as bytes, token,
        lease_expires_at; and for an item that collects an earlier gate's results, `collects`: its
        partition's id and what it collects, `core.pipelines.Collects`). Claims that expired in the
        queue are settled first (`expire_claims`). Refused unless the queue is in pull mode; [] when
        nothing is ready or its window is closed. Only partitions with a priority in `priorities`
        (lowest, highest; both included).
        Claims count against the queue's limit and its pipeline's gate limits, as watchers' slots do,
        and take nothing of a gate that is full or outside its windows."""
        worker = storable(worker, WORKER_LIMIT)  # as every record of its deliveries will name it
        self.expire_claims(queue, policy)
        with self.write() as conn:
            settings = self._queue(conn, queue)
            spec = self._claims_pipeline(conn, queue)
            gate_limits = flow.with_widths(spec.limits if spec is not None else {}, flow.gate_widths(conn, queue))
            rules = settings.flow(spec.flow if spec is not None else None)
            # Claims count against the limits: one claimer at a time decides, under the queue row's lock.
            if settings.limited or gate_limits or rules.any:
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
            flow_room: Room | None = None
            # Some candidates may be of groups or gates without room: read a few more than wanted.
            wanted = max_items * 4 + 16 if rules.any else max_items
            rows = self.dialect.find_claimable(conn, queue, wanted, sorted(blocked), priorities)
            groups: dict[int, str] = {}
            if rules.any:
                groups = flow.groups_of(conn, (r.partition_id for r in rows)) if rules.grouped else {}
                in_use = flow.group_use(conn, queue) if rules.grouped else {}
                flow_room = flow.room(conn, queue, rules, set(groups.values()), in_use)
            chosen = _within_limits(rows, now, room, gate_room, gate_limits, flow_room, groups)[:max_items]
            if flow_room is not None:
                flow.spend(conn, flow_room)
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
            claimed = self.dialect.claim_items(conn, claiming, ids)
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
                        "concurrency_group": groups.get(r.partition_id),
                    }
                    for r in chosen
                ],
            )
            entries: list[dict[str, Any]] = [
                {
                    "id": r.id,
                    "partition": r.key,
                    "queue": r.queue,
                    "gate": r.gate,
                    "attempt": r.attempts + 1,
                    "deliveries": r.deliveries + 1,
                    "data": stored_bytes(r.data),
                    "token": tokens[r.id],
                    "lease_expires_at": iso(held[r.id][1]),
                }
                for r in chosen
            ]
            for entry, r in zip(entries, chosen, strict=True):
                what = collects(spec, r.gate, r.collect)
                if what is not None:  # a fan-in item: `Feed.claim` adds what it collects
                    entry["collects"] = (r.partition_id, what)
            return entries

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
        else by `policy`. An answer whose accumulate names a number no operation is declared for
        (on its gate, or its queue) fails its item for good, saying which."""
        results: list[dict[str, Any] | Exception] = []
        answers = [(item_id, storable(token), response, error) for item_id, token, response, error in answers]
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
                if outcome.accumulate is not None and (why := self._accumulate_refusal(conn, outcome, claim.queue)):
                    outcome = outcome_of(ready, policy_of(claim.queue, claim.gate), error=PermanentError(why))
                used.add(token)
                done.append((claim, item, outcome))
                results.append(
                    {"id": item_id, "outcome": str(outcome.kind), "attempts": outcome.attempts, "error": outcome.error}
                )
            if done:
                self._finish(conn, done, "answered")
                failing = {claim.partition_id for claim, _, outcome in done if outcome.kind == Kind.FAIL}
                for pid in sorted({claim.partition_id for claim, _, _ in done}):
                    self._settle(conn, pid, failed_now=pid in failing)
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
            self._settle(conn, claim.partition_id, failed_now=False)

    def expire_claims(self, queue: str | None, policy: RetryPolicy, *, limit: int = EXPIRED_PER_SWEEP) -> int:
        """Settle up to `limit` claims (of `queue`, or every queue) that ran out without an answer:
        each counts an attempt and is retried with backoff, or fails its item when its attempts
        run out (its gate's attempts in the queue's pipeline, else `policy`'s). Returns how many were settled."""
        query = select(*CLAIM_COLUMNS).where(C.state == ACTIVE_CLAIM, C.expires_at < db_now())
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
            rows = {r.id: r for r in conn.execute(item_rows([c.item_id for c in found])).all()}
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
                failing = {claim.partition_id for claim, _, outcome in finished if outcome.kind == Kind.FAIL}
                for pid in sorted({claim.partition_id for claim, _, _ in finished}):
                    self._settle(conn, pid, failed_now=pid in failing)
            return len(found)

    # ------------------------------------------------------------ helpers

    def _held(self, conn: Connection, item_id: int, token: str) -> tuple[Any, Any]:
        """The claim `token` on `item_id` and the item, the partition locked; raises NotFound for
        an unknown token and StaleClaim when it no longer holds the item."""
        token = storable(token)  # (a token with a NUL in it matches none, as any other wrong token)
        claim = conn.execute(select(*CLAIM_COLUMNS).where(C.token == token)).one_or_none()
        if claim is None or claim.item_id != item_id:
            raise NotFound(f"item {item_id} has no claim with this token")
        conn.execute(select(P.id).where(P.id == claim.partition_id).with_for_update()).all()
        item = conn.execute(item_rows([item_id])).one_or_none()
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
        self.dialect.end_claims(conn, tokens, state)

    def _claims_of(self, conn: Connection, tokens: list[str]) -> list[Any]:
        return self.dialect.claims_of(conn, tokens)

    def _items_of(self, conn: Connection, ids: list[int]) -> list[Any]:
        return self.dialect.items_of(conn, ids)


def _within_limits(
    rows: Sequence[Any],
    now: datetime,
    room: int | None,
    gate_room: dict[int, int],
    gate_limits: Mapping[int, int],
    flow_room: Room | None = None,
    groups: Mapping[int, str] | None = None,
) -> list[Any]:
    """The candidate `rows` a claim takes, in order: those whose partition's windows are open at
    `now`, while their weights fit the queue's `room` (None: no limit) and their gate's `gate_room`,
    and their group's limits and the rate buckets have room (`flow_room`, charged as they are taken).
    As a watcher's fetch counts it, a partition heavier than its gate's limit takes the whole gate (it
    runs alone), and one that does not fit at its gate now is not overtaken there by lighter ones."""
    chosen: list[Any] = []
    for row in rows:
        if row.windows and not timewindows.is_open(
            timewindows.parse_windows(row.windows), timewindows.zone(row.window_tz), now
        ):
            continue
        weight = min(row.weight, gate_limits[row.gate]) if row.gate in gate_room else row.weight
        if row.gate in gate_room and weight > gate_room[row.gate]:
            gate_room[row.gate] = 0
            continue
        if room is not None and row.weight > room:
            break
        group = (groups or {}).get(row.partition_id)
        if flow_room is not None and not flow_room.take(row.gate, group, row.weight):
            continue
        if row.gate in gate_room:
            gate_room[row.gate] -= weight
        if room is not None:
            room -= row.weight
        chosen.append(row)
    return chosen


def _by_queue_and_worker(done: Sequence[tuple[Any, Any, Outcome]]) -> dict[tuple[str, str], list[Outcome]]:
    grouped: dict[tuple[str, str], list[Outcome]] = {}
    for claim, _, outcome in done:
        grouped.setdefault((claim.queue, claim.worker), []).append(outcome)
    return grouped


def item_rows(ids: list[int]) -> Any:
    """Items `ids` with what answering their claims checks of them and their partition."""
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
            I.not_yet,
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
        not_yet=item.not_yet,
    )
