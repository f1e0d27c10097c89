"""PostgreSQL behind PgBouncer in transaction pooling mode (`?feedproc_pooler=transaction`):
producers, watchers and waiters lose no function. Without the option, psycopg's prepared statements
met other server connections and watchers died ("prepared statement "_pg3_4" does not exist");
LISTEN through the pooler never hears a notification, so watchers listen on a direct connection
(`--listen-db`) or poll."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from feedproc import Feed
from feedproc.core.pipelines import parse_toml

from ..pgbouncer_support import PgBouncer
from ..support import WatcherProcesses, json_of, run_cli, wait_until

pytestmark = pytest.mark.postgres_only

PIPELINE = """
queue = "gpu"
[[gate]]
name = "classify"
number = 0
[[gate]]
name = "rank"
number = 1
collect = "classify"
"""


@pytest.fixture
def pooled_url(db_url: str, pgbouncer: PgBouncer) -> str:
    return pgbouncer.url(db_url)


def listening_sessions(db_url: str) -> int:
    """How many server sessions of this database sit in LISTEN (read on a direct connection)."""
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            query = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN %'"
            return int(conn.execute(text(query)).scalar_one())
    finally:
        engine.dispose()


def test_watchers_behind_a_transaction_pooler_drain_a_fan_out_and_its_fan_in(pooled_url: str, tmp_path: Path) -> None:
    feed = Feed(pooled_url)
    feed.apply_pipeline(parse_toml(PIPELINE))
    files = [f"f{n}" for n in range(40)]
    for n in range(6):  # each connection runs the same statements many times: psycopg would prepare them
        feed.add_partition(
            f"upload-{n}", [*({"gate": 0, "data": {"file": f}} for f in files), {"gate": 1}], queue="gpu"
        )
    watchers = WatcherProcesses(pooled_url, tmp_path)
    try:
        for _ in range(2):
            watchers.start(
                "--queue", "gpu", "--processor", "cli_processors:Joins", "--concurrency", "8", "--poll-interval", "0.2"
            )
        wait_until(
            lambda: all(feed.status(f"upload-{n}").status == "complete" for n in range(6)),
            timeout=120,
            what="6 uploads",
        )
    finally:
        watchers.stop_all()
    logs = watchers.logs()
    assert "prepared statement" not in logs and " ERROR " not in logs and " WARNING " not in logs, logs
    for n in range(6):
        [joined] = feed.items(f"upload-{n}", gate=1)
        assert [row[1]["label"] for row in json_of(joined.result)["rows"]] == [f.upper() for f in files]
    feed.close()


@pytest.fixture
def pooled_watchers(pooled_url: str, tmp_path: Path) -> Iterator[WatcherProcesses]:
    """Watcher processes behind the pooler, stopped after the test."""
    watchers = WatcherProcesses(pooled_url, tmp_path)
    try:
        yield watchers
    finally:
        watchers.stop_all()


def start_logged(watchers: WatcherProcesses, *args: str) -> None:
    """A watcher of `cli_processors:LoggedSlow` with `args` (its deliveries logged beside its log)."""
    log = watchers.log_dir / "deliveries.log"
    watchers.start("--processor", "cli_processors:LoggedSlow", *args, FEEDPROC_TEST_DELIVERY_LOG=str(log))


def completes(feed: Feed, key: str, timeout: float) -> None:
    wait_until(lambda: feed.status(key).status == "complete", timeout=timeout, what=f"{key} to complete")


def test_without_a_listen_database_a_watcher_behind_the_pooler_polls(
    db_url: str, pooled_url: str, pooled_watchers: WatcherProcesses
) -> None:
    feed = Feed(pooled_url)
    feed.add_partition("before", [(0, b"{}")])
    start_logged(pooled_watchers, "--poll-interval", "0.3")
    completes(feed, "before", timeout=60)
    assert listening_sessions(db_url) == 0  # a LISTEN through the pooler would hear nothing
    feed.add_partition("after", [(0, b"{}")])
    completes(feed, "after", timeout=30)
    assert "notifications" not in pooled_watchers.logs(), pooled_watchers.logs()
    feed.close()


def test_a_listen_database_beside_the_pooler_wakes_a_watcher_at_once(
    db_url: str, pooled_url: str, pooled_watchers: WatcherProcesses
) -> None:
    feed = Feed(pooled_url)
    # Polls 60 s apart: only a notification finds the partition within the test's 20 s.
    start_logged(pooled_watchers, "--poll-interval", "60", "--listen-db", db_url)
    wait_until(
        lambda: listening_sessions(db_url) == 1, timeout=30, what="the watcher to LISTEN on the direct connection"
    )
    feed.add_partition("first", [(0, b"{}")])  # found by the watcher's first poll, or a notification
    completes(feed, "first", timeout=30)
    added = time.monotonic()
    feed.add_partition("woken", [(0, json.dumps({"n": 1}).encode())])
    completes(feed, "woken", timeout=20)
    assert time.monotonic() - added < 20
    feed.close()


def test_wait_through_the_pooler_returns_when_the_partition_completes(
    pooled_url: str, pooled_watchers: WatcherProcesses
) -> None:
    feed = Feed(pooled_url)
    feed.add_partition("waited", [(0, b"{}")])
    start_logged(pooled_watchers, "--poll-interval", "0.3")
    waited = run_cli(pooled_url, "wait", "waited", "--timeout", "60")
    assert waited.returncode == 0 and "complete" in waited.stdout, waited.stderr
    feed.close()


def test_a_pooler_mode_feedproc_does_not_know_exits_2_in_one_line_naming_it() -> None:
    done = run_cli("postgresql://postgres@127.0.0.1:1/x?feedproc_pooler=statement", "status")
    said = "feedproc: error: feedproc_pooler='statement' in the database URL: the pooler's mode must be transaction"
    assert (done.returncode, done.stderr.strip()) == (2, said)


def test_a_listen_database_that_is_not_postgresql_is_refused(pooled_url: str) -> None:
    done = run_cli(pooled_url, "watch", "--handler", "http://127.0.0.1:9/", "--listen-db", "sqlite:///x.db", timeout=30)
    said = done.stderr.strip()  # one line (the database's user name is masked in it, as a credential)
    assert (
        done.returncode == 2 and said.startswith("feedproc: error: the listen database is where") and "\n" not in said
    )
