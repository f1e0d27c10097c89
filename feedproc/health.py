"""Probes for Kubernetes, and the tiny HTTP server a watcher uses for them and for /metrics.

Each probe answers 200 `{"status": "ok", ...}` when its checks pass, else 503 with
`{"status": "unavailable", "reasons": [...]}`. A watcher serves three (on `--health-port`):

- `GET /livez` (liveness): fails only when the watcher itself is stuck: its write loop gave up
  (`watcher.fatal`), or its heartbeat has not renewed the leases within a lease length while the
  database answers and writes. A heartbeat stale *because the database is away* (or refuses
  writes) keeps the watcher live: restarting it would not bring the database back, and would only
  add reconnection storms. It never checks the handler.
- `GET /readyz` (readiness): the database answers and takes writes (no outage the watcher is
  waiting out: a read-only database answers a ping), each handler service the watcher sends items to
  (its `--handler`, or the handlers of its pipeline's gates) answers HTTP at all at its base URL
  (any status), and the write loop has not given up.
- `GET /healthz`: all of the above at once (the heartbeat check without the database excuse), as
  before `/livez` and `/readyz` existed. `feedproc serve` checks the database only.

Checks run concurrently, each within `CHECK_TIMEOUT`; reasons never show credentials. The server
(uvicorn) runs in a thread of its own, so a probe never touches the watcher's event loop.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any
from urllib.parse import urlsplit

import httpx

from .core.errors import FeedprocError
from .logs import redact
from .metrics import CONTENT_TYPE
from .serving import Limits, uvicorn_settings

CHECK_TIMEOUT = 3.0  # seconds one check may take before it counts as failed
MAX_CONNECTIONS = 8  # monitor connections at once (plus one kept for probes: serving.py)
CONNECTION_TIMEOUT = 5.0  # seconds a monitor connection may take to send its request, or stay idle
Route = Callable[[], tuple[int, str, bytes]]  # -> (status, content type, body)
Check = tuple[Callable[[], Any], str]  # (a call that raises when the check fails, what it checks)

# Threads start only as checks need them. A probe runs the database's check and one per handler
# service (a pipeline may have one per gate), and up to MAX_CONNECTIONS probes may run at once: too
# few threads would queue checks behind a slow service until they time out though their service is up.
_checks = ThreadPoolExecutor(32, thread_name_prefix="feedproc-health")


def _failure(what: str, error: BaseException) -> str:
    if isinstance(error, FeedprocError):
        return redact(f"{what}: {error}")
    return redact(f"{what}: {type(error).__name__}: {error}")


def _run_checks(checks: list[Check]) -> list[str | None]:
    """Run checks at once, all within one deadline; each one's failure reason, or None when it passed."""
    futures = [(_checks.submit(fn), what) for fn, what in checks]
    deadline = time.monotonic() + CHECK_TIMEOUT
    reasons: list[str | None] = []
    for future, what in futures:
        try:
            future.result(timeout=max(0.0, deadline - time.monotonic()))
        except FutureTimeout:
            reasons.append(f"{what}: no answer within {CHECK_TIMEOUT:g}s")
        except Exception as error:
            reasons.append(_failure(what, error))
        else:
            reasons.append(None)
    return reasons


def _bounded(fn: Callable[[], Any], what: str) -> str | None:
    """Run a check with a deadline; its failure reason, or None when it passed."""
    return _run_checks([(fn, what)])[0]


def _database(store: Any) -> Check:
    return store.ping, "database"


def database_reason(store: Any) -> str | None:
    return _bounded(*_database(store))


