"""One benchmark: the runs of feedproc (enqueue, drain, paced phases) for every place, workload and
watcher count, the peers' runs beside them, and `run_bench`, the CLI's entry point.

The watchers are exactly `feedproc watch`, in subprocesses started as
`python -m feedproc.bench.watch watch ...` (see `watch.py`); producers use the public `Feed`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .. import Feed
from . import peers
from .collect import KEY as COLLECT_KEY
from .collect import analyse_collect, collect_partition, fill_collected
from .measure import analyse, drain_window, fill_finished, read_db, read_statement_counts
from .options import (
    ACCUMULATE_WORKLOADS,
    COLLECT_WORKLOADS,
    DIR_ENV,
    FAN_GATES,
    FAN_WORKLOADS,
    HTTP_WORKLOADS,
    PACED_TICK,
    PGQUEUER_CONSUMERS,
    PULL_CLAIM,
    PULL_WORKLOADS,
    STATS_ENV,
    WARMUP,
    BenchFailed,
    BenchOptions,
    listens,
)
from .places import Place, Poller, pg_delta, pg_stats
from .processes import Processes, helper
from .report import summary, to_markdown

_UNFINISHED = "SELECT count(*) FROM feedproc_partitions WHERE status <> 'complete'"
# What a watcher's LISTEN connection shows in pg_stat_activity once it listens for ready work (its
# last statement there): the paced phase's warm-up waits for every watcher's.
_LISTENING = "LISTEN feedproc_ready"
# The watcher processes' entry: `feedproc watch` with the statement counters installed.
_WATCH = "feedproc.bench.watch"
_PROCESSOR = "feedproc.bench.watch:BenchProcessor"
_ACCUMULATING = "feedproc.bench.watch:AccumulatingBenchProcessor"
_COLLECTOR = "feedproc.bench.watch:CollectProcessor"


def partition_shapes(workload: str, partitions: int, items: int) -> list[list[tuple[int, bytes]]]:
    """The backlog of a workload: flat and http P x N items at gate 0; fan (and http-fan, pipeline)
    P x (3 gates x N//3 + 1)."""
    if workload in FAN_WORKLOADS:
        width = max(1, items // FAN_GATES)
        return [_fan_partition(width) for _ in range(partitions)]
    return [_flat_partition(items) for _ in range(partitions)]


def _flat_partition(size: int) -> list[tuple[int, bytes]]:
    return [(0, b'{"kind":"file","n":%d}' % n) for n in range(size)]


def _fan_partition(width: int) -> list[tuple[int, bytes]]:
    rows = [(gate, b'{"kind":"file","n":%d}' % n) for gate in range(FAN_GATES) for n in range(width)]
    return [*rows, (FAN_GATES, b'{"kind":"rank"}')]


def _apply_pipeline(url: str, handler: str) -> None:
    """The `pipeline` workload's pipeline: each of the fan's gates sent to a handler of its own (a
    path of the bench handler, so each gate gets its own client, as separate services would)."""
    from ..core.pipelines import from_mapping

    base = handler.rstrip("/")
    gates = [{"name": f"g{n}", "number": n, "handler": f"{base}/g{n}"} for n in range(FAN_GATES + 1)]
    with Feed(url) as feed:
        feed.apply_pipeline(from_mapping({"queue": "default", "gate": gates}, source="bench"), by="bench")


@contextlib.contextmanager
def _commits_sent() -> Iterator[list[float]]:
    """`[t]`: the time this process last sent a COMMIT. An item is ready when its partition's
    transaction commits: the moment COMMIT is sent is a bound from below, so a latency measured
    from it is never flattered. Listened for on every engine: the producer's `Feed` is the only
    one committing while the paced phase adds partitions."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    sent = [0.0]

    def stamp(_conn: Any) -> None:
        sent[0] = time.time()

    event.listen(Engine, "commit", stamp)
    try:
        yield sent
    finally:
        event.remove(Engine, "commit", stamp)


def _check_accumulated(url: str, partitions: int, workload: str) -> bool:
    """Whether each drained partition's accumulator is what its items' answers add up to, once
    each (`watch.accumulated_by`); BenchFailed naming the first that is not."""
    from .watch import accumulated_by

    with Feed(url) as feed:
        for n in range(partitions):
            key = f"{workload}-{n}"
            ids = [item.id for item in feed.items(key, limit=10_000)]
            numbers = [accumulated_by(item_id) for item_id in ids]
            expected = {"max_score": max(x["max_score"] for x in numbers), "pages": sum(x["pages"] for x in numbers)}
            got = feed.status(key).accumulated
            if got != expected:
                raise BenchFailed(f"partition {key} accumulated {got}, expected {expected}")
    return True


class Bench:
    """The runs of one `feedproc bench`, each in a throwaway database; logs in a temporary folder."""

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
                if workload in PULL_WORKLOADS:
                    feed.set_queue("default", mode="pull")
                if workload in ACCUMULATE_WORKLOADS:
                    feed.set_queue("default", accumulate=ACCUMULATE_WORKLOADS[workload])
                if opts.queue:  # the cost of a setting: e.g. a rate far above the drain rate
                    feed.set_queue("default", **opts.queue)
                    result["queue_settings"] = opts.queue
                shapes = partition_shapes(workload, opts.partitions, opts.items)
                started = time.perf_counter()
                for n, shape in enumerate(shapes):
                    group = f"group-{n % opts.groups}" if opts.groups else None
                    feed.add_partition(f"{workload}-{n}", shape, group=group)
                seconds = time.perf_counter() - started
            total = sum(len(shape) for shape in shapes)
            result.update(partitions=len(shapes), items=total)
            result["enqueue"] = {"items": total, "seconds": round(seconds, 4), "rate": round(total / seconds, 1)}

            committed: dict[str, float] = {}  # paced partition key -> time its add_partition returned
            target = ["--processor", _ACCUMULATING if workload in ACCUMULATE_WORKLOADS else _PROCESSOR]
            if workload in HTTP_WORKLOADS:
                handler = Processes(folder)
                handler_log = folder / "handler"
                handler_log.mkdir()
                script = str(helper("bench_handler.py"))
                log = str(handler_log / "calls-handler.log")
                proc = handler.start([sys.executable, script, "--port", "0", "--log", log], dict(os.environ), "handler")
                target = ["--handler", self._handler_url(folder / "handler.out", proc), *HTTP_WORKLOADS[workload]]
                if workload == "pipeline":  # watchers without --handler serve the queue's pipeline
                    _apply_pipeline(url, target[1])
                    target = []

            pull = workload in PULL_WORKLOADS
            drain = self._drain(url, place, folder / "drain", target, watchers, total, pull=pull)
            result["drain"] = drain
            if workload in ACCUMULATE_WORKLOADS:
                result["accumulated_exact"] = _check_accumulated(url, len(shapes), workload)
            window = drain_window(read_db(url, self.after), total)
            if opts.latency_seconds > 0 and window is not None and not pull:  # pull: the drain only
                rate = total / (window[1] - window[0])
                result["paced"] = self._paced(url, folder / "paced", target, workload, watchers, rate / 2, committed)
            if handler is not None:
                handler.stop()
                result["handler_peak_rss_mb"] = handler.peak_mb()
                handler = None
            if workload == "http":  # the ceiling of one request per item
                result["ceiling"] = self._ceiling(folder / "ceiling", total, shapes[0][0][1])
            analyse(url, self.after, folder, result, workload, committed)
        except Exception as error:  # a database error, say: report it, go on with the next run
            result["problems"].append(_problem(error))
        finally:
            if handler is not None:
                handler.stop()
            place.keep_or_drop(url, folder, result, keep=opts.keep)
        return result

    def run_collect(self, place: Place, workload: str, size: int) -> dict[str, Any]:
        """A collect workload at `size` (see `collect.py`): one partition, one watcher; collect-http
        with the bench's collecting handler and a `feedproc serve` for its results URL."""
        seq = next(self.sequence)
        folder = self.work / f"{seq:02d}-{place.name}-{workload}-{size}"
        logs = folder / "drain"
        logs.mkdir(parents=True)
        url = place.create(f"bench_{self.run_id}_{seq}")
        result: dict[str, Any] = {
            "system": "feedproc",
            "db": place.name,
            "workload": workload,
            "watchers": 1,
            "size": size,
            "problems": [],
        }
        servers = Processes(logs)  # collect-http: feedproc serve and the handler
        try:
            with Feed(url) as feed:
                feed.migrate()
                feed.add_partition(COLLECT_KEY, collect_partition(size))
            started = time.perf_counter()
            fill_collected(url, COLLECT_KEY, size - 1)
            result["setup"] = {"rows": size - 1, "seconds": round(time.perf_counter() - started, 2)}
            result.update(partitions=1, items=size + 1)
            poller = Poller(url)
            # --item-timeout, --timeout: reading a million results takes seconds to tens of seconds,
            # more than a default call may; one phase's own timeout bounds the run anyway.
            timeout = f"{self.options.timeout:g}"
            target = ["--processor", _COLLECTOR, "--item-timeout", timeout]
            if workload == "collect-http":
                env = dict(os.environ, FEEDPROC_DATABASE_URL=url)
                serve = servers.start(
                    [sys.executable, "-m", "feedproc", "serve", "--port", "0", "--log-level", "WARNING"], env, "serve"
                )
                api = self._served_url(logs / "serve.out", serve)
                command = [sys.executable, str(helper("bench_collect_handler.py")), "--port", "0", "--dir", str(logs)]
                handler = servers.start(command, dict(os.environ), "handler")
                handler_url = self._handler_url(logs / "handler.out", handler)
                target = ["--handler", handler_url, "--callback-url", api, "--timeout", timeout]
            procs = self._watchers(url, logs, target, 1)
            try:
                self._wait(poller, procs, _UNFINISHED, "fan-in")
            finally:
                procs.stop()
                poller.close()
                servers.stop()
            result["peak_rss_mb"] = procs.peak_mb()
            if workload == "collect-http":
                result["server_peak_rss_mb"] = dict(zip(("serve", "handler"), servers.peak_mb(), strict=False))
            analyse_collect(url, logs, result)
        except Exception as error:  # a database error, say: report it, go on with the next run
            result["problems"].append(_problem(error))
        finally:
            servers.stop()
            place.keep_or_drop(url, folder, result, keep=self.options.keep)
        return result

    def _ceiling(self, folder: Path, requests: int, data: bytes) -> dict[str, Any]:
        """The client ceiling (`ceiling.py`): a bare loop of the same client against a fresh handler
        (no call log), at the watchers' concurrency, `requests` requests."""
        folder.mkdir()
        handler = Processes(folder)
        try:
            proc = handler.start(
                [sys.executable, str(helper("bench_handler.py")), "--port", "0"], dict(os.environ), "handler"
            )
            url = self._handler_url(folder / "handler.out", proc)
            concurrency = str(self.options.concurrency)
            command = [sys.executable, "-m", "feedproc.bench.ceiling", url, concurrency, str(requests), data.decode()]
            done = subprocess.run(command, capture_output=True, text=True, timeout=self.options.timeout, check=False)
            if done.returncode != 0:
                raise BenchFailed(f"the client ceiling failed: {done.stderr.strip().splitlines()[-1:]}")
            ceiling: dict[str, Any] = json.loads(done.stdout)
            return ceiling
        finally:
            handler.stop()

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
            "-m",
            _WATCH,
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

    def _pull_workers(self, url: str, folder: Path, count: int) -> Processes:
        """One `feedproc serve` and `count` `feedproc work` processes (the no-op processor, claiming
        up to PULL_CLAIM items at once) instead of watchers."""
        folder.mkdir(parents=True, exist_ok=True)
        procs = Processes(folder)
        token = "bench-worker-token"
        env = dict(os.environ, FEEDPROC_DATABASE_URL=url, FEEDPROC_WORKER_TOKEN=token, **{DIR_ENV: str(folder)})
        server = procs.start(
            [sys.executable, "-m", "feedproc", "serve", "--port", "0", "--log-level", "WARNING"], env, "serve"
        )
        api = self._served_url(folder / "serve.out", server)
        command = [
            sys.executable,
            "-m",
            "feedproc",
            "work",
            "--api",
            api,
            "--processor",
            _PROCESSOR,
            "--concurrency",
            str(PULL_CLAIM),
            "--lease-seconds",
            "60",
            "--shutdown-grace",
            "10",
            "--log-level",
            "WARNING",
        ]
        for n in range(count):
            procs.start(command, env, f"worker-{n}")
        return procs

    def _served_url(self, out: Path, proc: subprocess.Popen[bytes]) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = re.search(r"http://[0-9.]+:\d+", out.read_text() if out.exists() else "")
            if found:
                return found.group(0)
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        raise BenchFailed("feedproc serve did not start")

    def _drain(
        self, url: str, place: Place, folder: Path, target: list[str], watchers: int, total: int, *, pull: bool = False
    ) -> dict[str, Any]:
        before = pg_stats(url) if place.postgres else None
        poller = Poller(url)
        procs = self._pull_workers(url, folder, watchers) if pull else self._watchers(url, folder, target, watchers)
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
        opts = self.options
        poller = Poller(url)
        procs = self._watchers(url, folder, target, watchers)
        phase: dict[str, Any] = {"target_rate": round(rate, 1)}
        try:
            # Warm up: every watcher registered (and LISTENing, on PostgreSQL), then one small
            # partition per watcher worked off; the latencies count only what the producer adds next.
            ready_sql = "SELECT count(*) FROM feedproc_watchers"
            if listens(url):
                ready_sql = (
                    "SELECT least((SELECT count(*) FROM feedproc_watchers), (SELECT count(*) FROM pg_stat_activity"
                    f" WHERE datname = current_database() AND query = '{_LISTENING}'))"
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
            if workload in FAN_WORKLOADS:
                # The backlog's shape: "half the drain rate" is only meaningful for the same partitions.
                width = max(1, opts.items // FAN_GATES)
                size = FAN_GATES * width + 1
                make = lambda: _fan_partition(width)  # noqa: E731
            else:
                size = max(1, round(rate * PACED_TICK))
                make = lambda: _flat_partition(size)  # noqa: E731
            interval = size / rate
            offered = 0
            with Feed(url) as feed, _commits_sent() as commit_sent:
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

    # ------------------------------------------------------------ peers

    def run_peer(self, place: Place, peer: str, settings: dict[str, Any], processes: int, jobs: int) -> dict[str, Any]:
        seq = next(self.sequence)
        label = peer if peer == "procrastinate" else f"{peer}-b{settings['batch_size']}"
        folder = self.work / f"{seq:02d}-{label}-{processes}"
        folder.mkdir()
        url = place.create(f"bench_{self.run_id}_{seq}")
        return peers.run_peer(self.options, place, url, folder, peer, settings, processes, jobs)

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
                "collect_sizes": opts.sizes,
            },
        }
        runs: list[dict[str, Any]] = []
        peers: list[dict[str, Any]] = []
        peer_place = next((place for place in places if place.postgres), None) if opts.against else None
        try:
            for place in places:
                meta["databases"].append(place.version())
            # collect(-http): a run per size (`--sizes`), one watcher: its one fan-in item leaves a second nothing.
            plan = [
                (place, workload, n)
                for place in places
                for workload in opts.workloads
                for n in (list(dict.fromkeys(opts.sizes)) if workload in COLLECT_WORKLOADS else opts.watchers)
            ]
            peers_after = next((w for w in opts.workloads if w not in COLLECT_WORKLOADS), None)  # the peers' turn
            for step, (place, workload, n) in enumerate(plan, start=1):
                if workload in COLLECT_WORKLOADS:
                    result = self.run_collect(place, workload, n)
                else:
                    result = self.run_feedproc(place, workload, n)
                runs.append(result)
                self.log(f"[{step}/{len(plan)}] {summary(result)}")
                if place is peer_place and workload == peers_after:
                    peers += self._run_peers(peer_place, n)
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
                self.log(f"      {summary(result)}")
        return results


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


def _problem(error: Exception) -> str:
    """A run's failure as its report lists it: a BenchFailed's words, else the error's type and first line."""
    if isinstance(error, BenchFailed):
        return str(error)
    first = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first}"
