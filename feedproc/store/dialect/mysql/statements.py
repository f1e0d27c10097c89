"""MariaDB/MySQL's statements, each beside what explains its shape: what `MySQLDialect` runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Select, bindparam, delete, func, literal, select, text
from sqlalchemy.dialects.mysql import insert as mysql_upsert
from sqlalchemy.engine import Connection

from ....core.records import ReadyItem
from ...answers import OUTCOME_COLUMNS, with_results
from ...base import IS_AVAILABLE, I, P, W
from ...claimable import CLAIMABLE_PARTITION, MAX_CLAIM, NOT_BLOCKED
from ...collecting import PAGE_COLUMNS
from ...foundations import db_now, seconds_from_now
from ...schema import accumulators, items, partitions, watchers
from ..sqlite import SQLiteDialect
from ..sqlite.statements import (
    ACQUIRE_CANDIDATES,
    ACQUIRE_CANDIDATES_AGED,
    IDLE,
    LEASABLE,
    LEASED_FOR_DISPATCH,
    RENEW,
    RENEW_WRITTEN_LEASES,
    STEAL_CANDIDATE,
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


# An answer's write (`update_items`): arrays are PostgreSQL's, and an UPDATE per row is a round trip per answer
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
        i.not_yet = COALESCE(v.not_yet, i.not_yet),
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


def update_items_mysql(conn: Connection, rows: list[dict[str, Any]], watcher_id: str) -> int:
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
MYSQL_READ_READY_AT = select(P.id, P.ready_at, IDLE, P.gate, P.queue, P.tolerate).where(
    P.id.in_(bindparam("pids", expanding=True))
)


def find_ready_mysql(
    conn: Connection,
    watcher_id: str,
    limit: int,
    excluded: list[int],
    closed: list[int],
    after: int,
    aging: float | None = None,
) -> list[ReadyItem]:
    params = {"watcher": watcher_id, "after": after, "aging": aging}
    leased = [p for p in conn.execute(LEASED_FOR_DISPATCH, params).all() if p.id not in closed]
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
        "SELECT i.id, i.version, t.n, i.gate, i.attempts, i.data, i.deliveries, i.lost, i.collect, i.not_yet"
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
            r[9],
            p.priority,
        )
        for r in rows
    ]


# The in-flight record (`mark_inflight`): one multi-row upsert (ON DUPLICATE KEY UPDATE has no WHERE: each assignment
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


def mark_inflight_mysql(
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


# `acquire_leases` takes the candidates in two steps (`lock_picked`): InnoDB locks every row a
# locking read reads, before its sort and LIMIT, so `FOR UPDATE SKIP LOCKED` on the ordered query
# above could lock all of a queue's ready partitions, and concurrent acquirers would skip them all.
# A plain read picks them in lease order; a locking read by id takes those no one else has locked,
# their conditions checked again on the locked rows (the previous owner read there, under the lock).
MYSQL_ACQUIRE_PICK = ACQUIRE_CANDIDATES.with_only_columns(P.id).where(P.id.not_in(bindparam("seen", expanding=True)))
MYSQL_ACQUIRE_PICK_AGED = ACQUIRE_CANDIDATES_AGED.with_only_columns(P.id).where(
    P.id.not_in(bindparam("seen", expanding=True))
)
MYSQL_ACQUIRE_LOCK = by_id(
    select(P.id, P.lease_owner).where(P.id.in_(bindparam("ids", expanding=True)), *LEASABLE)
).with_for_update(skip_locked=True)

# `request_steals` on MariaDB/MySQL: the victim's partitions to mark, picked, then locked (as above).

MYSQL_STEAL_PICK = (
    select(P.id)
    .where(*STEAL_CANDIDATE, P.id.not_in(bindparam("seen", expanding=True)))
    .order_by(P.priority, P.created_at.desc())
    .limit(bindparam("limit"))
)
MYSQL_STEAL_LOCK = by_id(
    select(P.id).where(P.id.in_(bindparam("ids", expanding=True)), *STEAL_CANDIDATE)
).with_for_update(skip_locked=True)
# Watchers dead for a while, on MariaDB/MySQL: read first, then deleted by id. A DELETE that scans
# waits for the lock of every row it reads, matching or not (InnoDB reads an UPDATE's rows
# semi-consistently, not a DELETE's): two watchers beating at once, each holding its own row, would
# deadlock on each other's.
DEAD_WATCHERS = select(W.id).where(W.expires_at < seconds_from_now(-10 * bindparam("lease_seconds")))
FORGET_WATCHERS = delete(watchers).where(
    W.id.in_(bindparam("ids", expanding=True)), W.expires_at < seconds_from_now(-10 * bindparam("lease_seconds"))
)

# A heartbeat's renewal of its watcher's leases. On MariaDB/MySQL the partitions are read first,
# then renewed by primary key: the UPDATE by owner went through a secondary index (status, updated_at)
# and held its record while it waited for a partition a group commit had locked; that commit then
# released the partition, which changes that index's record: a deadlock, the heartbeat its victim
# (a 100,000-child fan-out with a 1.5 s lease, once in a few runs).
MYSQL_OWNED = select(P.id).where(P.lease_owner == bindparam("watcher"), P.status == IS_AVAILABLE)
MYSQL_RENEW = (
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


# Lost deliveries charged (`charge_lost`): one UPDATE joined to the charges (PyMySQL runs an executemany UPDATE as one
# statement per row), version-guarded alike.
MYSQL_CHARGE_LOST = """
    UPDATE feedproc_items AS i JOIN ({rows}) AS c ON i.id = c.id AND i.version = c.version
    SET i.status = c.status, i.attempts = c.attempts, i.lost = i.lost + 1, i.deliveries = i.deliveries + 1,
        i.last_error = c.error, i.next_attempt_at = UTC_TIMESTAMP(6), i.progress = NULL,
        i.version = i.version + 1, i.updated_at = UTC_TIMESTAMP(6)
    WHERE i.status = 'available'
