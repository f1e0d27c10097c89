"""What a run measured, read after it: the processors' call logs, the watchers' statement counts,
and the database's own record (items' `created_at`/`updated_at`, `leased` and `gate_advanced`
events), through read-only SQL of the bench's own; then rates, latencies and the exactly-once check."""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

from .options import HTTP_WORKLOADS, WARMUP
from .places import engine


@dataclass
class Call:
    id: int
    gate: int
    attempt: int
    at: float


def read_calls(folder: Path) -> tuple[list[Call], dict[str, int], int]:
    """Every processor call logged in `folder` (calls-*.log); deliveries per log; unreadable lines."""
    calls: list[Call] = []
    per_log: dict[str, int] = {}
    bad = 0
    for path in sorted(folder.glob("calls-*.log")):
        count = 0
        for line in path.read_text().splitlines():
            parts = line.split()
            try:
                calls.append(Call(int(parts[0]), int(parts[1]), int(parts[2]), float(parts[3])))
                count += 1
            except (ValueError, IndexError):
                bad += 1
        per_log[path.stem] = count
    return calls, per_log, bad


def read_statement_counts(folder: Path) -> dict[str, int]:
    total: Counter[str] = Counter()
    for path in folder.glob("stats-*.json"):
        total.update(json.loads(path.read_text()))
    return dict(total)


def percentiles(values: Iterable[float]) -> dict[str, Any]:
    """p50 and p99 (nearest rank) in milliseconds, and the sample size."""
    ordered = sorted(values)
    if not ordered:
        return {"p50": None, "p99": None, "n": 0}

    def rank(q: float) -> float:
        return round(ordered[max(0, math.ceil(q * len(ordered)) - 1)] * 1000, 2)

    return {"p50": rank(0.50), "p99": rank(0.99), "max": round(ordered[-1] * 1000, 2), "n": len(ordered)}


class ItemRow(NamedTuple):
    id: int
    partition_id: int
    gate: int
    status: str
    created_at: datetime
    updated_at: datetime


@dataclass
class DbFacts:
    """What a finished run left in the database, read once."""

    items: list[ItemRow]  # in id order
    partitions: dict[int, tuple[str, str]]  # id -> (key, status)
    leased: dict[int, float]  # partition id -> first `leased` event time (pull: its first claim)
    entered: dict[tuple[int, int], float]  # (partition id, gate) -> gate_advanced event time


_ITEMS = (
    "SELECT id, partition_id, gate, status, created_at, updated_at FROM feedproc_items WHERE id > :after ORDER BY id"
)
_PARTITIONS = 'SELECT id, "key", status FROM feedproc_partitions WHERE id > :after'  # `key` is reserved in MySQL
_EVENTS = (
    "SELECT partition_id, kind, detail, at FROM feedproc_events"
    " WHERE kind IN ('leased', 'gate_advanced') AND partition_id > :after"
)


_FIRST_CLAIMS = (
    "SELECT partition_id, min(claimed_at) FROM feedproc_claims WHERE partition_id > :after GROUP BY partition_id"
)


def _utc(value: datetime | str) -> datetime:
    """A timestamp as feedproc stores it (PostgreSQL: timestamptz; SQLite: UTC text; MariaDB/MySQL:
    a naive DATETIME in UTC), aware UTC."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def read_db(url: str, after: tuple[int, int] = (0, 0)) -> DbFacts:
    """The run's partitions (id > after[0]), items (id > after[1]) and their events."""
    from sqlalchemy import text

    own = engine(url)
    try:
        with own.connect() as conn:
            rows = [
                ItemRow(id, pid, gate, status, _utc(created), _utc(updated))
                for id, pid, gate, status, created, updated in conn.execute(text(_ITEMS), {"after": after[1]})
            ]
            parts = {pid: (key, status) for pid, key, status in conn.execute(text(_PARTITIONS), {"after": after[0]})}
            leased: dict[int, float] = {}
            entered: dict[tuple[int, int], float] = {}
            for pid, kind, detail, at in conn.execute(text(_EVENTS), {"after": after[0]}):
                if kind == "leased":
                    leased[pid] = min(leased.get(pid, math.inf), _utc(at).timestamp())
                else:
                    entered[(pid, json.loads(detail)["to"])] = _utc(at).timestamp()
            for pid, at in conn.execute(text(_FIRST_CLAIMS), {"after": after[0]}):  # pull workers' "lease"
                leased[pid] = min(leased.get(pid, math.inf), _utc(at).timestamp())
    finally:
        own.dispose()
    return DbFacts(rows, parts, leased, entered)


FINISHED_PER_PARTITION = 10_000


