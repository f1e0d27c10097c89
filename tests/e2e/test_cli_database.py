"""What the database does, as the command line tells it (issue 30, finding 11): one line naming the
state of the database, exit 1, nothing written, never a traceback. Real `python -m feedproc`
processes against a database made read-only for real (`tests/outages.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from feedproc import Feed

from ..outages import pg_read_only, read_only_directory
from ..support import run_cli
from .test_cli import assert_error


@pytest.mark.postgres_only
def test_add_on_a_read_only_postgresql_says_so_in_one_line(db_url: str, pg_admin_url: str) -> None:
    with pg_read_only(pg_admin_url, db_url):
        assert_error(run_cli(db_url, "add", "k", "--open"), 1, "feedproc: error: the database is read-only")
    with Feed(db_url) as feed:
        assert feed.queue_of("k") is None


@pytest.mark.sqlite_only
def test_add_on_a_sqlite_file_on_read_only_storage_says_so_in_one_line(feed: Feed, db_url: str) -> None:
    assert feed.summary()  # (its open connection keeps the WAL's shared memory file: SQLite cannot make one there)
    with read_only_directory(Path(db_url.removeprefix("sqlite:///")).parent):
        assert_error(run_cli(db_url, "add", "k", "--open"), 1, "feedproc: error: the database is read-only")
    assert feed.queue_of("k") is None
