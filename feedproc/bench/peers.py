"""`feedproc bench --against`: the flat no-op drain with PgQueuer or Procrastinate on the same
PostgreSQL server, with the same number of processes. The peers run in subprocesses
(`cmds/bench_peers.py`): neither feedproc nor the bench ever imports them. Their rates are read
from their own tables, their deliveries from call logs of the bench's format."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from .measure import iso, read_calls
from .options import BenchFailed, BenchOptions
from .places import Place, engine, pg_delta, pg_stats
from .processes import Processes, helper


def run_peer(
    options: BenchOptions,
    place: Place,
    url: str,
    folder: Path,
    peer: str,
    settings: dict[str, Any],
    processes: int,
    jobs: int,
) -> dict[str, Any]:
    """Enqueue `jobs` no-op jobs with `peer` in the throwaway database `url`, drain them with
    `processes` workers, and measure as for feedproc; the database is dropped after (unless kept)."""
    result: dict[str, Any] = {
        "system": peer,
        "settings": settings,
        "db": place.name,
        "workload": "flat",
        "watchers": processes,
        "items": jobs,
        "problems": [],
    }
    script = str(helper("bench_peers.py"))
    procs = Processes(folder)
    try:
        chunk = str(max(1, options.items))
        setup = subprocess.run(
            [sys.executable, script, peer, "setup", "--dsn", url, "--jobs", str(jobs), "--chunk", chunk],
            capture_output=True,
            text=True,
            timeout=options.timeout,
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
        finished = procs.wait_exit(time.monotonic() + options.timeout)
        procs.stop()
        if not finished:
            raise BenchFailed(f"{peer} did not drain {jobs} jobs within {options.timeout:g}s")
        if procs.dead():
            raise BenchFailed(f"a {peer} worker failed: {procs.errors() or 'no message'}")
        time.sleep(0.3)
        drain: dict[str, Any] = {"peak_rss_mb": procs.peak_mb(), "server": pg_delta(before, pg_stats(url), 1, jobs)}
        result["drain"] = drain
        _analyse(url, peer, folder, result)
    except Exception as error:
        first = (str(error).strip().splitlines() or [""])[0]
        result["problems"].append(f"{type(error).__name__}: {first}" if not isinstance(error, BenchFailed) else first)
    finally:
        procs.stop()
        place.keep_or_drop(url, folder, result, keep=options.keep)
    return result


_PGQUEUER = (
    "SELECT min(created) FILTER (WHERE status = 'picked'),"
    " max(created) FILTER (WHERE status = 'successful'),"
    " count(*) FILTER (WHERE status = 'successful'), (SELECT count(*) FROM pgqueuer) FROM pgqueuer_log"
)
_PROCRASTINATE = (
    "SELECT (SELECT min(at) FROM procrastinate_events WHERE type = 'started'),"
    " (SELECT max(at) FROM procrastinate_events WHERE type = 'succeeded'),"
    " count(*) FILTER (WHERE status = 'succeeded'), count(*) FILTER (WHERE status <> 'succeeded')"
    " FROM procrastinate_jobs"
)


def _analyse(url: str, peer: str, folder: Path, result: dict[str, Any]) -> None:
    from sqlalchemy import text

    own = engine(url)
    try:
        with own.connect() as conn:
            first, last, succeeded, left = conn.execute(text(_PGQUEUER if peer == "pgqueuer" else _PROCRASTINATE)).one()
    finally:
        own.dispose()
    jobs = result["items"]
    calls, per_log, bad = read_calls(folder)
    deliveries = Counter(call.id for call in calls)
    twice = sum(1 for n in deliveries.values() if n > 1)
    result["deliveries"] = {"items": jobs, "calls": len(calls), "redelivered": twice, "per_log": per_log}
    result["complete"] = succeeded == jobs and left == 0
    result["exactly_once"] = result["complete"] and len(deliveries) == jobs and twice == 0 and bad == 0
    if not result["exactly_once"]:
        result["problems"].append(f"{succeeded} of {jobs} succeeded, {len(deliveries)} distinct calls, {twice} twice")
    drain = result["drain"]
    if first is not None and last is not None and last > first:
        seconds = (last - first).total_seconds()
        drain.update(
            seconds=round(seconds, 4),
            rate=round(jobs / seconds, 1),
            first_dispatch=iso(first.timestamp()),
            last_completion=iso(last.timestamp()),
        )
        if calls:
            drain["rate_from_first_call"] = round(jobs / max(1e-9, last.timestamp() - min(c.at for c in calls)), 1)