def fill_finished(url: str, count: int) -> tuple[int, int]:
    """Put `count` complete items (in complete partitions of 10,000) in the tables, as a long-lived
    deployment has, then VACUUM, ANALYZE and CHECKPOINT (MariaDB/MySQL: ANALYZE TABLE) as
    autovacuum and time would have. Returns the highest partition and item ids, so that the run's
    own rows can be told apart."""
    from sqlalchemy import text

    own = engine(url)
    mysql = own.dialect.name in ("mysql", "mariadb")
    # The database's clock in UTC, as feedproc stores it (MariaDB's CURRENT_TIMESTAMP is the
    # session's zone, and whole seconds).
    now = "UTC_TIMESTAMP(6)" if mysql else "CURRENT_TIMESTAMP"
    try:
        with own.begin() as conn:
            for start in range(0, count, FINISHED_PER_PARTITION):
                n = min(FINISHED_PER_PARTITION, count - start)
                conn.execute(
                    text(
                        'INSERT INTO feedproc_partitions ("key", queue, status, gate, priority, sealed,'
                        " manual_checkpoint, created_at, updated_at)"
                        f" VALUES (:key, 'default', 'complete', 0, 0, :yes, :no, {now}, {now})"
                    ),
                    {"key": f"finished-{start // FINISHED_PER_PARTITION}", "yes": True, "no": False},
                )
                if mysql:
                    _fill_items_mysql(conn, n)
                    continue
                conn.execute(
                    text(
                        "WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < :n)"
                        " INSERT INTO feedproc_items (partition_id, gate, status, data, next_attempt_at, created_at,"
                        " updated_at) SELECT (SELECT max(id) FROM feedproc_partitions), 0, 'complete', :data,"
                        " CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP FROM s"
                    ),
                    {"n": n, "data": b"{}"},
                )
        with own.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            if own.dialect.name == "postgresql":
                # In a long-lived deployment these rows were vacuumed and checkpointed long ago: do
                # it now, or the run measures the fill's own hint-bit writes and checkpoint I/O.
                conn.execute(text("VACUUM (ANALYZE) feedproc_items"))
                conn.execute(text("VACUUM (ANALYZE) feedproc_partitions"))
                conn.execute(text("CHECKPOINT"))
            elif mysql:
                # InnoDB purges and flushes by itself; its index statistics are what the planner needs.
                conn.execute(text("ANALYZE TABLE feedproc_items, feedproc_partitions"))
            else:
                conn.execute(text("ANALYZE"))
            last_partition = conn.execute(text("SELECT max(id) FROM feedproc_partitions")).scalar()
            last_item = conn.execute(text("SELECT max(id) FROM feedproc_items")).scalar()
        return (last_partition or 0, last_item or 0)
    finally:
        own.dispose()


def _fill_items_mysql(conn: Any, n: int) -> None:
    """`n` complete items in the newest partition, on MariaDB/MySQL: one executemany, which PyMySQL
    sends as multi-row INSERTs when every value is a parameter (MySQL caps a recursive CTE at 1,000
    rows unless told otherwise; the others' generator is not portable)."""
    from sqlalchemy import text

    partition, now = conn.execute(text("SELECT max(id), UTC_TIMESTAMP(6) FROM feedproc_partitions")).one()
    row = {"partition": partition, "gate": 0, "status": "complete", "data": b"{}", "now": now}
    conn.execute(
        text(
            "INSERT INTO feedproc_items (partition_id, gate, status, data, next_attempt_at, created_at, updated_at)"
            " VALUES (:partition, :gate, :status, :data, :now, :now, :now)"
        ),
        [row] * n,
    )


def drain_window(facts: DbFacts, backlog: int) -> tuple[float, float] | None:
    """The backlog's first `leased` event and its last item's `updated_at` (database times)."""
    rows = facts.items[:backlog]
    if not rows:
        return None
    pids = {row.partition_id for row in rows}
    first = min((facts.leased[p] for p in pids if p in facts.leased), default=None)
    last = max(row.updated_at.timestamp() for row in rows)
    return (first, last) if first is not None and last > first else None


def gate_advances(rows: Sequence[Any], first_call: dict[int, float], last_call: dict[int, float]) -> tuple[list, list]:
    """Per partition and pair of consecutive gates holding items: first call at the next gate minus
    (a) the last `updated_at` at the gate (the commit of its last answer, which also advances the
    gate), and (b) the last processor call at the gate (the answer as the handler saw it)."""
    done: dict[tuple[int, int], float] = {}
    called: dict[tuple[int, int], float] = {}
    first: dict[tuple[int, int], float] = {}
    for row in rows:
        key = (row.partition_id, row.gate)
        done[key] = max(done.get(key, -math.inf), row.updated_at.timestamp())
        if row.id in first_call:
            first[key] = min(first.get(key, math.inf), first_call[row.id])
            called[key] = max(called.get(key, -math.inf), last_call[row.id])
    gates_of: dict[int, list[int]] = defaultdict(list)
    for pid, gate in sorted(done):
        gates_of[pid].append(gate)
    from_commit, from_answer = [], []
    for pid, gates in gates_of.items():
        for gate, following in itertools.pairwise(gates):
            if (pid, following) in first:
                from_commit.append(first[(pid, following)] - done[(pid, gate)])
                if (pid, gate) in called:
                    from_answer.append(first[(pid, following)] - called[(pid, gate)])
    return from_commit, from_answer


