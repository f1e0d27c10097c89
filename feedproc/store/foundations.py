"""What SQLite, PostgreSQL and MariaDB/MySQL share below the statements, each in its form per database.

The store writes dialect-neutral SQLAlchemy Core where it can; where the databases need different
statements, each database's `Dialect` (`dialect/`) holds them. This module supplies what the
statements stand on:

* `UTCDateTime`, a timestamp type that reads back as an aware UTC `datetime` on every engine, and
  `Float64`, `Blob` and `LongText`, whose MySQL forms hold what the others do;
* `db_now()` and `db_now_plus(seconds)`, SQL expressions for the *database's* clock (lease
  deadlines, retry times and `not_before` are never judged on a watcher host's clock);
* `make_engine(url)`, which normalises the URL and configures each engine for concurrent use
  (SQLite: WAL, `synchronous=NORMAL`, `busy_timeout`, `BEGIN IMMEDIATE` for writes;
  PostgreSQL: psycopg 3, pre-ping so a restarted server is survived, no prepared statements behind
  a transaction pooler (`pooling.py`); MariaDB/MySQL: PyMySQL,
  READ COMMITTED like PostgreSQL, UTC sessions, ANSI quoting and `||`);
* `DriverStatement`, how the PostgreSQL hot path's statements run: on the driver's own cursor.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import BigInteger, DateTime, Engine, Float, LargeBinary, Text, create_engine, event, make_url
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import URL, Connection
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import ColumnElement, FunctionElement
from sqlalchemy.types import TypeDecorator

from ..core.errors import InvalidInput
from .pooling import connection_defaults, split_pooler
from .prefixes import DEFAULT_PREFIX, PREFIX_OPTION, install, qualify

SQLITE_BUSY_TIMEOUT_MS = 10_000
#: The dialect names of MariaDB and MySQL (SQLAlchemy names a MariaDB reached by `mysql://` "mysql").
MYSQL = ("mysql", "mariadb")
#: A double-precision number (MySQL's FLOAT is single precision: durations would lose their
#: milliseconds).
Float64 = Float().with_variant(mysql.DOUBLE(asdecimal=False), *MYSQL)
#: An item's data (MySQL's BLOB stops at 64 KiB).
Blob = LargeBinary().with_variant(mysql.LONGBLOB(), *MYSQL)
#: Text of any length: errors with their traceback, in-flight records, windows (MySQL's TEXT stops
#: at 64 KiB).
LongText = Text().with_variant(mysql.MEDIUMTEXT(), *MYSQL)
#: Execution option that makes a SQLite transaction start with BEGIN IMMEDIATE.
WRITE_OPTION = "feedproc_write"


def table_options(bind: Engine | Connection) -> dict[str, str]:
    """Options for CREATE TABLE. On MariaDB/MySQL: InnoDB, utf8mb4, compared byte for byte without
    padding, as PostgreSQL and SQLite compare text (the server's default collation would make
    partition key 'A' the same as 'a', and 'a' the same as 'a ')."""
    if bind.dialect.name not in MYSQL:
        return {}
    collation = "utf8mb4_nopad_bin" if getattr(bind.dialect, "is_mariadb", False) else "utf8mb4_0900_bin"
    return {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": collation}


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored as UTC; always returned as an aware `datetime` in UTC.

    PostgreSQL stores `timestamptz`. SQLite stores the text `YYYY-MM-DD HH:MM:SS.ffffff`, the same
    shape `db_now()` produces there, so comparisons in SQL are plain string comparisons. MariaDB and
    MySQL store `DATETIME(6)` in UTC (their sessions run in UTC, see `make_engine`).
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Any) -> Any:
        if dialect.name in MYSQL:
            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return dialect.type_descriptor(self.impl)

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name != "postgresql" else value

    def process_result_value(self, value: Any, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):  # a raw SQLite value read through a textual/aggregate column
            value = datetime.fromisoformat(value)
        moment: datetime = value
        if moment.tzinfo is None:
            return moment.replace(tzinfo=UTC)
        return moment.astimezone(UTC)


class db_now(FunctionElement[datetime]):  # noqa: N801 - reads like the SQL function it is
    """The database server's current time (UTC)."""

    type = UTCDateTime()
    inherit_cache = True


