"""A read-only database takes no watcher down (issue 30, finding 11): a watcher waits it out, its
`/readyz` 503 and its `/livez` 200 meanwhile (a restart would not make the database take writes),
says so once when it starts and once when it ends, and finishes its work once writes return; one
started meanwhile waits too. Real watchers in this process, with their monitor server; the
database made read-only for real (`tests/outages.py`). MariaDB's read-only mode is global to its
server: its test is a fault test (tests/e2e/test_faults.py), with `waits_out_read_only`."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from feedproc import Feed, Item, Processor, Response
from feedproc.health import MonitorServer, WatcherProbe
from feedproc.watcher import Watcher

from ..outages import Lines, pg_read_only, read_only_directory
from ..support import FAST, wait_status, wait_until, watching

LEASE = FAST["lease_seconds"]


class Held(Processor):
    """Completes each item once `release` is set; `started` once an item has arrived."""

    def __init__(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()

    async def process(self, item: Item) -> Response:
        self.started.set()
        while not self.release.is_set():
            await asyncio.sleep(0.02)
        return Response(done=True)


@contextlib.contextmanager
def probed(watcher: Watcher) -> Iterator[Callable[[str], httpx.Response]]:
    """The watcher's /livez and /readyz on a monitor server of its own; yields a GET of a path."""
    probe = WatcherProbe(watcher)
    server = MonitorServer("127.0.0.1", 0, {"/livez": probe.live, "/readyz": probe.ready}).start()
    try:
        yield lambda path: httpx.get(f"http://127.0.0.1:{server.port}{path}", timeout=10)
    finally:
        server.close()


def unready_for_read_only(get: Callable[[str], httpx.Response]) -> Any:
    """Wait until /readyz is 503 saying the database is read-only; its reasons."""

    def said() -> Any:
        response = get("/readyz")
        read_only = response.status_code == 503 and "the database is read-only" in response.text
        return response.json()["reasons"] if read_only else None

    return wait_until(said, timeout=30, what="/readyz to say the database is read-only")


def live_and_unready_past_a_lease(get: Callable[[str], httpx.Response]) -> None:
    """/livez 200 and /readyz 503 throughout twice a lease length: the heartbeat goes stale meanwhile,
    and a stale heartbeat is excused while the database refuses writes."""
    deadline = time.monotonic() + 2 * LEASE
    while time.monotonic() < deadline:
        live, ready = get("/livez"), get("/readyz")
        assert (live.status_code, ready.status_code) == (200, 503), (live.text, ready.text)
        time.sleep(0.2)
    assert "heartbeat" in get("/livez").json().get("note", "")  # stale, and excused


def one_outage_said(lines: Lines) -> None:
    assert lines.count("database unavailable") == 1, lines.messages
    assert lines.count("database reachable again") == 1, lines.messages


def waits_out_read_only(watcher_url: str, feed: Feed, read_only: Callable[[], Any]) -> None:
    """A watcher of `watcher_url` delivers the items of a partition; `read_only()` makes the database
    read-only before their answers come; the watcher waits it out and finishes the partition."""
    feed.add_partition("p", [(0, b"{}")] * 3)
    processor = Held()
    with (
        Lines("feedproc.watcher") as lines,
        watching(watcher_url, processor) as running,
        probed(running.watcher) as get,
    ):
        wait_until(processor.started.is_set, what="the items to be delivered")
        with read_only():
            processor.release.set()  # answers that cannot be written now
            unready_for_read_only(get)
            live_and_unready_past_a_lease(get)
        wait_status(feed, "p", "complete")
        wait_until(lambda: get("/readyz").status_code == 200, what="/readyz 200 again")
        assert running.thread.is_alive() and running.watcher.fatal is None
    one_outage_said(lines)


@pytest.mark.postgres_only
def test_a_watcher_waits_out_a_read_only_database_then_finishes_its_work(
    db_url: str, feed: Feed, pg_admin_url: str
) -> None:
    waits_out_read_only(db_url, feed, lambda: pg_read_only(pg_admin_url, db_url))


@contextlib.contextmanager
def read_only(db_url: str, request: pytest.FixtureRequest) -> Iterator[None]:
    """The test's database read-only: a PostgreSQL setting, or read-only storage for a SQLite file."""
    if db_url.startswith("sqlite"):
        with read_only_directory(Path(db_url.removeprefix("sqlite:///")).parent):
            yield
    else:
        with pg_read_only(request.getfixturevalue("pg_admin_url"), db_url):
            yield


@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
def test_a_watcher_started_on_a_read_only_database_waits_and_starts_once_it_takes_writes(
    db_url: str, feed: Feed, request: pytest.FixtureRequest
) -> None:
    feed.add_partition("p", [(0, b"{}")] * 3)  # (SQLite: this Feed's open connection keeps the WAL's files)
    processor = Held()
    processor.release.set()
    with Lines("feedproc.watcher") as lines, contextlib.ExitStack() as outage:
        outage.enter_context(read_only(db_url, request))
        with watching(db_url, processor) as running, probed(running.watcher) as get:
            reasons = unready_for_read_only(get)
            assert reasons == [next(r for r in reasons if r.startswith("database: the database is read-only"))]
            live_and_unready_past_a_lease(get)
            outage.close()  # writes return
            wait_status(feed, "p", "complete")
            assert running.thread.is_alive() and running.watcher.fatal is None
    one_outage_said(lines)
