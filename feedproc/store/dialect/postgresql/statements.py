"""PostgreSQL's statements, each beside what explains its shape: what `PostgreSQLDialect` runs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import text

from ....core.models import MAX_PRIORITY
from ...answers import OUTCOME_COLUMNS, with_results
from ...base import P
from ...collecting import PAGE_COLUMNS
from ...foundations import DriverStatement, pg_bigint_array
from ...gating import SETTLE_COLUMNS, gate_facts
from ...notify import CHANNEL, FINISHED_CHANNEL, WANTED_CHANNEL
from .. import AccumulatorRow
from ..sqlite import SQLiteDialect
from ..sqlite.statements import APPEND_OR_REPLACE, REFRESH_READY_AT

#: The statements PostgreSQL shares with SQLite (standard SQL), each named where it is run.
SQLITE = SQLiteDialect()

NOTIFY = text(f"SELECT pg_notify('{CHANNEL}', :queue)")
NOTIFY_WANTED = text(f"SELECT pg_notify('{WANTED_CHANNEL}', :watcher)")
NOTIFY_FINISHED = text(f"SELECT pg_notify('{FINISHED_CHANNEL}', :key)")

# PostgreSQL: the batch's rows in one statement on the driver's cursor, each merged by its own
# combination. SQLAlchemy's INSERT ... ON CONFLICT, one per combination, cost 0.36-0.41 ms of CPU
# per group commit of 200 answers with two names (sum and max), this 0.20-0.26 (most of it the
# merge in Python). The group commit runs it inside its first item update (`PG_ACCUMULATING`).
_PG_ROWS = """acc_rows AS (
        SELECT * FROM unnest(CAST(:acc_pids AS bigint[]), CAST(:acc_names AS varchar[]),
                             CAST(:acc_values AS double precision[]), CAST(:acc_hows AS varchar[]))
            AS r(partition_id, name, value, how)
    )"""
_PG_MERGE = """INSERT INTO feedproc_accumulators AS a (partition_id, name, value)
    SELECT partition_id, name, value FROM acc_rows
    ON CONFLICT (partition_id, name) DO UPDATE SET value = CASE (
        SELECT r.how FROM acc_rows AS r WHERE r.partition_id = excluded.partition_id AND r.name = excluded.name)
        WHEN 'min' THEN LEAST(a.value, excluded.value)
        WHEN 'max' THEN GREATEST(a.value, excluded.value)
        ELSE a.value + excluded.value
    END"""
PG_UPSERT = DriverStatement(f"WITH {_PG_ROWS}\n    {_PG_MERGE}")
#: The WITH clause that merges rows (`pg_accumulator_params`) before the statement it begins: a
#: group commit's merge rides on its item update, not a round trip of its own (which, on two busy
#: cores, waited for the server's process to be scheduled: 17% of the group commit's time, sampled).
PG_ACCUMULATING = f"WITH {_PG_ROWS},\n    merged AS ({_PG_MERGE})\n"


def pg_accumulator_params(rows: list[AccumulatorRow]) -> dict[str, Any]:
    """The parameters of `PG_ACCUMULATING` (and the standalone upsert) for `rows`."""
    return {
        "acc_pids": pg_bigint_array(r[0] for r in rows),
        "acc_names": [r[1] for r in rows],
        "acc_values": [r[3] for r in rows],
        "acc_hows": [r[2] for r in rows],
    }


# The partitions a batch answers for, locked, with their epochs: the fence.
# On PostgreSQL the lock also turns sequential scans off for the rest of the transaction, in the
# same round trip (set_config(..., true) is SET LOCAL as a function; it runs whenever a lease is
# held, the only case in which more statements follow). The batch statements find their rows by
# key (`id = ANY(...)`), but on a small or never-analyzed table the planner prices a hash join over
# a sequential scan below a few hundred index look-ups, and each batch then reads the whole table:
# O(table) per batch (measured: 30,000 items, 200 answers: 12 ms instead of 6).
PG_LOCK_HELD_LEASES = text(
    """
    SELECT p.id, p.lease_epoch
    FROM (SELECT set_config('enable_seqscan', 'off', true)) AS planner, feedproc_partitions AS p
    WHERE p.id = ANY(CAST(:pids AS bigint[])) AND p.lease_owner = :watcher AND p.status = 'available'
    ORDER BY p.id
    FOR UPDATE OF p
    """
)

# A transactional processor's answer: the lease must not have ended either, on the clock of this
# statement (clock_timestamp(); now() is the start of the processor's transaction).
PG_LOCK_LIVE_LEASES = text(
    """
    SELECT p.id, p.lease_epoch
    FROM feedproc_partitions AS p
    WHERE p.id = ANY(CAST(:pids AS bigint[])) AND p.lease_owner = :watcher AND p.status = 'available'
      AND p.lease_expires_at > clock_timestamp()
    ORDER BY p.id
    FOR UPDATE OF p
    """
)

# The common answer, "done" without new data, on PostgreSQL: four arrays instead of twelve, all
# bound as text literals (pg_bigint_array): the start time and duration in microseconds, because
# formatting floats cost 1 us each (2.9 us of watcher CPU per item, sampled with py-spy). They are
# turned into a time by interval arithmetic, exact to the microsecond, not `to_timestamp(x / 1e6)`:
# that divides in numeric (0.57 against 0.26 s per million rows, with the duration's division).
# `attempts` stays: a complete item's failed deliveries at its gate, as the contract defines them.
# (SQLite writes it with the general update below.)
_PG_COMPLETE_ITEMS_SQL = """
    UPDATE feedproc_items AS i SET
        status = 'complete',
        last_error = NULL,
        next_attempt_at = now(),
        progress = NULL,
        deliveries = i.deliveries + 1,
        lost = 0,
        started_at = TIMESTAMPTZ 'epoch' + v.started * INTERVAL '1 microsecond',
        duration = v.duration * CAST(1e-6 AS double precision),
        delivered_by = :watcher,
        claimed_until = NULL,
        version = i.version + 1,
        updated_at = now()
    FROM unnest(CAST(:id AS bigint[]), CAST(:version AS bigint[]), CAST(:started AS bigint[]),
                CAST(:duration AS bigint[])) AS v(id, version, started, duration)
    WHERE i.id = ANY(CAST(:id AS bigint[])) AND i.id = v.id AND i.version = v.version
    """
PG_COMPLETE_ITEMS = DriverStatement(_PG_COMPLETE_ITEMS_SQL)
# The same, merging the batch's accumulate numbers first (`PG_ACCUMULATING`): exactly
# once all the same, as a version that does not match rolls the whole group commit back.
PG_COMPLETE_ITEMS_ACCUMULATING = DriverStatement(PG_ACCUMULATING + _PG_COMPLETE_ITEMS_SQL)

# Every answer ends the item's claim, if a pull worker or a callback handler held one (`pulling.py`).
# Every other answer (its columns: `answers.OUTCOME_COLUMNS`). One statement per batch of answers on
# PostgreSQL: the outcomes arrive as arrays. The version match is the guard (every change of an
# item's status bumps its version, so an item dispatched while available is still available if its
# version is unchanged). There is deliberately no `status = 'available'` term: before the table has
# statistics PostgreSQL would read every available item through the items' index and hash them all,
# per batch (O(backlog)); `id = ANY(...)` instead makes it look up the batch's own rows.
# Answers that carry a `result` (fan-in: what the item produced, kept apart from its data) are
# written by a form with one more column: the common batch binds no array of NULLs for it. A result
# replaces the item's previous one; an answer without one keeps it (as `data`).
_PG_UPDATE_ITEMS_SQL = """
    UPDATE feedproc_items AS i SET
        status = v.status,
        gate = v.gate,
        data = COALESCE(v.data, i.data),{result}
        attempts = v.attempts,
        last_error = CASE WHEN v.error IS NOT NULL THEN v.error WHEN v.clear THEN NULL ELSE i.last_error END,
        next_attempt_at = now() + v.delay * interval '1 second',
        progress = v.progress,  -- kept only by a 'not yet' answer that carries it
        not_yet = COALESCE(v.not_yet, i.not_yet),
        deliveries = i.deliveries + 1,
        lost = 0,
        started_at = TIMESTAMPTZ 'epoch' + v.started * INTERVAL '1 microsecond',
        duration = v.duration * CAST(1e-6 AS double precision),
        delivered_by = :watcher,
        claimed_until = NULL,
        version = i.version + 1,
        updated_at = now()
    FROM unnest(CAST(:id AS bigint[]), CAST(:version AS bigint[]), CAST(:status AS varchar[]),
                CAST(:gate AS integer[]), CAST(:data AS bytea[]), CAST(:attempts AS integer[]),
                CAST(:error AS text[]), CAST(:clear AS boolean[]), CAST(:delay AS double precision[]),
                CAST(:progress AS double precision[]), CAST(:not_yet AS integer[]), CAST(:started AS bigint[]),
                CAST(:duration AS bigint[]){result_array})
        AS v(id, version, status, gate, data, attempts, error, clear, delay, progress, not_yet, started,
             duration{result_name})
    WHERE i.id = ANY(CAST(:id AS bigint[])) AND i.id = v.id AND i.version = v.version
    """
PG_UPDATE_ITEMS = text(_PG_UPDATE_ITEMS_SQL.format(result="", result_array="", result_name=""))
PG_UPDATE_ITEMS_WITH_RESULT = text(
    _PG_UPDATE_ITEMS_SQL.format(
        result="\n        result = COALESCE(v.result, i.result),",
        result_array=", CAST(:result AS bytea[])",
        result_name=", result",
    )
)

# PostgreSQL: also what _settle reads, for the partitions whose gate drained (ready_at NULL), so it
# needs no query of its own for them. (SQLite renders RETURNING columns unqualified, which would
# turn the facts' correlated subqueries into questions about the items' own columns.)
PG_REFRESH_READY_AT = REFRESH_READY_AT.returning(*SETTLE_COLUMNS, *gate_facts(P.id, P.gate))

# The leases a long group commit wrote under, renewed before it commits (`Answers._renew`).
PG_RENEW_LEASES = text(
    """
    UPDATE feedproc_partitions
    SET lease_expires_at = statement_timestamp() + CAST(:seconds AS double precision) * interval '1 second'
    WHERE id = ANY(CAST(:pids AS bigint[])) AND lease_owner = :watcher AND status = 'available'
    """
)


def _aged(table: str = "") -> str:
    """`aged_priority` (SQLite's statements) as SQL text, for the statements written as text: the
    priority raised by one for every :aging seconds since creation, capped; the priority itself when
    :aging is NULL."""
    steps = f"CAST(FLOOR(EXTRACT(EPOCH FROM (now() - {table}created_at)) / CAST(:aging AS double precision)) AS bigint)"
    return (
        f"CASE WHEN CAST(:aging AS double precision) IS NULL THEN {table}priority"
        f" WHEN {table}priority > {MAX_PRIORITY} - {steps} THEN {MAX_PRIORITY}"
        f" ELSE {table}priority + {steps} END"
    )


# The ready items of a watcher's partitions, in dispatch order, in one statement that walks the
# leased partitions in order (priority, then from the one after :after, the last partition the
# previous fetch served, by id, wrapping around) and stops once it has `limit` items, as SQLite's
# `find_ready` does: the recursive `walk` takes from each partition, in due order on feedproc_items_by_gate
# (ids only: an index-only scan), what is still wanted, and the items are joined back to their rows
# for the data. The previous form (LATERAL per partition, each up to `limit`, then a sort) read
# partitions x limit index entries to keep `limit` of them: 4,000 for 200 items with 20 partitions
# leased, 6.2 ms per fetch against 0.6-1.3 ms now (EXPLAIN ANALYZE, with and without statistics),
# and dispatch order makes the first partitions' items the ones kept anyway. The walk reads the
# partitions from arrays (`walk_order`): joining the leased partitions at every step costs O(leased)
# per step (200 partitions with an item each: 7.4 ms against 1.3, and 3.3 for the LATERAL form).
# `OFFSET 0` keeps the per-partition subquery from being inlined (it would run twice: once per use
# of its result).
# An item a handler's 202 or a pull worker claimed is due when its claim ends (its next_attempt_at),
# plus a grace (`SETTLE_GRACE`) for the expiry to be settled first, so it is not fetched meanwhile;
# testing `claimed_until` here too would turn the walk's index-only scan into heap reads. Fetched
# before the settling all the same, the item's new delivery supersedes the claim (versions), and
# the late answer is refused.
# Items in flight here are skipped with `NOT IN (SELECT unnest(...))`, which PostgreSQL runs as one
# hashed subplan: `<> ALL(array)` compares each candidate with every excluded id (2-10x slower
# with a few hundred in flight). Its columns are ReadyItem's fields, in order (`collect`: the gate
# whose results an item collects, given when it was added; NULL for nearly all).
PG_FETCH_READY = DriverStatement(
    f"""
    WITH RECURSIVE leased AS MATERIALIZED (
        SELECT p.id, p.key, p.queue, p.lease_epoch, p.weight, p.gate, {_aged("p.")} AS priority,
               row_number() OVER (ORDER BY {_aged("p.")} DESC, p.id <= :after, p.id) AS n
        FROM feedproc_partitions AS p
        WHERE p.lease_owner = :watcher AND p.status = 'available' AND p.wanted_by IS NULL
          AND p.lease_expires_at > now() AND p.ready_at <= now()
          AND p.id NOT IN (SELECT unnest(CAST(:closed AS bigint[])))
    ), walk_order AS MATERIALIZED (
        SELECT array_agg(id ORDER BY n) AS pids, array_agg(gate ORDER BY n) AS gates, count(*) AS total
        FROM leased
    ), walk (n, taken, ids) AS (
        SELECT CAST(0 AS bigint), 0, CAST('{{}}' AS bigint[])
        UNION ALL
        SELECT w.n + 1, w.taken + cardinality(x.ids), x.ids
        FROM walk AS w
        CROSS JOIN walk_order AS o
        CROSS JOIN LATERAL (
            SELECT ARRAY(
                SELECT c.id
                FROM feedproc_items AS c
                WHERE c.partition_id = o.pids[w.n + 1] AND c.gate = o.gates[w.n + 1] AND c.status = 'available'
                  AND c.next_attempt_at <= now()
                  AND c.id NOT IN (SELECT unnest(CAST(:excluded AS bigint[])))
                ORDER BY c.next_attempt_at, c.id
                LIMIT :limit - w.taken)
            OFFSET 0) AS x(ids)
        WHERE w.taken < :limit AND w.n < o.total
    )
    SELECT i.id, i.version, l.id, l.key, l.queue, l.lease_epoch, i.gate, i.attempts, i.data, l.weight,
           i.deliveries, i.lost, i.collect, i.not_yet, l.priority
    FROM walk AS w
    CROSS JOIN LATERAL unnest(w.ids) WITH ORDINALITY AS t(id, ord)
    JOIN leased AS l ON l.n = w.n
    JOIN feedproc_items AS i ON i.id = t.id
    ORDER BY w.n, t.ord
    """
)


# What a fetch took, recorded as in flight before anything of it is delivered: one row per
# partition (what is still in flight there from earlier fetches, plus these), unless a newer lease
# wrote that row meanwhile; only the partitions returned may be delivered. A row per partition and
# fetch, not per item: marking each item row cost as much as completing it (28 against 25 us per
# item, measured on 30,000 items in batches of 200); and a statement of its own, with the entries
# encoded here as runs of ids: built inside the fetch statement (a CTE and an aggregate), the
# record cost 8 us of database CPU per item. It commits without waiting for its WAL flush: a record
# lost in a database crash means a delivery not charged, nothing worse.
# Its ON CONFLICT clause is the one SQLite runs (`sqlite.APPEND_OR_REPLACE`).
PG_MARK_INFLIGHT = DriverStatement(
    f"""
    INSERT INTO feedproc_inflight AS f (partition_id, watcher, epoch, entries)
    SELECT m.pid, :watcher, m.epoch, m.entries
    FROM (SELECT set_config('synchronous_commit', 'off', true)) AS durability,
         unnest(CAST(:pids AS bigint[]), CAST(:epochs AS bigint[]), CAST(:entries AS text[])) AS m(pid, epoch, entries)
    ORDER BY m.pid
    ON CONFLICT (partition_id) DO UPDATE
        SET watcher = excluded.watcher, epoch = excluded.epoch, entries = {APPEND_OR_REPLACE}
        WHERE f.epoch <= excluded.epoch
    RETURNING f.partition_id
    """
)

# A producer's new items of one partition: the partition once, the gates and data as arrays.
PG_INSERT_NEW_ITEMS = text(
    """
    INSERT INTO feedproc_items (partition_id, gate, status, data, next_attempt_at, created_at, updated_at)
    SELECT :pid, u.gate, 'available', u.data, now(), now(), now()
    FROM unnest(CAST(:gate AS integer[]), CAST(:data AS bytea[])) WITH ORDINALITY AS u(gate, data, n)
    ORDER BY u.n
    """
)
# Any item rows (`gating.ITEM_COLUMNS`: children carry their parent): one statement for the whole
# chunk, arrays in, unnest.
PG_INT_COLUMNS = ("partition_id", "gate", "parent_id", "parent_gate", "seq")  # never NULL: the rows are children
PG_INSERT_ITEMS = text(
    """
    INSERT INTO feedproc_items
        (partition_id, gate, status, data, parent_id, parent_gate, seq, next_attempt_at, created_at, updated_at)
    SELECT u.partition_id, u.gate, u.status, u.data, u.parent_id, u.parent_gate, u.seq, now(), now(), now()
    FROM unnest(CAST(:partition_id AS bigint[]), CAST(:gate AS integer[]), CAST(:status AS varchar[]),
                CAST(:data AS bytea[]), CAST(:parent_id AS bigint[]), CAST(:parent_gate AS integer[]),
                CAST(:seq AS integer[]))
        WITH ORDINALITY AS u(partition_id, gate, status, data, parent_id, parent_gate, seq, n)
    ORDER BY u.n
    """
)
# Items that collect an earlier gate's results (`collect`, fan-in on a queue without a pipeline)
# go in by statements with that column: a chunk without any binds nothing more than before.
PG_INSERT_NEW_COLLECTING = text(
    """
    INSERT INTO feedproc_items (partition_id, gate, status, data, collect, next_attempt_at, created_at, updated_at)
    SELECT :pid, u.gate, 'available', u.data, u.collect, now(), now(), now()
    FROM unnest(CAST(:gate AS integer[]), CAST(:data AS bytea[]), CAST(:collect AS integer[]))
        WITH ORDINALITY AS u(gate, data, collect, n)
    ORDER BY u.n
    """
)
PG_INSERT_COLLECTING = text(
    """
    INSERT INTO feedproc_items (partition_id, gate, status, data, parent_id, parent_gate, seq, collect,
                                next_attempt_at, created_at, updated_at)
    SELECT u.partition_id, u.gate, u.status, u.data, u.parent_id, u.parent_gate, u.seq, u.collect, now(), now(), now()
    FROM unnest(CAST(:partition_id AS bigint[]), CAST(:gate AS integer[]), CAST(:status AS varchar[]),
                CAST(:data AS bytea[]), CAST(:parent_id AS bigint[]), CAST(:parent_gate AS integer[]),
                CAST(:seq AS integer[]), CAST(:collect AS integer[]))
        WITH ORDINALITY AS u(partition_id, gate, status, data, parent_id, parent_gate, seq, collect, n)
    ORDER BY u.n
    """
)


def pg_int_array(values: Iterable[int | None]) -> str:
    """`pg_bigint_array` for integers that may be missing (NULL)."""
    return "{" + ",".join("NULL" if v is None else str(int(v)) for v in values) + "}"


# `acquire` on PostgreSQL: pick, lease and log in one statement (data-modifying CTEs share one
# snapshot and commit together), one round trip: the path from a notification to dispatch.
# RETURNING sees the new epoch; `c.lease_owner` is the previous owner. Never in a queue in pull mode.
_PG_ACQUIRE = """
    WITH candidates AS (
        SELECT id, lease_owner FROM feedproc_partitions
        WHERE queue = :queue AND status = 'available' AND ready_at IS NOT NULL AND ready_at <= now()
          AND (not_before IS NULL OR not_before <= now())
          AND (lease_owner IS NULL OR lease_expires_at < now())
          AND NOT EXISTS (SELECT 1 FROM feedproc_queues WHERE name = :queue AND mode = 'pull')
        ORDER BY priority DESC, created_at, id
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    ), leased AS (
        UPDATE feedproc_partitions AS p SET
            lease_owner = :watcher,
            lease_epoch = p.lease_epoch + 1,
            lease_expires_at = now() + CAST(:seconds AS double precision) * interval '1 second',
            wanted_by = NULL,
            version = p.version + 1,
            updated_at = now()
        FROM candidates AS c
        WHERE p.id = c.id
        RETURNING p.id, p.key, p.lease_epoch, p.weight, p.item_timeout, p.windows, p.window_tz, p.partition_limit,
                  EXTRACT(EPOCH FROM (p.lease_expires_at - now())) AS remaining, c.lease_owner AS previous
    ), logged AS (
        INSERT INTO feedproc_events (partition_id, item_id, kind, watcher, detail, at)
        SELECT id, NULL, CASE WHEN previous IS NULL THEN 'leased' ELSE 'expired' END, :watcher,
               CASE WHEN previous IS NULL THEN NULL ELSE '{"previous": ' || to_json(previous)::text || '}' END, now()
        FROM leased
    )
    SELECT l.id, l.key, l.lease_epoch, l.weight, l.item_timeout, l.windows, l.window_tz, l.partition_limit, l.remaining,
           f.watcher AS pending_watcher, f.entries AS pending_entries
    FROM leased AS l LEFT JOIN feedproc_inflight AS f ON f.partition_id = l.id AND f.epoch < l.lease_epoch
    ORDER BY l.id
    """
PG_ACQUIRE = text(_PG_ACQUIRE)
# With the queue's aging (:aging seconds a step): by aged priority (a sort of its leasable partitions).
PG_ACQUIRE_AGED = text(
    _PG_ACQUIRE.replace("ORDER BY priority DESC, created_at, id", f"ORDER BY {_aged()} DESC, created_at, id")
)


# The reads of claims and items, and the claims' end, with arrays instead of one bound parameter per
# value (an answer batch of 100: 1.9 and 2.2 ms for the expanded IN lists, measured with engine events).
PG_CLAIMS_OF = text(
    """
    SELECT token, item_id, partition_id, queue, worker, gate, version, weight, lease_seconds, state,
           claimed_at, expires_at, expires_at > now() AS live
    FROM feedproc_claims WHERE token = ANY(CAST(:tokens AS varchar[]))
    """
)
PG_ITEMS_OF = text(
    """
    SELECT i.id, i.version, i.partition_id, i.gate, i.status, i.attempts, i.deliveries, i.lost, i.not_yet,
           p.key, p.queue, p.status AS partition_status
    FROM feedproc_items AS i JOIN feedproc_partitions AS p ON p.id = i.partition_id
    WHERE i.id = ANY(CAST(:ids AS bigint[]))
    """
)
PG_END_CLAIMS = text(
    "UPDATE feedproc_claims SET state = :state, ended_at = now() WHERE token = ANY(CAST(:tokens AS varchar[]))"
)


# The next `:max` claimable items of a queue on PostgreSQL: its partitions in lease order (priority,
# then age), each one's items at its current gate in due order, locked with SKIP LOCKED so that
# concurrent claimers never wait for each other nor take the same item. There is deliberately no
# ORDER BY over the join: the nested loop yields the partitions in order, and the LIMIT stops it as
# soon as it has enough (an outer sort would walk and lock every ready partition's items first).
PG_CANDIDATES = text(
    """
    SELECT i.id, i.version, i.partition_id, p.key, p.queue, i.gate, i.attempts, i.data, p.weight,
           i.deliveries, i.lost, p.windows, p.window_tz, p.rank, i.collect
    FROM (SELECT id, key, queue, gate, weight, windows, window_tz,
                 row_number() OVER (ORDER BY priority DESC, created_at, id) AS rank
          FROM feedproc_partitions
          WHERE queue = :queue AND status = 'available' AND ready_at IS NOT NULL AND ready_at <= now()
            AND (not_before IS NULL OR not_before <= now())
            AND (lease_owner IS NULL OR lease_expires_at < now())
            AND gate <> ALL(CAST(:blocked AS int[]))
            AND priority BETWEEN CAST(:min_priority AS bigint) AND CAST(:max_priority AS bigint)
          ORDER BY priority DESC, created_at, id) AS p
    CROSS JOIN LATERAL (
        SELECT id, version, partition_id, gate, attempts, data, deliveries, lost, next_attempt_at, collect
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

# One page of collected results (`collecting.py`: why the partition and gate terms are off the indexes).
PG_PAGE = text(
    f"SELECT {PAGE_COLUMNS.format(length='octet_length')} FROM feedproc_items"
    " WHERE id > :after AND id <= :until AND partition_id + 0 = :pid AND gate + 0 = :gate"
    " AND status IN ('complete', 'failed') ORDER BY id LIMIT :limit"
)


def update_items_params(rows: list[dict[str, Any]]) -> dict[str, Any]:
    columns = (*OUTCOME_COLUMNS, "result") if with_results(rows) else OUTCOME_COLUMNS
    return {c: [r[c] for r in rows] for c in columns}


def micros_array(values: Iterable[int | None]) -> str:
    """`pg_bigint_array` for values that may be missing (outcomes written without a record)."""
    values = list(values)
    if None not in values:
        return "{" + ",".join(map(str, values)) + "}"
    return "{" + ",".join("NULL" if v is None else str(int(v)) for v in values) + "}"