class db_now_plus(FunctionElement[datetime]):  # noqa: N801
    """The database server's current time plus a number of seconds (a float expression)."""

    type = UTCDateTime()
    inherit_cache = True


_SQLITE_NOW_FORMAT = "'%Y-%m-%d %H:%M:%f000'"  # %f is SS.SSS; the zeros make microseconds


@compiles(db_now, "postgresql")
def _pg_now(element: db_now, compiler: Any, **kw: Any) -> str:
    return "now()"


@compiles(db_now, "sqlite")
def _sqlite_now(element: db_now, compiler: Any, **kw: Any) -> str:
    return f"strftime({_SQLITE_NOW_FORMAT}, 'now')"


@compiles(db_now, "mysql")
@compiles(db_now, "mariadb")
def _mysql_now(element: db_now, compiler: Any, **kw: Any) -> str:
    return "UTC_TIMESTAMP(6)"


@compiles(db_now_plus, "postgresql")
def _pg_now_plus(element: db_now_plus, compiler: Any, **kw: Any) -> str:
    (seconds,) = element.clauses
    return f"(now() + CAST({compiler.process(seconds, **kw)} AS DOUBLE PRECISION) * interval '1 second')"


@compiles(db_now_plus, "sqlite")
def _sqlite_now_plus(element: db_now_plus, compiler: Any, **kw: Any) -> str:
    (seconds,) = element.clauses
    modifier = f"printf('%+.6f seconds', {compiler.process(seconds, **kw)})"
    return f"strftime({_SQLITE_NOW_FORMAT}, 'now', {modifier})"


@compiles(db_now_plus, "mysql")
@compiles(db_now_plus, "mariadb")
def _mysql_now_plus(element: db_now_plus, compiler: Any, **kw: Any) -> str:
    (seconds,) = element.clauses
    micros = f"CAST(ROUND({compiler.process(seconds, **kw)} * 1000000) AS SIGNED)"
    return f"TIMESTAMPADD(MICROSECOND, {micros}, UTC_TIMESTAMP(6))"


class db_minute(FunctionElement[datetime]):  # noqa: N801
    """The start of the database clock's current minute (UTC): a throughput bucket."""

    type = UTCDateTime()
    inherit_cache = True


@compiles(db_minute, "postgresql")
def _pg_minute(element: db_minute, compiler: Any, **kw: Any) -> str:
    return "date_trunc('minute', now())"


@compiles(db_minute, "sqlite")
def _sqlite_minute(element: db_minute, compiler: Any, **kw: Any) -> str:
    return "strftime('%Y-%m-%d %H:%M:00.000000', 'now')"


@compiles(db_minute, "mysql")
@compiles(db_minute, "mariadb")
def _mysql_minute(element: db_minute, compiler: Any, **kw: Any) -> str:
    # (no DATE_FORMAT: its `%` would be taken for a parameter by the driver's paramstyle)
    now = "UTC_TIMESTAMP(6)"  # one value throughout a statement
    return f"TIMESTAMP(DATE({now}), MAKETIME(HOUR({now}), MINUTE({now}), 0))"


class seconds_until(FunctionElement[float]):  # noqa: N801 - reads like the SQL it renders
    """Seconds from the database's now until a timestamp column (negative when it has passed)."""

    type = Float()
    inherit_cache = True


@compiles(seconds_until, "postgresql")
def _pg_seconds_until(element: seconds_until, compiler: Any, **kw: Any) -> str:
    (column,) = element.clauses
    return f"EXTRACT(EPOCH FROM ({compiler.process(column, **kw)} - now()))"


