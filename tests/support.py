"""Test helpers: waiting with a deadline, a scripted HTTP handler on loopback, and feedproc processes."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import io
import json
import locale
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

import pytest
from sqlalchemy import event, select, text
from sqlalchemy.engine import Connection

from feedproc import Feed, Item, Processor, Response, Watcher, WatcherConfig
from feedproc.core.records import Applied, Kind, Outcome, ReadyItem
from feedproc.core.views import HistoryEntry, PartitionStatus, StatusLease
from feedproc.store import Store
from feedproc.store.foundations import DriverStatement
from feedproc.store.schema import claims, events, items, partitions

ROOT = Path(__file__).resolve().parent.parent


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, every: float | None = None, what: str = "") -> Any:
    """Poll `predicate` until it returns something truthy; fail the test at the deadline. It is
    asked every `every` seconds, or by default at once, then after 0.02 s, the pause growing by a
    quarter each time up to 0.1 s: a predicate is often `feed.status()` (several queries), and at a
    fixed 0.05 s the polls of waits lasting seconds were half of a test worker's CPU."""
    deadline = time.monotonic() + timeout
    pause = every if every is not None else 0.02
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(pause)
        if every is None:
            pause = min(pause * 1.25, 0.1)
    pytest.fail(f"timed out after {timeout}s waiting for {what or predicate} (last value: {last!r})")


# ---------------------------------------------------------------- a handler service


@dataclass
class Delivery:
    body: dict[str, Any]
    headers: dict[str, str]
    start: float
    end: float

    @property
    def gate(self) -> int:
        return self.body["gate"]


Answer = tuple[Any, ...]  # (status, body: dict | list | str | bytes [, headers [, sleep seconds]])


class _Server(ThreadingHTTPServer):
    request_queue_size = 1024  # the default backlog of 5 resets bursts of new connections


@dataclass
class HandlerService:
    """A real HTTP handler on 127.0.0.1; tests script its answers with `behavior(body) -> Answer`."""

    behavior: Callable[[dict[str, Any]], Answer] = lambda body: (200, {"done": True})
    deliveries: list[Delivery] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.lock = threading.Lock()
        service = self

        class _Request(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # One send per answer and no Nagle delay: over keep-alive, headers and body written
            # separately otherwise wait ~40 ms for the client's delayed ACK.
            disable_nagle_algorithm = True
            wbufsize = 1 << 16

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                start = time.time()
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = json.loads(raw)
                answer = service.behavior(body)
                status, payload = answer[0], answer[1]
                headers = answer[2] if len(answer) > 2 else {}
                if len(answer) > 3:
                    time.sleep(answer[3])
                out = json.dumps(payload).encode() if isinstance(payload, dict | list) else payload
                out = out.encode() if isinstance(out, str) else out
                with service.lock:
                    service.deliveries.append(
                        Delivery(body, {k.lower(): v for k, v in self.headers.items()}, start, time.time())
                    )
                try:
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                except OSError:  # the client gave up (a timeout test)
                    pass

        self.server = _Server(("127.0.0.1", 0), _Request)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/handle"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def of(self, partition: str) -> list[Delivery]:
        with self.lock:
            return [d for d in self.deliveries if d.body["partition"] == partition]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ---------------------------------------------------------------- processes that die with the test run

#: prctl(2)'s option that makes the kernel signal a process when the thread that started it ends.
PR_SET_PDEATHSIG = 1
_prctl: Any = None
if sys.platform == "linux":  # elsewhere, process groups alone (a killed pytest can leave processes)
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
    _prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def die_with_parent(parent: int, sig: int = signal.SIGTERM) -> None:
    """Ask the kernel for `sig` when our parent (pid `parent`) dies; exit at once if it already
    has (between the fork and now, when no signal would ever come). Safe in a preexec_fn: no
    imports, no locks. xdist workers call it on themselves (conftest)."""
    if _prctl is None:
        return
    _prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)


#: A guard process: waits for the end of its standard input (the test process closed it, or died),
#: then kills the process group named on its first line. Not itself killed by the test's death.
GUARD = """
import os, signal, sys
line = sys.stdin.readline()
sys.stdin.read()
if line.strip():
    try:
        os.killpg(int(line), signal.SIGKILL)
    except ProcessLookupError:
        pass
"""