def handler_base(url: str) -> str:
    """The scheme and host of a handler URL, without credentials: `http://u:pw@ocr:8080/classify` ->
    `http://ocr:8080/` (the probe needs none: any HTTP answer, a 401 too, means the service is up)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}/"


def _handler(url: str) -> Check:
    base = handler_base(url)

    def probe() -> None:
        with httpx.Client(timeout=CHECK_TIMEOUT) as client:
            client.get(base)  # any HTTP answer means the service is up

    return probe, f"handler {base}"  # a base without credentials (handler_base drops them)


def handler_reason(url: str) -> str | None:
    return _bounded(*_handler(url))


def report(reasons: list[str | None], **facts: Any) -> tuple[int, dict[str, Any]]:
    """(200 or 503, the JSON body) from the failed checks' reasons."""
    failed = [r for r in reasons if r]
    if failed:
        return 503, {"status": "unavailable", "reasons": failed, **facts}
    return 200, {"status": "ok", **facts}


class DatabaseProbe:
    """/healthz of `feedproc serve`: the database answers, asked through `feed`, a handle of the
    probe's own (not the API's pool, whose connections busy reads may all hold), on this module's
    threads (not the API's), within CHECK_TIMEOUT. Probes arriving while a ping runs wait for that
    ping: a database that hangs costs one thread, however often it is probed."""

    def __init__(self, feed: Any) -> None:
        self.feed = feed
        self._lock = threading.Lock()
        self._ping: Future[None] | None = None

    async def __call__(self) -> tuple[int, dict[str, Any]]:
        with self._lock:
            if self._ping is None or self._ping.done():
                self._ping = _checks.submit(self.feed.ping)
            ping = self._ping
        try:  # shielded: one probe's timeout must not cancel the ping another probe waits for
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(ping)), CHECK_TIMEOUT)
        except TimeoutError:
            return report([f"database: no answer within {CHECK_TIMEOUT:g}s"])
        except Exception as error:
            return report([_failure("database", error)])
        return report([None])


class WatcherProbe:
    """/healthz, /livez, /readyz and /metrics of one watcher, computed from its state when asked."""

    def __init__(self, watcher: Any, handler_url: str | None = None) -> None:
        self.watcher = watcher
        self.handler_url = handler_url

    def _fatal(self) -> str | None:
        fatal = getattr(self.watcher, "fatal", None)
        return redact(f"watcher: {fatal}") if fatal else None

    def _outage(self) -> str | None:
        """The database outage the watcher is waiting out: it may answer a ping meanwhile (a
        read-only database does, and refuses every write)."""
        outage = getattr(self.watcher, "database_outage", None)
        return redact(f"database: {outage}") if outage else None

    def _database(self, reason: str | None) -> str | None:
        """The database's check: its ping's failure, else the outage the watcher met."""
        return reason or self._outage()

    def _stale(self) -> str | None:
        lease, age = self.watcher.config.lease_seconds, self.watcher.heartbeat_age
        if age > lease:
            return f"heartbeat: leases last renewed {age:.1f}s ago (lease {lease:g}s)"
        return None

    def _answer(self, reasons: list[str | None], **facts: Any) -> tuple[int, str, bytes]:
        w = self.watcher
        status, body = report(
            reasons, watcher=w.id, queue=w.config.queue, heartbeat_age=round(w.heartbeat_age, 3), **facts
        )
        return status, "application/json", json.dumps(body).encode()

    def _handlers(self) -> list[Check]:
        """A check per handler service items go to now, by base URL: the `--handler`, or the
        handlers of the gates of the pipeline version the watcher follows (read when asked, so a
        pipeline applied meanwhile is probed as it is)."""
        from .processors.http import HTTPProcessor

        urls = [self.handler_url] if self.handler_url else []
        router = getattr(self.watcher, "router", None)
        urls += [p.url for p in getattr(router, "processors", []) if isinstance(p, HTTPProcessor)]
        return [_handler(base) for base in dict.fromkeys(handler_base(url) for url in urls)]

    def health(self) -> tuple[int, str, bytes]:
        """Everything at once: database, heartbeat, handlers, write loop."""
        checks = [_database(self.watcher.store), *self._handlers()]
        database, *handlers = _run_checks(checks)
        return self._answer([self._database(database), *handlers, self._stale(), self._fatal()])

    def live(self) -> tuple[int, str, bytes]:
        """Liveness: the watcher is not stuck. A stale heartbeat counts only while the database
        answers and takes writes (otherwise the outage is the cause, and a restart would not help)."""
        fatal, stale = self._fatal(), self._stale()
        if fatal or not stale:
            return self._answer([fatal])
        outage = self._outage()
        if outage:
            return self._answer([], note=f"{stale}; the watcher is waiting out the database ({outage})")
        database = database_reason(self.watcher.store)
        if database:
            return self._answer([], note=f"{stale}; the database is not answering ({database})")
        return self._answer([stale])

    def ready(self) -> tuple[int, str, bytes]:
        """Readiness: the database answers and takes writes, the handlers answer, and the write
        loop runs."""
        checks = [_database(self.watcher.store), *self._handlers()]
        database, *handlers = _run_checks(checks)
        return self._answer([self._database(database), *handlers, self._fatal()])

    def metrics(self) -> tuple[int, str, bytes]:
        """The watcher's registry, plus its queue's backlog read from the database now."""
        w = self.watcher

        def backlog() -> int | None:
            try:
                return int(w.store.queue_gauges(w.config.queue)["backlog"].get((w.config.queue,), 0))
            except Exception:  # the database is away: the process's own metrics are still worth serving
                return None

        return 200, CONTENT_TYPE, w.metrics.render(backlog=backlog)


