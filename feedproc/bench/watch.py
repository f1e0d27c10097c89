"""What runs inside the bench's watcher processes: `python -m feedproc.bench.watch watch ARGS...`.

That is exactly `feedproc watch ARGS...`, with the watcher's SQLAlchemy statements, transactions
and pool checkouts counted first (when FEEDPROC_BENCH_STATS is set) and written to
FEEDPROC_BENCH_DIR/stats-<pid>.json at exit; and `BenchProcessor`, the no-op processor, which
appends `<item id> <gate> <attempt> <unix time>` per call to FEEDPROC_BENCH_DIR/calls-<pid>.log.

This module imports the CLI (to hand over to `feedproc watch`), which is why nothing imports it:
the bench names it on a subprocess command line only, so the CLI's lazy import of the bench
(`feedproc bench`) makes no cycle.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .. import Processor, Response
from .options import DIR_ENV, STATS_ENV


class BenchProcessor(Processor):
    """The no-op processor of the bench: completes every item, logging `id gate attempt time`."""

    def __init__(self) -> None:
        folder = os.environ.get(DIR_ENV)
        self._log = open(Path(folder) / f"calls-{os.getpid()}.log", "a", buffering=1 << 16) if folder else None  # noqa: SIM115

    async def process(self, item: Any) -> Response:
        if self._log is not None:
            self._log.write(f"{item.id} {item.gate} {item.attempt} {time.time():.6f}\n")
        return Response(done=True)

    async def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


class AccumulatingBenchProcessor(BenchProcessor):
    """The no-op processor whose every answer carries accumulate numbers: `pages` (item id mod 7,
    plus 1: summed) and `max_score` (id mod 1000 / 1000: the greatest kept), as `flat-accumulate`
    declares them."""

    async def process(self, item: Any) -> Response:
        if self._log is not None:  # as BenchProcessor's, without a coroutine more per call
            self._log.write(f"{item.id} {item.gate} {item.attempt} {time.time():.6f}\n")
        return Response(done=True, accumulate=accumulated_by(item.id))


def accumulated_by(item_id: int) -> dict[str, float]:
    """What item `item_id`'s answer accumulates in `flat-accumulate` (the bench checks the sums)."""
    return {"pages": item_id % 7 + 1, "max_score": item_id % 1000 / 1000}


def tally(collected: Iterable[Any]) -> tuple[int, int, int]:
    """Iterate collected results once: how many, how many ids came twice (a byte per id since the
    first: a million ids cost 1 MB) and the sum of their results' `n`."""
    seen = bytearray()
    first: int | None = None
    count = twice = total = 0
    for row in collected:
        first = row.id if first is None else first
        offset = row.id - first
        if offset >= len(seen):
            seen.extend(bytes(offset - len(seen) + 65536))
        twice += seen[offset]
        seen[offset] = 1
        count += 1
        total += json.loads(row.result or b"{}").get("n", 0)
    return count, twice, total


class CollectProcessor(Processor):
    """The collect workload's processor (see `collect.py`), logging its calls as BenchProcessor does.
    At gate 0 (the item whose answer drains the gate): its data as its result. At the fan-in: notes
    when it was entered, iterates every collected result (a plain `def`: the pages are read on its
    worker thread) counting them, the ids seen twice (a byte per id since the first) and the sum of
    their `n`, and writes that with its times and RSS to FEEDPROC_BENCH_DIR/collect-<pid>.jsonl."""

    def __init__(self) -> None:
        folder = os.environ.get(DIR_ENV)
        self._folder = Path(folder) if folder else None

    def process(self, item: Any) -> Response:
        entered = time.time()
        if self._folder is not None:
            with open(self._folder / f"calls-{os.getpid()}.log", "a") as log:
                log.write(f"{item.id} {item.gate} {item.attempt} {entered:.6f}\n")
        if item.collected is None:
            return Response(done=True, result=item.data)
        rss_at_call = _status_mb("VmRSS")
        started = time.perf_counter()
        count, twice, total = tally(item.collected)
        iterated = time.perf_counter() - started
        record = {
            "id": item.id,
            "entered": entered,
            "iterate_seconds": iterated,
            "count": count,
            "len": len(item.collected),
            "twice": twice,
            "sum": total,
            "rss_at_call_mb": rss_at_call,
            "hwm_mb": _status_mb("VmHWM"),
        }
        if self._folder is not None:
            with open(self._folder / f"collect-{os.getpid()}.jsonl", "a") as out:
                out.write(json.dumps(record) + "\n")
        return Response(done=True, result={"count": count, "twice": twice, "sum": total})


def _status_mb(field: str) -> float | None:
    """A /proc/self/status figure (VmRSS, VmHWM: the kernel's high-water mark) in MB; None off Linux."""
    try:
        with open("/proc/self/status") as status:
            return round(next(int(line.split()[1]) for line in status if line.startswith(field + ":")) / 1024, 1)
    except (OSError, StopIteration):
        return None


def watch_main() -> None:
    """`feedproc ARGS` (ARGS: `watch ...`), with statements, transactions and pool checkouts counted
    (when FEEDPROC_BENCH_STATS is set) and written to FEEDPROC_BENCH_DIR/stats-<pid>.json at exit."""
    counts = _count_statements() if os.environ.get(STATS_ENV) else None
    try:
        from ..cli import main

        main(sys.argv[1:])
    finally:
        folder = os.environ.get(DIR_ENV)
        if counts is not None and folder:
            path = Path(folder) / f"stats-{os.getpid()}.json"
            path.with_suffix(".tmp").write_text(json.dumps(dict(counts)))
            path.with_suffix(".tmp").replace(path)


def _count_statements() -> Counter[str]:
    from sqlalchemy import event
    from sqlalchemy.engine import Engine
    from sqlalchemy.pool import Pool

    # The hot path's statements run on the driver's cursor, out of the engine events' sight: the
    # runtime offers this hook for them (and nothing else of the runtime's internals is used here).
    from ..store.foundations import DriverStatement

    counts: Counter[str] = Counter()
    lock = threading.Lock()

    def add(key: str, n: int = 1) -> None:
        with lock:
            counts[key] += n

    def on_statement(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        # An executemany (SQLite's per-row UPDATE) is one statement per parameter set in the database.
        add("statements", len(parameters) if many and isinstance(parameters, list | tuple) else 1)

    event.listen(Engine, "before_cursor_execute", on_statement)
    DriverStatement.observer = lambda conn, statement: add("statements")
    event.listen(Engine, "commit", lambda conn: add("commits"))
    event.listen(Engine, "rollback", lambda conn: add("rollbacks"))
    event.listen(Pool, "checkout", lambda *args: add("checkouts"))
    return counts


if __name__ == "__main__":
    watch_main()
