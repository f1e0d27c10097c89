"""`feedproc bench`: feedproc's throughput and latency, measured from the database, beside its peers.

For every database place (`--db`, repeatable), workload and watcher count, one **run**:

1. a fresh throwaway database (PostgreSQL, MariaDB/MySQL: `CREATE DATABASE bench_<run>_<n>` on the
   server of the given URL, dropped afterwards; SQLite: a new file beside the given one, or in a
   temporary directory), migrated;
2. **enqueue**: the workload's partitions are added through `Feed.add_partition`, one call each,
   timed in this process (items per second);
3. **drain**: W `feedproc watch` processes start at once and work the backlog off; the drain rate
   is items ÷ (first `leased` event → last item `updated_at`), both read from the database after
   the run; the watchers are stopped (SIGTERM) once the database says every partition is
   complete, so their database statistics are flushed and counted for this phase alone;
4. **paced** (`--latency-seconds`, unless 0): W new watchers, warmed up on one small partition
   each, and a producer adding partitions at half the drain rate just measured (flat and http: a
   partition every 20 ms; fan: partitions of the backlog's shape, as "half the rate" only means
   something for the same partitions); dispatch latency (item ready → the processor called with
   it) and gate-advance latency at that load. The rate the producer achieved is reported too.

The watchers are exactly `feedproc watch` (started as `python -m feedproc.bench.watch watch ...`,
which counts their SQLAlchemy statements and transactions with engine events before handing over
to the CLI). The no-op processor (`watch.BenchProcessor`) and the HTTP handler
(`cmds/bench_handler.py`) append one line per call, `<item id> <gate> <attempt> <unix time>`, to a
log: the call times for the latencies and the deliveries for the exactly-once check. Database
timestamps (`now()` on PostgreSQL, `UTC_TIMESTAMP(6)` on MariaDB/MySQL, the process clock on
SQLite) and the processes' `time.time()` come from the same host clock here.

The fan-in's workloads, `collect` (a Python processor) and `collect-http` (an HTTP handler and a
`feedproc serve` for its results URL), run differently: per size of `--sizes`, one partition of N
items fanning in to one item that collects them, one watcher; see `collect.py`.

`--against pgqueuer,procrastinate` runs the equivalent flat no-op drain with each peer (through
`cmds/bench_peers.py`, in subprocesses; feedproc never imports them) on the same PostgreSQL
server, with the same number of processes, and tabulates the ratios.

The bench is a tool beside the runtime, not part of it: nothing in feedproc imports it but the
CLI's `bench` command, lazily. It enqueues through the public `Feed`, runs watchers as `feedproc
watch` subprocesses, and reads its measurements with SQL of its own on connections of its own.

Modules: `options` (the validated options, shared constants), `run` (the runs and `run_bench`),
`collect` (the collect workloads' setup and reading),
`watch` (inside the watcher processes), `places` (throwaway databases, the bench's connections),
`processes` (subprocesses), `measure` (reading and computing the results), `peers`, `report`.
"""

from __future__ import annotations

from .measure import DbFacts, fill_finished, read_db
from .options import BenchFailed, BenchOptions, parse_options
from .run import Bench, run_bench

__all__ = [
    "Bench",
    "BenchFailed",
    "BenchOptions",
    "DbFacts",
    "fill_finished",
    "parse_options",
    "read_db",
    "run_bench",
]
