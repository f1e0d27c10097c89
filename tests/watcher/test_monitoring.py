"""`feedproc watch --health-port N --metrics-port N` (issue 6): a real watcher process answers
Kubernetes probes and Prometheus scrapes on its own small HTTP server, on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import json
import socket
import threading
import time
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from feedproc import DatabaseUnavailable, Feed, health, serving
from feedproc.health import MonitorServer, WatcherProbe

from ..api_support import Slowloris, free_port, probe_for
from ..support import HandlerService, WatcherProcesses, metric, metric_samples, wait_until

FAST = ("--poll-interval", "0.1", "--lease-seconds", "5", "--retry-delay", "0.05", "--monitor-host", "127.0.0.1")
pytestmark = pytest.mark.slow
# Checks that do not depend on the database's dialect run on SQLite only, to keep the suite fast.
dialect_independent = pytest.mark.sqlite_only


def get(port: int, path: str) -> httpx.Response | None:
    """The answer, or None while the watcher is not listening yet."""
    try:
        return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=10)
    except httpx.HTTPError:
        return None


def scrape(port: int, **expected: float) -> str:
    """Scrape /metrics until each `expected` sample (`name` or `name__label_value`, the queue being
    "default") has its value."""

    def ready() -> str | None:
        response = get(port, "/metrics")
        text = response.text if response is not None else ""
        found = metric_samples(text) if response is not None else {}
        wanted = {(name, frozenset({"queue": "default"}.items())): value for name, value in expected.items()}
        return text if all(found.get(key) == value for key, value in wanted.items()) else None

    return wait_until(ready, timeout=60, every=0.2, what=f"metrics {expected}")


def test_healthz_is_200_when_database_heartbeat_and_handler_answer(
    watchers: WatcherProcesses, handler: HandlerService
) -> None:
    port = free_port()
    watchers.start("--handler", handler.url, *FAST, "--health-port", str(port))
    response = wait_until(lambda: get(port, "/healthz"), timeout=60, what="/healthz")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "ok" and response.json()["queue"] == "default"


@dialect_independent
def test_healthz_is_503_naming_the_handler_when_it_does_not_answer(watchers: WatcherProcesses) -> None:
    port, dead = free_port(), free_port()
    watchers.start("--handler", f"http://127.0.0.1:{dead}/handle", *FAST, "--health-port", str(port))
    response = wait_until(lambda: get(port, "/healthz"), timeout=60, what="/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert [reason for reason in body["reasons"] if reason.startswith(f"handler http://127.0.0.1:{dead}/")]


def test_metrics_count_completed_items_gate_advances_and_latency(
    feed: Feed, watchers: WatcherProcesses, handler: HandlerService
) -> None:
    feed.add_partition("p", [(0, b"1"), (0, b"2"), (1, b"3")])
    port = free_port()
    watchers.start("--handler", handler.url, *FAST, "--metrics-port", str(port))
    wait_until(lambda: feed.status("p").status == "complete", timeout=60, what="p to complete")
    text = scrape(port, feedproc_items_completed_total=3, feedproc_gate_advances_total=1)
    # the processing histogram per gate (its pipeline name, else its number)
    assert metric(text, "feedproc_processing_seconds_count", queue="default", gate="0") == 2
    assert metric(text, "feedproc_processing_seconds_bucket", queue="default", gate="0", le="+Inf") == 2
    assert metric(text, "feedproc_processing_seconds_bucket", queue="default", gate="1", le="+Inf") == 1
    assert metric(text, "feedproc_backlog_items", queue="default") == 0
    assert "# TYPE feedproc_leases_held gauge" in text


@dialect_independent
def test_metrics_count_retries_and_failures(feed: Feed, watchers: WatcherProcesses, handler: HandlerService) -> None:
    handler.behavior = lambda body: (503, "busy")
    feed.add_partition("p", [(0, b"1")])
    port = free_port()
    watchers.start("--handler", handler.url, *FAST, "--max-attempts", "2", "--metrics-port", str(port))
    wait_until(lambda: feed.status("p").status == "failed", timeout=60, what="p to fail")
    scrape(port, feedproc_items_retried_total=1, feedproc_items_failed_total=1, feedproc_items_processed_total=2)


@dialect_independent
def test_health_and_metrics_can_share_one_port(watchers: WatcherProcesses, handler: HandlerService) -> None:
    port = free_port()
    watchers.start("--handler", handler.url, *FAST, "--health-port", str(port), "--metrics-port", str(port))
    assert wait_until(lambda: get(port, "/healthz"), timeout=60, what="/healthz").status_code == 200
    scrape(port, feedproc_leases_held=0)


@dialect_independent
def test_healthz_turns_503_once_the_heartbeat_is_older_than_a_lease(db_url: str) -> None:
    """A watcher that never renews its leases (here: one that is not running) is reported unhealthy."""
    from feedproc.store import Store
    from feedproc.watcher import Watcher, WatcherConfig

    store = Store(db_url)
    watcher = Watcher(store, processor=None, config=WatcherConfig(lease_seconds=1.0))
    server = MonitorServer("127.0.0.1", 0, {"/healthz": WatcherProbe(watcher).health}).start()
    try:
        healthy = get(server.port, "/healthz")
        assert healthy is not None and healthy.status_code == 200
        stale = wait_until(
            lambda: (r := get(server.port, "/healthz")) is not None and r.status_code == 503 and r,
            timeout=30,
            what="/healthz to report the stale heartbeat",
        )
        [reason] = stale.json()["reasons"]
        assert reason.startswith("heartbeat: leases last renewed") and "(lease 1s)" in reason
    finally:
        server.close()
        store.close()


# ---------------------------------------------------------------- issue 14: liveness, readiness, logs


@dialect_independent
def test_livez_stays_200_while_the_handler_is_down_and_readyz_names_it_redacted(
    feed: Feed, watchers: WatcherProcesses
) -> None:
    """A handler outage makes the watcher unready, never dead: Kubernetes must not restart every
    watcher for it. Credentials of the handler URL are shown nowhere: probes, logs (JSON lines)."""
    port, dead = free_port(), free_port()
    feed.add_partition("p", [(0, b"1")])
    watchers.start(
        "--handler",
        f"http://user:secret@127.0.0.1:{dead}/handle",
        "--header",
        "X-Api-Key: tok-abcdef123456",  # (an Authorization header would conflict with the URL's credentials)
        "--log-format",
        "json",
        *FAST,
        "--health-port",
        str(port),
    )
    ready = wait_until(lambda: get(port, "/readyz"), timeout=60, what="/readyz")
    assert ready.status_code == 503
    # The probe asks the handler's base URL without its credentials (any HTTP answer means up).
    assert [r for r in ready.json()["reasons"] if r.startswith(f"handler http://127.0.0.1:{dead}/:")], ready.text
    assert "secret" not in ready.text and "user" not in ready.text
    live = get(port, "/livez")
    assert live is not None and live.status_code == 200, live and live.text
    assert live.json()["status"] == "ok" and live.json()["queue"] == "default"
    health = get(port, "/healthz")
    assert health is not None and health.status_code == 503
    # Deliveries keep failing against the dead handler while it stays live.
    wait_until(lambda: feed.items("p")[0].attempts >= 2, timeout=60, what="two attempts")
    assert get(port, "/livez").status_code == 200  # type: ignore[union-attr]
    for body in (ready.text, live.text, health.text):
        assert "secret" not in body and "user" not in body

    watchers.stop_all()
    assert watchers.processes[0].returncode == 0
    output = watchers.logs()
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines, "the watcher logged nothing"
    parsed = [json.loads(line) for line in lines]  # every line on stderr (and stdout) is JSON
    assert all({"time", "level", "logger", "message"} <= set(line) for line in parsed)
    assert any(line.get("handler") == f"http://***@127.0.0.1:{dead}/handle" for line in parsed), output
    assert "secret" not in output and "tok-abcdef123456" not in output


class FakeStore:
    def __init__(self) -> None:
        self.down: str | None = None

    def ping(self) -> None:
        if self.down:
            raise DatabaseUnavailable(self.down)


class FakeWatcher:
    """What the probes read of a watcher."""

    def __init__(self) -> None:
        self.id = "w-1"
        self.config = SimpleNamespace(queue="default", lease_seconds=5.0)
        self.store = FakeStore()
        self.heartbeat_age = 1.0


def probe(route: Any) -> tuple[int, dict[str, Any]]:
    status, kind, body = route()
    assert kind == "application/json"
    return status, json.loads(body)


def test_livez_fails_when_the_heartbeat_is_stale_while_the_database_answers() -> None:
    watcher = FakeWatcher()
    probes = WatcherProbe(watcher)
    assert probe(probes.live)[0] == 200
    watcher.heartbeat_age = 6.0
    status, body = probe(probes.live)
    assert status == 503 and body["reasons"] == ["heartbeat: leases last renewed 6.0s ago (lease 5s)"]


def test_livez_stays_200_when_the_database_is_why_the_heartbeat_is_stale() -> None:
    """Restarting watchers does not bring a database back."""
    watcher = FakeWatcher()
    watcher.heartbeat_age = 60.0
    watcher.store.down = "connection refused by postgresql://app:hunter22@db/feedproc"
    probes = WatcherProbe(watcher)
    status, body = probe(probes.live)
    assert status == 200 and "the database is not answering" in body["note"]
    assert "hunter22" not in body["note"] and "postgresql://***@db/feedproc" in body["note"]
    status, body = probe(probes.ready)
    assert status == 503 and body["reasons"][0].startswith("database: connection refused")
    status, body = probe(probes.health)
    assert status == 503 and len(body["reasons"]) == 2  # the database, the heartbeat


def test_a_dead_write_loop_fails_every_probe_with_its_reason_redacted() -> None:
    watcher = FakeWatcher()
    watcher.fatal = "write loop: cannot write answers to postgresql://app:hunter22@db/x for 30s"  # type: ignore[attr-defined]
    probes = WatcherProbe(watcher)
    for route in (probes.live, probes.ready, probes.health):
        status, body = probe(route)
        assert status == 503
        assert body["reasons"] == ["watcher: write loop: cannot write answers to postgresql://***@db/x for 30s"]


def test_probe_checks_run_at_once_within_one_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hanging database and a hanging handler cost one check timeout, not two (probe timeouts are ~5s)."""
    release = threading.Event()
    monkeypatch.setattr(health, "CHECK_TIMEOUT", 0.5)
    watcher = FakeWatcher()
    watcher.store.ping = lambda: release.wait(10)  # type: ignore[method-assign,assignment]
    monkeypatch.setattr(health, "_handler", lambda url: (lambda: release.wait(10), "handler x"))
    try:
        started = time.monotonic()
        status, body = probe(WatcherProbe(watcher, "http://x/").ready)
        elapsed = time.monotonic() - started
    finally:
        release.set()
    assert status == 503 and len(body["reasons"]) == 2
    assert elapsed < 0.95, elapsed