def spawn(
    args: Sequence[str | os.PathLike[str]],
    *,
    preexec_fn: Callable[[], None] | None = None,
    guard: bool = False,
    **popen: Any,
) -> subprocess.Popen[Any]:
    """Start a subprocess that no killed pytest leaves behind: in a process group (and session) of
    its own, so that `stop_group` kills it with whatever it started, and with SIGTERM from the kernel
    when this process dies (PR_SET_PDEATHSIG: the child shuts down as on any SIGTERM).

    The signal comes when the *thread* that started the child ends: start processes that outlive a
    call from pytest's main thread (tests run there, also under xdist). `guard`: for a child that
    starts processes of its own (a shell with background jobs, the benchmark), a guard process kills
    the whole group when this process dies; `stop_group` ends the guard too."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("start long-lived test processes from the main thread (PR_SET_PDEATHSIG is per thread)")
    return _spawn(args, preexec_fn=preexec_fn, guard=guard, **popen)


def _spawn(
    args: Sequence[str | os.PathLike[str]], *, preexec_fn: Callable[[], None] | None, guard: bool, **popen: Any
) -> subprocess.Popen[Any]:
    parent = os.getpid()

    def prepare() -> None:
        die_with_parent(parent)
        if preexec_fn is not None:
            preexec_fn()

    guarding = None
    if guard:  # started first, so that it is waiting before the group exists
        guarding = subprocess.Popen(
            [sys.executable, "-S", "-c", GUARD], stdin=subprocess.PIPE, start_new_session=True, text=True
        )
    try:
        process = subprocess.Popen(args, start_new_session=True, preexec_fn=prepare, **popen)
    except BaseException:
        if guarding is not None:
            _end_guard(guarding)
        raise
    if guarding is not None:
        assert guarding.stdin is not None
        guarding.stdin.write(f"{process.pid}\n")
        guarding.stdin.flush()
        _GUARDS[process.pid] = guarding
    return process


#: Guard processes by the process group they watch.
_GUARDS: dict[int, subprocess.Popen[str]] = {}


def _end_guard(guarding: subprocess.Popen[str]) -> None:
    guarding.kill()
    guarding.wait()
    if guarding.stdin is not None:
        guarding.stdin.close()


def stop_group(process: subprocess.Popen[Any], *, grace: float = 20.0) -> None:
    """SIGTERM `process` (a `spawn`ed group leader) and wait up to `grace` seconds; then SIGKILL its
    whole process group, which also ends whatever it started in the background."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)
    guarding = _GUARDS.pop(process.pid, None)
    if guarding is not None:
        _end_guard(guarding)


