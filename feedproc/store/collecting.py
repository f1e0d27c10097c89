"""Collected results (fan-in): what the items of an earlier gate of a partition produced, read for
the item that collects them, counted and a page at a time (`core.fanin.Collected`).

"The collected gate's items" are the partition's items whose current gate is that gate, complete
(their results) or failed (their errors), in item id order. The fan-in item is delivered only once
its partition's gate has moved past that gate, and no item may enter a gate below the current one,
so the collection no longer changes while it is read.

The reads are made for a million results. The counts (and the lowest and highest id) read the
items' `feedproc_items_by_gate` index alone. A page walks the primary key from the last id seen
towards that highest id, a window of ids at a time, keeping the partition's items at the gate: in
id order, each row read once over the whole walk. (That index orders a gate's items by status and
due time, not id: paging it by id would read the whole gate for every page, a billion index
entries for a million results.)

A handler reads them over HTTP from `feedproc serve` (`api/collected.py`), authorised by its
delivery's own token: a claim row (`feedproc_claims`), like a pull worker's or a 202's. A watcher's
delivery records one in state `collecting` when it hands a handler a `results_url`; it holds while
the item's version is the claim's (every end of a delivery bumps it: an answer, a retry, a lost
delivery charged, an operator's action) and its lease lasts (the request's timeout and a grace).
Such rows count against no limit and no expiry settles them (both look at `active` claims only);
a 202 turns one into the callback's claim (same token); they go with their partition.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, insert, select, text
from sqlalchemy.engine import Connection

from ..core.errors import NotFound, StaleClaim
from ..core.fanin import COLLECT_INLINE_BYTES, PAGE, PAGE_BYTES, CollectedResult, result_size, shown_number
from ..core.pipelines import Collects, collects
from .accumulating import Accumulating
from .base import AVAILABLE, CANCELLED, C, I, P
from .foundations import db_now, seconds_from_now, stored_bytes
from .pipelines import Pipelines
from .schema import claims, items, partitions

#: A collecting delivery's claim (`feedproc_claims.state`): its handler reads the results with it.
COLLECTING = "collecting"
#: Bytes of a result read with the page's first statement: larger ones are read after it, only as
#: far as the page's byte bound takes them (a page of 1,000 results of 10 MiB is never fetched).
SMALL_RESULT = 4096
#: Ids a page's first statement walks at most (then twice as many, and so on, while too few are the
#: partition's): a fan-out's children have ids close together, so usually one window makes a page.
WINDOW = 2 * PAGE

# The collected gate's items counted, with the lowest and highest id: feedproc_items_by_gate alone
# (an index-only range of the partition's gate, per status).
_COUNTS = text(
    """
    SELECT status, count(*), min(id), max(id) FROM feedproc_items
    WHERE partition_id = :pid AND gate = :gate AND status IN ('complete', 'failed')
    GROUP BY status
    """
)
# One page (each dialect's `read_collected`, its columns these with the database's byte `{length}`):
# the primary key walked from `after` to `until`, a window of ids at a time (`WINDOW`,
# doubled while the partition's items are sparse in it). The partition and gate terms are kept off
# every index (`+ 0`, SQLite's unary `+`, MariaDB's FORCE INDEX): on the items' index the planner
# would read the whole gate and sort it, for every page. And the window bounds what a page reads
# whatever the plan: over the whole range PostgreSQL, misjudging those terms, read and sorted every
# row of it per page (a million results: 0.2-0.4 s a page, 180 s in all; 7 s with windows).
PAGE_COLUMNS = (
    "id, status, CASE WHEN {length}(result) <= :small THEN result END AS small, {length}(result) AS size,"
    " CASE WHEN status = 'failed' THEN last_error END AS error"
)
_LARGE_RESULTS = select(I.id, I.result).where(I.id.in_(bindparam("ids", expanding=True)))


@dataclass(frozen=True, slots=True)
class Gathered:
    """What a fan-in item receives as its delivery starts: its `collection` counted, every result
    when they fit inline (`results`; None: they travel by pages) and the partition's `accumulated`
    numbers (as shown: an int where the value is one)."""

    collection: Collection
    results: list[CollectedResult] | None
    accumulated: dict[str, int | float]


@dataclass(frozen=True, slots=True)
class Collection:
    """The results an item collects, counted: the collected `gate` of partition `partition_id`,
    its `count` complete and `failed` failed items, and the lowest and highest of their ids (0 when
    there are none): a page walk's bounds."""

    partition_id: int
    gate: int
    count: int = 0
    failed: int = 0
    first: int = 0
    last: int = 0

    @property
    def total(self) -> int:
        return self.count + self.failed