def test_the_monitor_server_bounds_its_requests_but_always_answers_probes() -> None:
    """With MAX_CONNECTIONS connections each in a /metrics request, another /metrics request is
    answered 503 at once, and /livez still 200."""
    release, entered = threading.Event(), []

    def slow_metrics() -> tuple[int, str, bytes]:
        entered.append(1)
        release.wait(30)
        return 200, "text/plain", b"ok"

    routes = {"/livez": lambda: (200, "application/json", b"{}"), "/metrics": slow_metrics}
    server = MonitorServer("127.0.0.1", 0, routes).start()
    busy = [threading.Thread(target=get, args=(server.port, "/metrics")) for _ in range(health.MAX_CONNECTIONS)]
    try:
        for thread in busy:
            thread.start()
        wait_until(lambda: len(entered) == health.MAX_CONNECTIONS, timeout=10, what="every connection in a request")
        assert get(server.port, "/metrics").status_code == 503  # type: ignore[union-attr]
        assert get(server.port, "/livez").status_code == 200  # type: ignore[union-attr]
    finally:
        release.set()
        for thread in busy:
            thread.join(timeout=30)
        server.close()
    assert get(server.port, "/livez") is None  # closed


def test_a_new_connection_at_the_cap_closes_the_oldest_idle_one() -> None:
    server = MonitorServer("127.0.0.1", 0, {"/livez": lambda: (200, "application/json", b"{}")}).start()
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(health.MAX_CONNECTIONS)]
    try:
        time.sleep(serving.ROOM_DELAY)  # connections that sent nothing yet are safe for this long
        assert get(server.port, "/livez").status_code == 200  # type: ignore[union-attr]
        idle[0].settimeout(10)
        assert idle[0].recv(1024).startswith(b"HTTP/1.1 503 ")  # told why, then closed
    finally:
        for connection in idle:
            connection.close()
        server.close()


