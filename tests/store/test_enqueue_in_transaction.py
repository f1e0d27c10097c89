"""Enqueue in your transaction (issue 33): `add_partition`, `add_items`, `seal` and `cancel` given
`connection=` write in the caller's transaction. Nothing of feedproc's commits unless the caller
commits, a rollback leaves no trace (no partition, items, history or notification), a refusal undoes
only feedproc's part, and a connection that is not this feed's database and tables is refused."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from feedproc import Feed
from feedproc.core.errors import DuplicateKey, InvalidInput, NotFound, Refused
from feedproc.store.foundations import make_engine

ITEMS = [(0, b'{"file": "a.pdf"}'), (0, b'{"file": "b.pdf"}')]


@pytest.fixture
def uploads(feed: Feed) -> Iterator[None]:
    """The caller's own table, beside feedproc's in the same database."""
    with feed.begin() as conn:
        conn.execute(text("CREATE TABLE uploads (name VARCHAR(40) PRIMARY KEY)"))
    yield


def rows(feed: Feed, table: str) -> int:
    """How many rows `table` holds, as committed."""
    with feed.store.engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())


def feedproc_rows(feed: Feed) -> dict[str, int]:
    return {table: rows(feed, f"feedproc_{table}") for table in ("partitions", "items", "events", "stats")}


class Abort(Exception):
    """The caller's reason to roll its transaction back."""


def test_a_rollback_after_add_leaves_nothing(feed: Feed, uploads: None) -> None:
    before = feedproc_rows(feed)
    with pytest.raises(Abort), feed.begin() as conn:
        conn.execute(text("INSERT INTO uploads VALUES ('a')"))
        assert feed.add_partition("upload-a", ITEMS, connection=conn) == 2
        raise Abort
    assert feedproc_rows(feed) == before
    assert rows(feed, "uploads") == 0
    with pytest.raises(NotFound):
        feed.status("upload-a")


def test_nothing_is_visible_to_others_before_the_caller_commits(feed: Feed, uploads: None) -> None:
    with feed.begin() as conn:
        feed.add_partition("upload-b", ITEMS, connection=conn)
        assert feed.queue_of("upload-b") is None  # another connection: not committed yet
    assert feed.status("upload-b").status == "available"
    assert len(feed.items("upload-b")) == 2


def test_a_commit_keeps_the_callers_rows_and_the_partition_together(feed: Feed, uploads: None) -> None:
    with feed.begin() as conn:
        conn.execute(text("INSERT INTO uploads VALUES ('c')"))
        feed.add_partition("upload-c", ITEMS, connection=conn, sealed=False)
        feed.add_items("upload-c", [(0, b"{}")], connection=conn)
        feed.seal("upload-c", connection=conn)
    assert rows(feed, "uploads") == 1
    status = feed.status("upload-c", history=10)
    assert status.sealed and len(feed.items("upload-c")) == 3
    assert [e.kind for e in status.history or ()][:3] == ["created", "items_added", "sealed"]


def test_add_items_seal_and_cancel_rolled_back_change_nothing(feed: Feed) -> None:
    feed.add_partition("open", ITEMS, sealed=False)
    before = feedproc_rows(feed)
    with pytest.raises(Abort), feed.begin() as conn:
        feed.add_items("open", [(0, b"{}")], connection=conn)
        feed.seal("open", connection=conn)
        feed.cancel("open", connection=conn)
        raise Abort
    assert feedproc_rows(feed) == before
    status = feed.status("open")
    assert status.status == "available" and not status.sealed


def test_a_cancel_commits_with_the_callers_transaction(feed: Feed) -> None:
    feed.add_partition("doomed", ITEMS)
    with feed.begin() as conn:
        feed.cancel("doomed", connection=conn)
    assert feed.status("doomed").status == "cancelled"


def test_a_duplicate_key_undoes_only_feedprocs_part_and_the_callers_transaction_goes_on(
    feed: Feed, uploads: None
) -> None:
    feed.add_partition("taken", ITEMS)
    before = feedproc_rows(feed)
    with feed.begin() as conn:
        conn.execute(text("INSERT INTO uploads VALUES ('before')"))
        with pytest.raises(DuplicateKey):
            feed.add_partition("taken", ITEMS, connection=conn)
        conn.execute(text("INSERT INTO uploads VALUES ('after')"))  # usable still, on PostgreSQL too
    assert rows(feed, "uploads") == 2
    assert feedproc_rows(feed) == before


