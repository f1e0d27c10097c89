"""MariaDB's and MySQL's statements: no RETURNING, no arrays, no LATERAL, and InnoDB's locking reads.

What sets them apart from the others, and shapes every statement here:

* an UPDATE returns no rows: what it wrote is read back, the rows locked by the transaction;
* PyMySQL's executemany sends one statement per row unless VALUES holds nothing but placeholders:
  rows go in as multi-row INSERTs (`insert_many_mysql`) or as a derived table of one SELECT per row
  (`mysql_rows`) joined to the table in one UPDATE;
* InnoDB locks every row a locking read reads, before its sort and LIMIT: an ordered
  `FOR UPDATE SKIP LOCKED` could lock a whole queue, so rows are picked with a plain read and then
  locked by primary key (`lock_picked`, `by_id`);
* the sessions run with ANSI_QUOTES and PIPES_AS_CONCAT (`dialects.MYSQL_SESSION`), so SQLite's
  standard statements mean the same here: where the class runs one, it says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Insert, Row, Select, Table, Update, bindparam, delete, func, insert, literal, select, text
from sqlalchemy.dialects.mysql import insert as mysql_upsert
from sqlalchemy.engine import Connection

from ...core.records import Outcome, ProgressReport, ReadyItem
from ..answers import OUTCOME_COLUMNS, with_results
from ..base import IS_AVAILABLE, I, P, W
from ..claimable import CLAIMABLE_PARTITION, MAX_CLAIM, NOT_BLOCKED
from ..collecting import PAGE_COLUMNS
from ..dialects import db_minute, db_now, seconds_from_now
from ..queues import started_of
from ..schema import accumulators, attempts, items, partitions, stats, watchers
from . import AccumulatorRow
from .sqlite import (
    ACQUIRE_CANDIDATES,
    IDLE,
    LEASABLE,
    LEASED_FOR_DISPATCH,
    RENEW,
    RENEW_WRITTEN_LEASES,
    SET_READY_AT,
    STEAL_CANDIDATE,
    SQLiteDialect,
    lease_picked,
    merge_by_combination,
    new_item_rows,
)

#: The statements MariaDB/MySQL shares with SQLite (standard SQL), each named where it is run.
SQLITE = SQLiteDialect()

#: Rows per multi-row INSERT on MariaDB/MySQL (`insert_many_mysql`).
MYSQL_INSERT_CHUNK = 1000


def insert_many_mysql(conn: Connection, table: str, rows: Sequence[Mapping[str, Any]], *, now: Sequence[str]) -> None:
    """Insert `rows` (all with the same keys) into `table` with multi-row INSERTs, the `now` columns
    set to the database clock. PyMySQL's executemany sends one INSERT per row unless VALUES holds
    nothing but placeholders, and the clock is SQL: an executemany of 2,000 items was 2,000 round
    trips. Times are bound as naive UTC, as `UTCDateTime` stores them."""
    columns = list(rows[0])
    names = ", ".join(f'"{c}"' for c in [*columns, *now])
    one = "(" + ", ".join(["%s"] * len(columns) + ["UTC_TIMESTAMP(6)"] * len(now)) + ")"
    for start in range(0, len(rows), MYSQL_INSERT_CHUNK):
        chunk = rows[start : start + MYSQL_INSERT_CHUNK]
        params = [_naive_utc(row[c]) for row in chunk for c in columns]
        conn.exec_driver_sql(f'INSERT INTO "{table}" ({names}) VALUES {", ".join([one] * len(chunk))}', tuple(params))


def _naive_utc(value: Any) -> Any:
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    return value


# MariaDB/MySQL's twin: arrays are PostgreSQL's, and an UPDATE per row is a round trip per answer
# (PyMySQL batches only INSERTs), so the outcomes arrive as a derived table of one SELECT per row
# (UNION ALL), joined to the items in one multi-table UPDATE. Its row count is the rows matched (the
# dialect connects with CLIENT_FOUND_ROWS), what the version guard compares.
_MYSQL_OUTCOME_ROW = "SELECT " + ", ".join(f"%s AS {c}" for c in OUTCOME_COLUMNS)
_MYSQL_OUTCOME_ROW_WITH_RESULT = _MYSQL_OUTCOME_ROW + ", %s AS result"
_MYSQL_UPDATE_ITEMS = """
    UPDATE feedproc_items AS i JOIN ({rows}) AS v ON i.id = v.id AND i.version = v.version SET
        i.status = v.status,
        i.gate = v.gate,
        i.data = COALESCE(v.data, i.data),{result}
        i.attempts = v.attempts,
        i.last_error = CASE WHEN v.error IS NOT NULL THEN v.error WHEN v.clear THEN NULL ELSE i.last_error END,
        i.next_attempt_at = TIMESTAMPADD(MICROSECOND, CAST(ROUND(v.delay * 1000000) AS SIGNED), UTC_TIMESTAMP(6)),
        i.progress = v.progress,
        i.deliveries = i.deliveries + 1,
        i.lost = 0,
        i.started_at = TIMESTAMPADD(MICROSECOND, v.started, TIMESTAMP('1970-01-01')),
        i.duration = v.duration / 1000000.0,
        i.delivered_by = %s,
        i.claimed_until = NULL,
        i.version = i.version + 1,
        i.updated_at = UTC_TIMESTAMP(6)
    WHERE i.status = 'available'
