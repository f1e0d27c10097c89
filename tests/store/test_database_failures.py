"""What a database does to feedproc (issue 30, finding 11): each way a real database fails reaches
producers as what it is, in one clear message, and a conflict the database asks to run again is
run again. Each class is made for real on the test's own database (see `tests/outages.py`);
MariaDB's read-only mode is global to its server, so its test is a fault test (tests/e2e/test_faults.py).
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import NullPool, create_engine, event, text

from feedproc import Feed
from feedproc.core.errors import DatabaseRefusesWrites, DatabaseUnavailable
from feedproc.store import Store

from ..outages import (
    as_admin,
    database_name,
    end_sessions,
    pg_read_only,
    pg_role,
    read_only_directory,
    tiny_disk,
    tiny_tablespace,
)
from ..support import wait_until


def sqlite_file(db_url: str) -> Path:
    return Path(db_url.removeprefix("sqlite:///"))


def refuses_writes_and_still_reads(feed: Feed) -> None:
    with pytest.raises(DatabaseRefusesWrites) as refused:
        feed.add_partition("q", [(0, b"{}")])
    assert str(refused.value) == "the database is read-only"
    assert feed.status("p").status == "available"  # reading works throughout


@pytest.mark.postgres_only
def test_a_read_only_postgresql_refuses_writes_saying_so_and_still_reads(
    feed: Feed, db_url: str, pg_admin_url: str
) -> None:
    feed.add_partition("p", [(0, b"{}")])
    with pg_read_only(pg_admin_url, db_url):
        refuses_writes_and_still_reads(feed)
    feed.add_partition("q", [(0, b"{}")])  # writes again: its read-only session was not kept


@pytest.mark.sqlite_only
def test_a_read_only_sqlite_file_refuses_writes_saying_so_and_still_reads(feed: Feed, db_url: str) -> None:
    feed.add_partition("p", [(0, b"{}")])  # (this Feed's open connection keeps the WAL's files in place)
    with read_only_directory(sqlite_file(db_url).parent), Feed(db_url) as opened_meanwhile:
        refuses_writes_and_still_reads(opened_meanwhile)
    with Feed(db_url) as later:
        later.add_partition("q", [(0, b"{}")])


@pytest.mark.postgres_only
def test_sessions_the_server_ends_are_an_outage_saying_so_and_the_next_call_reconnects(
    db_url: str, pg_admin_url: str
) -> None:
    store = Store(db_url, pre_ping=False)  # as a watcher's: no ping before each call
    try:
        store.ping()
        end_sessions(pg_admin_url, db_url)  # SQLSTATE 57P01, as a shutdown or a failover ends them
        with pytest.raises(DatabaseUnavailable, match="shutting down, restarting or ended the connection"):
            store.ping()
        store.ping()
    finally:
        store.close()


@pytest.mark.postgres_only
def test_a_database_with_no_connection_left_is_unavailable_saying_so(db_url: str, pg_admin_url: str) -> None:
    name = database_name(db_url)
    with pg_role(pg_admin_url, db_url) as url:
        as_admin(pg_admin_url, f'ALTER DATABASE "{name}" CONNECTION LIMIT 0')  # SQLSTATE 53300 for its role
        try:
            with Feed(url) as feed, pytest.raises(DatabaseUnavailable, match="no connection left") as refused:
                feed.summary()
            assert "too many connections" in str(refused.value)  # the server's own words follow
        finally:
            as_admin(pg_admin_url, f'ALTER DATABASE "{name}" CONNECTION LIMIT -1')


@pytest.mark.postgres_only
def test_a_full_disk_refuses_writes_saying_so_and_still_reads(feed: Feed, db_url: str, pg_admin_url: str) -> None:
    feed.add_partition("p", [(0, b"{}")])
    with tiny_tablespace(pg_admin_url) as tablespace:
        as_admin(db_url, f'ALTER TABLE feedproc_items SET TABLESPACE "{tablespace}"')
        try:
            with pytest.raises(DatabaseRefusesWrites, match="the database's disk is full") as refused:
                for n in range(100):  # 2 MB: a few partitions of 200 KB that cannot be compressed
                    feed.add_partition(f"big-{n}", [(0, os.urandom(200_000))])
            assert "No space left on device" in str(refused.value)  # (SQLSTATE 53100)
            assert feed.status("p").status == "available"
        finally:
            as_admin(db_url, "ALTER TABLE feedproc_items SET TABLESPACE pg_default")


def test_a_sqlite_file_on_a_full_disk_refuses_writes_saying_so_and_still_reads(sqlite_template: Path) -> None:
    with tiny_disk() as disk:
        shutil.copy(sqlite_template, disk / "feedproc.db")
        with Feed(f"sqlite:///{disk / 'feedproc.db'}") as feed:
            feed.add_partition("p", [(0, b"{}")])
            with pytest.raises(DatabaseRefusesWrites, match="the database's disk is full") as refused:
                for n in range(100):  # 2 MB: a few partitions of 200 KB
                    feed.add_partition(f"big-{n}", [(0, os.urandom(200_000))])
            assert "database or disk is full" in str(refused.value)  # (SQLITE_FULL)
            assert feed.status("p").status == "available"


@pytest.mark.postgres_only
def test_a_transaction_aborted_by_a_serialization_failure_is_run_again(
    feed: Feed, db_url: str, pg_admin_url: str
) -> None:
    feed.add_partition("p", [(0, b"{}")], sealed=False)
    name = database_name(db_url)
    as_admin(pg_admin_url, f"ALTER DATABASE \"{name}\" SET default_transaction_isolation = 'repeatable read'")
    end_sessions(pg_admin_url, db_url)
    feed.status("p")  # reconnected: its sessions are repeatable read now
    answered: list[Any] = []  # each error the database answered the Feed's statements with
    event.listen(feed.store.engine, "handle_error", lambda context: answered.append(context.original_exception))
    other = create_engine(db_url, poolclass=NullPool).connect()
    errors: list[BaseException] = []

    def seal() -> None:
        try:
            feed.seal("p")
        except BaseException as error:
            errors.append(error)

    try:
        other.execute(text("UPDATE feedproc_partitions SET priority = 1 WHERE key = 'p'"))  # locked, uncommitted
        sealing = threading.Thread(target=seal)
        sealing.start()
        waiting = "SELECT count(*) FROM pg_stat_activity WHERE datname = :name AND wait_event_type = 'Lock'"
        wait_until(lambda: as_admin(pg_admin_url, waiting, name=name)[0][0], what="the seal to wait for the lock")
        other.commit()  # the seal's snapshot is older than this change: SQLSTATE 40001 when it locks the row
        sealing.join(30)
    finally:
        other.close()
    assert errors == []
    assert [getattr(error, "sqlstate", None) for error in answered] == ["40001"]
    status = feed.status("p")
    assert status.sealed and status.priority == 1
