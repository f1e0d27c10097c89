"""The store's connection layer: engine, transactions, error translation, the schema check and
migrations, and the few row writers every concern shares (a partition's lock, its version bump,
its history).

Every concern of the store is a mixin over `StoreBase` (see `__init__.py`): they all run their SQL
through `write()`, `single()` and `read()` here, so a driver error becomes one of feedproc's own
errors in one place. What differs between the databases is `self.dialect` (`dialect/`): the
concerns call its named operations and never ask which database they run on.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import ColumnElement, Row, delete, insert, literal_column, select, text, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from ..core.errors import (
    DatabaseConflict,
    DatabaseRefused,
    DatabaseRefusesWrites,
    DatabaseUnavailable,
    InvalidInput,
    NotFound,
    SchemaAhead,
    SchemaMissing,
)
from ..core.models import Status
from ..core.timestamps import iso  # noqa: F401 - the store's modules import it from here
from .dialect import Dialect, dialect_for
from .foundations import WRITE_OPTION, db_now, make_engine, normalize_url
from .pooling import listen_dsn, split_pooler
from .prefixes import DEFAULT_PREFIX, PREFIX_OPTION, prefix_from
from .schema import attempts, claims, events, inflight, items, partitions, queues, schema_info, watchers
from .upgrades import LOCK_ATTEMPTS, LOCK_WAIT, declared_compatible_since, schema_fit

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

log = logging.getLogger("feedproc.store")
P, I, W, E, Q = partitions.c, items.c, watchers.c, events.c, queues.c  # noqa: E741 - column namespaces, read as table initials
A, F, C = attempts.c, inflight.c, claims.c
# `Status` values as plain strings: they are bound and compared on the watcher's paths, where looking
# up an enum member costs 90 ns (Python 3.11) against 7 for a module constant.
AVAILABLE, COMPLETE, FAILED, CANCELLED = (s.value for s in Status)
# Status tests in WHERE clauses are SQL literals, not bound parameters: the partial indexes are
# defined on `status = 'failed'` (and the partitions' on their own status), and once psycopg
# prepares a statement PostgreSQL may switch to a generic plan, which can use a partial index only
# if the condition is literal.
IS_AVAILABLE: ColumnElement[str] = literal_column(f"'{AVAILABLE}'")
IS_FAILED: ColumnElement[str] = literal_column(f"'{FAILED}'")
#: A pull worker's claim while it holds its item (feedproc_claims.state), as a SQL literal.
ACTIVE_CLAIM: ColumnElement[str] = literal_column("'active'")
#: A queue whose items workers claim (feedproc_queues.mode), as a SQL literal.
PULL: ColumnElement[str] = literal_column("'pull'")
#: A partition's columns with no lease on it (released, deferred, finished, cancelled).
NO_LEASE: Mapping[str, None] = {"lease_owner": None, "lease_expires_at": None, "wanted_by": None}


class StoreBase:
    """The engine and its transactions. Thread-safe: each call takes its own pooled connection."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 5,
        pre_ping: bool = True,
        table_prefix: str | None = None,
        listen_url: str | None = None,
    ) -> None:
        self.url, self.listen_url = url, listen_url
        #: Whose tables these are (`prefixes.py`): given, else $FEEDPROC_TABLE_PREFIX, else `feedproc_`.
        self.table_prefix = prefix_from(table_prefix)
        self.engine = make_engine(url, pool_size=pool_size, pre_ping=pre_ping, table_prefix=self.table_prefix)
        #: Every statement and decision that differs between the databases, as named operations.
        self.dialect: Dialect = dialect_for(self.engine)
        #: Where notifications are listened for (a libpq string), or None: poll (SQLite, MariaDB/MySQL,
        #: PostgreSQL behind a transaction pooler with no direct `listen_url`; `pooling.py`).
        self.listen_dsn: str | None = None
        if self.dialect.notifies:
            _, pooler = split_pooler(normalize_url(url))
            listening = normalize_url(listen_url) if listen_url else None
            self.listen_dsn = listen_dsn(self.engine.url, pooler, listening)
        elif listen_url:
            raise InvalidInput("a listen database is for PostgreSQL's notifications; this database has none")
        #: queue -> (when read, its pipeline or None), for pull claims and settles (`pipelines.cached_pipeline`)
        self._pipelines_read: dict[str, tuple[float, Any]] = {}
        #: queue -> (when read, its accumulate declaration), for pull answers (`accumulating.py`)
        self._operations_read: dict[str, tuple[float, dict[str, str]]] = {}
        self._code_revision: str | None = None

    def close(self) -> None:
        self.engine.dispose()

    # ------------------------------------------------------------ transactions

    @contextmanager
    def _connection(self) -> Iterator[Connection]:
        """A pooled connection, its driver errors translated. When the database refused to write,
        the pool's connections are closed, not used again: a session keeps the read-only state it
        began with (PostgreSQL's default_transaction_read_only, a SQLite file opened on read-only
        storage), and the next attempt must meet the database as it is by then."""
        try:
            with self.engine.connect() as conn:
                yield conn
        except DBAPIError as error:  # as `translated_errors` does, here: one context manager a transaction, not two
            if _error_code(error.orig) in _REFUSES_WRITES:
                self.engine.dispose()  # this one included; those out now are closed when given back
            raise _translate(error).with_traceback(error.__traceback__) from None

    @contextmanager
    def _tx(self, *, write: bool) -> Iterator[Connection]:
        with self._connection() as conn:
            if write:
                conn = conn.execution_options(**{WRITE_OPTION: True})
            with conn.begin():
                yield conn

    def write(self, within: Connection | None = None) -> AbstractContextManager[Connection]:
        """A write transaction (SQLite: BEGIN IMMEDIATE); or, `within` a caller's transaction, a
        savepoint in it (`joined`)."""
        return self._tx(write=True) if within is None else self.joined(within)

    @contextmanager
    def joined(self, conn: Connection) -> Iterator[Connection]:
        """feedproc's statements inside a caller's transaction on `conn` ("enqueue in your
        transaction"): nothing is begun or committed here, the caller's commit or rollback decides.
        They run in a SAVEPOINT, so a refusal (DuplicateKey, Refused, a driver error) undoes only
        them and leaves the caller's transaction usable: on PostgreSQL a failed statement would
        otherwise abort the whole transaction. `conn` must be in a transaction already and come from
        an engine of feedproc's on this database with these tables (`check_joinable`)."""
        self.check_joinable(conn)
        with translated_errors(), conn.begin_nested():
            yield conn

    def check_joinable(self, conn: object) -> None:
        """TypeError unless `conn` is a SQLAlchemy Connection; InvalidInput, one line, unless it is
        in a transaction begun by its owner and was made by `make_engine` for this database's URL
        with this store's table prefix (another engine would miss what feedproc's sessions set up:
        its table prefix, SQLite's BEGIN IMMEDIATE, MariaDB's ANSI quoting and UTC session)."""
        if not isinstance(conn, Connection):
            raise TypeError(f"connection must be a SQLAlchemy Connection, not {type(conn).__name__}")
        autocommit = conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT"
        if conn.closed or not conn.in_transaction() or autocommit:
            raise InvalidInput("the connection has no transaction begun: pass one inside `with feed.begin() as conn:`")
        if conn.engine.url != self.engine.url:
            raise InvalidInput(
                f"the connection is to {conn.engine.url.render_as_string(hide_password=True)!r}, not this "
                f"feed's {self.engine.url.render_as_string(hide_password=True)!r}: use feed.begin()"
            )
        prefix = conn.get_execution_options().get(PREFIX_OPTION)
        if prefix != self.table_prefix:
            made = "by an engine feedproc did not make" if prefix is None else f"with table prefix {prefix!r}"
            raise InvalidInput(
                f"the connection was made {made}, not for this feed's tables ({self.table_prefix!r}): use feed.begin()"
            )

    @contextmanager
    def caller_write(self) -> Iterator[Connection]:
        """A write transaction on this store's engine for a caller to add its own statements to and
        pass to `joined`: committed when the block ends, rolled back when it raises. Its driver
        errors are not translated (the caller's statements raise what SQLAlchemy raises)."""
        with self.engine.connect() as conn:
            conn.execution_options(**{WRITE_OPTION: True})  # SQLite: BEGIN IMMEDIATE, as `write()`
            with conn.begin():
                yield conn

    @contextmanager
    def single(self) -> Iterator[Connection]:
        """A connection for ONE statement that is its own transaction: in autocommit mode where the
        dialect `autocommits_single_statements` (PostgreSQL: one round trip instead of three, BEGIN,
        the statement, COMMIT, which is what a watcher's latency path is made of), else an ordinary
        write transaction (the dialects say why)."""
        if not self.dialect.autocommits_single_statements:
            with self._tx(write=True) as conn:
                yield conn
            return
        with self._connection() as conn:
            yield conn.execution_options(isolation_level="AUTOCOMMIT")

    def read(self) -> AbstractContextManager[Connection]:
        """A read-only transaction."""
        return self._tx(write=False)

    # ------------------------------------------------------------ schema

    def migrate(self) -> tuple[str | None, str | None]:
        """Create or upgrade the schema to the newest revision (idempotent); the revisions before
        (None: no schema) and after. Safe while watchers work: each lock is waited for briefly, the
        whole upgrade tried again when one is not had (`upgrades.py`), and the schema then declares
        which older feedproc may still run on it."""
        from alembic import command
        from alembic.script import ScriptDirectory

        before = self.schema_revision()
        config = alembic_config(self.url, self.table_prefix)
        script = ScriptDirectory.from_config(config)
        _refuse_ahead(script, before)  # alembic would fail half-way, with a traceback
        for attempt in range(1, LOCK_ATTEMPTS + 1):
            try:
                with self.engine.connect() as conn:
                    try:
                        with conn.begin():
                            self.dialect.limit_lock_waits(conn, LOCK_WAIT)
                            config.attributes["connection"] = conn
                            command.upgrade(config, "head")
                    finally:
                        conn.invalidate()  # its session settings go with it, not to the next user
                break
            except DBAPIError as error:
                if _error_code(error.orig) not in _LOCK_NOT_AVAILABLE or attempt == LOCK_ATTEMPTS:
                    raise _translate(error).with_traceback(error.__traceback__) from None
                log.warning("migrate: a lock was not had within %gs (attempt %d); trying again", LOCK_WAIT, attempt)
                time.sleep(min(0.2 * attempt, 2.0))
        head = script.get_current_head()
        assert head is not None
        since = declared_compatible_since(script.get_revision(head).module, head)
        with self.write() as conn:
            conn.execute(delete(schema_info))
            conn.execute(insert(schema_info).values(id=1, compatible_since=since))
        return before, self.schema_revision()

    def code_revision(self) -> str | None:
        """The newest schema revision this feedproc knows (its release, as watchers record it)."""
        if self._code_revision is None:
            from alembic.script import ScriptDirectory

            self._code_revision = ScriptDirectory.from_config(
                alembic_config(self.url, self.table_prefix)
            ).get_current_head()
        return self._code_revision

    def schema_revision(self) -> str | None:
        """The schema revision in the database, or None when it has no feedproc schema."""
        try:
            with self.read() as conn:
                return conn.execute(text("SELECT version_num FROM feedproc_version")).scalar()
        except SchemaMissing:
            return None

    def compatible_since(self) -> str | None:
        """The oldest revision whose code runs on the database's schema, as `migrate` recorded it
        (None: a schema older than that record, 0018)."""
        try:
            with self.read() as conn:
                return conn.execute(select(schema_info.c.compatible_since)).scalar()
        except (SchemaMissing, DatabaseRefused):
            return None

    def check_schema(self) -> str | None:
        """Raise SchemaMissing unless the database is at the newest schema revision, or at a newer
        one that declares this feedproc compatible (then return the line saying so, also logged);
        SchemaAhead when it is at a newer one that does not (`upgrades.py`)."""
        from alembic.script import ScriptDirectory

        script = ScriptDirectory.from_config(alembic_config(self.url, self.table_prefix))
        known = {revision.revision for revision in script.walk_revisions()}
        self._code_revision = script.get_current_head()  # what `code_revision` would read again
        current = self.schema_revision()
        since = self.compatible_since() if current is not None and current not in known else None
        note = schema_fit(self._code_revision, known, current, since)
        if note is not None:
            log.warning(note)
        return note

    # ------------------------------------------------------------ rows every concern writes

    def _lock(self, conn: Connection, key: str) -> Row[Any]:
        """Partition `key`, locked for the rest of the transaction; NotFound if unknown."""
        row = conn.execute(select(partitions).where(P.key == key).with_for_update()).one_or_none()
        if row is None:
            raise NotFound(f"no partition {key!r}")
        return row

    def _touch(self, conn: Connection, pids: int | Sequence[int], *where: ColumnElement[bool], **values: Any) -> int:
        """`touch`."""
        return touch(conn, pids, *where, **values)

    def _event(
        self,
        conn: Connection,
        pid: int,
        kind: str,
        *,
        item_id: int | None = None,
        watcher: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        """Append one entry to partition `pid`'s history."""
        self._events(conn, [event(pid, kind, item_id=item_id, watcher=watcher, detail=detail)])

    def _events(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        """Append history entries (rows made by `event`), stamped with the database's clock."""
        self.dialect.insert_stamped(conn, events, rows, ("at",))

    def _tally(self, conn: Connection, queue: str, source: str, counts: Mapping[str, int]) -> None:
        """Add `counts` (added, processed, completed, failed) to `source`'s row of `queue` for the
        database clock's current minute (`feedproc_stats`, the dashboard's throughput)."""
        values = {k: int(v) for k, v in counts.items() if k in TALLIED and v}
        if not values:
            return
        self.dialect.add_to_stats(conn, queue, source, values)


def touch(conn: Connection, pids: int | Sequence[int], *where: ColumnElement[bool], **values: Any) -> int:
    """Change partitions (one id, or several), bumping their version and `updated_at` as every
    change of a partition does; `where` narrows the rows. Returns how many changed."""
    which = P.id == pids if isinstance(pids, int) else P.id.in_(pids)
    statement = update(partitions).where(which, *where)
    return int(conn.execute(statement.values(version=P.version + 1, updated_at=db_now(), **values)).rowcount)


#: The counters of `feedproc_stats`.
TALLIED = ("added", "processed", "completed", "failed")


def this_process(role: str) -> str:
    """A `feedproc_stats` source for this process: `role:host:pid` (its own row: no waiting on others)."""
    import os
    import socket

    return f"{role}:{socket.gethostname()[:80]}:{os.getpid()}"


def this_thread(role: str) -> str:
    """A `feedproc_stats` source for this thread: `role:host:pid:thread`. Producers count their adds
    here: an add in a caller's transaction holds its counter row until the caller commits, and with
    one row per process every other thread's add to that queue waited for that commit (measured on
    PostgreSQL: a transaction held open 2.0 s made another thread's add wait 2.05 s)."""
    import threading

    return f"{this_process(role)}:{threading.get_native_id()}"


def event(
    pid: int,
    kind: str,
    *,
    item_id: int | None = None,
    watcher: str | None = None,
    detail: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One history entry of partition `pid`, as `_events` inserts it."""
    return {
        "partition_id": pid,
        "kind": kind,
        "item_id": item_id,
        "watcher": watcher,
        "detail": json.dumps(detail) if detail is not None else None,
    }


def utcnow() -> datetime:
    return datetime.now(UTC)


# ---------------------------------------------------------------- errors


@contextmanager
def translated_errors() -> Iterator[None]:
    """Re-raise every driver error as one of feedproc's own (`_translate`): its message a summary
    of the database's, never the statement or its parameters (which may hold anything: a claim's
    token, a worker's text). The driver's error stays on the new one's traceback frames for
    debugging, not in its chain, which logs and tracebacks would print."""
    try:
        yield
    except DBAPIError as error:
        translated = _translate(error)
        raise translated.with_traceback(error.__traceback__) from None


def _translate(error: DBAPIError) -> Exception:
    """What a user should hear of a driver error: the class of failure it is (the database is
    read-only, shutting down, out of connections or disk, a conflict to retry, unreachable, the
    schema missing), else a refusal naming the database's first line."""
    orig = error.orig
    code = _error_code(orig)
    said = _first_line(orig or error)
    if code in _SCHEMA_MISSING or "no such table" in said:
        return SchemaMissing("the database has no feedproc schema: run `feedproc migrate`")
    if code in _READ_ONLY:
        return DatabaseRefusesWrites("the database is read-only")
    if code in _DISK_FULL:
        return DatabaseRefusesWrites(f"the database's disk is full ({said})")
    if code in _CONFLICT:
        return DatabaseConflict(
            f"the database aborted the transaction in a conflict ({said}); running it again succeeds"
        )
    if code in _SHUTTING_DOWN or any(phrase in said for phrase in _SHUTTING_DOWN_SAID):
        return DatabaseUnavailable(
            f"database unavailable: it is shutting down, restarting or ended the connection ({said})"
        )
    if code in _TOO_MANY_CONNECTIONS or any(phrase in said for phrase in _TOO_MANY_CONNECTIONS_SAID):
        return DatabaseUnavailable(f"database unavailable: it has no connection left for feedproc ({said})")
    if isinstance(error, OperationalError) or error.connection_invalidated:
        return DatabaseUnavailable(f"database unavailable: {said}")
    unique = isinstance(error, IntegrityError) and is_unique_violation(error)
    return DatabaseRefused(f"the database refused the statement: {said}", unique=unique)


def _error_code(orig: BaseException | None) -> str | int | None:
    """MariaDB/MySQL's error number, PostgreSQL's SQLSTATE, or SQLite's error name (its extended
    names, SQLITE_READONLY_DBMOVED say, by their primary one)."""
    args: tuple[Any, ...] = getattr(orig, "args", ())
    if args and isinstance(args[0], int):  # PyMySQL: (number, message); its `sqlstate` is coarser
        return args[0]
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate:
        return str(sqlstate)
    name = getattr(orig, "sqlite_errorname", None)
    return "_".join(str(name).split("_")[:2]) if name else None


def _first_line(error: BaseException) -> str:
    """The first line of a driver's message (the rest may quote the statement), bounded; MariaDB's
    `(1290, "The MariaDB server is ...")` as its text alone."""
    args: tuple[Any, ...] = getattr(error, "args", ())
    numbered = len(args) == 2 and isinstance(args[0], int) and isinstance(args[1], str)
    text = args[1] if numbered else str(error)
    lines = text.strip().splitlines()
    return (lines[0] if lines else type(error).__name__)[:300]


#: The failure classes, by PostgreSQL's SQLSTATE, MariaDB/MySQL's error number and SQLite's error name.
_SCHEMA_MISSING = {"42P01", 1146}  # undefined table; ER_NO_SUCH_TABLE
# read_only_sql_transaction; ER_OPTION_PREVENTS_STATEMENT (--read-only), ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION
_READ_ONLY = {"25006", 1290, 1792, "SQLITE_READONLY"}
_DISK_FULL = {"53100", 1021, 1114, "SQLITE_FULL"}  # disk_full; ER_DISK_FULL, ER_RECORD_FILE_FULL
_REFUSES_WRITES = _READ_ONLY | _DISK_FULL
# serialization_failure, deadlock_detected; ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT
_CONFLICT = {"40001", "40P01", 1213, 1205}
_SHUTTING_DOWN = {"57P01", "57P02", "57P03", 1053}  # admin/crash shutdown, cannot connect now; ER_SERVER_SHUTDOWN
_LOCK_NOT_AVAILABLE = {"55P03", 1205}  # lock_not_available; ER_LOCK_WAIT_TIMEOUT (metadata locks too)
_TOO_MANY_CONNECTIONS = {"53300", 1040, 1203}  # too_many_connections; ER_CON_COUNT_ERROR, ER_TOO_MANY_USER_CONNECTIONS
# A connection refused while it is made carries no SQLSTATE with psycopg: PostgreSQL's words, then.
_SHUTTING_DOWN_SAID = (
    "the database system is shutting down",
    "the database system is starting up",
    "terminating connection due to administrator command",
)
_TOO_MANY_CONNECTIONS_SAID = ("too many connections", "too many clients")


def is_unique_violation(error: IntegrityError) -> bool:
    text = str(error.orig).lower()
    return "unique" in text or "duplicate key" in text or "duplicate entry" in text


# ---------------------------------------------------------------- migrations


def _refuse_ahead(script: ScriptDirectory, current: str | None) -> None:
    """SchemaAhead when the database's revision `current` is none of this feedproc's own."""
    if current is None or current in {revision.revision for revision in script.walk_revisions()}:
        return
    head = script.get_current_head()
    newer = current.isdigit() and head is not None and head.isdigit() and int(current) > int(head)
    how = "newer than this feedproc" if newer else "unknown to this feedproc, which knows up to"
    raise SchemaAhead(f"the database is at schema {current}, {how} ({head}): upgrade feedproc")


def migrations_path() -> Path:
    """Where the alembic revisions are: inside the installed package, or beside it in a checkout."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "_migrations", package.parent / "migrations"):
        if (candidate / "env.py").exists():
            return candidate
    raise RuntimeError("feedproc's migrations are missing from this installation")


def alembic_config(url: str, table_prefix: str = DEFAULT_PREFIX) -> Config:
    """An alembic configuration for feedproc's revisions against the database at `url`, for the
    tables under `table_prefix` (its version table is `<prefix>version`)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_path()))
    config.set_main_option("sqlalchemy.url", str(url).replace("%", "%%"))
    config.set_main_option("feedproc_table_prefix", table_prefix)
    return config