"""


def _update_items_mysql(conn: Connection, rows: list[dict[str, Any]], watcher_id: str) -> int:
    if with_results(rows):
        derived = " UNION ALL ".join([_MYSQL_OUTCOME_ROW_WITH_RESULT] * len(rows))
        params = [r[c] for r in rows for c in (*OUTCOME_COLUMNS, "result")]
        result = "\n        i.result = COALESCE(v.result, i.result),"
        statement = _MYSQL_UPDATE_ITEMS.format(rows=derived, result=result)
    else:
        derived = " UNION ALL ".join([_MYSQL_OUTCOME_ROW] * len(rows))
        params = [r[c] for r in rows for c in OUTCOME_COLUMNS]
        statement = _MYSQL_UPDATE_ITEMS.format(rows=derived, result="")
    return int(conn.exec_driver_sql(statement, (*params, watcher_id)).rowcount)


# MariaDB/MySQL has no UPDATE ... RETURNING: the refresh, then what it wrote (the rows are locked).
_MYSQL_READ_READY_AT = select(P.id, P.ready_at, IDLE, P.gate, P.queue, P.tolerate).where(
    P.id.in_(bindparam("pids", expanding=True))
)


def _find_ready_mysql(
    conn: Connection, watcher_id: str, limit: int, excluded: list[int], closed: list[int]
) -> list[ReadyItem]:
    leased = [p for p in conn.execute(LEASED_FOR_DISPATCH, {"watcher": watcher_id}).all() if p.id not in closed]
    if not leased:
        return []
    # One index walk per partition (feedproc_items_by_gate, in due order, stopping at the limit: the
    # ids only), the runs joined to their rows for the data once the first `limit` in dispatch order
    # are chosen. Two round trips, whatever the number of partitions leased.
    skip = f" AND c.id NOT IN ({','.join(map(str, map(int, excluded)))})" if excluded else ""
    runs = " UNION ALL ".join(
        f"(SELECT c.id, {n} AS n, c.next_attempt_at AS due FROM feedproc_items AS c"
        f" WHERE c.partition_id = {int(p.id)} AND c.gate = {int(p.gate)} AND c.status = 'available'"
        f" AND c.next_attempt_at <= UTC_TIMESTAMP(6){skip} ORDER BY c.next_attempt_at, c.id LIMIT {int(limit)})"
        for n, p in enumerate(leased)
    )
    rows = conn.exec_driver_sql(
        "SELECT i.id, i.version, t.n, i.gate, i.attempts, i.data, i.deliveries, i.lost, i.collect"
        f" FROM (SELECT u.id, u.n, u.due FROM ({runs}) AS u ORDER BY u.n, u.due, u.id LIMIT {int(limit)}) AS t"
        " JOIN feedproc_items AS i ON i.id = t.id ORDER BY t.n, t.due, t.id"
    ).all()
    return [
        ReadyItem(
            r[0],
            r[1],
            (p := leased[r[2]]).id,
            p.key,
            p.queue,
            p.lease_epoch,
            r[3],
            r[4],
            r[5],
            p.weight,
            r[6],
            r[7],
            r[8],
        )
        for r in rows
    ]


# MariaDB/MySQL's twin: one multi-row upsert (ON DUPLICATE KEY UPDATE has no WHERE: each assignment
# keeps the old value unless the record is of this lease or an older one; `epoch` is assigned last,
# since assignments see the values assigned before them). Which records are this lease's is read
# back: the upsert's row count cannot tell a record kept from one written.
_MYSQL_NEWER_OR_SAME = "feedproc_inflight.epoch <= VALUES(epoch)"
_MYSQL_MARK_INFLIGHT = f"""
    INSERT INTO feedproc_inflight (partition_id, watcher, epoch, entries) VALUES {{rows}}
    ON DUPLICATE KEY UPDATE
        entries = CASE
            WHEN NOT ({_MYSQL_NEWER_OR_SAME}) THEN feedproc_inflight.entries
            WHEN feedproc_inflight.epoch = VALUES(epoch) AND LEFT(VALUES(entries), 1) <> '='
                THEN CONCAT(feedproc_inflight.entries, ',', VALUES(entries))
            ELSE TRIM(LEADING '=' FROM VALUES(entries)) END,
        watcher = IF({_MYSQL_NEWER_OR_SAME}, VALUES(watcher), feedproc_inflight.watcher),
        epoch = IF({_MYSQL_NEWER_OR_SAME}, VALUES(epoch), feedproc_inflight.epoch)
