#!/usr/bin/env python3
"""A bounded soak: feedproc watchers under random kills, stalls and stops, then the invariant checks.

    python cmds/soak.py --db sqlite:///soak.db --minutes 2
    python cmds/soak.py --db postgresql://postgres@127.0.0.1:5432/soak --minutes 10 --watchers 4

Starts a handler service on loopback (a thread of this process, recording every delivery with its
start and end time and the watcher that made it), `--watchers` `feedproc watch` processes (with
`--processor tests.faults_support:StampedHTTP`: feedproc's HTTP processor, plus headers naming the
watcher and the moment it dispatched, so that a request sent just before a SIGSTOP that reaches
the handler after the SIGCONT is not mistaken for a dispatch after the stall), and for
the first part of the run (`--submit-for`) keeps submitting fan-out/fan-in partitions (the workflow
of tests/faults_support.py: roots at gate 0 that add children at gate 1, a final item at gate 2).
Every few seconds (`--fault-every`) one random fault hits a random healthy watcher:

* kill -9, and a replacement is started;
* SIGSTOP for longer than the lease, then SIGCONT;
* SIGTERM (a graceful yield: it must exit 0 within its grace period), and a replacement is started.

At the end the faults stop, every watcher is continued, and the run waits (at most `--drain`
seconds) for every submitted partition to finish. Then it prints the invariant checks with their
counts — all complete; the gate barrier never crossed; completed items never delivered again;
children written exactly once; repeated deliveries only of items in flight at a kill or a stop;
SIGTERM exits clean — and exits 1 if any fails. The database is migrated first; keys are unique per
run, so a database may be reused (only this run's partitions are checked).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from feedproc import Feed  # noqa: E402
from feedproc.core.errors import DatabaseUnavailable  # noqa: E402
from tests.faults_support import (  # noqa: E402
    DISPATCHED_HEADER,
    WATCHER_HEADER,
    Call,
    Check,
    FanOut,
    Fleet,
    fan_out_items,
    report,
    stored_partitions,
    workflow_checks,
)

# ---------------------------------------------------------------- the handler service


class Handler:
    """The workflow's handler on 127.0.0.1, in a thread; records every delivery as a `Call`."""

    def __init__(self, behavior: FanOut) -> None:
        self.behavior = behavior
        self.calls: list[Call] = []
        self.lock = threading.Lock()
        service = self

        class _Request(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                start = time.time()
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                answer = service.behavior(body)
                status, payload = answer[0], answer[1]
                time.sleep(answer[3] if len(answer) > 3 else 0.0)
                out = json.dumps(payload).encode()
                call = Call(
                    body["token"],
                    body["id"],
                    body["partition"],
                    body["gate"],
                    body["attempt"],
                    self.headers.get(WATCHER_HEADER, "?"),
                    start,
                    time.time(),
                    float(self.headers.get(DISPATCHED_HEADER, start)),
                )
                with service.lock:
                    service.calls.append(call)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                except OSError:  # the watcher died or gave up
                    pass

        class _Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # connections of killed watchers reset: expected here

        self.server = _Server(("127.0.0.1", 0), _Request)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/handle"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def snapshot(self) -> list[Call]:
        with self.lock:
            return list(self.calls)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ---------------------------------------------------------------- the run


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {message}", flush=True)


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.run_id = uuid.uuid4().hex[:6]
        self.feed = Feed(args.db)
        self.feed.migrate()
        self.handler = Handler(FanOut(seed=args.seed))
        self.logs = Path(args.logs or tempfile.mkdtemp(prefix="feedproc-soak-"))
        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ, FEEDPROC_DATABASE_URL=args.db, PYTHONUNBUFFERED="1")
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), self.env.get("PYTHONPATH", "")]))
        self.fleet = Fleet(self._spawn)
        self.names = (f"w{n}" for n in itertools.count(1))
        self.keys: list[str] = []  # appended by the submitting thread
        self.done = threading.Event()
        self.submit_errors = 0
        self.stopped: dict[str, float] = {}  # name -> when to SIGCONT it
        self.terminating: dict[str, float] = {}  # name -> when SIGTERM was sent
        self.term_exits: list[tuple[str, int | None, float]] = []  # (name, exit code, seconds)
        # feedproc's HTTP processor, plus the headers that name the watcher and say when it
        # dispatched (tests/faults_support.py: StampedHTTP)
        self.env["FEEDPROC_FAULTS_HANDLER"] = self.handler.url
        self.watch_args = (
            "--processor",
            "tests.faults_support:StampedHTTP",
            "--lease-seconds",
            str(args.lease),
            "--poll-interval",
            "0.2",
            "--concurrency",
            "4",
            "--retry-delay",
            "0.1",
            "--shutdown-grace",
            str(args.grace),
        )

    def _spawn(self, name: str, args: Any) -> tuple[subprocess.Popen[bytes], Path]:
        path = self.logs / f"watch-{len(self.fleet.members) + 1:03}.log"
        with open(path, "ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "feedproc", "watch", *args],
                env=dict(self.env, FEEDPROC_FAULTS_WATCHER=name),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=ROOT,
            )
        return process, path

    def start_watcher(self) -> str:
        name = next(self.names)
        self.fleet.start(name, *self.watch_args)
        return name

    def healthy(self) -> list[str]:
        return [
            m.name
            for m in self.fleet.members.values()
            if m.alive and m.name not in self.stopped and m.name not in self.terminating
        ]

    def submit(self, until: float) -> None:
        """Submit partitions until `until` (a thread of its own: on SQLite a watcher stopped inside a
        write transaction blocks producers, and the fault loop must still be able to continue it)."""
        rng = random.Random(None if self.args.seed is None else self.args.seed + 1)
        while not self.done.wait(rng.uniform(0.2, 2 * self.args.submit_every - 0.2)) and time.monotonic() < until:
            key = f"soak-{self.run_id}-{len(self.keys):05}"
            roots, fanout = rng.randint(1, 4), rng.randint(0, 10)
            try:
                self.feed.add_partition(key, fan_out_items(roots, fanout), priority=rng.choice([0, 0, 0, 1]))
            except DatabaseUnavailable as error:
                self.submit_errors += 1
                log(f"could not submit {key}: {error}")
                if key not in stored_partitions(self.feed.store.engine, [key]):
                    continue  # not written: try again with the same key
            self.keys.append(key)

    def fault(self) -> None:
        healthy = self.healthy()
        if len(healthy) < 2:
            return  # keep at least one watcher working
        name = self.rng.choice(healthy)
        kind = self.rng.choice(["kill", "stop", "term"])
        if kind == "kill":
            self.fleet.kill(name)
            log(f"kill -9 {name}; started {self.start_watcher()}")
        elif kind == "stop":
            length = self.args.lease + self.rng.uniform(1.0, 3.0)
            self.fleet.stop(name)
            self.stopped[name] = time.monotonic() + length
            log(f"SIGSTOP {name} for {length:.1f}s (lease {self.args.lease:g}s)")
        else:
            self.fleet.term(name)
            self.terminating[name] = time.monotonic()
            log(f"SIGTERM {name}")

    def tend(self) -> None:
        """Continue stalled watchers whose time is up; replace watchers that finished stopping."""
        now = time.monotonic()
        for name, until in list(self.stopped.items()):
            if now >= until:
                self.fleet.cont(name)
                del self.stopped[name]
                log(f"SIGCONT {name}")
        for name, since in list(self.terminating.items()):
            member = self.fleet[name]
            code = member.process.poll()
            if code is None and now - since < self.args.grace + 15:
                continue
            if code is None:
                member.process.kill()
                member.process.wait(timeout=10)
            self.term_exits.append((name, code, now - since))
            del self.terminating[name]
            log(f"{name} exited {code} {now - since:.1f}s after SIGTERM; started {self.start_watcher()}")

    def progress(self) -> None:
        keys = list(self.keys)
        parts = stored_partitions(self.feed.store.engine, keys) if keys else {}
        done = Counter(p["status"] for p in parts.values())
        faults = Counter(f.kind for f in self.fleet.faults)
        log(
            f"{len(keys)} partitions submitted ({dict(done)}), {len(self.handler.snapshot())} deliveries, "
            f"faults {dict(faults)}, {len(self.healthy())} healthy watchers"
        )

    def run(self) -> int:
        args = self.args
        log(f"soak {self.run_id}: {args.db}, {args.watchers} watchers, {args.minutes} min; logs in {self.logs}")
        for _ in range(args.watchers):
            self.start_watcher()
        started = time.monotonic()
        end = started + args.minutes * 60
        submitter = threading.Thread(target=self.submit, args=(started + args.minutes * 60 * args.submit_for,))
        submitter.start()
        next_fault = started + 2.0
        next_progress = started + 30
        try:
            while time.monotonic() < end:
                now = time.monotonic()
                if now >= next_fault:
                    self.fault()
                    next_fault = now + self.rng.uniform(0.5, 1.5) * args.fault_every
                if now >= next_progress:
                    self.progress()
                    next_progress = now + 30
                self.tend()
                time.sleep(0.05)
            log("faults over: continuing every stalled watcher and waiting for the work to finish")
            self.done.set()
            for name in list(self.stopped):
                self.stopped[name] = 0.0
            while self.terminating or self.stopped:
                self.tend()
                time.sleep(0.05)
            submitter.join()
            deadline = time.monotonic() + args.drain
            while time.monotonic() < deadline:
                parts = stored_partitions(self.feed.store.engine, self.keys)
                if all(p["status"] in ("complete", "failed", "cancelled") for p in parts.values()):
                    break
                time.sleep(0.5)
            self.progress()
        finally:
            self.done.set()
            self.fleet.stop_all()
            self.handler.close()
        return self.check()

    def check(self) -> int:
        calls = self.handler.snapshot()
        checks = workflow_checks(self.feed.store.engine, self.keys, calls, self.fleet.faults)
        bad_exits = [
            f"{name} exited {code} after {took:.1f}s"
            for name, code, took in self.term_exits
            if code != 0 or took > self.args.grace + 5
        ]
        checks.append(Check("SIGTERM exits 0 within the grace period", f"{len(self.term_exits)} stops", bad_exits))
        tracebacks = [m.name for m in self.fleet.members.values() if "Traceback" in m.text()]
        checks.append(
            Check(
                "no tracebacks in watcher logs", f"{len(self.fleet.members)} watchers", [f"in {n}" for n in tracebacks]
            )
        )
        faults = Counter(f.kind for f in self.fleet.faults if f.kind != "cont")
        print()
        engine = self.feed.store.engine.dialect.name
        shape = f"{len(self.keys)} partitions, {len(calls)} deliveries, {len(self.fleet.members)} watcher processes"
        print(f"soak {self.run_id} on {engine}: {shape}, faults {dict(faults)}, {self.submit_errors} submit errors")
        print(report(checks))
        failed = [c.name for c in checks if not c.ok]
        print(f"\n{'FAILED: ' + ', '.join(failed) if failed else 'all checks passed'} (logs: {self.logs})")
        self.feed.close()
        return 1 if failed else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", required=True, help="database URL (migrated by the soak)")
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the faulty part of the run")
    parser.add_argument("--watchers", type=int, default=4)
    parser.add_argument("--lease", type=float, default=3.0, help="--lease-seconds of the watchers")
    parser.add_argument("--grace", type=float, default=5.0, help="--shutdown-grace of the watchers")
    parser.add_argument("--fault-every", type=float, default=4.0, help="mean seconds between faults")
    parser.add_argument("--submit-every", type=float, default=0.6, help="mean seconds between partitions")
    parser.add_argument("--submit-for", type=float, default=0.7, help="fraction of the run that submits work")
    parser.add_argument("--drain", type=float, default=180.0, help="seconds to wait for the work to finish")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--logs", help="directory for the watchers' logs (default: a new temporary one)")
    args = parser.parse_args()
    if args.watchers < 2:
        parser.error("--watchers must be at least 2 (a fault always leaves one watcher healthy)")
    sys.exit(Soak(args).run())


if __name__ == "__main__":
    main()
