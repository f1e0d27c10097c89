"""`feedproc bench`: feedproc's throughput and latency, measured from the database, beside its peers.

For every database place (`--db`, repeatable), workload and watcher count, one **run**:

1. a fresh throwaway database (PostgreSQL: `CREATE DATABASE bench_<run>_<n>` on the server of the
   given URL, dropped afterwards; SQLite: a new file beside the given one, or in a temporary
   directory), migrated;
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

The watchers are exactly `feedproc watch` (started through `watch_main` below, which counts their
SQLAlchemy statements and transactions with engine events before handing over to the CLI). The
no-op processor (`BenchProcessor`) and the HTTP handler (`cmds/bench_handler.py`) append one line
per call, `<item id> <gate> <attempt> <unix time>`, to a log: the call times for the latencies and
the deliveries for the exactly-once check. Database timestamps (`now()` on PostgreSQL, the
process clock on SQLite) and the processes' `time.time()` come from the same host clock here.

`--against pgqueuer,procrastinate` runs the equivalent flat no-op drain with each peer (through
`cmds/bench_peers.py`, in subprocesses; feedproc never imports them) on the same PostgreSQL
server, with the same number of processes, and tabulates the ratios.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import json
import math
import os
import platform
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .core.errors import FeedprocError, InvalidInput
from .core.models import Response
from .processors import Processor

WORKLOADS = ("flat", "fan", "http")
PEERS = ("pgqueuer", "procrastinate")
DIR_ENV = "FEEDPROC_BENCH_DIR"  # where a bench watcher writes its call log and statement counts
STATS_ENV = "FEEDPROC_BENCH_STATS"  # set: watch_main counts SQLAlchemy statements
PACED_TICK = 0.02  # seconds between two partitions of the flat paced load
FAN_GATES = 3  # the fan workload: items at gates 0..2, then one fan-in item at gate 3
PGQUEUER_CONSUMERS = 5  # PgQueuer's benchmark tool: --dequeue 5
WARMUP = "warmup-"  # key prefix of the paced phase's warm-up partitions (not in the latencies)
_UNFINISHED = "SELECT count(*) FROM feedproc_partitions WHERE status <> 'complete'"


class BenchFailed(FeedprocError):
    """A benchmark run did not complete, or an item was not processed exactly once."""


# ---------------------------------------------------------------- inside the watcher processes


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


def watch_main() -> None:
    """`feedproc watch ARGS`, with statements, transactions and pool checkouts counted (when
    FEEDPROC_BENCH_STATS is set) and written to FEEDPROC_BENCH_DIR/stats-<pid>.json at exit."""
    counts = _count_statements() if os.environ.get(STATS_ENV) else None
    try:
        from .cli import main

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

    from .store.dialects import DriverStatement

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


# ---------------------------------------------------------------- options


@dataclass
class BenchOptions:
    places: list[str]
    workloads: list[str]
    watchers: list[int]
    partitions: int
    items: int
    against: list[str]
    quick: bool = False
    concurrency: int = 50
    poll_interval: float = 0.1
    latency_seconds: float = 5.0
    pgqueuer_batches: list[int] = field(default_factory=lambda: [10, 500])
    procrastinate_jobs: int = 5000
    procrastinate_concurrency: int = 10
    finished: int = 0  # finished items put in the tables before each feedproc run
    timeout: float = 900.0
    keep: bool = False
    json_path: Path | None = None
    markdown_path: Path | None = None
    command: str = "feedproc bench"


def _csv(value: str, option: str) -> list[str]:
    parts = [part.strip() for part in value.split(",") if part.strip()]
    if not parts:
        raise InvalidInput(f"{option} {value!r}: expected a comma-separated list")
    return parts


def parse_options(
    *,
    db: Sequence[str] | None,
    fallback_db: str | None,
    workload: str | None,
    watchers: str | None,
    partitions: int | None,
    items: int | None,
    quick: bool,
    against: str | None,
    concurrency: int,
    poll_interval: float,
    latency_seconds: float | None,
    pgqueuer_batches: str,
    procrastinate_jobs: int,
    timeout: float,
    keep: bool,
    finished: int = 0,
    json_path: Path | None,
    markdown_path: Path | None,
    command: str,
) -> BenchOptions:
    """Validate the `feedproc bench` options (InvalidInput, exit 2, when malformed)."""
    places = list(db or [])
    if not places:
        places = ["sqlite"]
        if fallback_db and _is_pg(fallback_db):
            places.append(fallback_db)
    for place in places:
        if not (_is_pg(place) or _is_sqlite(place)):
            raise InvalidInput(f"--db {place!r}: use sqlite, sqlite:///DIR/FILE.db or postgresql://...")
    workloads = _csv(workload or ",".join(WORKLOADS), "--workload")
    for name in workloads:
        if name not in WORKLOADS:
            raise InvalidInput(f"--workload {name!r}: choose from {', '.join(WORKLOADS)}")
    counts = [_positive_int(v, "--watchers") for v in _csv(watchers or ("1" if quick else "1,2,4"), "--watchers")]
    peers = _csv(against, "--against") if against else []
    for name in peers:
        if name not in PEERS:
            raise InvalidInput(f"--against {name!r}: choose from {', '.join(PEERS)}")
    missing = [name for name in peers if importlib.util.find_spec(name) is None]  # looked up, not imported
    if missing:
        raise InvalidInput(f"--against {','.join(missing)}: not installed; pip install 'feedproc[bench]'")
    if peers and quick:
        raise InvalidInput("--quick runs no peers: drop --against")
    if peers and not any(_is_pg(place) for place in places):
        raise InvalidInput("--against needs a PostgreSQL --db (the peers run on PostgreSQL only)")
    return BenchOptions(
        places=places,
        workloads=list(dict.fromkeys(workloads)),
        watchers=list(dict.fromkeys(counts)),
        partitions=partitions or (2 if quick else 20),
        items=items or (10 if quick else 1000),
        against=list(dict.fromkeys(peers)),
        quick=quick,
        concurrency=concurrency,
        poll_interval=poll_interval,
        latency_seconds=latency_seconds if latency_seconds is not None else (0.5 if quick else 5.0),
        pgqueuer_batches=[_positive_int(v, "--pgqueuer-batches") for v in _csv(pgqueuer_batches, "--pgqueuer-batches")],
        procrastinate_jobs=procrastinate_jobs,
        finished=finished,
        timeout=timeout,
        keep=keep,
        json_path=json_path,
        markdown_path=markdown_path,
        command=command,
    )


def _positive_int(value: str, option: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise InvalidInput(f"{option} {value!r}: expected positive integers") from None
    if number < 1:
        raise InvalidInput(f"{option} {value!r}: expected positive integers")
    return number


def _is_pg(url: str) -> bool:
    return url.split(":", 1)[0].split("+", 1)[0] in ("postgresql", "postgres")


def _listen_channel() -> str:
    from .store.notify import CHANNEL

    return CHANNEL


def _is_sqlite(url: str) -> bool:
    return url == "sqlite" or url.startswith("sqlite:")


# ---------------------------------------------------------------- throwaway databases


class Place:
    """Where throwaway databases are made: a PostgreSQL server, or a directory for SQLite files."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.postgres = _is_pg(url)
        self.name = "postgresql" if self.postgres else "sqlite"
        self._tempdir: Path | None = None
        self._admin: Any = None
        if self.postgres:
            from sqlalchemy import create_engine
            from sqlalchemy.pool import NullPool

            from .store.dialects import normalize_url

            self._admin = create_engine(normalize_url(url), poolclass=NullPool, isolation_level="AUTOCOMMIT")
            self.admin_url = normalize_url(url)
        else:
            from sqlalchemy import make_url

            path = make_url(url).database if url != "sqlite" else None
            if path and path != ":memory:":
                self.directory = Path(path).resolve().parent
            else:
                self._tempdir = Path(tempfile.mkdtemp(prefix="feedproc-bench-"))
                self.directory = self._tempdir

    def version(self) -> str:
        if not self.postgres:
            return f"SQLite {sqlite3.sqlite_version}"
        from sqlalchemy import text

        with self._admin.connect() as conn:
            return "PostgreSQL " + str(conn.execute(text("SHOW server_version")).scalar()).split()[0]

    def create(self, name: str) -> str:
        if self.postgres:
            from sqlalchemy import text

            with self._admin.connect() as conn:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
            return self.admin_url.set(database=name).render_as_string(hide_password=False)
        path = self.directory / f"{name}.db"
        return f"sqlite:///{path}"

    def drop(self, url: str) -> None:
        if self.postgres:
            from sqlalchemy import make_url, text

            name = make_url(url).database
            with self._admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            return
        path = Path(url.removeprefix("sqlite:///"))
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)

    def close(self) -> None:
        if self._admin is not None:
            self._admin.dispose()
        if self._tempdir is not None:
            shutil.rmtree(self._tempdir, ignore_errors=True)