"""


def _mark_inflight_mysql(
    conn: Connection, watcher_id: str, pids: list[int], epochs: list[int], entries: list[str]
) -> set[int]:
    rows = ",".join(["(%s, %s, %s, %s)"] * len(pids))
    params = [v for pid, epoch, e in zip(pids, epochs, entries, strict=True) for v in (pid, watcher_id, epoch, e)]
    conn.exec_driver_sql(_MYSQL_MARK_INFLIGHT.format(rows=rows), tuple(params))
    ours = dict(zip(pids, epochs, strict=True))
    held = conn.exec_driver_sql(
        f"SELECT partition_id, epoch FROM feedproc_inflight WHERE partition_id IN ({','.join(map(str, ours))})"
    ).all()
    return {pid for pid, epoch in held if ours.get(pid) == epoch}


def by_id(statement: Select[Any]) -> Select[Any]:
    """`statement`, a locking read of partitions by id, reading them by primary key on MariaDB/MySQL
    whatever the optimizer thinks of a small table: a locking read that scans waits for (or, with
    SKIP LOCKED, skips) the lock of every row it reads, whether it matches or not."""
    return statement.with_hint(partitions, "FORCE INDEX (PRIMARY)", "mysql").with_hint(
        partitions, "FORCE INDEX (PRIMARY)", "mariadb"
    )


# MariaDB/MySQL's twin takes the candidates in two steps (`lock_picked`): InnoDB locks every row a
# locking read reads, before its sort and LIMIT, so `FOR UPDATE SKIP LOCKED` on the ordered query
# above could lock all of a queue's ready partitions, and concurrent acquirers would skip them all.
# A plain read picks them in lease order; a locking read by id takes those no one else has locked,
# their conditions checked again on the locked rows (the previous owner read there, under the lock).
_MYSQL_ACQUIRE_PICK = ACQUIRE_CANDIDATES.with_only_columns(P.id).where(P.id.not_in(bindparam("seen", expanding=True)))
_MYSQL_ACQUIRE_LOCK = by_id(
    select(P.id, P.lease_owner).where(P.id.in_(bindparam("ids", expanding=True)), *LEASABLE)
).with_for_update(skip_locked=True)

# `request_steals` on MariaDB/MySQL: the victim's partitions to mark, picked, then locked (as above).

_MYSQL_STEAL_PICK = (
    select(P.id)
    .where(*STEAL_CANDIDATE, P.id.not_in(bindparam("seen", expanding=True)))
    .order_by(P.priority, P.created_at.desc())
    .limit(bindparam("limit"))
)
_MYSQL_STEAL_LOCK = by_id(
    select(P.id).where(P.id.in_(bindparam("ids", expanding=True)), *STEAL_CANDIDATE)
).with_for_update(skip_locked=True)
# Watchers dead for a while, on MariaDB/MySQL: read first, then deleted by id. A DELETE that scans
# waits for the lock of every row it reads, matching or not (InnoDB reads an UPDATE's rows
# semi-consistently, not a DELETE's): two watchers beating at once, each holding its own row, would
# deadlock on each other's.
_DEAD_WATCHERS = select(W.id).where(W.expires_at < seconds_from_now(-10 * bindparam("lease_seconds")))
_FORGET_WATCHERS = delete(watchers).where(
    W.id.in_(bindparam("ids", expanding=True)), W.expires_at < seconds_from_now(-10 * bindparam("lease_seconds"))
)

# A heartbeat's renewal of its watcher's leases. On MariaDB/MySQL the partitions are read first,
# then renewed by primary key: the UPDATE by owner went through a secondary index (status, updated_at)
# and held its record while it waited for a partition a group commit had locked; that commit then
# released the partition, which changes that index's record: a deadlock, the heartbeat its victim
# (a 100,000-child fan-out with a 1.5 s lease, once in a few runs).
_MYSQL_OWNED = select(P.id).where(P.lease_owner == bindparam("watcher"), P.status == IS_AVAILABLE)
_MYSQL_RENEW = (
    RENEW.where(P.id.in_(bindparam("ids", expanding=True)))
    .with_hint("FORCE INDEX (PRIMARY)", dialect_name="mysql")
    .with_hint("FORCE INDEX (PRIMARY)", dialect_name="mariadb")
)
#: Rounds of picking and locking on MariaDB/MySQL (`lock_picked`) before settling for fewer rows than
#: asked: each round past rows that concurrent transactions locked meanwhile looks twice as far.
LOCK_ROUNDS = 3


def lock_picked(conn: Connection, pick: Any, lock: Any, params: dict[str, Any], limit: int) -> list[Any]:
    """MariaDB/MySQL's `SELECT ... ORDER BY ... LIMIT :limit FOR UPDATE SKIP LOCKED`, in two steps:
    up to `limit` rows picked by `pick` (a plain read, bound `:limit` and `:seen`, the ids picked in
    earlier rounds) and locked by `lock` (bound `:ids`; SKIP LOCKED, its conditions checked again on
    the locked rows), the first of them in the pick's order taken. Only picked rows are ever locked,
    whatever the plan of the ordered read (a later round's extra ones until the commit, untouched)."""
    taken: list[Any] = []
    seen: list[int] = []
    for n in range(LOCK_ROUNDS):
        want = limit - len(taken)
        walk = want << n
        ids = list(conn.execute(pick, {**params, "limit": walk, "seen": seen}).scalars())
        if not ids:
            break
        order = {pid: i for i, pid in enumerate(ids)}
        locked = sorted(conn.execute(lock, {**params, "ids": ids}), key=lambda r: order[r.id])
        taken += locked[:want]
        if len(ids) < walk or len(taken) >= limit:  # no more to pick, or enough
            break
        seen += ids
    return taken


# MariaDB/MySQL's twin: one UPDATE joined to the charges (PyMySQL runs an executemany UPDATE as one
# statement per row), version-guarded alike.
_MYSQL_CHARGE_LOST = """
    UPDATE feedproc_items AS i JOIN ({rows}) AS c ON i.id = c.id AND i.version = c.version
    SET i.status = c.status, i.attempts = c.attempts, i.lost = i.lost + 1, i.deliveries = i.deliveries + 1,
        i.last_error = c.error, i.next_attempt_at = UTC_TIMESTAMP(6), i.progress = NULL,
        i.version = i.version + 1, i.updated_at = UTC_TIMESTAMP(6)
    WHERE i.status = 'available'
"""
_MYSQL_CHARGE_CELLS = (("id", "%s"), ("version", "%s"), ("status", "%s"), ("attempts", "%s"), ("error", "%s"))

# `isolate`'s record on MariaDB/MySQL (MARK_INFLIGHT's ON CONFLICT ... WHERE is PostgreSQL's and
# SQLite's): ON DUPLICATE KEY UPDATE has no WHERE, so each column keeps its value unless the record is
# of this lease or an older one, `epoch` assigned last (an assignment sees those made before it). The
# record is rewritten whole, its "=" kept as on a first insert (decoding ignores it).
_MYSQL_MARK_ISOLATED = text(
    f"""
    INSERT INTO feedproc_inflight (partition_id, watcher, epoch, entries) VALUES (:pid, :watcher, :epoch, :entries)
    ON DUPLICATE KEY UPDATE
        entries = IF({_MYSQL_NEWER_OR_SAME}, VALUES(entries), feedproc_inflight.entries),
        watcher = IF({_MYSQL_NEWER_OR_SAME}, VALUES(watcher), feedproc_inflight.watcher),
        epoch = IF({_MYSQL_NEWER_OR_SAME}, VALUES(epoch), feedproc_inflight.epoch)
    """
)


# What `claim` reads back on MariaDB/MySQL, which has no UPDATE ... RETURNING.
_MYSQL_CLAIMED = select(I.id, I.version, I.claimed_until).where(I.id.in_(bindparam("ids", expanding=True)))


# MariaDB/MySQL's twin: one UPDATE joined to the reports (PyMySQL runs an executemany UPDATE as one
# statement per row).
_MYSQL_STORE_PROGRESS = """
    UPDATE feedproc_items AS i JOIN ({rows}) AS r ON i.id = r.id AND i.gate = r.gate
    SET i.progress = COALESCE(r.progress, i.progress), i.started_at = COALESCE(r.started, i.started_at)
    WHERE i.status = 'available'
"""
_MYSQL_PROGRESS_CELLS = (("id", "%s"), ("gate", "%s"), ("progress", "%s"), ("started", "CAST(%s AS DATETIME(6))"))


def mysql_rows(cells: Sequence[tuple[str, str]], count: int) -> str:
    """`count` rows of bound values as a derived table for MariaDB/MySQL, its columns named as `cells`
    (name, placeholder expression) say: `SELECT %s AS a, %s AS b UNION ALL SELECT %s, %s ...`, for a
    statement run with `exec_driver_sql` (a table value constructor is VALUES on MariaDB and VALUES ROW
    on MySQL; this is both's)."""
    first = "SELECT " + ", ".join(f"{cell} AS {name}" for name, cell in cells)
    return first + (" UNION ALL SELECT " + ", ".join(cell for _, cell in cells)) * (count - 1)


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
        *CLAIMABLE_PARTITION,
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
_MYSQL_CLAIMABLE_PARTITIONS_UNBLOCKED = _MYSQL_CLAIMABLE_PARTITIONS.where(NOT_BLOCKED)
_MYSQL_LOCK_ITEMS = (
    select(I.id, I.version)
    .where(I.id.in_(bindparam("ids", expanding=True)), *_CLAIMABLE_ITEM)
    .with_hint(items, "FORCE INDEX (PRIMARY)", "mysql")  # by id only, whatever the table's size
    .with_hint(items, "FORCE INDEX (PRIMARY)", "mariadb")
    .with_for_update(skip_locked=True)
)
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
        " i.deliveries, i.lost, p.windows, p.window_tz, i.collect"
        f" FROM (SELECT u.id, u.n, u.due FROM ({walks}) AS u ORDER BY u.n, u.due, u.id LIMIT {int(limit)}) AS t"
        " JOIN feedproc_items AS i ON i.id = t.id JOIN feedproc_partitions AS p ON p.id = i.partition_id"
        " ORDER BY t.n, t.due, t.id"
    )