@compiles(seconds_until, "sqlite")
def _sqlite_seconds_until(element: seconds_until, compiler: Any, **kw: Any) -> str:
    (column,) = element.clauses
    return f"((julianday({compiler.process(column, **kw)}) - julianday('now')) * 86400.0)"


@compiles(seconds_until, "mysql")
@compiles(seconds_until, "mariadb")
def _mysql_seconds_until(element: seconds_until, compiler: Any, **kw: Any) -> str:
    (column,) = element.clauses
    return f"(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), {compiler.process(column, **kw)}) / 1000000.0)"


class whole(FunctionElement[int]):  # noqa: N801 - reads like the SQL it renders
    """The whole part of a non-negative number, as a 64-bit integer: FLOOR where the database has
    it for certain (SQLite's is an optional build of its math functions: a CAST truncates)."""

    type = BigInteger()
    inherit_cache = True


@compiles(whole)
def _whole(element: whole, compiler: Any, **kw: Any) -> str:
    (value,) = element.clauses
    return f"CAST(FLOOR({compiler.process(value, **kw)}) AS BIGINT)"


@compiles(whole, "mysql")
@compiles(whole, "mariadb")
def _mysql_whole(element: whole, compiler: Any, **kw: Any) -> str:
    (value,) = element.clauses
    return f"CAST(FLOOR({compiler.process(value, **kw)}) AS SIGNED)"


@compiles(whole, "sqlite")
def _sqlite_whole(element: whole, compiler: Any, **kw: Any) -> str:
    (value,) = element.clauses
    return f"CAST({compiler.process(value, **kw)} AS INTEGER)"


def seconds_from_now(seconds: float | ColumnElement[Any]) -> ColumnElement[datetime]:
    """`now() + seconds` on the database clock; `seconds` may be a Python number or SQL."""
    from sqlalchemy import Float, literal

    if not isinstance(seconds, ColumnElement):
        seconds = literal(float(seconds), Float)
    return db_now_plus(seconds)


def normalize_url(url: str | URL) -> URL:
    """Accept `postgresql://` (and `postgres://`) as psycopg 3 URLs and `mysql://`/`mariadb://` as
    PyMySQL ones; leave others as given.
    InvalidInput for what is not a database URL at all (a bare file name, say; see `parse_db_url`)
    or names a database feedproc does not support."""
    parsed = url if isinstance(url, URL) else parse_db_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    elif parsed.drivername in MYSQL:
        parsed = parsed.set(drivername=parsed.drivername + "+pymysql")
    if parsed.get_backend_name() not in ("sqlite", "postgresql", *MYSQL):
        raise InvalidInput(
            f"unsupported database {parsed.get_backend_name()!r}: use sqlite:///PATH, postgresql:// or mysql://"
        )
    split_pooler(parsed)  # an unknown pooler, or one in front of another database: refused here
    return parsed


def parse_db_url(url: str) -> URL:
    """`url` parsed, or InvalidInput in one line naming what is wrong with it (its password hidden):
    not a URL SQLAlchemy can read (a bare file name, a port that is not a number), a SQLite URL with
    two slashes (`sqlite://feedproc.db`, whose file SQLAlchemy would take for a host), or a port out
    of range. The drivers would otherwise refuse these later, with a traceback."""
    shown = redact_db_url(url)
    rest = url.removeprefix("sqlite://")
    if rest != url and rest[:1] not in ("", "/", "?"):
        like = f"sqlite:///{rest}" if "@" not in rest else "sqlite:///feedproc.db"
        raise InvalidInput(
            f"{shown!r} is not a SQLite URL: a file's URL has three slashes, like {like} "
            "(four before an absolute path: sqlite:////var/lib/feedproc.db)"
        )
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise InvalidInput(
            f"{shown!r} is not a database URL: use sqlite:///PATH, postgresql://HOST/DB or mysql://HOST/DB"
        ) from None
    if parsed.port is not None and not 0 < parsed.port < 65536:
        raise InvalidInput(f"{shown!r}: port {parsed.port} is out of range (1 to 65535)")
    return parsed


