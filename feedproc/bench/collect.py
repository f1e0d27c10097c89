"""The `collect` workload: one partition of N items fanning in to one item that collects them.

Its partition, added through `Feed`: at gate 0 one available item (data `{"n": N}`), at gate 1 one
item collecting gate 0. Then N - 1 complete items with results `{"n": 1}` .. `{"n": N-1}` are
written at gate 0 in one statement of the bench's own (`fill_collected`): a million in seconds,
where having a watcher answer them would take minutes and measure the drain, not the fan-in. The
table is then vacuumed and analysed, as autovacuum and time would have.

One `feedproc watch` (`watch.CollectProcessor`) then answers the available item with its data as
its result: that answer drains gate 0, and the same transaction advances the partition to gate 1
and records the `gate_advanced` event — **the barrier**, at the event's time (the database clock:
PostgreSQL's `now()` is its transaction's start, a few ms before its commit, so the figure is an
upper bound by that much). The watcher delivers the fan-in item: `process()` notes the time it
was entered (**the fan-in call**), iterates `item.collected` to the end (counting the results, any
id seen twice, and the sum of their `n`: N(N + 1)/2 when each was read once) and notes its own RSS.

Reported per N: barrier → fan-in call, the iteration's time and rate, barrier → the fan-in's answer
committed (its `updated_at`), and the watcher's peak RSS (the bench's sampling and VmHWM).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .measure import _utc, iso, read_calls
from .places import engine

KEY = "collect"


def collect_partition(size: int) -> list[dict[str, Any]]:
    """The partition `Feed.add_partition` adds: the item left to answer at gate 0, the fan-in item."""
    return [{"gate": 0, "data": {"n": size}}, {"gate": 1, "data": {"size": size}, "collect": 0}]


def fill_collected(url: str, key: str, count: int) -> None:
    """`count` complete items at gate 0 of partition `key`, results `{"n": 1}` .. `{"n": count}`, in
    one INSERT ... SELECT over a recursive series; then VACUUM/ANALYZE (and a CHECKPOINT on PostgreSQL),
    so the run does not measure the fill's own hint-bit writes and checkpoint I/O."""
    from sqlalchemy import text

    from ..store.foundations import db_now

    own = engine(url)
    name = own.dialect.name
    now = str(db_now().compile(dialect=own.dialect))
    result = {
        "postgresql": "convert_to('{\"n\":' || n || '}', 'UTF8')",
        "sqlite": "CAST('{\"n\":' || n || '}' AS BLOB)",
    }.get(name, "CONCAT('{\"n\":', n, '}')")
    insert = (
        "INSERT INTO feedproc_items (partition_id, gate, status, data, result, next_attempt_at, created_at, updated_at)"
        f" WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < :count)"
        f" SELECT :pid, 0, 'complete', :data, {result}, {now}, {now}, {now} FROM s"
    )
    try:
        if count > 0:
            with own.begin() as conn:
                pid = conn.execute(text('SELECT id FROM feedproc_partitions WHERE "key" = :key'), {"key": key}).scalar()
                if name in ("mysql", "mariadb"):  # both stop a recursive CTE at 1,000 rows unless told
                    mariadb = getattr(own.dialect, "is_mariadb", False)
                    setting = "max_recursive_iterations" if mariadb else "cte_max_recursion_depth"
                    conn.execute(text(f"SET SESSION {setting} = :depth"), {"depth": count + 1})
                conn.execute(text(insert), {"pid": pid, "count": count, "data": b"{}"})
        with own.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            if name == "postgresql":
                conn.execute(text("VACUUM (ANALYZE) feedproc_items"))
                if count >= 10_000:  # a few pages' writes are nothing to flush (and the server is shared)
                    conn.execute(text("CHECKPOINT"))
            elif name in ("mysql", "mariadb"):
                conn.execute(text("ANALYZE TABLE feedproc_items"))
            else:
                conn.execute(text("ANALYZE"))
    finally:
        own.dispose()


# The partition's first two items, the ones the watcher is given (the fill's come after them).
_GIVEN = "SELECT id, gate, status, updated_at FROM feedproc_items WHERE partition_id = :pid ORDER BY id LIMIT 2"
_NOT_COMPLETE = "SELECT count(*) FROM feedproc_items WHERE partition_id = :pid AND status <> 'complete'"
_PARTITION = 'SELECT id, status FROM feedproc_partitions WHERE "key" = :key'
_ADVANCED = "SELECT detail, at FROM feedproc_events WHERE partition_id = :pid AND kind = 'gate_advanced'"


def analyse_collect(url: str, folder: Path, result: dict[str, Any]) -> None:
    """Read what a collect run left (the database, the processor's call log and record in `folder`)
    and add its figures and checks to `result`."""
    from sqlalchemy import text

    size = int(result["size"])
    own = engine(url)
    try:
        with own.connect() as conn:
            pid, status = conn.execute(text(_PARTITION), {"key": KEY}).one()
            given = conn.execute(text(_GIVEN), {"pid": pid}).all()
            not_complete = conn.execute(text(_NOT_COMPLETE), {"pid": pid}).scalar()
            advanced = [
                _utc(at).timestamp()
                for detail, at in conn.execute(text(_ADVANCED), {"pid": pid})
                if json.loads(detail)["to"] == 1
            ]
    finally:
        own.dispose()
    calls, _, bad = read_calls(folder)
    records = [json.loads(line) for path in folder.glob("collect-*.jsonl") for line in path.read_text().splitlines()]
    fan_in = next((row for row in given if row.gate == 1), None)
    called = sorted((call.gate, call.id) for call in calls)
    expected = sorted((row.gate, row.id) for row in given)
    read = records[-1] if records else {}
    read_ok = (read.get("count"), read.get("len"), read.get("twice"), read.get("sum")) == (
        size,
        size,
        0,
        size * (size + 1) // 2,
    )
    result["complete"] = status == "complete" and not_complete == 0 and len(given) == 2
    result["exactly_once"] = result["complete"] and called == expected and not bad and len(records) == 1 and read_ok
    result["deliveries"] = {"calls": len(calls), "items": len(expected), "fan_in_calls": len(records)}
    result["read"] = {key: read.get(key) for key in ("count", "len", "twice", "sum")}
    result["pages"] = read.get("pages")  # collect-http: results URL pages read (0: all inline)
    if not result["complete"]:
        result["problems"].append(f"partition {status}, {not_complete} of its items not complete")
    elif not result["exactly_once"]:
        result["problems"].append(
            f"not read exactly once: calls {called} for {expected}; read {result['read']} of {size}"
        )
    if not read or not advanced:
        return
    barrier = advanced[0]
    entered = float(read["entered"])
    figures: dict[str, Any] = {
        "barrier": iso(barrier),
        "barrier_to_call_ms": round((entered - barrier) * 1000, 1),
        "iterate_seconds": round(read["iterate_seconds"], 3),
        "results_per_second": round(size / read["iterate_seconds"], 0) if read["iterate_seconds"] else None,
        "rss_at_call_mb": read.get("rss_at_call_mb"),
        "peak_rss_in_call_mb": read.get("hwm_mb"),
    }
    if fan_in is not None:
        figures["barrier_to_answer_seconds"] = round(_utc(fan_in.updated_at).timestamp() - barrier, 3)
    result["fan_in"] = figures
