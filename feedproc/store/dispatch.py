"""Dispatch: a watcher's fetch of ready items, the in-flight record the fetch writes, and the slot
claim of a queue with a concurrency limit (the fetch within the limit).

The fetch and its in-flight record are the dialect's `find_ready` and `mark_inflight`: on PostgreSQL
the watcher's hot path, two statements run on the driver's cursor (`DriverStatement`), each its own
autocommit transaction. SQLite has no LATERAL; it is in-process, so it fetches with one short query
per leased partition inside a write transaction. MariaDB/MySQL has neither LATERAL nor arrays: it
reads the leased partitions, then every one's due items in one UNION ALL of per-partition index
walks, each stopping at the limit.

What a fetch took is recorded as in flight before anything of it is delivered: one row per partition
(what is still in flight there from earlier fetches, plus these), unless a newer lease wrote that row
meanwhile; only the partitions returned may be delivered (the dialects' statements say how).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from sqlalchemy import select
from sqlalchemy.engine import Connection

from ..core.flow import Room
from ..core.records import Fetched, ReadyItem, SlotClaim, encode_inflight
from . import flow
from .base import IS_AVAILABLE, P
from .queues import Queues

InFlight = dict[int, list[tuple[int, int]]]  # partition id -> (item id, version) still in flight
#: Reads one fetch under flow control makes at most: a group filled (or a bucket emptied) by one
#: read closes its partitions, and the next read takes the other groups' items instead.
FLOW_ROUNDS = 4


class Dispatch(Queues):
    """Fetching ready items, recording them in flight, within a queue's concurrency limit and its
    pipeline's gate limits."""

    def fetch_ready(
        self,
        watcher_id: str,
        limit: int,
        exclude: Iterable[int] = (),
        *,
        slots: SlotClaim | None = None,
        closed: Iterable[int] = (),
        closed_gates: Iterable[int] = (),
        kept: InFlight | None = None,
        after: int = 0,
        aging: float | None = None,
    ) -> list[ReadyItem]:
        """Items at the current gate of this watcher's partitions (not wanted by a thief) that are due,
        skipping `exclude` (items already in flight here): the highest priority's partitions first,
        within a priority from the one after `after` (see below), each partition's items in the order
        they became ready. Partitions in `closed` (outside their time windows), and those
        whose current gate is in `closed_gates` (a pipeline gate outside its windows), are skipped.

        With `slots` (the watcher's queue has a concurrency limit, or its pipeline gate limits) the
        fetch is also the slot claim: see `_fetch_within_limit`.

        The items returned are recorded as in flight (`feedproc_inflight`) before they are returned,
        appended to what the partition's record holds, or, for the partitions in `kept` (partition id
        -> (item id, version) of the items still in flight from earlier fetches), replacing it with
        those and these: a watcher that takes a partition over charges whatever is still there.
        `after`: the last partition the previous fetch served; partitions of one priority are walked
        from the one after it (by id, wrapping around), so successive fetches take turns. `aging`:
        the queue's (seconds per step): priorities are aged by it (`aged_priority`)."""
        excluded, shut, kept = sorted(set(exclude)), sorted(set(closed)), kept or {}
        gates = sorted(set(closed_gates))
        if slots is not None:
            return self._fetch_within_limit(watcher_id, limit, excluded, slots, shut, kept, gates, after, aging)
        if limit <= 0:
            return []
        with self.single() as conn:  # PostgreSQL: autocommit; SQLite: a write transaction
            shut = self._at_gates(conn, watcher_id, gates, shut)
            return self._fetch(conn, watcher_id, limit, excluded, shut, kept, after=after, aging=aging)

    def _at_gates(self, conn: Connection, watcher_id: str, gates: list[int], closed: list[int]) -> list[int]:
        """`closed` and the partitions leased to `watcher_id` whose current gate is one of `gates`."""
        if not gates:
            return closed
        at = select(P.id).where(P.lease_owner == watcher_id, P.status == IS_AVAILABLE, P.gate.in_(gates))
        return sorted(set(closed) | set(conn.execute(at).scalars()))

    def _fetch(
        self,
        conn: Connection,
        watcher_id: str,
        limit: int,
        excluded: list[int],
        closed: list[int],
        kept: InFlight,
        keep: Callable[[list[ReadyItem]], list[ReadyItem]] | None = None,
        after: int = 0,
        aging: float | None = None,
    ) -> list[ReadyItem]:
        """Find the ready items, keep those `keep` takes (all without it), and record them in flight
        (with `kept`), per partition; the items of partitions whose record a newer lease holds are
        dropped."""
        found = self.dialect.find_ready(conn, watcher_id, limit, excluded, closed, after, aging)
        if keep is not None:
            found = keep(found)
        if not found:
            return found
        taken: InFlight = {}
        epochs: dict[int, int] = {}
        for item in found:
            taken.setdefault(item.partition_id, []).append((item.id, item.version))
            epochs[item.partition_id] = item.epoch
        pids = sorted(taken)
        entries = [
            "=" + encode_inflight([*kept[pid], *taken[pid]]) if pid in kept else encode_inflight(taken[pid])
            for pid in pids
        ]
        marked = self.dialect.mark_inflight(conn, watcher_id, pids, [epochs[pid] for pid in pids], entries)
        return found if len(marked) == len(pids) else [item for item in found if item.partition_id in marked]

    def _fetch_within_limit(
        self,
        watcher_id: str,
        want: int,
        excluded: list[int],
        claim: SlotClaim,
        closed: list[int],
        kept: InFlight,
        closed_gates: list[int],
        after: int = 0,
        aging: float | None = None,
    ) -> list[ReadyItem]:
        """Fetch ready items only as far as the queue's concurrency limit, its gates' limits and its
        flow controls (group limits, rates) allow, and take their slots and tokens, in one write
        transaction under the queue row's lock (SQLite: BEGIN IMMEDIATE).

        Free = limit - slots of the queue's other live watchers - `claim.held` (the weight this
        watcher still has in flight, which it knows exactly); likewise per limited gate, with the
        watchers' per-gate slots and the claims at that gate, and per concurrency group (and gate)
        with their group slots. Partitions whose current gate has no slot or token free, or whose
        group has none, are not read. Items are taken in dispatch order while their weights fit (a
        weight above a limit counts as the limit, so such an item runs alone); a heavy item that does
        not fit stops the queue's fetch, and its gate's (it is not overtaken by lighter ones). The
        watcher's row is then set to what it holds. A dead watcher's slots stop counting when its
        registration expires. With a rate, the list returned is a `Fetched` saying when the first
        dry bucket has a token again."""
        with self.write() as conn:
            settings = self._queue(conn, claim.queue, lock=True)
            limits = flow.with_widths(dict(claim.gate_limits), flow.gate_widths(conn, claim.queue))
            rules = settings.flow(claim.flow)
            if not settings.limited and not limits and not rules.any:  # the limits were lifted meanwhile
                self._set_slots(conn, watcher_id, 0)
                if want <= 0:
                    return []
                shut = self._at_gates(conn, watcher_id, closed_gates, closed)
                return self._fetch(conn, watcher_id, want, excluded, shut, kept, after=after, aging=aging)
            queue_free: int | None = None
            if settings.limited:
                queue_free = settings.limit - self._slots_in_use(conn, claim.queue, besides=watcher_id) - claim.held
            gate_free: dict[int, int] = {}
            if limits:
                used = self._gate_slots_in_use(conn, claim.queue, besides=watcher_id)
                gate_free = {g: n - used.get(g, 0) - claim.gate_held.get(g, 0) for g, n in limits.items()}
            full = [g for g, free in gate_free.items() if free <= 0]
            groups: dict[int, str] = {}
            room: Room | None = None
            if rules.any:
                groups = flow.leased_groups(conn, watcher_id) if rules.grouped else {}
                in_use = flow.group_use(conn, claim.queue, besides=watcher_id) if rules.grouped else {}
                for key, weight in claim.group_held.items():
                    in_use[key] = in_use.get(key, 0) + weight
                room = flow.room(conn, claim.queue, rules, set(groups.values()), in_use)
                full += [gate for gate in rules.gate_rates if room.gate_dry(gate)]
                closed = sorted({*closed, *(pid for pid, group in groups.items() if room.group_full(group))})
            budget = want if queue_free is None else min(want, queue_free)
            if room is not None and room.queue_dry:
                budget = 0
            taken: list[ReadyItem] = []
            if budget > 0:

                def keep(found: list[ReadyItem]) -> list[ReadyItem]:
                    nonlocal queue_free
                    out: list[ReadyItem] = []
                    for item in found:
                        weight = min(item.weight, settings.limit) if settings.limited else item.weight
                        if item.gate in limits:
                            weight = min(weight, limits[item.gate])
                        if queue_free is not None and weight > queue_free:
                            break  # strict dispatch order: a heavy item is not overtaken by lighter ones
                        if item.gate in gate_free and weight > gate_free[item.gate]:
                            gate_free[item.gate] = 0  # nor within its gate
                            continue
                        group = groups.get(item.partition_id)
                        if room is not None and not room.take(item.gate, group, weight):
                            continue  # its group is full, or a bucket is dry
                        if item.gate in gate_free:
                            gate_free[item.gate] -= weight
                        if queue_free is not None:
                            queue_free -= weight
                        out.append(replace(item, weight=weight, group=group))
                    return out

                shut_gates, touched = {*closed_gates, *full}, set[int]()
                for _ in range(FLOW_ROUNDS if room is not None else 1):
                    shut = self._at_gates(conn, watcher_id, sorted(shut_gates), closed)
                    left = {pid: entries for pid, entries in kept.items() if pid not in touched}
                    skip = sorted({*excluded, *(item.id for item in taken)})
                    got = self._fetch(conn, watcher_id, budget - len(taken), skip, shut, left, keep, after, aging)
                    taken += got
                    touched.update(item.partition_id for item in got)
                    if room is None or len(taken) >= budget or room.queue_dry or queue_free == 0:
                        break
                    # Groups filled and buckets emptied by this round: read the others' items now.
                    filled = {pid for pid, group in groups.items() if room.group_full(group)} - set(closed)
                    emptied = {gate for gate in rules.gate_rates if room.gate_dry(gate)} - shut_gates
                    if not filled and not emptied:
                        break
                    closed, shut_gates = sorted({*closed, *filled}), shut_gates | emptied
            held_at = dict(claim.gate_held)
            group_held = dict(claim.group_held)
            for item in taken:  # every gate's, limited or not: a window may open at any gate
                held_at[item.gate] = held_at.get(item.gate, 0) + item.weight
                if item.group is not None:
                    group_held[(item.group, item.gate)] = group_held.get((item.group, item.gate), 0) + item.weight
            self._set_slots(
                conn,
                watcher_id,
                claim.held + sum(item.weight for item in taken),
                gate_slots=held_at,
                group_slots=group_held if rules.grouped else None,
            )
            if room is None or not rules.rated:
                return taken
            flow.spend(conn, room)
            return Fetched(taken, retry_in=room.next_token_in())