def redact_db_url(url: str) -> str:
    """A database URL as it may be shown: its password hidden (its user information, when the URL
    cannot be parsed), and the values of secret query parameters (`?password=`)."""
    from ..core.redaction import redact_text

    try:
        return redact_text(make_url(url).render_as_string(hide_password=True))
    except (ArgumentError, ValueError):
        scheme, separator, rest = url.partition("://")
        if "@" in rest:
            rest = "***@" + rest.rsplit("@", 1)[1]
        return redact_text(scheme + separator + rest)


def make_engine(
    url: str | URL, *, pool_size: int = 5, pre_ping: bool = True, table_prefix: str = DEFAULT_PREFIX
) -> Engine:
    """Create an engine configured for feedproc's concurrency model on each database, its
    statements under `table_prefix` (see `prefixes.py`)."""
    parsed = normalize_url(url)
    options = {PREFIX_OPTION: table_prefix}
    if parsed.get_backend_name() == "sqlite":
        engine = _sqlite_engine(parsed, options)
        install(engine, table_prefix)
        return engine
    if parsed.get_backend_name() == "postgresql":
        try:
            import psycopg  # noqa: F401 - asked here so that a missing driver says how to get it
        except ImportError:
            raise InvalidInput("PostgreSQL needs its driver: pip install 'feedproc[postgres]'") from None
        parsed, pooler = split_pooler(parsed)
        connect_args: dict[str, Any] = {"application_name": "feedproc", **connection_defaults(parsed)}
        if pooler == "transaction":
            # Never prepared: the next execution may meet another server connection (`pooling.py`).
            connect_args["prepare_threshold"] = None
        engine = create_engine(
            parsed,
            execution_options=options,
            # Producers test a pooled connection before use; watchers skip the round trip (a
            # disconnect invalidates the whole pool anyway, and their writes are retried).
            pool_pre_ping=pre_ping,
            pool_size=pool_size,
            max_overflow=pool_size,
            future=True,
            connect_args=connect_args,
        )
        install(engine, table_prefix)
        return engine
    if parsed.get_backend_name() in MYSQL:
        engine = _mysql_engine(parsed, options, pool_size=pool_size, pre_ping=pre_ping)
        install(engine, table_prefix)
        return engine
    raise InvalidInput(
        f"unsupported database {parsed.get_backend_name()!r}: use sqlite:///PATH, postgresql:// or mysql://"
    )


#: What every MariaDB/MySQL session of feedproc runs first. UTC, so that DATETIME columns and
#: `UTC_TIMESTAMP()` agree whatever the server's zone; ANSI_QUOTES and PIPES_AS_CONCAT, so that the
#: statements written in standard SQL for SQLite and PostgreSQL (double-quoted names, `||`) mean the
#: same here.
MYSQL_SESSION = "SET time_zone = '+00:00', sql_mode = CONCAT(@@sql_mode, ',ANSI_QUOTES,PIPES_AS_CONCAT')"


def _mysql_engine(url: URL, options: dict[str, Any], *, pool_size: int, pre_ping: bool) -> Engine:
    try:
        import pymysql  # noqa: F401 - asked here so that a missing driver says how to get it
    except ImportError:
        raise InvalidInput("MariaDB/MySQL needs its driver: pip install 'feedproc[mysql]'") from None
    return create_engine(
        url,
        execution_options=options,
        # READ COMMITTED, as on PostgreSQL: each statement sees what committed before it, and InnoDB
        # takes no gap locks (REPEATABLE READ's would make concurrent inserts and fetches wait and
        # deadlock on ranges no one writes).
        isolation_level="READ COMMITTED",
        pool_pre_ping=pre_ping,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_recycle=3600,
        connect_args={"connect_timeout": 10, "init_command": MYSQL_SESSION, "charset": "utf8mb4"},
    )