def test_the_monitor_server_closes_connections_that_trickle_their_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The header deadline counts from the connection's start: bytes arriving do not extend it."""
    monkeypatch.setattr(health, "CONNECTION_TIMEOUT", 0.5)
    server = MonitorServer("127.0.0.1", 0, {"/livez": lambda: (200, "application/json", b"{}")}).start()
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as connection:
            started = time.monotonic()
            connection.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n")
            with pytest.raises(OSError):
                while time.monotonic() - started < 10:
                    time.sleep(0.1)
                    connection.sendall(b"X-Slow: 1\r\n")
            assert time.monotonic() - started < 3
    finally:
        server.close()


@dialect_independent
def test_slowloris_clients_do_not_starve_the_watchers_probes(
    watchers: WatcherProcesses, handler: HandlerService
) -> None:
    """Twice MAX_CONNECTIONS connections trickling a header line every second, for longer than the
    header deadline: /livez answers 200 within two seconds throughout, and the server closes them."""
    port = free_port()
    watchers.start("--handler", handler.url, *FAST, "--health-port", str(port))
    wait_until(lambda: get(port, "/livez"), timeout=60, what="/livez")
    loris = Slowloris(port, 2 * health.MAX_CONNECTIONS, path="/metrics")
    try:
        wait_until(lambda: loris.opened >= 2 * health.MAX_CONNECTIONS, timeout=30, what="the slow connections")
        assert probe_for(f"http://127.0.0.1:{port}/livez", health.CONNECTION_TIMEOUT + 3) == []
        assert loris.closed > 0
    finally:
        loris.close()


def test_the_monitor_server_closes_connections_that_send_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health, "CONNECTION_TIMEOUT", 0.5)
    server = MonitorServer("127.0.0.1", 0, {"/livez": lambda: (200, "application/json", b"{}")}).start()
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as connection:
            connection.settimeout(10)
            started = time.monotonic()
            assert connection.recv(1024) == b""  # closed by the server, long before our own timeout
            assert time.monotonic() - started < 5
    finally:
        server.close()
