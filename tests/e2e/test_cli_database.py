"""What the database does, as the command line tells it (issue 30, findings 11 and 12): one line
naming the state of the database, exit 1, nothing written, never a traceback. Real `python -m
feedproc` processes against a database made read-only for real (`tests/outages.py`), or left at a
schema revision newer than this feedproc's."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import text

from feedproc import Feed
from feedproc.store import Store, alembic_config

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


def at_a_newer_revision(db_url: str) -> tuple[str, str]:
    """The database as a newer feedproc migrated it; (its revision, this feedproc's newest)."""
    head = ScriptDirectory.from_config(alembic_config(db_url)).get_current_head()
    assert head is not None
    newer = f"{int(head) + 1:04d}"
    store = Store(db_url)
    try:
        with store.write() as conn:
            conn.execute(text("UPDATE feedproc_version SET version_num = :newer"), {"newer": newer})
            conn.execute(text("UPDATE feedproc_schema SET compatible_since = :newer"), {"newer": newer})
    finally:
        store.close()
    return newer, head


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["watch", "--handler", "http://127.0.0.1:9/"], id="watch"),
        pytest.param(["serve", "--port", "0"], id="serve"),
    ],
)
def test_a_schema_newer_than_feedproc_says_to_upgrade_feedproc(db_url: str, args: list[str]) -> None:
    newer, head = at_a_newer_revision(db_url)
    said = (
        f"feedproc: error: the database is at schema {newer}, newer than this feedproc ({head}); "
        f"it runs feedproc from schema {newer} on: upgrade feedproc"
    )
    assert_error(run_cli(db_url, *args, timeout=30), 1, said)


def test_migrate_on_a_schema_newer_than_feedproc_refuses_in_one_line_and_changes_nothing(db_url: str) -> None:
    newer, head = at_a_newer_revision(db_url)
    said = f"feedproc: error: the database is at schema {newer}, newer than this feedproc ({head}): upgrade feedproc"
    assert_error(run_cli(db_url, "migrate", timeout=30), 1, said)
    store = Store(db_url)
    try:
        assert store.schema_revision() == newer
    finally:
        store.close()