def _claimable(conn: Connection, queue: str, max_items: int, blocked: Sequence[int]) -> list[Any]:
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


# One page of collected results (`collecting.py`), the primary key forced (FORCE INDEX).
_MYSQL_PAGE = text(
    f"SELECT {PAGE_COLUMNS.format(length='LENGTH')} FROM feedproc_items FORCE INDEX (PRIMARY)"
    " WHERE id > :after AND id <= :until AND partition_id = :pid AND gate = :gate"
    " AND status IN ('complete', 'failed') ORDER BY id LIMIT :limit"
)


# The leases a long group commit wrote under, renewed by primary key: the rows it locked (as the
# heartbeat's `_MYSQL_RENEW`).
_MYSQL_RENEW_WRITTEN_LEASES = RENEW_WRITTEN_LEASES.with_hint("FORCE INDEX (PRIMARY)", dialect_name="mysql").with_hint(
    "FORCE INDEX (PRIMARY)", dialect_name="mariadb"
)

# An accumulator's rows inserted, each merged into the row already there (`ON DUPLICATE KEY UPDATE`,
# with the inserted row's value): by addition, or keeping the lesser or the greater.
_ACCUMULATOR_UPSERT = mysql_upsert(accumulators)
_MERGE_ACCUMULATOR = {
    how: _ACCUMULATOR_UPSERT.on_duplicate_key_update({"value": merged})
    for how, merged in (
        ("add", accumulators.c.value + _ACCUMULATOR_UPSERT.inserted.value),
        ("min", func.least(accumulators.c.value, _ACCUMULATOR_UPSERT.inserted.value)),
        ("max", func.greatest(accumulators.c.value, _ACCUMULATOR_UPSERT.inserted.value)),
    )
}


