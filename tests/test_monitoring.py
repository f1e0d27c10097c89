"""`feedproc watch --health-port N --metrics-port N` (issue 6): a real watcher process answers
Kubernetes probes and Prometheus scrapes on its own small HTTP server, on SQLite and PostgreSQL."""

from __future__ import annotations

import httpx
import pytest

from feedproc import Feed

from .api_support import free_port
from .support import HandlerService, WatcherProcesses, wait_until

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


def scrape(port: int, *expected: str) -> str:
    """Scrape /metrics until every `expected` line is in it."""

    def ready() -> str | None:
        response = get(port, "/metrics")
        text = response.text if response is not None else ""
        return text if all(line in text.splitlines() for line in expected) else None

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
    wait_until(lambda: feed.status("p")["status"] == "complete", timeout=60, what="p to complete")
    text = scrape(
        port,
        'feedproc_items_completed_total{queue="default"} 3',
        'feedproc_gate_advances_total{queue="default"} 1',
        'feedproc_processing_seconds_count{queue="default"} 3',
    )
    assert 'feedproc_processing_seconds_bucket{queue="default",le="+Inf"} 3' in text
    assert 'feedproc_backlog_items{queue="default"} 0' in text
    assert "# TYPE feedproc_leases_held gauge" in text


@dialect_independent
def test_metrics_count_retries_and_failures(feed: Feed, watchers: WatcherProcesses, handler: HandlerService) -> None:
    handler.behavior = lambda body: (503, "busy")
    feed.add_partition("p", [(0, b"1")])
    port = free_port()
    watchers.start("--handler", handler.url, *FAST, "--max-attempts", "2", "--metrics-port", str(port))
    wait_until(lambda: feed.status("p")["status"] == "failed", timeout=60, what="p to fail")
    scrape(
        port,
        'feedproc_items_retried_total{queue="default"} 1',
        'feedproc_items_failed_total{queue="default"} 1',
        'feedproc_items_processed_total{queue="default"} 2',
    )


@dialect_independent
def test_health_and_metrics_can_share_one_port(watchers: WatcherProcesses, handler: HandlerService) -> None:
    port = free_port()
    watchers.start("--handler", handler.url, *FAST, "--health-port", str(port), "--metrics-port", str(port))
    assert wait_until(lambda: get(port, "/healthz"), timeout=60, what="/healthz").status_code == 200
    scrape(port, 'feedproc_leases_held{queue="default"} 0')


@dialect_independent
def test_healthz_turns_503_once_the_heartbeat_is_older_than_a_lease(db_url: str) -> None:
    """A watcher that never renews its leases (here: one that is not running) is reported unhealthy."""
    from feedproc.health import MonitorServer, WatcherProbe
    from feedproc.store import Store
    from feedproc.watcher import Watcher, WatcherConfig

    store = Store(db_url)
    watcher = Watcher(store, processor=None, config=WatcherConfig(lease_seconds=1.0))
    server = MonitorServer("127.0.0.1", 0, {"/healthz": WatcherProbe(watcher).health}).start()
    try:
        assert get(server.port, "/healthz").status_code == 200
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
