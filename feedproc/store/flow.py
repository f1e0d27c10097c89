"""Flow control in the database: the weight each concurrency group has in flight fleet-wide, and
the token buckets of rate limits, read and spent by the fetch or claim that holds the queue row's
lock (so no two of them decide at once; `core/flow.py` has the arithmetic).

A group's weight in flight is what the live watchers of the queue say they hold of it
(feedproc_watchers.group_slots, set in the same transaction as their fetch) plus the unexpired
claims of its partitions' items. A bucket's row holds its tokens at its last refill, on the
database clock; a bucket without a row is full.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.engine import Connection

from ..core.errors import NotFound, Refused
from ..core.flow import (
    FlowRules,
    GateReport,
    GroupUse,
    Rate,
    Room,
    adapted,
    burst,
    check_rate_name,
    decode_group_slots,
    format_rate,
    parse_rate,
    refill,
    shared_bucket,
)
from .base import ACTIVE_CLAIM, IS_AVAILABLE, C, P, Q, StoreBase, W
from .foundations import db_now
from .schema import gate_windows, rate_buckets

B, GW = rate_buckets.c, gate_windows.c
log = logging.getLogger("feedproc.store")


def gate_widths(conn: Connection, queue: str) -> dict[int, float]:
    """The adaptive concurrency windows of `queue`'s gates that have one (handlers pushed back)."""
    return {int(gate): float(width) for gate, width in conn.execute(select(GW.gate, GW.width).where(GW.queue == queue))}


def with_widths(limits: dict[int, int], widths: dict[int, float]) -> dict[int, int]:
    """Gate limits with the adaptive windows: the smaller of a gate's limit and its window (whole, at least 1)."""
    merged = dict(limits)
    for gate, width in widths.items():
        window = max(1, int(width))
        merged[gate] = min(merged.get(gate, window), window)
    return merged


class AdaptiveWindows(StoreBase):
    """Adaptive concurrency: each gate's fleet-wide window, shrunk when its handler pushes back and
    grown as its answers succeed (`core.flow.adapted`), read by every fetch as a gate limit."""

    def adapt(self, watcher_id: str, queue: str, reports: dict[int, GateReport]) -> dict[int, float]:
        """Apply one watcher's `reports` (gate -> what it saw) to `queue`'s windows, in one
        transaction; returns every window of the queue now. A first push-back at a gate opens its
        window at a share of what the fleet is estimated to run there (this watcher's items in
        flight there, times the queue's live watchers); a window grown to what the fleet may run at
        all (its live watchers' concurrency) is removed."""
        with self.write() as conn:
            fleet = conn.execute(
                select(func.count(), func.coalesce(func.sum(W.concurrency), 0)).where(
                    W.queue == queue, W.expires_at > db_now()
                )
            ).one()
            watchers, ceiling = max(int(fleet[0]), 1), int(fleet[1])
            now: datetime = conn.execute(select(db_now())).scalar_one()
            rows = {
                int(row.gate): row
                for row in conn.execute(
                    select(GW.gate, GW.width, GW.cut_at)
                    .where(GW.queue == queue, GW.gate.in_(sorted(reports)))
                    .with_for_update()
                )
            }
            for gate, report in sorted(reports.items()):
                row = rows.get(gate)
                width = None if row is None else float(row.width)
                since_cut = None if row is None else (now - row.cut_at).total_seconds()
                fleet_runs = report.in_flight * watchers  # (a pull queue has no watcher: what is reported)
                new = adapted(width, report, fleet=fleet_runs, ceiling=max(ceiling, fleet_runs), since_cut=since_cut)
                cut = new is not None and (width is None or new < width)
                if new is None and row is not None:
                    conn.execute(delete(gate_windows).where(GW.queue == queue, GW.gate == gate))
                elif new is not None and row is None:
                    conn.execute(
                        insert(gate_windows).values(queue=queue, gate=gate, width=new, cut_at=now, updated_at=now)
                    )
                elif new is not None and new != width:
                    values: dict[str, Any] = {"width": new, "updated_at": now} | ({"cut_at": now} if cut else {})
                    conn.execute(update(gate_windows).where(GW.queue == queue, GW.gate == gate).values(**values))
                if cut:
                    self._log_cut(queue, gate, width, new, watcher_id)
            return gate_widths(conn, queue)

    def gate_windows(self, queue: str) -> dict[int, float]:
        """`queue`'s adaptive concurrency windows: gate -> width (read by each watcher once a second at most)."""
        with self.single() as conn:
            return gate_widths(conn, queue)

    def _log_cut(self, queue: str, gate: int, width: float | None, new: float | None, watcher: str) -> None:
        """A cut, logged (not in a partition's history: the window is the gate's, fleet-wide)."""
        log.info(
            "queue %s gate %s: handler pushed back, concurrency window %s -> %.1f",
            queue,
            gate,
            "none" if width is None else f"{width:.1f}",
            new or 0.0,
            extra={"event": "window_cut", "queue": queue, "gate": gate, "width": new, "watcher": watcher},
        )