class MySQLDialect:
    """MariaDB (10.6 or newer) and MySQL (8), through PyMySQL."""

    name = "mysql"
    notifies = False  # no LISTEN: watchers poll
    # `single()` is an ordinary write transaction: autocommit is a server setting of the session, so
    # switching a pooled connection to it and back would cost two round trips where the COMMIT costs
    # one (and the switch on a connection the server dropped raises outside SQLAlchemy's handling).
    autocommits_single_statements = False
    writes_done_narrowly = False  # every answer goes through `update_items`
    ready_at_rows_carry_settle_facts = False  # no RETURNING: `refresh_ready_at` reads back less

    def insert_stamped(
        self, conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]], now: tuple[str, ...]
    ) -> None:
        if rows:
            insert_many_mysql(conn, table.name, rows, now=now)

    def add_to_stats(self, conn: Connection, queue: str, source: str, values: Mapping[str, int]) -> None:
        added = mysql_upsert(stats).values(bucket=db_minute(), queue=queue, source=source[:120], **values)
        conn.execute(added.on_duplicate_key_update({k: stats.c[k] + added.inserted[k] for k in values}))

    def insert_partition(self, conn: Connection, statement: Insert) -> int:
        # No INSERT ... RETURNING: the id InnoDB gave it, as the driver reports it
        return int(conn.execute(statement).lastrowid)

    def notify_ready(self, conn: Connection, queue: str) -> None:
        SQLITE.notify_ready(conn, queue)  # no LISTEN/NOTIFY, as on SQLite: watchers poll

    def notify_wanted(self, conn: Connection, owner: str) -> None:
        SQLITE.notify_wanted(conn, owner)  # no LISTEN/NOTIFY, as on SQLite

    def notify_finished(self, conn: Connection, key: str) -> None:
        SQLITE.notify_finished(conn, key)  # no LISTEN/NOTIFY, as on SQLite

    def lock_held_leases(self, conn: Connection, pids: list[int], watcher_id: str) -> dict[int, int]:
        return SQLITE.lock_held_leases(conn, pids, watcher_id)  # SQLite's SELECT ... FOR UPDATE, by key

    def complete_items(
        self, conn: Connection, completed: list[Outcome], watcher_id: str, accumulate: list[AccumulatorRow]
    ) -> int:
        raise NotImplementedError("MariaDB/MySQL writes every answer with update_items (writes_done_narrowly is False)")

    def update_items(self, conn: Connection, rows: list[dict[str, Any]], watcher_id: str) -> int:
        return _update_items_mysql(conn, rows, watcher_id)

    def bump_version(self, conn: Connection, statement: Update, matched_version: int) -> int | None:
        # no UPDATE ... RETURNING: the version it set is the one it matched, plus one
        return matched_version + 1 if conn.execute(statement).rowcount == 1 else None

    def refresh_ready_at(self, conn: Connection, pids: list[int], idle_after: float) -> Sequence[Row[Any]]:
        # no UPDATE ... RETURNING: the refresh, then what it wrote
        params = {"pids": pids, "idle_after": float(idle_after)}
        conn.execute(SET_READY_AT, params)
        return conn.execute(_MYSQL_READ_READY_AT, params).all()

    def renew_written_leases(self, conn: Connection, pids: list[int], watcher_id: str, seconds: float) -> None:
        conn.execute(_MYSQL_RENEW_WRITTEN_LEASES, {"pids": pids, "watcher": watcher_id, "seconds": float(seconds)})

    def merge_accumulators(self, conn: Connection, rows: list[AccumulatorRow]) -> None:
        merge_by_combination(conn, rows, _MERGE_ACCUMULATOR)  # one statement per combination, as on SQLite

    def find_ready(
        self, conn: Connection, watcher_id: str, limit: int, excluded: list[int], closed: list[int]
    ) -> list[ReadyItem]:
        return _find_ready_mysql(conn, watcher_id, limit, excluded, closed)

    def mark_inflight(
        self, conn: Connection, watcher_id: str, pids: list[int], epochs: list[int], entries: list[str]
    ) -> set[int]:
        return _mark_inflight_mysql(conn, watcher_id, pids, epochs, entries)

    def mark_isolated(self, conn: Connection, params: dict[str, Any]) -> None:
        conn.execute(_MYSQL_MARK_ISOLATED, params)

    def insert_new_items(
        self, conn: Connection, pid: int, gates: list[int], data: list[bytes], collects: list[int | None] | None
    ) -> None:
        self.insert_item_rows(conn, new_item_rows(pid, gates, data, collects))

    def insert_item_rows(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        insert_many_mysql(conn, items.name, rows, now=("next_attempt_at", "created_at", "updated_at"))

    def acquire_leases(
        self, conn: Connection, watcher_id: str, queue: str, limit: int, lease_seconds: float
    ) -> Sequence[Row[Any]]:
        """The candidates picked, then locked row by row (`lock_picked`); then leased as on SQLite."""
        candidates = lock_picked(conn, _MYSQL_ACQUIRE_PICK, _MYSQL_ACQUIRE_LOCK, {"queue": queue}, limit)
        return lease_picked(self, conn, candidates, watcher_id, lease_seconds)

    def renew_leases(self, conn: Connection, watcher_id: str, seconds: float) -> None:
        owned = list(conn.execute(_MYSQL_OWNED, {"watcher": watcher_id}).scalars())  # by primary key: see _MYSQL_OWNED
        if owned:
            conn.execute(_MYSQL_RENEW, {"ids": owned, "watcher": watcher_id, "seconds": float(seconds)})

    def forget_dead_watchers(self, conn: Connection, lease_seconds: float) -> None:
        dead = list(conn.execute(_DEAD_WATCHERS, {"lease_seconds": float(lease_seconds)}).scalars())
        if dead:
            conn.execute(_FORGET_WATCHERS, {"ids": dead, "lease_seconds": float(lease_seconds)})

    def pick_partitions_to_steal(self, conn: Connection, victim: str, take: int) -> list[int]:
        return [r.id for r in lock_picked(conn, _MYSQL_STEAL_PICK, _MYSQL_STEAL_LOCK, {"victim": victim}, take)]

    def lock_leases(self, conn: Connection, watcher_id: str, pairs: list[tuple[int, int]]) -> list[int]:
        # By id, the epochs compared here: a row-value IN may scan the table (see `by_id`).
        held = conn.execute(
            by_id(select(P.id, P.lease_epoch))
            .where(P.id.in_(sorted({pid for pid, _ in pairs})), P.lease_owner == watcher_id)
            .order_by(P.id)
            .with_for_update()
        ).all()
        ours = set(pairs)
        return [r.id for r in held if (r.id, r.lease_epoch) in ours]

    def charge_lost(self, conn: Connection, updates: list[dict[str, Any]], records: list[dict[str, Any]]) -> None:
        keys = ("b_id", "b_version", "b_status", "b_attempts", "b_error")
        charges = mysql_rows(_MYSQL_CHARGE_CELLS, len(updates))
        conn.exec_driver_sql(_MYSQL_CHARGE_LOST.format(rows=charges), tuple(u[k] for u in updates for k in keys))
        # one multi-row INSERT (PyMySQL's executemany runs a statement per row when VALUES hold SQL)
        conn.execute(insert(attempts).values([{**r, "ended_at": db_now()} for r in records]))

    def store_progress(self, conn: Connection, reports: Sequence[ProgressReport]) -> None:
        # (the driver's own parameters: a start as a naive UTC DATETIME, as UTCDateTime binds it)
        values = [v for r in reports for v in (r.item_id, r.gate, r.fraction, started_of(r, naive=True))]
        rows = mysql_rows(_MYSQL_PROGRESS_CELLS, len(reports))
        conn.exec_driver_sql(_MYSQL_STORE_PROGRESS.format(rows=rows), tuple(values))

    def find_claimable(self, conn: Connection, queue: str, max_items: int, blocked: Sequence[int]) -> list[Any]:
        return _claimable(conn, queue, max_items, blocked)

    def claim_items(self, conn: Connection, claiming: Update, ids: list[int]) -> Sequence[Any]:
        # no UPDATE ... RETURNING: read back (the rows are locked by this transaction)
        conn.execute(claiming)
        return conn.execute(_MYSQL_CLAIMED, {"ids": ids}).all()

    def claims_of(self, conn: Connection, tokens: list[str]) -> list[Any]:
        return SQLITE.claims_of(conn, tokens)  # an IN list, as on SQLite

    def items_of(self, conn: Connection, ids: list[int]) -> list[Any]:
        return SQLITE.items_of(conn, ids)  # an IN list, as on SQLite

    def end_claims(self, conn: Connection, tokens: list[str], state: str) -> None:
        SQLITE.end_claims(conn, tokens, state)  # an IN list, as on SQLite

    def read_collected(self, conn: Connection, params: dict[str, Any]) -> Sequence[Row[Any]]:
        return conn.execute(_MYSQL_PAGE, params).all()

    def deletable(self, chunk: Select[Any]) -> Select[Any]:
        # No LIMIT in an IN subquery there, nor a DELETE reading its own table: the chunk goes
        # through a derived table (materialized: its LIMIT keeps it unmerged).
        return select(chunk.subquery("chunk").c[0])
