#!/usr/bin/env python3
"""Measure feedproc's end-to-end throughput on one database.

    python cmds/throughput.py --db sqlite:///t.db --partitions 10 --items 1000 --watchers 1
    python cmds/throughput.py --db postgresql://postgres@127.0.0.1/test --http   # via the HTTP processor

Enqueues P partitions x N items at gate 0 (the enqueue rate is timed around `Feed.add_partition`),
starts W `feedproc watch` processes (a no-op Python processor, or with --http the example handler
service in cmds/), and reports the drain rate measured from the database: from the first lease to
the last item's completion (`updated_at`), not from inside a watcher. The database is migrated and
the keys are unique per run, so it may be reused.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from sqlalchemy import func, select

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from feedproc import Feed  # noqa: E402
from feedproc.schema import events, items, partitions  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--watchers", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--http", action="store_true", help="use the HTTP processor and cmds/example_handler.py")
    args = parser.parse_args()

    run = uuid.uuid4().hex[:6]
    feed = Feed(args.db)
    feed.migrate()
    payload = b'{"kind": "file", "name": "x.pdf"}'
    started = time.perf_counter()
    for p in range(args.partitions):
        feed.add_partition(f"tp-{run}-{p}", [(0, payload)] * args.items)
    enqueue = time.perf_counter() - started
    total = args.partitions * args.items

    env = dict(os.environ, FEEDPROC_DATABASE_URL=args.db, PYTHONPATH=str(HERE))
    handler = None
    if args.http:
        handler = subprocess.Popen(
            [sys.executable, str(HERE / "example_handler.py"), "--port", "0"], stdout=subprocess.PIPE, env=env
        )
        assert handler.stdout is not None
        url = handler.stdout.readline().decode().strip().removeprefix("listening on ")
        target = ["--handler", url]
    else:
        target = ["--processor", "noop_processor:Noop"]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "feedproc",
                "watch",
                *target,
                "--concurrency",
                str(args.concurrency),
                "--poll-interval",
                "0.2",
                "--log-level",
                "WARNING",
            ],
            env=env,
        )
        for _ in range(args.watchers)
    ]
    keys = [f"tp-{run}-{p}" for p in range(args.partitions)]
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if all(feed.status(k)["status"] == "complete" for k in keys):
                break
            time.sleep(0.2)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)
        if handler is not None:
            handler.terminate()
            handler.wait()

    with feed.store.read() as conn:
        ids = select(partitions.c.id).where(partitions.c.key.in_(keys)).scalar_subquery()
        first = conn.execute(
            select(func.min(events.c.at)).where(events.c.partition_id.in_(ids), events.c.kind == "leased")
        ).scalar_one()
        last = conn.execute(select(func.max(items.c.updated_at)).where(items.c.partition_id.in_(ids))).scalar_one()
    drain = (last - first).total_seconds()
    mode = "http" if args.http else "no-op"
    shape = f"{args.watchers} watcher(s)  {args.partitions}x{args.items} items"
    print(
        f"{feed.store.engine.dialect.name}  {mode}  {shape}: "
        f"enqueue {total / enqueue:,.0f} items/s, drain {total / drain:,.0f} items/s ({drain:.2f}s)"
    )
    feed.close()


if __name__ == "__main__":
    main()
