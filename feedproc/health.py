"""Liveness for Kubernetes probes, and the tiny HTTP server a watcher uses for /healthz and /metrics.

`GET /healthz` answers 200 `{"status": "ok", ...}` when every check passes, else 503 with
`{"status": "unavailable", "reasons": [...]}`. A watcher checks that the database answers, that its
heartbeat renewed its leases within a lease length, and (with `--handler`) that the handler's base
URL answers HTTP at all (any status). `feedproc serve` checks the database only.

The watcher's monitoring server runs in a thread of its own (the standard library's
`ThreadingHTTPServer`), so a probe never touches the watcher's event loop.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import httpx

from .errors import FeedprocError
from .metrics import CONTENT_TYPE
from .redact import redact_text, url_secrets

CHECK_TIMEOUT = 3.0  # seconds one check may take before it counts as failed
Route = Callable[[], tuple[int, str, bytes]]  # -> (status, content type, body)

_checks = ThreadPoolExecutor(4, thread_name_prefix="feedproc-health")


def _bounded(fn: Callable[[], Any], what: str) -> str | None:
    """Run a check with a deadline; its failure reason, or None when it passed."""
    future = _checks.submit(fn)
    try:
        future.result(timeout=CHECK_TIMEOUT)
    except FutureTimeout:
        return f"{what}: no answer within {CHECK_TIMEOUT:g}s"
    except FeedprocError as error:
        return f"{what}: {error}"
    except Exception as error:
        return f"{what}: {type(error).__name__}: {error}"
    return None


def database_reason(store: Any) -> str | None:
    return _bounded(store.ping, "database")


def handler_base(url: str) -> str:
    """The scheme and host of a handler URL, without credentials: `http://u:pw@ocr:8080/classify` ->
    `http://ocr:8080/` (the probe needs none: any HTTP answer, a 401 too, means the service is up)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}/"


def handler_reason(url: str) -> str | None:
    """Why the handler's base URL does not answer HTTP, or None; the reason never shows credentials."""
    base = handler_base(url)

    def probe() -> None:
        with httpx.Client(timeout=CHECK_TIMEOUT) as client:
            client.get(base)  # any HTTP answer means the service is up

    reason = _bounded(probe, f"handler {base}")
    return redact_text(reason, url_secrets(url)) if reason else None


def report(reasons: list[str | None], **facts: Any) -> tuple[int, dict[str, Any]]:
    """(200 or 503, the JSON body) from the failed checks' reasons."""
    failed = [r for r in reasons if r]
    if failed:
        return 503, {"status": "unavailable", "reasons": failed, **facts}
    return 200, {"status": "ok", **facts}


def serve_health(store: Any) -> tuple[int, dict[str, Any]]:
    """/healthz of `feedproc serve`: the database answers."""
    return report([database_reason(store)])


class WatcherProbe:
    """/healthz and /metrics of one watcher, computed from its state when asked."""

    def __init__(self, watcher: Any, handler_url: str | None = None) -> None:
        self.watcher = watcher
        self.handler_url = handler_url

    def health(self) -> tuple[int, str, bytes]:
        w = self.watcher
        lease = w.config.lease_seconds
        age = w.heartbeat_age
        reasons = [database_reason(w.store)]
        if age > lease:
            reasons.append(f"heartbeat: leases last renewed {age:.1f}s ago (lease {lease:g}s)")
        if self.handler_url:
            reasons.append(handler_reason(self.handler_url))
        status, body = report(reasons, watcher=w.id, queue=w.config.queue, heartbeat_age=round(age, 3))
        return status, "application/json", json.dumps(body).encode()

    def metrics(self) -> tuple[int, str, bytes]:
        w = self.watcher
        backlog: int | None = None
        try:
            backlog = w.store.queue_gauges(w.config.queue)["backlog"].get((w.config.queue,), 0)
        except Exception:  # the database is away: the process counters are still worth serving
            backlog = None
        text = w.metrics.render(leases_held=len(w.owned), backlog=backlog)
        return 200, CONTENT_TYPE, text.encode()


class MonitorServer:
    """A small threaded HTTP server for GET routes (`/healthz`, `/metrics`)."""

    def __init__(self, host: str, port: int, routes: dict[str, Route]) -> None:
        self.routes = routes
        server = self

        class _Request(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                route = server.routes.get(self.path.split("?", 1)[0])
                if route is None:
                    status, kind, body = 404, "application/json", b'{"error": "not found"}'
                else:
                    try:
                        status, kind, body = route()
                    except Exception as error:  # never let a probe take the thread down
                        status, kind = 503, "application/json"
                        body = json.dumps({"status": "unavailable", "reasons": [str(error)]}).encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer((host, port), _Request)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="feedproc-monitor", daemon=True)

    def start(self) -> MonitorServer:
        self.thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
