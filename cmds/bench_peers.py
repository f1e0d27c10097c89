#!/usr/bin/env python3
"""The peers of `feedproc bench --against`: PgQueuer and Procrastinate, run the same way as feedproc.

    python cmds/bench_peers.py pgqueuer setup --dsn URL --jobs 20000 --chunk 1000
    python cmds/bench_peers.py pgqueuer work --dsn URL --batch-size 10 --consumers 5 --log calls.log
    python cmds/bench_peers.py procrastinate setup --dsn URL --jobs 5000 --chunk 1000
    python cmds/bench_peers.py procrastinate work --dsn URL --concurrency 10 --log calls.log

`setup` installs the peer's schema in the (fresh, empty) database and enqueues `--jobs` no-op jobs
in chunks of `--chunk` (one batched call per chunk, like feedproc's one `add_partition` per
partition), then prints `{"enqueue_seconds": ...}` as JSON. `work` runs one worker process until
the queue is empty (PgQueuer's drain mode, Procrastinate's `wait=False`); each job appends
`<job id> 0 1 <unix time at call>` to `--log`, the same format as feedproc's bench processor, so
the benchmark counts deliveries and dispatch times the same way for every system.

Settings are the peers' own: PgQueuer as its benchmark tool (tools/benchmark.py) runs it: asyncpg,
uvloop, `--consumers` PgQueuer instances per process each on its own connection (the tool's
`--dequeue`, 5), `--batch-size` jobs per dequeue (the tool's `--dequeue-batch-size`, 10; 500 is
the fastest setting the feedproc issue measured); durable tables (PgQueuer's default durability).
Procrastinate: its psycopg connector, LISTEN/NOTIFY on, `--concurrency` job slots per worker
(10), a pool large enough for every slot.

feedproc never imports this module or the peers; the benchmark runs it in subprocesses.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import IO, Any


def plain_dsn(url: str) -> str:
    """A libpq URL for the peers' drivers (SQLAlchemy's `postgresql+psycopg://` spelling removed)."""
    scheme, sep, rest = url.partition("://")
    return f"postgresql://{rest}" if sep and scheme.startswith("postgres") else url


def _open_log(path: str | None) -> IO[str] | None:
    return open(path, "a", buffering=1 << 16) if path else None


# ---------------------------------------------------------------- PgQueuer


async def pgqueuer_setup(dsn: str, jobs: int, chunk: int) -> dict[str, Any]:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    connection = await asyncpg.connect(dsn=dsn)
    try:
        queries = Queries(AsyncpgDriver(connection))
        await queries.install()
        started = time.perf_counter()
        for first in range(0, jobs, chunk):
            n = min(chunk, jobs - first)
            await queries.enqueue(["noop"] * n, [f'{{"n":{first + i}}}'.encode() for i in range(n)], [0] * n)
        return {"enqueue_seconds": time.perf_counter() - started, "jobs": jobs}
    finally:
        await connection.close()


async def pgqueuer_work(dsn: str, batch_size: int, consumers: int, log: IO[str] | None) -> None:
    import asyncpg
    from pgqueuer import PgQueuer, types
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job

    async def one_consumer() -> None:
        pgq = PgQueuer(AsyncpgDriver(await asyncpg.connect(dsn=dsn)))

        @pgq.entrypoint("noop")  # type: ignore[untyped-decorator, unused-ignore]  # untyped without the bench extra
        async def noop(job: Job) -> None:
            if log is not None:
                log.write(f"{job.id} 0 1 {time.time():.6f}\n")

        await pgq.run(batch_size=batch_size, mode=types.QueueExecutionMode.drain)

    await asyncio.gather(*(one_consumer() for _ in range(consumers)))


# ---------------------------------------------------------------- Procrastinate


def procrastinate_app(dsn: str, pool_size: int, log: IO[str] | None) -> Any:
    import procrastinate

    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=dsn, min_size=1, max_size=pool_size),
    )

    @app.task(name="noop", pass_context=True)  # type: ignore[untyped-decorator, unused-ignore]  # as above
    async def noop(context: Any, n: int = 0) -> None:
        if log is not None:
            log.write(f"{context.job.id} 0 1 {time.time():.6f}\n")

    return app


async def procrastinate_setup(dsn: str, jobs: int, chunk: int) -> dict[str, Any]:
    app = procrastinate_app(dsn, 4, None)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        task = app.tasks["noop"]
        started = time.perf_counter()
        for first in range(0, jobs, chunk):
            n = min(chunk, jobs - first)
            await task.batch_defer_async(*({"n": first + i} for i in range(n)))
        return {"enqueue_seconds": time.perf_counter() - started, "jobs": jobs}


async def procrastinate_work(dsn: str, concurrency: int, log: IO[str] | None) -> None:
    app = procrastinate_app(dsn, concurrency + 2, log)
    async with app.open_async():
        await app.run_worker_async(
            concurrency=concurrency, wait=False, listen_notify=True, install_signal_handlers=False
        )


# ---------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("peer", choices=["pgqueuer", "procrastinate"])
    parser.add_argument("action", choices=["setup", "work"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--chunk", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=10, help="PgQueuer: jobs per dequeue")
    parser.add_argument("--consumers", type=int, default=5, help="PgQueuer: queue managers per process")
    parser.add_argument("--concurrency", type=int, default=10, help="Procrastinate: job slots per worker")
    parser.add_argument("--log", help="append one line per job call: id 0 1 time")
    args = parser.parse_args(argv)
    dsn = plain_dsn(args.dsn)

    runner: Any = asyncio.run
    try:
        import uvloop

        if args.peer == "pgqueuer":  # its benchmark tool runs on uvloop; Procrastinate documents none
            runner = uvloop.run
    except ImportError:
        pass

    if args.action == "setup":
        setup = pgqueuer_setup if args.peer == "pgqueuer" else procrastinate_setup
        print(json.dumps(runner(setup(dsn, args.jobs, args.chunk))), flush=True)
        return
    log = _open_log(args.log)
    try:
        if args.peer == "pgqueuer":
            runner(pgqueuer_work(dsn, args.batch_size, args.consumers, log))
        else:
            runner(procrastinate_work(dsn, args.concurrency, log))
    finally:
        if log is not None:
            log.close()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
