"""A test's own database made to fail as real ones do: read-only (PostgreSQL's
default_transaction_read_only, a SQLite file on read-only storage), out of connections, its sessions
ended, its disk full. Each acts on the test's database alone (a per-database setting, a role or a
mount of its own), never on what other tests share.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import NullPool, create_engine, make_url, text


def database_name(db_url: str) -> str:
    name = make_url(db_url).database
    assert name, db_url
    return name


def as_admin(admin_url: str, sql: str, **params: object) -> list[tuple[object, ...]]:
    """Run one statement as the server's administrator (PostgreSQL's or MariaDB's), in the database of
    `admin_url`."""
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with engine.connect() as conn:
            result = conn.execute(text(sql), params)
            return [tuple(row) for row in result] if result.returns_rows else []
    finally:
        engine.dispose()


def end_sessions(admin_url: str, db_url: str) -> None:
    """End every session on the test's PostgreSQL database (SQLSTATE 57P01 in each, as when the
    server is shut down or a failover ends them)."""
    as_admin(
        admin_url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :name",
        name=database_name(db_url),
    )


@contextlib.contextmanager
def pg_read_only(admin_url: str, db_url: str) -> Iterator[None]:
    """The test's PostgreSQL database read-only, as a replica or a demoted primary is (SQLSTATE
    25006): sessions begin read-only, and those open are ended so that every one reconnects to it.
    Afterwards new sessions write again; open ones stay read-only (feedproc must reconnect)."""
    name = database_name(db_url)
    as_admin(admin_url, f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    end_sessions(admin_url, db_url)
    try:
        yield
    finally:
        as_admin(admin_url, f'ALTER DATABASE "{name}" RESET default_transaction_read_only')


@contextlib.contextmanager
def pg_role(admin_url: str, db_url: str) -> Iterator[str]:
    """The test's database URL for a new role without superuser rights (connection limits bind it)
    that owns the database's tables; the role is dropped afterwards."""
    role, name = f"fp_role_{uuid.uuid4().hex[:8]}", database_name(db_url)
    as_admin(admin_url, f'CREATE ROLE "{role}" LOGIN')
    as_admin(admin_url, f'GRANT ALL ON DATABASE "{name}" TO "{role}"')
    as_admin(db_url, f'GRANT ALL ON ALL TABLES IN SCHEMA public TO "{role}"')
    as_admin(db_url, f'GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO "{role}"')
    try:
        yield make_url(db_url).set(username=role).render_as_string(hide_password=False)
    finally:
        end_sessions(admin_url, db_url)
        as_admin(db_url, f'DROP OWNED BY "{role}"')  # its privileges there, and on the database
        as_admin(admin_url, f'DROP ROLE "{role}"')


@contextlib.contextmanager
def mariadb_user(db_url: str) -> Iterator[str]:
    """The test's MariaDB database URL for a new user with every privilege on it and none beyond
    (root is not bound by `read_only`: it holds READ ONLY ADMIN); the user is dropped afterwards."""
    user, name = f"fp_{uuid.uuid4().hex[:8]}", database_name(db_url)
    as_admin(db_url, f"CREATE USER '{user}'@'%'")
    try:
        as_admin(db_url, f"GRANT ALL ON `{name}`.* TO '{user}'@'%'")
        yield make_url(db_url).set(username=user).render_as_string(hide_password=False)
    finally:
        as_admin(db_url, f"DROP USER '{user}'@'%'")


@contextlib.contextmanager
def mariadb_read_only(db_url: str) -> Iterator[None]:
    """The MariaDB server read-only for users without READ ONLY ADMIN (errors 1290): global to the
    server, so for fault tests alone (`pytest -m faults`)."""
    as_admin(db_url, "SET GLOBAL read_only = 1")
    try:
        yield
    finally:
        as_admin(db_url, "SET GLOBAL read_only = 0")


def can_mount() -> bool:
    return os.geteuid() == 0


def _run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def read_only_directory(path: Path) -> Iterator[None]:
    """`path` read-only for every file opened in it from now on (a read-only bind mount of it on
    itself, as a volume mounted read-only is); writable again afterwards."""
    if not can_mount():
        pytest.skip("read-only storage is made with a bind mount, which needs root")
    _run("mount", "--bind", str(path), str(path))
    try:
        _run("mount", "-o", "remount,bind,ro", str(path))
        yield
    finally:
        _run("umount", "-l", str(path))


@contextlib.contextmanager
def tiny_disk(megabytes: int = 2) -> Iterator[Path]:
    """A directory on a tmpfs of `megabytes` of its own: writing past them fails with ENOSPC, as on
    a full disk. It is made in the temporary directory, which a server running as another user (a
    local PostgreSQL) can reach: only root enters a test's own."""
    if not can_mount():
        pytest.skip("a full disk is made with a tmpfs mount, which needs root")
    directory = Path(tempfile.gettempdir()) / f"fp_tiny_{uuid.uuid4().hex[:8]}"
    directory.mkdir()
    try:
        _run("mount", "-t", "tmpfs", "-o", f"size={megabytes}m,mode=0700", "tmpfs", str(directory))
        try:
            yield directory
        finally:
            _run("umount", "-l", str(directory))
    finally:
        directory.rmdir()


@contextlib.contextmanager
def tiny_tablespace(admin_url: str, megabytes: int = 2) -> Iterator[str]:
    """A PostgreSQL tablespace on a `tiny_disk`: tables moved there fill it, and writing more is
    SQLSTATE 53100, disk full. Dropped afterwards (move its tables out first)."""
    with tiny_disk(megabytes) as directory:
        _run("chown", "postgres:postgres", str(directory))
        name = directory.name
        as_admin(admin_url, f"CREATE TABLESPACE \"{name}\" LOCATION '{directory}'")
        try:
            yield name
        finally:
            as_admin(admin_url, f'DROP TABLESPACE IF EXISTS "{name}"')


class Lines(logging.Handler):
    """The messages of one logger (records from any thread), attached for a block."""

    def __init__(self, name: str) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []
        self.logger = logging.getLogger(name)

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def __enter__(self) -> Lines:
        self.logger.addHandler(self)
        self.level_before, self.logger.level = self.logger.level, logging.DEBUG
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self)
        self.logger.level = self.level_before

    def count(self, start: str) -> int:
        return sum(message.startswith(start) for message in self.messages)