def test_a_refusal_inside_the_callers_transaction_leaves_it_usable(feed: Feed, uploads: None) -> None:
    feed.add_partition("sealed", ITEMS)
    with feed.begin() as conn:
        with pytest.raises(Refused, match="sealed"):
            feed.add_items("sealed", [(0, b"{}")], connection=conn)
        with pytest.raises(InvalidInput):
            feed.add_partition("bad", ITEMS, priority=2**63, connection=conn)
        conn.execute(text("INSERT INTO uploads VALUES ('still')"))
    assert rows(feed, "uploads") == 1


def test_a_connection_without_a_transaction_is_refused(feed: Feed) -> None:
    with feed.store.engine.connect() as conn, pytest.raises(InvalidInput, match="no transaction begun"):
        feed.add_partition("loose", ITEMS, connection=conn)
    with pytest.raises(NotFound):
        feed.status("loose")


def test_an_autocommit_connection_is_refused(feed: Feed) -> None:
    """Each of its statements would commit on its own: no transaction of the caller's to join."""
    with feed.store.engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        with conn.begin(), pytest.raises(InvalidInput, match="no transaction begun"):
            feed.add_partition("autocommitted", ITEMS, connection=conn)
    with pytest.raises(NotFound):
        feed.status("autocommitted")


def test_what_is_not_a_connection_is_a_type_error(feed: Feed) -> None:
    with pytest.raises(TypeError, match="SQLAlchemy Connection"):
        feed.add_partition("odd", ITEMS, connection="sqlite:///x.db")  # type: ignore[call-overload]


def test_a_connection_to_another_database_is_refused(feed: Feed, tmp_path: Path) -> None:
    other = make_engine(f"sqlite:///{tmp_path / 'other.db'}")
    try:
        with other.begin() as conn, pytest.raises(InvalidInput, match="not this feed's"):
            feed.add_partition("elsewhere", ITEMS, connection=conn)
    finally:
        other.dispose()


def test_a_connection_for_other_tables_is_refused(feed: Feed) -> None:
    """Same database, another table prefix: its statements would write another feed's tables."""
    prefixed = make_engine(feed.store.url, table_prefix="billing_")
    try:
        with prefixed.begin() as conn, pytest.raises(InvalidInput, match="table prefix 'billing_'"):
            feed.add_partition("mixed", ITEMS, connection=conn)
    finally:
        prefixed.dispose()


def test_a_connection_of_an_engine_feedproc_did_not_make_is_refused(feed: Feed) -> None:
    from sqlalchemy import create_engine

    plain = create_engine(feed.store.engine.url)
    try:
        with plain.begin() as conn, pytest.raises(InvalidInput, match="engine feedproc did not make"):
            feed.add_partition("plain", ITEMS, connection=conn)
    finally:
        plain.dispose()


def test_an_engine_made_by_make_engine_for_the_same_url_joins(feed: Feed) -> None:
    own = make_engine(feed.store.url, pool_size=1)
    try:
        with own.begin() as conn:
            feed.add_partition("own-engine", ITEMS, connection=conn)
    finally:
        own.dispose()
    assert feed.status("own-engine").status == "available"


@pytest.mark.postgres_only  # NOTIFY is transactional there; SQLite and MariaDB send none (watchers poll)
def test_a_rollback_notifies_no_one_and_a_commit_wakes_listeners(feed: Feed) -> None:
    import psycopg

    dsn = feed.store.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN feedproc_ready")
        with pytest.raises(Abort), feed.begin() as conn:
            feed.add_partition("rolled-back", ITEMS, queue="rolled-back", connection=conn)
            raise Abort
        with feed.begin() as conn:
            feed.add_partition("committed", ITEMS, queue="committed", connection=conn)
        # Notifications arrive in commit order: had the rollback sent one, it would come first.
        heard = []
        for note in listener.notifies(timeout=10):
            heard.append(note.payload)
            if note.payload == "committed":
                break
    assert heard == ["committed"]


@pytest.mark.servers_only  # SQLite has one write lock: any open write transaction holds it
def test_an_add_held_open_in_one_thread_does_not_hold_up_another_threads_add(feed: Feed) -> None:
    """Each thread counts its adds on a row of its own: one row per process made every other
    thread's add to the queue wait for the open transaction's commit."""
    added = threading.Event()

    def add_meanwhile() -> None:
        feed.add_partition("meanwhile", ITEMS)
        added.set()

    with feed.begin() as conn:
        feed.add_partition("held-open", ITEMS, connection=conn)
        other = threading.Thread(target=add_meanwhile)
        other.start()
        assert added.wait(10), "the other thread's add waited for this transaction"
    other.join()
    assert feed.status("held-open").status == feed.status("meanwhile").status == "available"