class Collecting(Accumulating, Pipelines):
    """The results an item at a collecting gate receives."""

    def gather(self, partition_id: int, what: Collects, *, inline_bytes: int = COLLECT_INLINE_BYTES) -> Gathered:
        """What a fan-in item of partition `partition_id` receives (`Gathered`): the collection of
        `what.gate` counted; its results read whole when there are none, or at most `what.inline`
        that come to at most `inline_bytes` (0: never); the partition's accumulator."""
        collection = self.collection(partition_id, what.gate)
        results: list[CollectedResult] | None = None
        if collection.total == 0:
            results = []
        elif collection.total <= what.inline and inline_bytes > 0:
            first, last, total = collection.first - 1, collection.last, collection.total
            read = self.collected_page(partition_id, what.gate, first, last, total, max_bytes=inline_bytes)
            if len(read) == total and sum(map(result_size, read)) <= inline_bytes:
                results = read
        accumulated = {name: shown_number(value) for name, value in self.accumulated(partition_id).items()}
        return Gathered(collection, results, accumulated)

    def collection(self, partition_id: int, gate: int) -> Collection:
        """Gate `gate` of partition `partition_id` counted (`Collection`)."""
        with self.read() as conn:
            return _count(conn, partition_id, gate)

    def collected_page(
        self,
        partition_id: int,
        gate: int,
        after: int,
        until: int,
        limit: int = PAGE,
        *,
        max_bytes: int = PAGE_BYTES,
    ) -> list[CollectedResult]:
        """The collected items of gate `gate` of partition `partition_id` with ids above `after` and up
        to `until` (a `Collection`'s `first - 1` and `last` bound the whole), in id order: at most
        `limit`, and past the first, no more than `max_bytes` of results and errors. The next page
        starts after the last id; an empty page, or one ending at `until`, was the last."""
        with self.read() as conn:
            return self._page(conn, partition_id, gate, after, until, limit, max_bytes)

    def _page(
        self, conn: Connection, pid: int, gate: int, after: int, until: int, limit: int, max_bytes: int
    ) -> list[CollectedResult]:
        kept: list[Any] = []
        used, full, window = 0, False, WINDOW
        while not full and len(kept) < limit and after < until:  # PAGE rows a statement: 4 MB of small results at most
            want = min(limit - len(kept), PAGE)
            upto = min(until, after + window)
            params = {"pid": pid, "gate": gate, "after": after, "until": upto, "small": SMALL_RESULT, "limit": want}
            rows = self.dialect.read_collected(conn, params)
            for row in rows:
                size = 24 + (row.size or 0) + len(row.error or "")
                if kept and used + size > max_bytes:
                    full = True
                    break
                kept.append(row)
                used += size
            if len(rows) == want:
                after = rows[-1].id
            else:  # every id of the window is read: on to the next, twice as wide (ids of others in between)
                after, window = upto, window * 2
        large = [row.id for row in kept if row.small is None and row.size is not None]
        fetched = dict(conn.execute(_LARGE_RESULTS, {"ids": large}).all()) if large else {}
        return [
            CollectedResult(row.id, error=row.error, failed=True)
            if row.status == "failed"
            else CollectedResult(row.id, _bytes(row.small if row.small is not None else fetched.get(row.id)))
            for row in kept
        ]

    def open_collection(self, item_id: int, version: int, watcher: str, seconds: float) -> str:
        """Record a delivery of item `item_id` (at `version`) that hands its handler a results URL:
        a claim in state `collecting`, valid for `seconds` and while the item keeps that version.
        Returns its token (the URL's, and a 202's callback token too)."""
        token = secrets.token_urlsafe(24)
        with self.write() as conn:
            row = conn.execute(
                select(I.partition_id, I.gate, P.queue)
                .select_from(items.join(partitions, P.id == I.partition_id))
                .where(I.id == item_id)
            ).one()
            conn.execute(
                insert(claims).values(
                    token=token,
                    item_id=item_id,
                    partition_id=row.partition_id,
                    queue=row.queue,
                    worker=watcher,
                    gate=row.gate,
                    version=version,
                    weight=0,
                    lease_seconds=float(seconds),
                    state=COLLECTING,
                    callback=False,
                    claimed_at=db_now(),
                    expires_at=seconds_from_now(float(seconds)),
                )
            )
        return token

    def collected_by(self, item_id: int, token: str, *, counted: bool = True) -> Collection:
        """What item `item_id` collects, for the holder of `token`: its delivery's claim (a
        collecting delivery's, a pull worker's or a 202's), compared in constant time; counted
        unless `counted` is False (then its partition and gate alone). NotFound when no claim of the
        item has that token or the item collects nothing; StaleClaim (409, with its `reason`) once
        the delivery ended: answered, retried, expired, cancelled."""
        with self.read() as conn:
            found = conn.execute(
                select(C.token, C.state, C.version, (C.expires_at > db_now()).label("live")).where(C.item_id == item_id)
            ).all()
            claim = next((c for c in found if hmac.compare_digest(c.token.encode(), token.encode())), None)
            if claim is None:
                raise NotFound(f"item {item_id} has no delivery with this token")
            item = conn.execute(
                select(I.partition_id, I.gate, I.status, I.version, I.collect, P.queue, P.status.label("partition"))
                .select_from(items.join(partitions, P.id == I.partition_id))
                .where(I.id == item_id)
            ).one_or_none()
            reason = _ended(claim, item)
            if reason is not None:
                said = f"the delivery of item {item_id} this token was given for has ended ({reason})"
                raise StaleClaim(said, reason)
            assert item is not None
            what = collects(self._claims_pipeline(conn, item.queue), item.gate, item.collect)
            if what is None:
                raise NotFound(f"item {item_id} collects no gate's results")
            if not counted:
                return Collection(item.partition_id, what.gate)
            return _count(conn, item.partition_id, what.gate)