def run_process(
    args: Sequence[str | os.PathLike[str]],
    *,
    timeout: float,
    input: str | None = None,
    guard: bool = False,
    **popen: Any,
) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(args, capture_output=True, text=True, timeout=timeout)` for a `spawn`ed
    child, whose process group is killed when it exits or times out: a shell's background jobs end
    with the shell. Output goes through files, not pipes, so a job still holding them does not keep
    the call waiting. Any thread may call it (the calling thread outlives the child)."""
    with tempfile.TemporaryFile() as given, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        if input is not None:
            given.write(input.encode(locale.getpreferredencoding(False)))
            given.seek(0)
        stdin = given if input is not None else subprocess.DEVNULL
        process = _spawn(args, preexec_fn=None, guard=guard, stdin=stdin, stdout=out, stderr=err, **popen)
        timed_out = False
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            stop_group(process, grace=0)
        stdout, stderr = _text(out), _text(err)
    if timed_out:
        raise subprocess.TimeoutExpired(process.args, timeout, stdout, stderr)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _text(file: IO[bytes]) -> str:
    """A captured output as `text=True` gives it: the locale's encoding, universal newlines."""
    file.seek(0)
    return file.read().decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


# ---------------------------------------------------------------- feedproc processes


def feedproc_env(db_url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ, FEEDPROC_DATABASE_URL=db_url, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "tests"), env.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


#: Commands that run until stopped (signal handlers, logging set up, servers): always a process.
LONG_RUNNING = frozenset({"watch", "work", "serve", "demo", "bench"})


def run_cli(
    db_url: str,
    *args: str,
    input: str | None = None,
    cwd: Path | None = None,
    timeout: float = 60,
    env: dict[str, str] | None = None,
    process: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`feedproc ARGS` against `db_url` (with `env` added to the environment): its exit code and
    output. A one-shot command runs in this process (`feedproc.cli.main`, what the console script
    calls, on the same arguments, environment, standard input and working directory): a process
    each cost about a second of CPU to start, most of the end-to-end tier's time on 2 cores. The
    long-running commands, and `process=True`, run `python -m feedproc` in a process of its own."""
    if process or LONG_RUNNING.intersection(args):
        return run_process(
            [sys.executable, "-m", "feedproc", *args],
            env=feedproc_env(db_url, **(env or {})),
            input=input,
            timeout=timeout,
            cwd=cwd,
        )
    return _run_here(["feedproc", *args], {"FEEDPROC_DATABASE_URL": db_url, **(env or {})}, input, cwd)


def _run_here(
    argv: list[str], env: dict[str, str], input: str | None, cwd: Path | None
) -> subprocess.CompletedProcess[str]:
    """`main()` with this environment, standard input and working directory, its output captured
    as a process's would be (text over byte buffers: the CLI reads `sys.stdin.buffer`)."""
    from feedproc.cli import main

    def stream(data: bytes = b"") -> io.TextIOWrapper:
        return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", write_through=True)

    stdin, stdout, stderr = stream((input or "").encode()), stream(), stream()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    saved = sys.stdin, sys.stdout, sys.stderr
    os.environ.update(env)
    sys.stdin, sys.stdout, sys.stderr = stdin, stdout, stderr
    code = 0
    try:
        if cwd is not None:
            os.chdir(cwd)
        main(argv[1:])
    except SystemExit as exited:
        code = exited.code if isinstance(exited.code, int) else (0 if exited.code is None else 1)
    except BaseException:  # what an uncaught exception does to a process: a traceback, exit 1
        traceback.print_exc()
        code = 1
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(argv, code, _written(stdout), _written(stderr))


def _written(stream: io.TextIOWrapper) -> str:
    buffer = stream.buffer
    assert isinstance(buffer, io.BytesIO)
    return buffer.getvalue().decode("utf-8", "replace")


class WatcherProcesses:
    """Starts `feedproc watch` subprocesses and always stops them."""

    def __init__(self, db_url: str, log_dir: Path) -> None:
        self.db_url = db_url
        self.log_dir = log_dir
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, *args: str, **env: str) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"watch-{len(self.processes)}.log", "ab")  # noqa: SIM115 - owned by the child
        process = spawn(
            [sys.executable, "-m", "feedproc", "watch", *args],
            env=feedproc_env(self.db_url, **env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.processes.append(process)
        return process

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.log_dir.glob("watch-*.log")))

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


@contextmanager
def statements_observed(store: Store, observe: Callable[[Connection, str], None]) -> Iterator[None]:
    """Call `observe(connection, statement)` before every statement the store runs: SQLAlchemy's
    own, and the hot path's driver statements (which SQLAlchemy's events do not see)."""

    def on_execute(
        conn: Connection, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
    ) -> None:
        observe(conn, statement)

    event.listen(store.engine, "before_cursor_execute", on_execute)
    DriverStatement.observer = observe
    try:
        yield
    finally:
        event.remove(store.engine, "before_cursor_execute", on_execute)
        DriverStatement.observer = None


# ---------------------------------------------------------------- shared by the tiers' tests


def db_state(feed: Feed) -> dict[str, list[tuple[Any, ...]]]:
    """Every partition, item and event row: equal before and after means nothing was written."""
    with feed.store.engine.connect() as conn:
        return {
            t.name: [tuple(r) for r in conn.execute(select(t).order_by(t.c.id))] for t in (partitions, items, events)
        }


def ready(gate: int = 0, attempts: int = 0) -> ReadyItem:
    return ReadyItem(
        id=7,
        version=3,
        partition_id=11,
        partition="p",
        queue="default",
        epoch=5,
        gate=gate,
        attempts=attempts,
        data=b"{}",
    )


A, B = "watcher-a", "watcher-b"


def register(
    store: Store,
    watcher: str,
    *,
    lease_seconds: float = 30.0,
    queue: str = "default",
    capacity: int = 8,
    concurrency: int = 2,
) -> None:
    store.register_watcher(
        watcher,
        host="test",
        pid=1,
        queue=queue,
        concurrency=concurrency,
        capacity=capacity,
        lease_seconds=lease_seconds,
    )


def answer(ready: ReadyItem, kind: str, **fields: Any) -> Outcome:
    return Outcome(
        item_id=ready.id,
        version=ready.version,
        partition_id=ready.partition_id,
        epoch=ready.epoch,
        gate=ready.gate,
        kind=kind,
        **fields,
    )


FAST: dict[str, Any] = {"poll_interval": 0.05, "lease_seconds": 3.0, "retry_delay": 0.05, "shutdown_grace": 5.0}


class WatcherThread:
    """A `feedproc.Watcher` on its own event loop in a background thread, with its own Store."""

    def __init__(
        self,
        db_url: str,
        processor: Any,
        *,
        table_prefix: str | None = None,
        hooks: Mapping[str, Callable[[dict[str, Any]], Any]] | None = None,
        hook_secret: str | None = None,
        **settings: Any,
    ) -> None:
        self.store = Store(db_url, table_prefix=table_prefix)
        config = WatcherConfig(**{**FAST, **settings})
        self.watcher = Watcher(self.store, processor, config, hooks=hooks, hook_secret=hook_secret)
        self.loop = asyncio.new_event_loop()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name=f"watcher-{self.watcher.id}", daemon=True)
        self.thread.start()

    @property
    def id(self) -> str:
        return self.watcher.id

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self.watcher.run())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
        except BaseException as error:
            self.error = error
        finally:
            asyncio.set_event_loop(None)
            self.loop.close()

    def stop(self, timeout: float = 30.0) -> None:
        """Ask the watcher to stop and wait until `run()` has returned (leases released)."""
        if self.thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop closed in the meantime
                self.loop.call_soon_threadsafe(self.watcher.stop)
            self.thread.join(timeout)
        self.store.close()
        assert not self.thread.is_alive(), f"watcher {self.id} did not stop within {timeout}s"
        if self.error is not None:
            raise self.error


@contextlib.contextmanager
def watching(db_url: str, processor: Any, **settings: Any) -> Iterator[WatcherThread]:
    """Run a watcher for the duration of the block; always stopped afterwards."""
    running = WatcherThread(db_url, processor, **settings)
    try:
        yield running
    finally:
        running.stop()


def wait_status(feed: Feed, key: str, status: str, timeout: float = 30.0, history: int = 0) -> PartitionStatus:
    def reached() -> PartitionStatus | None:
        current = feed.status(key, history=history)
        return current if current.status == status else None

    return wait_until(reached, timeout=timeout, what=f"partition {key} to become {status}")


def history_of(feed: Feed, key: str, kind: str | None = None) -> list[HistoryEntry]:
    events = feed.status(key, history=500).history or ()
    return [e for e in events if kind is None or e.kind == kind]


def fail(ready: ReadyItem, attempts: int = 1, error: str = "boom") -> Outcome:
    return answer(ready, Kind.FAIL, attempts=attempts, error=error)


def lease_and_fetch(store: Store, watcher: str = A, limit: int = 100) -> list[ReadyItem]:
    store.acquire(watcher, "default", 10, 30)
    return store.fetch_ready(watcher, limit)


def work_off(store: Store, key: str, kind: str = Kind.DONE, watcher: str = A) -> Applied:
    """Answer every ready item of `key` at its current gate with `kind`."""
    ready = [r for r in lease_and_fetch(store, watcher) if r.partition == key]
    assert ready, f"nothing ready in {key}"
    make: Callable[[ReadyItem], Outcome] = fail if kind == Kind.FAIL else (lambda r: answer(r, kind))
    return store.apply(watcher, [make(r) for r in ready])


def metric_samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """A Prometheus exposition, parsed by prometheus-client: {(sample name, labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample of a Prometheus exposition, or None when it is absent."""
    return metric_samples(text).get((name, frozenset(labels.items())))


def callback_claims(feed: Feed) -> list[Any]:
    """The claims 202 answers left: written by the group commit after the handler answered, so a
    callback sent before it finds no claim (404); a test waits for them before answering."""
    with feed.store.read() as conn:
        return list(conn.execute(select(claims.c.token).where(claims.c.callback.is_(True))))


def json_of(raw: bytes | str | None) -> Any:
    """An item's data or result read as JSON; None when it has none."""
    return None if raw is None else json.loads(raw)


def lease_of(status: PartitionStatus) -> StatusLease:
    """The lease a partition's status shows, failing the test when it shows none."""
    assert status.lease is not None, f"{status.key} is not leased"
    return status.lease


class Done(Processor):
    """Completes every item, remembering which it saw."""

    def __init__(self) -> None:
        self.seen: list[bytes] = []

    def process(self, item: Item) -> Response:
        self.seen.append(item.data)
        return Response(done=True)


def ledger_rows(feed: Feed) -> Counter[int]:
    """How many rows of `cli_processors.LEDGER_TABLE` each item has, as committed (the ledger a
    transactional processor writes one row per item to)."""
    with feed.store.engine.connect() as conn:
        return Counter(conn.execute(text("SELECT item_id FROM ledger")).scalars())