class MonitorServer:
    """GET routes (`/healthz`, `/livez`, `/readyz`, `/metrics`) served by uvicorn on a thread and
    event loop of its own, so a probe never touches the watcher's loop.

    Bounded (serving.py): at most `MAX_CONNECTIONS` connections, a newcomer closing the oldest one not
    in a request; a connection whose request line and headers are not complete within
    `CONNECTION_TIMEOUT` seconds, however slowly they trickle in, or that stays idle that long between
    two requests, is closed; /livez, /readyz and /healthz answer even when every connection is busy
    with /metrics. An idle connection holds a socket, not a thread. Routes are blocking calls: each
    runs on an executor of the server's own, a thread per connection it may hold."""

    def __init__(self, host: str, port: int, routes: dict[str, Route]) -> None:
        import uvicorn

        self.routes = routes
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        self._socket = socket.create_server((host, port), family=family)
        self.port: int = self._socket.getsockname()[1]
        config = uvicorn.Config(
            self._app,
            interface="asgi3",
            proxy_headers=False,
            lifespan="off",
            access_log=False,
            log_config=None,  # uvicorn's loggers propagate to feedproc's root handler
            **uvicorn_settings(Limits(MAX_CONNECTIONS, CONNECTION_TIMEOUT, CONNECTION_TIMEOUT)),
        )
        self._server = uvicorn.Server(config)
        # A thread per connection the server may hold: /metrics reading a slow database on every
        # connection still leaves probes a thread (the loop's default executor has cpus + 4).
        self._routes = ThreadPoolExecutor(MAX_CONNECTIONS + 1, thread_name_prefix="feedproc-monitor-route")
        self.thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="feedproc-monitor", daemon=True
        )

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        route = self.routes.get(scope["path"])
        if scope["method"] not in ("GET", "HEAD"):
            status, kind, body = 405, "application/json", b'{"error": "only GET"}'
        elif route is None:
            status, kind, body = 404, "application/json", b'{"error": "not found"}'
        else:
            try:
                status, kind, body = await asyncio.get_running_loop().run_in_executor(self._routes, route)
            except Exception as error:  # never let a probe take the server down
                status, kind = 503, "application/json"
                body = json.dumps({"status": "unavailable", "reasons": [redact(str(error))]}).encode()
        headers = [(b"content-type", kind.encode()), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})

    def start(self) -> MonitorServer:
        """Serve from now on (returns once uvicorn has started, within 10 s)."""
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and self.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self._server.started:
            self.close()
            raise OSError("the monitor server did not start")
        return self

    def close(self) -> None:
        self._server.should_exit = True
        if self.thread.is_alive():
            self.thread.join(timeout=5)
        self._socket.close()
        self._routes.shutdown(wait=False)
