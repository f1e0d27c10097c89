"""The benchmark's own database connections: throwaway databases (`Place`), its progress poller,
and PostgreSQL's server-side counters. None goes through feedproc's store: the bench only reads
what the runtime wrote (and creates and drops the databases it runs in)."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .options import is_mysql, is_pg

if TYPE_CHECKING:
    from sqlalchemy import URL, Engine


def engine(url: str, **options: Any) -> Engine:
    """An engine of the bench's own, without a pool (it connects seldom); `postgresql://` is
    psycopg 3 and `mysql://` PyMySQL, as for feedproc. MariaDB/MySQL sessions are set up as
    feedproc's are (UTC, ANSI quotes), so that the bench's SQL means the same on every database:
    `"key"` is a name there too, and timestamps are UTC."""
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    from ..store.pooling import split_pooler

    parsed, pooler = split_pooler(engine_url(url))
    if pooler == "transaction":  # behind PgBouncer: nothing prepared (store/pooling.py)
        options.setdefault("connect_args", {"prepare_threshold": None})
    if parsed.get_backend_name() in ("mysql", "mariadb"):
        from ..store.foundations import MYSQL_SESSION

        options.setdefault("connect_args", {"init_command": MYSQL_SESSION, "charset": "utf8mb4"})
    return create_engine(parsed, poolclass=NullPool, **options)


def engine_url(url: str) -> URL:
    from sqlalchemy import make_url

    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    elif parsed.drivername in ("mysql", "mariadb"):
        parsed = parsed.set(drivername=parsed.drivername + "+pymysql")
    return parsed


class Place:
    """Where throwaway databases are made: a PostgreSQL or MariaDB/MySQL server, or a directory for
    SQLite files."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.postgres = is_pg(url)
        self.mysql = is_mysql(url)
        # A MySQL-family server's name is settled by `version()` (a `mysql://` URL may reach MariaDB).
        self.name = "postgresql" if self.postgres else "mariadb" if self.mysql else "sqlite"
        self._tempdir: Path | None = None
        self._admin: Any = None
        if self.postgres or self.mysql:
            self._admin = engine(url, isolation_level="AUTOCOMMIT")
            self.admin_url = engine_url(url)
        else:
            from sqlalchemy import make_url

            path = make_url(url).database if url != "sqlite" else None
            if path and path != ":memory:":
                self.directory = Path(path).resolve().parent
            else:
                self._tempdir = Path(tempfile.mkdtemp(prefix="feedproc-bench-"))
                self.directory = self._tempdir

    def version(self) -> str:
        if not (self.postgres or self.mysql):
            return f"SQLite {sqlite3.sqlite_version}"
        from sqlalchemy import text

        with self._admin.connect() as conn:
            if self.postgres:
                return "PostgreSQL " + str(conn.execute(text("SHOW server_version")).scalar()).split()[0]
            version = str(conn.execute(text("SELECT VERSION()")).scalar())  # 10.11.6-MariaDB-0+deb12u1, 8.0.36
        self.name = "mariadb" if "mariadb" in version.lower() else "mysql"
        return ("MariaDB " if self.name == "mariadb" else "MySQL ") + version.split("-")[0]

    def create(self, name: str) -> str:
        if self.postgres or self.mysql:
            from sqlalchemy import text

            quoted = f"`{name}`" if self.mysql else f'"{name}"'
            with self._admin.connect() as conn:
                conn.execute(text(f"CREATE DATABASE {quoted}"))
            return self.admin_url.set(database=name).render_as_string(hide_password=False)
        path = self.directory / f"{name}.db"
        return f"sqlite:///{path}"

    def keep_or_drop(self, url: str, folder: Path, result: dict[str, Any], *, keep: bool) -> None:
        """After a run: with `keep`, name its database and logs in the result; otherwise drop the
        database (quietly: a run's own problems are already in the result)."""
        if keep:
            result["database"] = url
            result["logs"] = str(folder)
            return
        with contextlib.suppress(Exception):
            self.drop(url)

    def drop(self, url: str) -> None:
        if self.postgres or self.mysql:
            from sqlalchemy import make_url, text

            name = make_url(url).database
            # MariaDB/MySQL have no FORCE: the watchers are stopped by now, so nothing holds it open.
            sql = (
                f"DROP DATABASE IF EXISTS `{name}`" if self.mysql else f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'
            )
            with self._admin.connect() as conn:
                conn.execute(text(sql))
            return
        path = Path(url.removeprefix("sqlite:///"))
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)

    def close(self) -> None:
        if self._admin is not None:
            self._admin.dispose()
        if self._tempdir is not None:
            shutil.rmtree(self._tempdir, ignore_errors=True)


class Poller:
    """The benchmark's own connection for polling a run's progress, counting its transactions."""

    def __init__(self, url: str) -> None:
        self.engine = engine(url, isolation_level="AUTOCOMMIT")
        self.conn = self.engine.connect()
        self.transactions = 0

    def scalar(self, sql: str) -> Any:
        from sqlalchemy import text
        from sqlalchemy.exc import OperationalError

        self.transactions += 1
        try:
            return self.conn.execute(text(sql)).scalar()
        except OperationalError:  # a dropped connection (SQLite: busy past its timeout): once more
            self.conn.close()
            self.conn = self.engine.connect()
            return self.conn.execute(text(sql)).scalar()

    def close(self) -> None:
        self.conn.close()
        self.engine.dispose()


_PG_STATS = (
    "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted "
    "FROM pg_stat_database WHERE datname = current_database()"
)


def pg_stats(url: str) -> dict[str, int]:
    """This database's counters in pg_stat_database (a fresh connection; closed, so its own
    transaction is counted by the next reading)."""
    from sqlalchemy import text

    own = engine(url, isolation_level="AUTOCOMMIT")
    try:
        with own.connect() as conn:
            row = conn.execute(text(_PG_STATS)).one()
    finally:
        own.dispose()
    return dict(zip(("xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted"), row, strict=True))


def pg_delta(before: dict[str, int], after: dict[str, int], own_transactions: int, items: int) -> dict[str, Any]:
    """Server-side work of one phase per item, less the benchmark's own transactions."""
    xacts = after["xact_commit"] + after["xact_rollback"] - before["xact_commit"] - before["xact_rollback"]
    xacts -= own_transactions
    rows = sum(after[k] - before[k] for k in ("tup_inserted", "tup_updated", "tup_deleted"))
    return {
        "transactions": xacts,
        "transactions_per_item": round(xacts / items, 3) if items else None,
        "rows_written_per_item": round(rows / items, 3) if items else None,
    }
