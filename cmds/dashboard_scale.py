"""How the dashboard holds up at scale: seed a PostgreSQL database with 10,000 partitions and 1M
items (a mix of finished, failed and waiting work, a day of throughput rows, watchers and in-flight
records), then time each page and each read behind it, median of several requests.

    python cmds/dashboard_scale.py postgresql://postgres@127.0.0.1:5432/dash_scale [--partitions N --items-per M]

The database is dropped and created again: give it a database of its own.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import create_engine, make_url, text

from feedproc import Feed


def recreate(url: str) -> None:
    admin = make_url(url).set(database="postgres")
    engine = create_engine(admin.set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT")
    name = make_url(url).database
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()


SEED = """
INSERT INTO feedproc_partitions (key, queue, status, gate, priority, sealed, manual_checkpoint, ready_at,
    version, created_at, updated_at)
SELECT 'upload/' || lpad(p::text, 6, '0'),
       CASE WHEN p % 3 = 0 THEN 'ocr' ELSE 'default' END,
       CASE WHEN p % 10 < 7 THEN 'complete' WHEN p % 10 = 7 THEN 'failed' ELSE 'available' END,
       CASE WHEN p % 10 < 7 THEN 2 ELSE p % 3 END, p % 5, true, false,
       CASE WHEN p % 10 >= 8 THEN now() END, 0,
       now() - (p || ' seconds')::interval, now() - ((p % 3600) || ' seconds')::interval
FROM generate_series(1, :partitions) AS p;

INSERT INTO feedproc_items (partition_id, gate, status, data, attempts, last_error, next_attempt_at, version,
    created_at, updated_at, deliveries, started_at, duration, delivered_by)
SELECT p.id, i % 3,
       CASE WHEN p.status = 'complete' THEN 'complete'
            WHEN p.status = 'failed' AND i = 1 THEN 'failed'
            WHEN p.status = 'failed' THEN 'complete'
            WHEN i % 3 < p.gate THEN 'complete' ELSE 'available' END,
       convert_to('{"file": "scan-' || i || '.pdf", "pages": 12}', 'UTF8'),
       CASE WHEN p.status = 'failed' AND i = 1 THEN 5 ELSE 0 END,
       CASE WHEN p.status = 'failed' AND i = 1 THEN 'ValueError: encrypted PDF' END,
       now(), 1, p.created_at, p.updated_at, 1, p.updated_at - interval '2 seconds', 0.05 + (i % 7) * 0.1, 'w-1'
FROM feedproc_partitions AS p, generate_series(1, :per) AS i;

INSERT INTO feedproc_stats (bucket, queue, source, added, processed, completed, failed)
SELECT date_trunc('minute', now()) - (m || ' minutes')::interval, q, 'watcher-' || w, 40, 45, 40, 1
FROM generate_series(0, 1439) AS m, unnest(ARRAY['default', 'ocr']) AS q, generate_series(1, 8) AS w;

INSERT INTO feedproc_watchers (id, host, pid, queue, concurrency, capacity, started_at, heartbeat_at, expires_at)
SELECT 'watcher-' || w, 'host-' || w, 1000 + w, 'default', 50, 200, now(), now(), now() + interval '1 hour'
FROM generate_series(1, 8) AS w;

UPDATE feedproc_partitions SET lease_owner = 'watcher-' || (id % 8 + 1), lease_epoch = 1,
    lease_expires_at = now() + interval '1 hour'
WHERE status = 'available';

INSERT INTO feedproc_inflight (partition_id, watcher, epoch, entries)
SELECT p.id, p.lease_owner, 1, string_agg(i.id || '/1', ',')
FROM feedproc_partitions AS p JOIN feedproc_items AS i ON i.partition_id = p.id AND i.status = 'available'
WHERE p.status = 'available' AND p.id % 8 = 0 AND i.id % 7 = 0
GROUP BY p.id, p.lease_owner;
"""


def timed(fn: Callable[[], Any], runs: int = 5) -> float:
    """Median milliseconds of `runs` calls (after one warm-up)."""
    fn()
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url")
    parser.add_argument("--partitions", type=int, default=10_000)
    parser.add_argument("--items-per", type=int, default=100)
    args = parser.parse_args()

    from fastapi.testclient import TestClient

    from feedproc.api import create_app

    recreate(args.url)
    feed = Feed(args.url)
    feed.migrate()
    started = time.perf_counter()
    with feed.store.engine.begin() as conn:
        for statement in SEED.split(";\n\n"):
            conn.execute(text(statement), {"partitions": args.partitions, "per": args.items_per})
    with feed.store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))  # as autovacuum leaves a table in steady state
    items = feed.summary().items["total"]
    print(f"seeded {args.partitions:,} partitions, {items:,} items in {time.perf_counter() - started:.0f} s")

    failed_key = feed.partitions(status="failed", limit=1)[0].key
    running_key = feed.partitions(status="available", limit=1)[0].key
    item_id = feed.items(failed_key, limit=1)[0].id
    client = TestClient(create_app(feed))

    print("\nreads (median ms of 5):")
    reads: dict[str, Callable[[], Any]] = {
        "partition_counts": feed.partition_counts,
        "partitions(sort=activity)": lambda: feed.partitions(sort="activity"),
        "partitions(sort=priority, offset=5000)": lambda: feed.partitions(sort="priority", offset=5000),
        "partitions(error='encrypted')": lambda: feed.partitions(error="encrypted"),
        f"running() ({len(feed.running())} rows)": feed.running,
        "throughput(day)": lambda: feed.throughput(seconds=86400, step=900),
        "throughput(hour, queue)": lambda: feed.throughput(queue="ocr"),
        "backlog_by_gate(default)": lambda: feed.backlog_by_gate("default"),
        "gauges()": feed.gauges,
        "timings(running partition)": lambda: feed.timings(running_key),
        "status(running partition)": lambda: feed.status(running_key, history=50),
    }
    for name, fn in reads.items():
        print(f"  {name:42} {timed(fn):8.1f}")

    print("\npages (median ms of 5, in-process HTTP):")
    pages = [
        "/",
        "/ui/overview",
        "/?sort=priority&offset=5000",
        "/?status=failed&error=encrypted",
        "/running",
        "/queues",
        "/queues/default",
        f"/partitions/{running_key.replace('/', '%2F')}",
        f"/items/{item_id}",
        "/api/v1/throughput?span=day",
    ]
    for path in pages:
        assert client.get(path).status_code == 200, path
        print(f"  {path:42} {timed(functools.partial(client.get, path)):8.1f}")


if __name__ == "__main__":
    main()