def analyse(
    url: str,
    after: tuple[int, int],
    folder: Path,
    result: dict[str, Any],
    workload: str,
    committed: dict[str, float],
) -> None:
    """Rates, latencies and the exactly-once check of a feedproc run, from the database (its rows
    after `after`) and the call logs in `folder`, added to `result`. `committed`: the time the
    producer sent the COMMIT of each paced partition, by key."""
    facts = read_db(url, after)
    logs = [folder / "handler"] if workload in HTTP_WORKLOADS else [folder / "drain", folder / "paced"]
    calls: list[Call] = []
    per_log: dict[str, int] = {}
    bad = 0
    for log_folder in logs:
        if log_folder.exists():
            found, counts, unreadable = read_calls(log_folder)
            calls += found
            per_log.update({f"{log_folder.name}/{k}": v for k, v in counts.items()})
            bad += unreadable
    first_call: dict[int, float] = {}
    last_call: dict[int, float] = {}
    deliveries: Counter[int] = Counter()
    for call in calls:
        deliveries[call.id] += 1
        first_call[call.id] = min(first_call.get(call.id, math.inf), call.at)
        last_call[call.id] = max(last_call.get(call.id, -math.inf), call.at)

    # Exactly once: every item complete, called once, and nothing else called.
    ids = {row.id for row in facts.items}
    incomplete = sum(1 for row in facts.items if row.status != "complete")
    unfinished = sum(1 for _, status in facts.partitions.values() if status != "complete")
    twice = sum(1 for n in deliveries.values() if n > 1)
    never = len(ids - deliveries.keys())
    unknown = len(deliveries.keys() - ids) + bad
    result["deliveries"] = {
        "items": len(ids),
        "calls": sum(deliveries.values()),
        "redelivered": twice,
        "never_called": never,
        "unknown": unknown,
        "per_log": per_log,
    }
    result["complete"] = incomplete == 0 and unfinished == 0
    result["exactly_once"] = result["complete"] and twice == 0 and never == 0 and unknown == 0
    if not result["complete"]:
        result["problems"].append(f"{incomplete} items and {unfinished} partitions not complete")
    elif not result["exactly_once"]:
        result["problems"].append(
            f"not exactly once: {twice} items redelivered, {never} never called, {unknown} unknown calls"
        )

    # Drain: the backlog's items, from its first lease to its last completion (database times).
    backlog = result.get("items", 0)
    drain_rows = facts.items[:backlog]
    drain = result.get("drain")
    if drain is not None and drain_rows:
        window = drain_window(facts, backlog)
        if window is not None:
            first, last = window
            drain["seconds"] = round(last - first, 4)
            drain["rate"] = round(backlog / (last - first), 1)
            drain["first_dispatch"] = iso(first)
            drain["last_completion"] = iso(last)
            called = [first_call[row.id] for row in drain_rows if row.id in first_call]
            if called:
                drain["rate_from_first_call"] = round(backlog / max(1e-9, last - min(called)), 1)
        commit, answer = gate_advances(drain_rows, first_call, last_call)
        drain["gate_advance_ms"] = percentiles(commit)
        drain["gate_advance_from_answer_ms"] = percentiles(answer)
    paced = result.get("paced")
    paced_rows = [row for row in facts.items[backlog:] if not facts.partitions[row.partition_id][0].startswith(WARMUP)]
    if paced is not None and paced_rows:
        # Ready: the producer's COMMIT for an item it added, its gate's `gate_advanced` event
        # for one that waited at a fan-in barrier. From the insert (`created_at`, the start of
        # the producer's transaction) is kept for reference: it adds the producer's own time.
        waits, from_insert = [], []
        first_gate: dict[int, int] = {}
        for row in paced_rows:
            first_gate[row.partition_id] = min(first_gate.get(row.partition_id, row.gate), row.gate)
        for row in paced_rows:
            if row.id in first_call:
                entered = facts.entered.get((row.partition_id, row.gate), -math.inf)
                inserted = max(row.created_at.timestamp(), entered)
                key = facts.partitions[row.partition_id][0]
                added = row.gate == first_gate[row.partition_id] and key in committed
                waits.append(first_call[row.id] - (committed[key] if added else inserted))
                from_insert.append(first_call[row.id] - inserted)
        paced["dispatch_latency_ms"] = percentiles(waits)
        paced["dispatch_latency_from_insert_ms"] = percentiles(from_insert)
        commit, answer = gate_advances(paced_rows, first_call, last_call)
        paced["gate_advance_ms"] = percentiles(commit)
        paced["gate_advance_from_answer_ms"] = percentiles(answer)


def iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="microseconds")