def _count(conn: Connection, pid: int, gate: int) -> Collection:
    counts = {"complete": (0, 0, 0), "failed": (0, 0, 0)}
    for status, n, low, high in conn.execute(_COUNTS, {"pid": pid, "gate": gate}):
        counts[status] = (int(n), int(low), int(high))
    (done, low_done, high_done), (failed, low_failed, high_failed) = counts["complete"], counts["failed"]
    lows = [low for n, low in ((done, low_done), (failed, low_failed)) if n]
    return Collection(pid, gate, done, failed, min(lows, default=0), max(high_done, high_failed))


def _ended(claim: Any, item: Any | None) -> str | None:
    """Why `claim` no longer authorises reading its item's results ("cancelled", "expired",
    "superseded"), or None."""
    if item is None or item.status == CANCELLED or item.partition == CANCELLED:
        return "cancelled"
    if claim.state not in (COLLECTING, "active"):  # answered, released, expired, cancelled...
        return str(claim.state) if claim.state in ("expired", "cancelled") else "superseded"
    if item.version != claim.version or item.status != AVAILABLE or item.partition != AVAILABLE:
        return "superseded"
    if not claim.live:
        return "expired"
    return None


def _bytes(value: Any) -> bytes | None:
    return None if value is None else stored_bytes(value)