def _sqlite_engine(url: URL, options: dict[str, Any]) -> Engine:
    if sqlite3.sqlite_version_info < (3, 35):
        raise RuntimeError(f"SQLite {sqlite3.sqlite_version} is too old; feedproc needs 3.35 or newer")
    engine = create_engine(
        url,
        execution_options=options,
        connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we issue BEGIN ourselves (below)
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # A deferred BEGIN that later upgrades to a write fails with "database is locked" at once,
        # whatever busy_timeout says; BEGIN IMMEDIATE waits for the write lock up front.
        immediate = conn.get_execution_options().get(WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def stored_bytes(value: Any) -> bytes:
    """An item's data as the bytes a processor gets. SQLite keeps whatever type a row was written
    with: a producer writing with SQL may have put TEXT (or a number) in the BLOB column, which is
    its UTF-8 here, the same bytes `CAST(... AS BLOB)` would have stored."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return str(value).encode("utf-8", "surrogatepass")


def pg_bigint_array(values: Iterable[int]) -> str:
    """A PostgreSQL array literal (`{1,2,3}`) of integers, bound as text and cast in the SQL
    (`CAST(:ids AS bigint[])`): psycopg's list dumper is pure Python, about 1 µs an element;
    joining the numbers is a tenth of that, and the hot path binds a few hundred per statement."""
    return "{" + ",".join(map(str, map(int, values))) + "}"


class DriverStatement:
    """A statement of the PostgreSQL hot path (the fetch, its in-flight record, the common "done"),
    run on the driver's own cursor inside the SQLAlchemy connection's transaction. Rows come back as
    plain tuples: SQLAlchemy's statement and result handling cost about 500 µs of watcher CPU per
    fetch of 100 items (1,180 against 940 µs with a driver cursor on one SQLAlchemy connection, 333
    on a bare one), more than the in-flight record the fetch writes. Errors take SQLAlchemy's own
    path: a lost connection is invalidated, and the error is raised as `sqlalchemy.exc.DBAPIError`
    (`OperationalError`, ...) so callers translate it like any other."""

    def __init__(self, sql: str) -> None:
        from sqlalchemy import text
        from sqlalchemy.dialects.postgresql.psycopg import dialect

        self.clause = text(sql)
        self.sql = str(self.clause.compile(dialect=dialect()))  # type: ignore[no-untyped-call]  # `:name` → `%(name)s`
        self._qualified: dict[str, str] = {DEFAULT_PREFIX: self.sql}  # the text under each table prefix

    #: Called with the connection and the statement before each execution, when set: SQLAlchemy's
    #: engine events do not see these statements (the benchmark and the tests count them this way).
    observer: ClassVar[Callable[[Connection, str], None] | None] = None

    def rows(self, conn: Connection, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        """Execute, returning every row as a tuple."""
        with self._cursor(conn, params) as cursor:
            return cursor.fetchall() if cursor.description is not None else []

    def run(self, conn: Connection, params: dict[str, Any]) -> int:
        """Execute, returning the number of rows it changed."""
        with self._cursor(conn, params) as cursor:
            return int(cursor.rowcount)

    @contextmanager
    def _cursor(self, conn: Connection, params: dict[str, Any]) -> Iterator[Any]:
        from sqlalchemy.exc import DBAPIError

        driver = conn.connection.dbapi_connection
        assert driver is not None
        prefix = conn.get_execution_options().get(PREFIX_OPTION, DEFAULT_PREFIX)
        sql = self._qualified.get(prefix) or self._qualified.setdefault(prefix, qualify(self.sql, prefix))
        cursor = driver.cursor()
        if DriverStatement.observer is not None:
            DriverStatement.observer(conn, sql)
        try:
            cursor.execute(sql, params)
            yield cursor
        except conn.dialect.loaded_dbapi.Error as error:
            lost = conn.dialect.is_disconnect(error, driver, cursor)
            if lost:
                conn.invalidate(error)
            base = conn.dialect.loaded_dbapi.Error
            raise DBAPIError.instance(
                sql, params, error, base, connection_invalidated=lost, dialect=conn.dialect
            ) from error
        finally:
            cursor.close()