"""
MYSQL_CHARGE_CELLS = (("id", "%s"), ("version", "%s"), ("status", "%s"), ("attempts", "%s"), ("error", "%s"))

# `isolate`'s record on MariaDB/MySQL (MARK_INFLIGHT's ON CONFLICT ... WHERE is PostgreSQL's and
# SQLite's): ON DUPLICATE KEY UPDATE has no WHERE, so each column keeps its value unless the record is
# of this lease or an older one, `epoch` assigned last (an assignment sees those made before it). The
# record is rewritten whole, its "=" kept as on a first insert (decoding ignores it).
MYSQL_MARK_ISOLATED = text(
    f"""
    INSERT INTO feedproc_inflight (partition_id, watcher, epoch, entries) VALUES (:pid, :watcher, :epoch, :entries)
    ON DUPLICATE KEY UPDATE
        entries = IF({_MYSQL_NEWER_OR_SAME}, VALUES(entries), feedproc_inflight.entries),
        watcher = IF({_MYSQL_NEWER_OR_SAME}, VALUES(watcher), feedproc_inflight.watcher),
        epoch = IF({_MYSQL_NEWER_OR_SAME}, VALUES(epoch), feedproc_inflight.epoch)
    """
)


# What `claim` reads back on MariaDB/MySQL, which has no UPDATE ... RETURNING.
MYSQL_CLAIMED = select(I.id, I.version, I.claimed_until).where(I.id.in_(bindparam("ids", expanding=True)))


# Progress reports (`store_progress`): one UPDATE joined to the reports (PyMySQL runs an executemany UPDATE as one
# statement per row).
MYSQL_STORE_PROGRESS = """
    UPDATE feedproc_items AS i JOIN ({rows}) AS r ON i.id = r.id AND i.gate = r.gate
    SET i.progress = COALESCE(r.progress, i.progress), i.started_at = COALESCE(r.started, i.started_at)
    WHERE i.status = 'available'
"""
MYSQL_PROGRESS_CELLS = (("id", "%s"), ("gate", "%s"), ("progress", "%s"), ("started", "CAST(%s AS DATETIME(6))"))


def mysql_rows(cells: Sequence[tuple[str, str]], count: int) -> str:
    """`count` rows of bound values as a derived table for MariaDB/MySQL, its columns named as `cells`
    (name, placeholder expression) say: `SELECT %s AS a, %s AS b UNION ALL SELECT %s, %s ...`, for a
    statement run with `exec_driver_sql` (a table value constructor is VALUES on MariaDB and VALUES ROW
    on MySQL; this is both's)."""
    first = "SELECT " + ", ".join(f"{cell} AS {name}" for name, cell in cells)
    return first + (" UNION ALL SELECT " + ", ".join(cell for _, cell in cells)) * (count - 1)


# Claimable items (`find_claimable`), in steps, all plain reads but the last: it has no LATERAL, and InnoDB locks
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


def claimable(
    conn: Connection, queue: str, max_items: int, blocked: Sequence[int], priorities: tuple[int, int]
) -> list[Any]:
    """Up to `max_items` claimable items of `queue` in claim order, at gates not `blocked`, of
    partitions with a priority in `priorities`, locked
    (MariaDB/MySQL: see `_mysql_claimable`). Items other claimers locked are skipped; each round past
    them walks twice as far (the extra items it locks stay untouched until the commit)."""
    rows: list[Any] = []
    seen: list[int] = []
    for n in range(CLAIM_ROUNDS):
        want = max_items - len(rows)
        walk = min(want << n, MAX_CLAIM)  # (a partition a branch of the UNION at most)
        params = {
            "queue": queue,
            "max": walk,
            "seen": seen,
            "min_priority": priorities[0],
            "max_priority": priorities[1],
        }
        if blocked:
            parts = conn.execute(_MYSQL_CLAIMABLE_PARTITIONS_UNBLOCKED, {**params, "blocked": list(blocked)}).all()
        else:
            parts = conn.execute(_MYSQL_CLAIMABLE_PARTITIONS, params).all()
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
MYSQL_PAGE = text(
    f"SELECT {PAGE_COLUMNS.format(length='LENGTH')} FROM feedproc_items FORCE INDEX (PRIMARY)"
    " WHERE id > :after AND id <= :until AND partition_id = :pid AND gate = :gate"
    " AND status IN ('complete', 'failed') ORDER BY id LIMIT :limit"
)


# The leases a long group commit wrote under, renewed by primary key: the rows it locked (as the
# heartbeat's `MYSQL_RENEW`).
MYSQL_RENEW_WRITTEN_LEASES = RENEW_WRITTEN_LEASES.with_hint("FORCE INDEX (PRIMARY)", dialect_name="mysql").with_hint(
    "FORCE INDEX (PRIMARY)", dialect_name="mariadb"
)

# An accumulator's rows inserted, each merged into the row already there (`ON DUPLICATE KEY UPDATE`,
# with the inserted row's value): by addition, or keeping the lesser or the greater.
_ACCUMULATOR_UPSERT = mysql_upsert(accumulators)
MERGE_ACCUMULATOR = {
    how: _ACCUMULATOR_UPSERT.on_duplicate_key_update({"value": merged})
    for how, merged in (
        ("add", accumulators.c.value + _ACCUMULATOR_UPSERT.inserted.value),
        ("min", func.least(accumulators.c.value, _ACCUMULATOR_UPSERT.inserted.value)),
        ("max", func.greatest(accumulators.c.value, _ACCUMULATOR_UPSERT.inserted.value)),
    )
}
