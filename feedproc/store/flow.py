"""Flow control in the database: the weight each concurrency group has in flight fleet-wide, and
the token buckets of rate limits, read and spent by the fetch or claim that holds the queue row's
lock (so no two of them decide at once; `core/flow.py` has the arithmetic).

A group's weight in flight is what the live watchers of the queue say they hold of it
(feedproc_watchers.group_slots, set in the same transaction as their fetch) plus the unexpired
claims of its partitions' items. A bucket's row holds its tokens at its last refill, on the
database clock; a bucket without a row is full.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import func, insert, select, update
from sqlalchemy.engine import Connection

from ..core.flow import FlowRules, GroupUse, Room, burst, decode_group_slots, refill
from .base import ACTIVE_CLAIM, IS_AVAILABLE, C, P, W
from .foundations import db_now
from .schema import rate_buckets

B = rate_buckets.c


def leased_groups(conn: Connection, watcher_id: str) -> dict[int, str]:
    """The concurrency group of each partition leased to `watcher_id` that has one."""
    rows = conn.execute(
        select(P.id, P.concurrency_group).where(
            P.lease_owner == watcher_id, P.status == IS_AVAILABLE, P.concurrency_group.is_not(None)
        )
    ).all()
    return {int(pid): str(group) for pid, group in rows}


def groups_of(conn: Connection, partition_ids: Iterable[int]) -> dict[int, str]:
    """The concurrency group of each of `partition_ids` that has one."""
    ids = sorted(set(partition_ids))
    if not ids:
        return {}
    rows = conn.execute(select(P.id, P.concurrency_group).where(P.id.in_(ids), P.concurrency_group.is_not(None))).all()
    return {int(pid): str(group) for pid, group in rows}


def group_use(conn: Connection, queue: str, *, besides: str | None = None) -> GroupUse:
    """Weight in flight per (group, gate) of `queue`: its live watchers' (other than `besides`)
    and its unexpired claims'. (A handful of watcher rows, and the claims in flight.)"""
    held = select(W.group_slots).where(W.queue == queue, W.expires_at > db_now(), W.group_slots.is_not(None))
    if besides is not None:
        held = held.where(W.id != besides)
    used: GroupUse = {}
    for text in conn.execute(held).scalars():
        for key, weight in decode_group_slots(text).items():
            used[key] = used.get(key, 0) + weight
    claimed = (
        select(C.concurrency_group, C.gate, func.sum(C.weight))
        .where(C.queue == queue, C.state == ACTIVE_CLAIM, C.expires_at > db_now(), C.concurrency_group.is_not(None))
        .group_by(C.concurrency_group, C.gate)
    )
    for group, gate, weight in conn.execute(claimed).all():
        used[(str(group), int(gate))] = used.get((str(group), int(gate)), 0) + int(weight)
    return used


def room(conn: Connection, queue: str, rules: FlowRules, groups: Iterable[str], used: GroupUse) -> Room:
    """The room one fetch or claim of `queue` has: `used` per group, and the whole tokens of each
    bucket that may apply (refilled up to the database's now), locked until the transaction ends."""
    rates = rules.buckets(queue, set(groups))
    tokens: dict[str, int] = {}
    fractions: dict[str, float] = {}
    now: datetime | None = None
    if rates:
        now = conn.execute(select(db_now())).scalar_one()
        stored = conn.execute(
            select(B.name, B.tokens, B.refilled_at).where(B.name.in_(sorted(rates))).with_for_update()
        ).all()
        held = {
            row.name: refill(row.tokens, (now - row.refilled_at).total_seconds(), rates[row.name]) for row in stored
        }
        for name, rate in rates.items():
            have = held.get(name, burst(rate))
            tokens[name] = int(have)
            fractions[name] = have - int(have)
    return Room(queue, rules, dict(used), tokens, rates, fractions, now)


def spend(conn: Connection, taken: Room) -> None:
    """Write back the buckets `taken` drew from: their tokens left, refilled as of now."""
    if not taken.spent:
        return
    now = taken.read_at
    existing = set(conn.execute(select(B.name).where(B.name.in_(sorted(taken.spent)))).scalars())
    for name in sorted(taken.spent):
        left = taken.tokens[name] + taken.fractions.get(name, 0.0)
        if name in existing:
            conn.execute(update(rate_buckets).where(B.name == name).values(tokens=left, refilled_at=now))
        else:
            conn.execute(insert(rate_buckets).values(name=name, queue=taken.queue, tokens=left, refilled_at=now))