class SharedRates(StoreBase):
    """Shared rates: a named rate (`ocr-api` at 600/min) that any queue's or pipeline gate's `rate`
    may name, so that every queue and gate calling one API draws from one bucket, fleet-wide; and a
    queue's own rate taken ahead of a fetch (`take_tokens`)."""

    def take_tokens(self, queue: str, rate: Rate, want: int, *, ahead: int = 0) -> tuple[int, float | None]:
        """Take up to `want` tokens of `queue`'s rate (its own bucket, or the shared rate it names),
        for a fetch of that many items, and up to `ahead` more for the next fetches while the bucket
        is more than half full (so that, short of tokens, no taker holds any back): (tokens taken,
        seconds until the next one when it ran dry). A queue with nothing but a rate fetches this way,
        with its prefetch, and gives back what it did not use (`give_back_tokens`): one short
        transaction per few fetches, where the slot claim's fetch locks the queue row and takes no
        more than the idle workers (that cost a fifth to a third of the flat drain, measured)."""
        if want <= 0:
            return 0, None
        with self.write() as conn:
            taken = room(conn, queue, FlowRules(rate=rate), (), {})
            (name,) = taken.rates or (None,)
            if name is None:  # a shared rate removed meanwhile: no limit
                return want + ahead, None
            have = taken.tokens[name]
            granted = min(want, have)
            granted += max(0, min(ahead, have - granted - int(burst(taken.rates[name]) / 2)))
            taken.tokens[name] -= granted
            taken.spent[name] = granted
            spend(conn, taken)
            return granted, taken.next_token_in() if granted < want else None

    def give_back_tokens(self, queue: str, rate: Rate, count: int) -> None:
        """Return `count` tokens taken for a fetch that found fewer items (at most the bucket's burst)."""
        if count <= 0:
            return
        with self.write() as conn:
            taken = room(conn, queue, FlowRules(rate=rate), (), {})
            (name,) = taken.rates or (None,)
            if name is None:
                return
            taken.tokens[name] = min(taken.tokens[name] + count, int(burst(taken.rates[name])))
            taken.spent[name] = 0
            spend(conn, taken)

    def set_rate(self, name: str, rate: str | float) -> dict[str, Any]:
        """Declare shared rate `name` at `rate` ("600/min", or items per second), or change its rate
        (the tokens it holds are kept, at most its new burst). Returns it as `rates` shows it."""
        check_rate_name(name)
        per_second = parse_rate(rate)
        with self.write() as conn:
            bucket = shared_bucket(name)
            if conn.execute(select(B.name).where(B.name == bucket).with_for_update()).first() is None:
                conn.execute(
                    insert(rate_buckets).values(
                        name=bucket, queue=None, tokens=burst(per_second), refilled_at=db_now(), per_second=per_second
                    )
                )
            else:
                conn.execute(update(rate_buckets).where(B.name == bucket).values(per_second=per_second))
            return self._rates(conn, name)[0]

    def remove_rate(self, name: str) -> None:
        """Remove shared rate `name`; Refused while a queue names it (a pipeline gate that names it is
        no longer limited by it), NotFound when there is none."""
        check_rate_name(name)
        with self.write() as conn:
            users = sorted(conn.execute(select(Q.name).where(Q.rate_name == name)).scalars())
            if users:
                raise Refused(f"rate {name!r} is the rate of queue {users[0]!r}: set another one first")
            if conn.execute(delete(rate_buckets).where(B.name == shared_bucket(name))).rowcount == 0:
                raise NotFound(f"no rate named {name!r}")

    def rates(self) -> list[dict[str, Any]]:
        """Every shared rate: name, rate ("600/min"), per second and the tokens it holds now."""
        with self.read() as conn:
            return self._rates(conn)

    def _rates(self, conn: Connection, name: str | None = None) -> list[dict[str, Any]]:
        query = select(B.name, B.tokens, B.refilled_at, B.per_second, db_now().label("now")).where(
            B.per_second.is_not(None)
        )
        query = query.where(B.name == shared_bucket(name)) if name is not None else query.order_by(B.name)
        return [
            {
                "name": row.name[2:],
                "rate": format_rate(row.per_second),
                "per_second": row.per_second,
                "tokens": round(refill(row.tokens, (row.now - row.refilled_at).total_seconds(), row.per_second), 3),
            }
            for row in conn.execute(query).all()
        ]

    def _shared_rate(self, conn: Connection, name: str) -> float:
        """Shared rate `name`'s items per second; Refused when it is not declared."""
        found = conn.execute(select(B.per_second).where(B.name == shared_bucket(name))).scalar_one_or_none()
        if found is None:
            raise Refused(f"no rate named {name!r}: declare it first (feedproc rate set {name} 600/min)")
        return float(found)


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
    wanted = rules.buckets(queue, set(groups))
    rates: dict[str, float] = {}
    tokens: dict[str, int] = {}
    fractions: dict[str, float] = {}
    now: datetime | None = None
    stored: Sequence[Any] = ()
    if wanted:  # the buckets with the database's clock, in one statement (the clock alone if none is stored yet)
        stored = conn.execute(
            select(B.name, B.tokens, B.refilled_at, B.per_second, db_now().label("now"))
            .where(B.name.in_(sorted(wanted)))
            .with_for_update()
        ).all()
        now = stored[0].now if stored else conn.execute(select(db_now())).scalar_one()
        held: dict[str, float] = {}
        for row in stored:
            rate = wanted[row.name] if wanted[row.name] is not None else row.per_second
            if rate is None:
                continue
            rates[row.name] = float(rate)
            held[row.name] = refill(row.tokens, (now - row.refilled_at).total_seconds(), rates[row.name])
        for name, own in wanted.items():
            if own is not None:
                rates.setdefault(name, own)
            if name not in rates:  # a shared rate removed meanwhile: it limits nothing now
                tokens[name] = 1 << 62
                continue
            have = held.get(name, burst(rates[name]))
            tokens[name] = int(have)
            fractions[name] = have - int(have)
    return Room(queue, rules, dict(used), tokens, rates, fractions, now, frozenset(row.name for row in stored))


def spend(conn: Connection, taken: Room) -> None:
    """Write back the buckets `taken` drew from (or gave back to): their tokens left, refilled as of now."""
    if not taken.spent:
        return
    now, existing = taken.read_at, taken.stored
    for name in sorted(taken.spent):
        if name not in taken.rates:
            continue  # a shared rate removed meanwhile
        left = taken.tokens[name] + taken.fractions.get(name, 0.0)
        if name in existing:
            conn.execute(update(rate_buckets).where(B.name == name).values(tokens=left, refilled_at=now))
        else:
            conn.execute(insert(rate_buckets).values(name=name, queue=taken.queue, tokens=left, refilled_at=now))