# ---------------------------------------------------------------- processes


def _helper(name: str) -> Path:
    """A helper script in `cmds/` (a checkout) or packaged beside feedproc (a wheel)."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "cmds" / name, here / "_examples" / name):
        if candidate.exists():
            return candidate
    raise BenchFailed(f"{name} is missing: run the benchmark from a feedproc checkout")


class Processes:
    """Subprocesses of one phase, with their peak RSS sampled (psutil when installed, and
    /proc/PID/status VmHWM, the kernel's high-water mark, read just before they stop)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.procs: list[subprocess.Popen[bytes]] = []
        self.peak: dict[int, int] = {}
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None

    def start(self, command: list[str], env: dict[str, str], name: str) -> subprocess.Popen[bytes]:
        with open(self.folder / f"{name}.out", "wb") as out, open(self.folder / f"{name}.err", "wb") as err:
            proc = subprocess.Popen(command, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        if self._sampler is None:
            self._sampler = threading.Thread(target=self._sample, name="bench-rss", daemon=True)
            self._sampler.start()
        return proc

    def _sample(self) -> None:
        try:
            import psutil
        except ImportError:  # /proc VmHWM alone (Linux)
            return
        handles: dict[int, Any] = {}
        while not self._stop.wait(0.1):
            for proc in list(self.procs):
                if proc.poll() is not None:
                    continue
                try:
                    handle = handles.get(proc.pid) or handles.setdefault(proc.pid, psutil.Process(proc.pid))
                    rss = handle.memory_info().rss
                except (psutil.Error, OSError):
                    continue
                self.peak[proc.pid] = max(self.peak.get(proc.pid, 0), rss)

    def record_high_water(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(OSError, ValueError):
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        hwm = int(line.split()[1]) * 1024
                        self.peak[proc.pid] = max(self.peak.get(proc.pid, 0), hwm)

    def alive(self) -> bool:
        return all(proc.poll() is None for proc in self.procs)

    def dead(self) -> list[subprocess.Popen[bytes]]:
        return [proc for proc in self.procs if proc.poll() is not None and proc.returncode != 0]

    def wait_exit(self, deadline: float) -> bool:
        """Wait for every process to exit by itself (the peers' drain mode); False at the deadline."""
        while time.monotonic() < deadline:
            if all(proc.poll() is not None for proc in self.procs):
                return True
            self.record_high_water()
            time.sleep(0.05)
        return False

    def stop(self, grace: float = 30.0) -> None:
        self.record_high_water()
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._stop.set()
        if self._sampler is not None:
            self._sampler.join(timeout=2)

    def peak_mb(self) -> list[float]:
        return [round(self.peak[p.pid] / 2**20, 1) for p in self.procs if p.pid in self.peak]

    def errors(self) -> str:
        tails = []
        for path in sorted(self.folder.glob("*.err")):
            text = path.read_text(errors="replace").strip()
            if text:
                tails.append(f"{path.name}: {text.splitlines()[-1][:300]}")
        return "; ".join(tails)


# ---------------------------------------------------------------- reading results


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


@dataclass
class DbFacts:
    """What a finished run left in the database, read once."""

    items: list[Any]  # (id, partition_id, gate, status, created_at, updated_at)
    partitions: dict[int, tuple[str, str]]  # id -> (key, status)
    leased: dict[int, float]  # partition id -> first `leased` event time
    entered: dict[tuple[int, int], float]  # (partition id, gate) -> gate_advanced event time


def read_db(url: str, after: tuple[int, int] = (0, 0)) -> DbFacts:
    """The run's partitions (id > after[0]), items (id > after[1]) and their events."""
    from sqlalchemy import select

    from .store import Store
    from .store.schema import events, items, partitions

    store = Store(url, pool_size=1)
    try:
        with store.read() as conn:
            rows = conn.execute(
                select(
                    items.c.id,
                    items.c.partition_id,
                    items.c.gate,
                    items.c.status,
                    items.c.created_at,
                    items.c.updated_at,
                )
                .where(items.c.id > after[1])
                .order_by(items.c.id)
            ).all()
            parts = {
                pid: (key, status)
                for pid, key, status in conn.execute(
                    select(partitions.c.id, partitions.c.key, partitions.c.status).where(partitions.c.id > after[0])
                )
            }
            leased: dict[int, float] = {}
            entered: dict[tuple[int, int], float] = {}
            for pid, kind, detail, at in conn.execute(
                select(events.c.partition_id, events.c.kind, events.c.detail, events.c.at).where(
                    events.c.kind.in_(["leased", "gate_advanced"]), events.c.partition_id > after[0]
                )
            ):
                if kind == "leased":
                    leased[pid] = min(leased.get(pid, math.inf), at.timestamp())
                else:
                    entered[(pid, json.loads(detail)["to"])] = at.timestamp()
    finally:
        store.close()
    return DbFacts(rows, parts, leased, entered)


FINISHED_PER_PARTITION = 10_000


def fill_finished(url: str, count: int) -> tuple[int, int]:
    """Put `count` complete items (in complete partitions of 10,000) in the tables, as a long-lived
    deployment has, then VACUUM, ANALYZE and CHECKPOINT as autovacuum and time would have. Returns
    the highest partition and item ids, so that the run's own rows can be told apart."""
    from sqlalchemy import func, select, text

    from .store import Store
    from .store.schema import items, partitions

    store = Store(url, pool_size=1)
    try:
        with store.write() as conn:
            for start in range(0, count, FINISHED_PER_PARTITION):
                n = min(FINISHED_PER_PARTITION, count - start)
                conn.execute(
                    text(
                        "INSERT INTO feedproc_partitions (key, queue, status, gate, priority, sealed,"
                        " manual_checkpoint, created_at, updated_at)"
                        " VALUES (:key, 'default', 'complete', 0, 0, :yes, :no, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                    ),
                    {"key": f"finished-{start // FINISHED_PER_PARTITION}", "yes": True, "no": False},
                )
                conn.execute(
                    text(
                        "WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < :n)"
                        " INSERT INTO feedproc_items (partition_id, gate, status, data, next_attempt_at, created_at,"
                        " updated_at) SELECT (SELECT max(id) FROM feedproc_partitions), 0, 'complete', :data,"
                        " CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP FROM s"
                    ),
                    {"n": n, "data": b"{}"},
                )
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            if store.postgres:
                # In a long-lived deployment these rows were vacuumed and checkpointed long ago: do
                # it now, or the run measures the fill's own hint-bit writes and checkpoint I/O.
                conn.execute(text("VACUUM (ANALYZE) feedproc_items"))
                conn.execute(text("VACUUM (ANALYZE) feedproc_partitions"))
                conn.execute(text("CHECKPOINT"))
            else:
                conn.execute(text("ANALYZE"))
            last_partition = conn.execute(select(func.max(partitions.c.id))).scalar()
            last_item = conn.execute(select(func.max(items.c.id))).scalar()
        return (last_partition or 0, last_item or 0)
    finally:
        store.close()


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


# ---------------------------------------------------------------- PostgreSQL server statistics


_PG_STATS = (
    "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted "
    "FROM pg_stat_database WHERE datname = current_database()"
)


def pg_stats(url: str) -> dict[str, int]:
    """This database's counters in pg_stat_database (a fresh connection; closed, so its own
    transaction is counted by the next reading)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    from .store.dialects import normalize_url

    engine = create_engine(normalize_url(url), poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            row = conn.execute(text(_PG_STATS)).one()
    finally:
        engine.dispose()
    return dict(zip(("xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted"), row, strict=True))


def pg_delta(before: dict[str, int], after: dict[str, int], own_transactions: int, items: int) -> dict[str, Any]:
    """Server-side work of one phase per item, less the benchmark's own transactions."""
    xacts = after["xact_commit"] + after["xact_rollback"] - before["xact_commit"] - before["xact_rollback"]
    xacts -= own_transactions
    rows = sum(after[k] - before[k] for k in ("tup_inserted", "tup_updated", "tup_deleted"))
    return {
        "transactions": xacts,
        "transactions_per_item": round(xacts / items, 3) if items else None,
        "rows_written_per_item": round(rows / items, 3) if items else None,
    }


class Poller:
    """The benchmark's own connection for polling a run's progress, counting its transactions."""

    def __init__(self, url: str) -> None:
        from sqlalchemy import create_engine
        from sqlalchemy.pool import NullPool

        from .store.dialects import normalize_url

        self.engine = create_engine(normalize_url(url), poolclass=NullPool, isolation_level="AUTOCOMMIT")
        self.conn = self.engine.connect()
        self.transactions = 0

    def scalar(self, sql: str) -> Any:
        from sqlalchemy import text
        from sqlalchemy.exc import OperationalError

        self.transactions += 1
        try:
            return self.conn.execute(text(sql)).scalar()
        except OperationalError:  # a dropped connection (SQLite: busy past its timeout): once more
            self.conn.close()
            self.conn = self.engine.connect()
            return self.conn.execute(text(sql)).scalar()

    def close(self) -> None:
        self.conn.close()
        self.engine.dispose()


# ---------------------------------------------------------------- workloads


def partition_shapes(workload: str, partitions: int, items: int) -> list[list[tuple[int, bytes]]]:
    """The backlog of a workload: flat and http P x N items at gate 0; fan P x (3 gates x N//3 + 1)."""
    if workload == "fan":
        width = max(1, items // FAN_GATES)
        return [_fan_partition(width) for _ in range(partitions)]
    return [_flat_partition(items) for _ in range(partitions)]


def _flat_partition(size: int) -> list[tuple[int, bytes]]:
    return [(0, b'{"kind":"file","n":%d}' % n) for n in range(size)]


def _fan_partition(width: int) -> list[tuple[int, bytes]]:
    rows = [(gate, b'{"kind":"file","n":%d}' % n) for gate in range(FAN_GATES) for n in range(width)]
    return [*rows, (FAN_GATES, b'{"kind":"rank"}')]


# ---------------------------------------------------------------- one feedproc run


class Bench:
    def __init__(self, options: BenchOptions) -> None:
        self.options = options
        self.run_id = uuid.uuid4().hex[:8]
        self.sequence = itertools.count(1)
        self.work = Path(tempfile.mkdtemp(prefix="feedproc-bench-logs-"))
        self.after = (0, 0)  # the highest partition and item ids before this run's own (see fill_finished)

    def log(self, message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    # ------------------------------------------------------------ feedproc

    def run_feedproc(self, place: Place, workload: str, watchers: int) -> dict[str, Any]:
        opts = self.options
        seq = next(self.sequence)
        folder = self.work / f"{seq:02d}-{place.name}-{workload}-{watchers}"
        folder.mkdir()
        url = place.create(f"bench_{self.run_id}_{seq}")
        result: dict[str, Any] = {
            "system": "feedproc",
            "db": place.name,
            "workload": workload,
            "watchers": watchers,
            "problems": [],
        }
        handler: Processes | None = None
        try:
            from .feed import Feed

            with Feed(url) as feed:
                feed.migrate()
            self.after = (0, 0)
            if opts.finished:
                started = time.perf_counter()
                self.after = fill_finished(url, opts.finished)
                result["finished_rows"] = opts.finished
                took = time.perf_counter() - started
                self.log(f"  {opts.finished:,} finished items put in the tables in {took:.1f}s")
            with Feed(url) as feed:
                shapes = partition_shapes(workload, opts.partitions, opts.items)
                started = time.perf_counter()
                for n, shape in enumerate(shapes):
                    feed.add_partition(f"{workload}-{n}", shape)
                seconds = time.perf_counter() - started
            total = sum(len(shape) for shape in shapes)
            result.update(partitions=len(shapes), items=total)
            result["enqueue"] = {"items": total, "seconds": round(seconds, 4), "rate": round(total / seconds, 1)}

            committed: dict[str, float] = {}  # paced partition key -> time its add_partition returned
            target: list[str] = ["--processor", "feedproc.bench:BenchProcessor"]
            if workload == "http":
                handler = Processes(folder)
                handler_log = folder / "handler"
                handler_log.mkdir()
                script = str(_helper("bench_handler.py"))
                log = str(handler_log / "calls-handler.log")
                proc = handler.start([sys.executable, script, "--port", "0", "--log", log], dict(os.environ), "handler")
                target = ["--handler", self._handler_url(folder / "handler.out", proc)]

            drain = self._drain(url, place, folder / "drain", target, watchers, total)
            result["drain"] = drain
            window = drain_window(read_db(url, self.after), total)
            if opts.latency_seconds > 0 and window is not None:
                rate = total / (window[1] - window[0])
                result["paced"] = self._paced(url, folder / "paced", target, workload, watchers, rate / 2, committed)
            if handler is not None:
                handler.stop()
                result["handler_peak_rss_mb"] = handler.peak_mb()
                handler = None
            self._analyse(url, folder, result, workload, committed)
        except BenchFailed as error:
            result["problems"].append(str(error))
        except Exception as error:  # a database error, say: report it, go on with the next run
            first = (str(error).strip().splitlines() or [""])[0]
            result["problems"].append(f"{type(error).__name__}: {first}")
        finally:
            if handler is not None:
                handler.stop()
            if opts.keep:
                result["database"] = url
                result["logs"] = str(folder)
            else:
                with contextlib.suppress(Exception):
                    place.drop(url)
        return result

    def _handler_url(self, out: Path, proc: subprocess.Popen[bytes]) -> str:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            text = out.read_text() if out.exists() else ""
            if text.startswith("listening on "):
                return text.split()[2]
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        raise BenchFailed("the benchmark HTTP handler did not start")

    def _watchers(self, url: str, folder: Path, target: list[str], count: int) -> Processes:
        folder.mkdir(parents=True, exist_ok=True)
        procs = Processes(folder)
        env = dict(os.environ, FEEDPROC_DATABASE_URL=url, **{DIR_ENV: str(folder), STATS_ENV: "1"})
        command = [
            sys.executable,
            "-c",
            "from feedproc.bench import watch_main; watch_main()",
            "watch",
            *target,
            "--concurrency",
            str(self.options.concurrency),
            "--poll-interval",
            str(self.options.poll_interval),
            "--shutdown-grace",
            "10",
            "--log-level",
            "WARNING",
        ]
        for n in range(count):
            procs.start(command, env, f"watcher-{n}")
        return procs

    def _wait(self, poller: Poller, procs: Processes, sql: str, what: str) -> None:
        deadline = time.monotonic() + self.options.timeout
        while time.monotonic() < deadline:
            if not poller.scalar(sql):
                return
            if procs.dead():
                raise BenchFailed(f"a watcher exited during the {what}: {procs.errors() or 'no message'}")
            time.sleep(0.05)
        raise BenchFailed(f"the {what} did not finish within {self.options.timeout:g}s")

    def _drain(
        self, url: str, place: Place, folder: Path, target: list[str], watchers: int, total: int
    ) -> dict[str, Any]:
        before = pg_stats(url) if place.postgres else None
        poller = Poller(url)
        procs = self._watchers(url, folder, target, watchers)
        try:
            self._wait(poller, procs, _UNFINISHED, "drain")
        finally:
            procs.stop()
            poller.close()
        phase: dict[str, Any] = {"peak_rss_mb": procs.peak_mb()}
        counts = read_statement_counts(folder)
        phase["client"] = counts
        if counts and total:
            phase["statements_per_item"] = round(counts.get("statements", 0) / total, 3)
            phase["transactions_per_item"] = round((counts.get("commits", 0) + counts.get("rollbacks", 0)) / total, 3)
        if before is not None:
            time.sleep(0.3)  # let the watchers' server backends finish exiting (they flush their stats then)
            phase["server"] = pg_delta(before, pg_stats(url), poller.transactions + 1, total)
        return phase

    def _paced(
        self,
        url: str,
        folder: Path,
        target: list[str],
        workload: str,
        watchers: int,
        rate: float,
        committed: dict[str, float],
    ) -> dict[str, Any]:
        from sqlalchemy import event

        from .feed import Feed

        opts = self.options
        poller = Poller(url)
        procs = self._watchers(url, folder, target, watchers)
        phase: dict[str, Any] = {"target_rate": round(rate, 1)}
        try:
            # Warm up: every watcher registered (and LISTENing, on PostgreSQL), then one small
            # partition per watcher worked off; the latencies count only what the producer adds next.
            ready_sql = "SELECT count(*) FROM feedproc_watchers"
            if _is_pg(url):
                ready_sql = (
                    "SELECT least((SELECT count(*) FROM feedproc_watchers), (SELECT count(*) FROM pg_stat_activity"
                    f" WHERE datname = current_database() AND query = 'LISTEN {_listen_channel()}'))"
                )
            deadline = time.monotonic() + 30
            while poller.scalar(ready_sql) < watchers:
                if time.monotonic() > deadline or procs.dead():
                    raise BenchFailed(f"the watchers did not start: {procs.errors() or 'no message'}")
                time.sleep(0.05)
            with Feed(url) as feed:
                for n in range(watchers):
                    feed.add_partition(f"{WARMUP}{workload}-{n}", _flat_partition(2))
            self._wait(poller, procs, _UNFINISHED, "warm-up")
            time.sleep(max(0.2, 2 * opts.poll_interval))
            if workload == "fan":
                # The backlog's shape: "half the drain rate" is only meaningful for the same partitions.
                width = max(1, opts.items // FAN_GATES)
                size = FAN_GATES * width + 1
                make = lambda: _fan_partition(width)  # noqa: E731
            else:
                size = max(1, round(rate * PACED_TICK))
                make = lambda: _flat_partition(size)  # noqa: E731
            interval = size / rate
            offered = 0
            with Feed(url) as feed:
                # An item is ready when its partition's transaction commits: stamp the moment
                # COMMIT is sent (a bound from below, so a latency measured from it is never flattered).
                commit_sent = [0.0]
                event.listen(feed.store.engine, "commit", lambda _conn: commit_sent.__setitem__(0, time.time()))
                started = next_at = time.monotonic()
                for n in itertools.count():
                    now = time.monotonic()
                    if now - started >= opts.latency_seconds:
                        break
                    if now < next_at:
                        time.sleep(next_at - now)
                    elif now - next_at > interval:
                        next_at = now  # behind schedule: no burst to catch up
                    key = f"paced-{workload}-{n}"
                    feed.add_partition(key, make())
                    committed[key] = commit_sent[0]
                    offered += size
                    next_at += interval
                elapsed = time.monotonic() - started
            phase.update(items=offered, seconds=round(elapsed, 3), offered_rate=round(offered / elapsed, 1))
            self._wait(poller, procs, _UNFINISHED, "paced phase")
        finally:
            procs.stop()
            poller.close()
        phase["peak_rss_mb"] = procs.peak_mb()
        counts = read_statement_counts(folder)
        phase["client"] = counts
        if counts and offered:
            phase["statements_per_item"] = round(counts.get("statements", 0) / offered, 3)
        return phase

    def _analyse(
        self, url: str, folder: Path, result: dict[str, Any], workload: str, committed: dict[str, float]
    ) -> None:
        """Rates, latencies and the exactly-once check, from the database and the call logs."""
        facts = read_db(url, self.after)
        logs = [folder / "handler"] if workload == "http" else [folder / "drain", folder / "paced"]
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
                drain["first_dispatch"] = _iso(first)
                drain["last_completion"] = _iso(last)
                called = [first_call[row.id] for row in drain_rows if row.id in first_call]
                if called:
                    drain["rate_from_first_call"] = round(backlog / max(1e-9, last - min(called)), 1)
            commit, answer = gate_advances(drain_rows, first_call, last_call)
            drain["gate_advance_ms"] = percentiles(commit)
            drain["gate_advance_from_answer_ms"] = percentiles(answer)
        paced = result.get("paced")
        paced_rows = [
            row for row in facts.items[backlog:] if not facts.partitions[row.partition_id][0].startswith(WARMUP)
        ]
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

    # ------------------------------------------------------------ peers

    def run_peer(self, place: Place, peer: str, settings: dict[str, Any], processes: int, jobs: int) -> dict[str, Any]:
        seq = next(self.sequence)
        label = peer if peer == "procrastinate" else f"{peer}-b{settings['batch_size']}"
        folder = self.work / f"{seq:02d}-{label}-{processes}"
        folder.mkdir()
        url = place.create(f"bench_{self.run_id}_{seq}")
        result: dict[str, Any] = {
            "system": peer,
            "settings": settings,
            "db": place.name,
            "workload": "flat",
            "watchers": processes,
            "items": jobs,
            "problems": [],
        }
        script = str(_helper("bench_peers.py"))
        procs = Processes(folder)
        try:
            chunk = str(max(1, self.options.items))
            setup = subprocess.run(
                [sys.executable, script, peer, "setup", "--dsn", url, "--jobs", str(jobs), "--chunk", chunk],
                capture_output=True,
                text=True,
                timeout=self.options.timeout,
            )
            if setup.returncode != 0:
                raise BenchFailed(f"{peer} setup failed: {(setup.stderr.strip().splitlines() or ['?'])[-1]}")
            seconds = json.loads(setup.stdout.strip().splitlines()[-1])["enqueue_seconds"]
            result["enqueue"] = {"items": jobs, "seconds": round(seconds, 4), "rate": round(jobs / seconds, 1)}
            before = pg_stats(url)
            extra = [f"--{key.replace('_', '-')}={value}" for key, value in settings.items()]
            for n in range(processes):
                log = str(folder / f"calls-{n}.log")
                procs.start(
                    [sys.executable, script, peer, "work", "--dsn", url, "--log", log, *extra],
                    dict(os.environ),
                    f"worker-{n}",
                )
            finished = procs.wait_exit(time.monotonic() + self.options.timeout)
            procs.stop()
            if not finished:
                raise BenchFailed(f"{peer} did not drain {jobs} jobs within {self.options.timeout:g}s")
            if procs.dead():
                raise BenchFailed(f"a {peer} worker failed: {procs.errors() or 'no message'}")
            time.sleep(0.3)
            drain: dict[str, Any] = {"peak_rss_mb": procs.peak_mb(), "server": pg_delta(before, pg_stats(url), 1, jobs)}
            result["drain"] = drain
            self._analyse_peer(url, peer, folder, result)
        except Exception as error:
            first = (str(error).strip().splitlines() or [""])[0]
            result["problems"].append(
                f"{type(error).__name__}: {first}" if not isinstance(error, BenchFailed) else first
            )
        finally:
            procs.stop()
            if self.options.keep:
                result["database"] = url
                result["logs"] = str(folder)
            else:
                with contextlib.suppress(Exception):
                    place.drop(url)
        return result

    def _analyse_peer(self, url: str, peer: str, folder: Path, result: dict[str, Any]) -> None:
        from sqlalchemy import create_engine, text
        from sqlalchemy.pool import NullPool

        from .store.dialects import normalize_url

        if peer == "pgqueuer":
            sql = (
                "SELECT min(created) FILTER (WHERE status = 'picked'),"
                " max(created) FILTER (WHERE status = 'successful'),"
                " count(*) FILTER (WHERE status = 'successful'), (SELECT count(*) FROM pgqueuer) FROM pgqueuer_log"
            )
        else:
            sql = (
                "SELECT (SELECT min(at) FROM procrastinate_events WHERE type = 'started'),"
                " (SELECT max(at) FROM procrastinate_events WHERE type = 'succeeded'),"
                " count(*) FILTER (WHERE status = 'succeeded'), count(*) FILTER (WHERE status <> 'succeeded')"
                " FROM procrastinate_jobs"
            )
        engine = create_engine(normalize_url(url), poolclass=NullPool)
        try:
            with engine.connect() as conn:
                first, last, succeeded, left = conn.execute(text(sql)).one()
        finally:
            engine.dispose()
        jobs = result["items"]
        calls, per_log, bad = read_calls(folder)
        deliveries = Counter(call.id for call in calls)
        twice = sum(1 for n in deliveries.values() if n > 1)
        result["deliveries"] = {"items": jobs, "calls": len(calls), "redelivered": twice, "per_log": per_log}
        result["complete"] = succeeded == jobs and left == 0
        result["exactly_once"] = result["complete"] and len(deliveries) == jobs and twice == 0 and bad == 0
        if not result["exactly_once"]:
            result["problems"].append(
                f"{succeeded} of {jobs} succeeded, {len(deliveries)} distinct calls, {twice} twice"
            )
        drain = result["drain"]
        if first is not None and last is not None and last > first:
            seconds = (last - first).total_seconds()
            drain.update(
                seconds=round(seconds, 4),
                rate=round(jobs / seconds, 1),
                first_dispatch=_iso(first.timestamp()),
                last_completion=_iso(last.timestamp()),
            )
            if calls:
                drain["rate_from_first_call"] = round(jobs / max(1e-9, last.timestamp() - min(c.at for c in calls)), 1)

    # ------------------------------------------------------------ the whole benchmark

    def run(self) -> dict[str, Any]:
        opts = self.options
        places = [Place(url) for url in opts.places]
        started = datetime.now(UTC)
        meta: dict[str, Any] = {
            "command": opts.command,
            "run_id": self.run_id,  # the throwaway databases are bench_<run_id>_<n>
            "started_at": started.isoformat(timespec="seconds"),
            "host": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "platform": platform.platform(),
                "load_average_at_start": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
            },
            "databases": [],
            "settings": {
                "partitions": opts.partitions,
                "items_per_partition": opts.items,
                "watch": f"--concurrency {opts.concurrency} --poll-interval {opts.poll_interval:g}",
                "latency_seconds": opts.latency_seconds,
                "pgqueuer_batches": opts.pgqueuer_batches,
                "pgqueuer_consumers_per_process": PGQUEUER_CONSUMERS,
                "procrastinate_jobs": opts.procrastinate_jobs,
                "procrastinate_concurrency": opts.procrastinate_concurrency,
            },
        }
        runs: list[dict[str, Any]] = []
        peers: list[dict[str, Any]] = []
        peer_place = next((place for place in places if place.postgres), None) if opts.against else None
        try:
            for place in places:
                meta["databases"].append(place.version())
            plan = [(place, workload, w) for place in places for workload in opts.workloads for w in opts.watchers]
            for n, (place, workload, watchers) in enumerate(plan, start=1):
                result = self.run_feedproc(place, workload, watchers)
                runs.append(result)
                self.log(f"[{n}/{len(plan)}] {_summary(result)}")
                if place is peer_place and workload == opts.workloads[0]:
                    peers += self._run_peers(peer_place, watchers)
            if peer_place is not None and not any(r["db"] == "postgresql" and r["workload"] == "flat" for r in runs):
                for watchers in opts.watchers:  # flat was not asked for: the peers still run
                    peers += self._run_peers(peer_place, watchers)
        finally:
            for place in places:
                place.close()
            if not opts.keep:
                shutil.rmtree(self.work, ignore_errors=True)
        meta["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        if hasattr(os, "getloadavg"):
            meta["host"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
        return {"meta": meta, "runs": runs, "peers": peers}

    def _run_peers(self, place: Place, watchers: int) -> list[dict[str, Any]]:
        opts = self.options
        jobs = opts.partitions * opts.items
        results = []
        for peer in opts.against:
            if peer == "pgqueuer":
                configs = [{"batch_size": b, "consumers": PGQUEUER_CONSUMERS} for b in opts.pgqueuer_batches]
                count = jobs
            else:
                configs = [{"concurrency": opts.procrastinate_concurrency}]
                count = min(jobs, opts.procrastinate_jobs)
            for settings in configs:
                result = self.run_peer(place, peer, settings, watchers, count)
                results.append(result)
                self.log(f"      {_summary(result)}")
        return results


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="microseconds")


def _summary(result: dict[str, Any]) -> str:
    drain = result.get("drain") or {}
    name = result["system"] if result["system"] == "feedproc" else f"{result['system']} {result.get('settings')}"
    text = f"{name} {result['db']} {result['workload']} x{result['watchers']}: {result.get('items', 0)} items"
    if drain.get("rate"):
        text += f", drain {drain['rate']:,.0f}/s"
    if result.get("problems"):
        text += "  PROBLEM: " + "; ".join(result["problems"])
    return text


# ---------------------------------------------------------------- output


def _num(value: Any, digits: int = 0) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}"


def _pair(stats: dict[str, Any] | None) -> str:
    if not stats or stats.get("p50") is None:
        return "—"
    return f"{stats['p50']:.1f} / {stats['p99']:.1f}"


def _peak(values: list[float] | None) -> str:
    return f"{max(values):.0f}" if values else "—"


def to_markdown(report: dict[str, Any]) -> str:
    meta = report["meta"]
    settings = meta["settings"]
    load = meta["host"].get("load_average_at_start")
    lines = [
        f"### feedproc bench, {meta['started_at']}",
        "",
        f"`{meta['command']}`: {meta['host']['cpus']} CPUs, load average {load[0] if load else '?'} at start, "
        f"Python {meta['host']['python']}, {', '.join(meta['databases'])}; "
        f"watchers `feedproc watch {settings['watch']}`, {settings['partitions']} partitions x "
        f"{settings['items_per_partition']} items; latencies at half the drain rate "
        f"for {settings['latency_seconds']:g}s.",
        "",
        "| db | workload | watchers | items | enqueue items/s | drain items/s | ½ load items/s: offered of target "
        "| dispatch p50 / p99 ms (½ load) | gate advance p50 / p99 ms (drain) | gate advance p50 / p99 ms (½ load) "
        "| peak RSS MB | statements / item | transactions / item | server transactions / item | once |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for run in report["runs"]:
        drain = run.get("drain") or {}
        paced = run.get("paced") or {}
        lines.append(
            "| "
            + " | ".join(
                [
                    run["db"],
                    run["workload"] + (f" (+{run['finished_rows']:,} finished)" if run.get("finished_rows") else ""),
                    str(run["watchers"]),
                    _num(run.get("items")),
                    _num((run.get("enqueue") or {}).get("rate")),
                    _num(drain.get("rate")),
                    f"{_num(paced.get('offered_rate'))} of {_num(paced.get('target_rate'))}" if paced else "—",
                    _pair(paced.get("dispatch_latency_ms")),
                    _pair(drain.get("gate_advance_ms")),
                    _pair(paced.get("gate_advance_ms")),
                    _peak(drain.get("peak_rss_mb")),
                    _num(drain.get("statements_per_item"), 2),
                    _num(drain.get("transactions_per_item"), 3),
                    _num((drain.get("server") or {}).get("transactions_per_item"), 3),
                    _once(run),
                ]
            )
            + " |"
        )
    if report["peers"]:
        lines += [
            "",
            "Flat no-op drain on the same PostgreSQL, same number of processes ("
            "drain = first dispatch to last completion, from each system's own tables):",
            "",
            "| system | settings | processes | jobs | enqueue jobs/s | drain jobs/s | feedproc ÷ system "
            "| peak RSS MB | server transactions / job | once |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        ours = {
            r["watchers"]: r
            for r in report["runs"]
            if r["db"] == "postgresql" and r["workload"] == "flat" and (r.get("drain") or {}).get("rate")
        }
        for watchers in sorted({p["watchers"] for p in report["peers"]}):
            rows = [ours[watchers]] if watchers in ours else []
            rows += [p for p in report["peers"] if p["watchers"] == watchers]
            mine = ours.get(watchers, {}).get("drain", {}).get("rate")
            for row in rows:
                drain = row.get("drain") or {}
                ratio = mine / drain["rate"] if mine and drain.get("rate") else None
                lines.append(
                    "| "
                    + " | ".join(
                        [
                            row["system"],
                            _settings_text(row),
                            str(row["watchers"]),
                            _num(row.get("items")),
                            _num((row.get("enqueue") or {}).get("rate")),
                            _num(drain.get("rate")),
                            "—" if ratio is None else f"{ratio:.2f}x",
                            _peak(drain.get("peak_rss_mb")),
                            _num((drain.get("server") or {}).get("transactions_per_item"), 3),
                            _once(row),
                        ]
                    )
                    + " |"
                )
    lines += ["", *LEGEND]
    problems = [
        f"- {r['system']} {r['db']} {r['workload']} x{r['watchers']}: {p}"
        for r in report["runs"] + report["peers"]
        for p in r.get("problems", [])
    ]
    if problems:
        lines += ["", "Problems:", *problems]
    return "\n".join(lines) + "\n"


LEGEND = [
    "How each figure is measured (clocks: the database's and the processes' are the same host's):",
    "- enqueue: items ÷ time of the `Feed.add_partition` calls (peers: their batched enqueue), in the bench process;",
    "- drain: items ÷ (first `leased` event → last item `updated_at`), read from the database after the run "
    "(peers: first `picked`/`started` → last `successful`/`succeeded` in their own tables);",
    "- dispatch: processor call time (logged by the no-op processor or the HTTP handler) minus the item's readiness: "
    "the moment the producer sent the COMMIT that added it, or its gate's `gate_advanced` event (the JSON also has "
    "the figure from the insert, `created_at`), while a producer adds partitions at half the drain rate "
    "(flat, http: one partition every 20 ms; fan: the backlog's partitions), or as close to it as one producer gets "
    "(the rate it offered is in the table);",
    "- gate advance: per partition, first call at gate g+1 minus last `updated_at` at gate g (the commit that "
    "advanced it); in the drain, and at half load;",
    "- peak RSS: the highest of the watcher processes (psutil samples and /proc VmHWM);",
    "- statements and transactions per item: counted in the watchers by SQLAlchemy engine events "
    "(an executemany counts each row; the pool's pre-ping is not counted); server transactions: "
    "pg_stat_database xact_commit + xact_rollback of the throwaway database over the drain, less the bench's own;",
    "- once: every item complete, and called exactly once according to the call logs.",
]


def _settings_text(row: dict[str, Any]) -> str:
    if row["system"] == "feedproc":
        return "flat, no-op processor"
    if row["system"] == "pgqueuer":
        s = row["settings"]
        return f"asyncpg, {s['consumers']} consumers x batch {s['batch_size']} per process"
    return f"psycopg, concurrency {row['settings']['concurrency']} per process"


def _once(run: dict[str, Any]) -> str:
    if run.get("exactly_once"):
        return "yes"
    return "NO" if "exactly_once" in run else "—"


# ---------------------------------------------------------------- entry point (the CLI's `bench`)


def run_bench(options: BenchOptions) -> dict[str, Any]:
    """Run the benchmark, print the Markdown table, write the files; BenchFailed if any run failed
    or any item was not processed exactly once (the report is written first)."""
    report = Bench(options).run()
    markdown = to_markdown(report)
    print(markdown, end="")
    if options.markdown_path is not None:
        options.markdown_path.write_text(markdown)
    if options.json_path is not None:
        options.json_path.write_text(json.dumps(report, indent=2) + "\n")
    failed = [r for r in report["runs"] + report["peers"] if r.get("problems") or not r.get("exactly_once")]
    if failed:
        first = failed[0]
        reason = "; ".join(first.get("problems") or ["not exactly once"])
        raise BenchFailed(
            f"{len(failed)} benchmark run(s) failed; first: {first['system']} {first['db']} "
            f"{first['workload']} x{first['watchers']}: {reason}"
        )
    return report
