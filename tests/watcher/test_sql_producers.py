"""Producing with plain SQL (the Go Feed guide, "Producing with SQL"): partitions and items written by a
producer that has no feedproc code, only the database's own driver, dispatch like any other.

The writes here go through `sqlite3`, `psycopg` or `pymysql` directly, never through feedproc; the
documentation's SQL is run exactly as printed there (tests/docs_support.py reads it).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pymysql
import pytest
from sqlalchemy import make_url

from feedproc import Feed, Item, Processor, Response

from ..docs_support import blocks
from ..support import wait_status, wait_until, watching


def readme_sql(dialect: str) -> str:
    """The documentation's SQL producer example for `dialect` ('PostgreSQL', 'SQLite' or 'MariaDB')."""
    (block,) = [block for block in blocks("sql") if block.startswith(f"-- {dialect}: ")]
    return block


@contextmanager
def driver(db_url: str) -> Iterator[Any]:
    """A connection of the database's own driver (no SQLAlchemy, no feedproc), in autocommit mode:
    the SQL says where its transactions begin and end."""
    url = make_url(db_url)
    if url.get_backend_name() == "sqlite":
        conn = sqlite3.connect(url.database or "", isolation_level=None)
    elif url.get_backend_name() == "mysql":  # a session as a producer has it: the server's sql_mode
        conn = pymysql.connect(  # type: ignore[assignment]
            host=url.host,
            port=url.port or 3306,
            user=url.username,
            password=url.password or "",
            database=url.database,
            autocommit=True,
        )
    else:
        dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
        conn = psycopg.connect(dsn, autocommit=True)  # type: ignore[assignment]
    try:
        yield conn
    finally:
        conn.close()


def run_sql(db_url: str, script: str) -> None:
    with driver(db_url) as conn:
        if isinstance(conn, sqlite3.Connection):
            conn.executescript(script)
        elif isinstance(conn, pymysql.Connection):
            with conn.cursor() as cursor:  # one statement at a time (no multi-statement protocol)
                for statement in filter(str.strip, script.split(";\n")):
                    cursor.execute(statement)
        else:
            conn.execute(script.encode())  # several statements, no parameters: the simple protocol


def dialect_of(db_url: str) -> str:
    """The documentation's name of the database: the word its SQL example begins with."""
    return {"postgresql": "PostgreSQL", "mysql": "MariaDB"}.get(make_url(db_url).get_backend_name(), "SQLite")


def now_sql(db_url: str) -> str:
    """The database clock as the documentation tells a producer to write it."""
    clocks = {"PostgreSQL": "now()", "MariaDB": "UTC_TIMESTAMP(6)"}
    return clocks.get(dialect_of(db_url), "strftime('%Y-%m-%d %H:%M:%f000', 'now')")


def data_sql(db_url: str, text: str) -> str:
    data = {"PostgreSQL": f"convert_to('{text}', 'UTF8')", "MariaDB": f"'{text}'"}
    return data.get(dialect_of(db_url), f"CAST('{text}' AS BLOB)")


def key_sql(db_url: str) -> str:
    return "`key`" if dialect_of(db_url) == "MariaDB" else "key"  # a reserved word there


def insert_item_sql(db_url: str, key: str, gate: int, text: str) -> str:
    now = now_sql(db_url)
    if dialect_of(db_url) == "MariaDB":  # the partition's id from a variable (the documentation: error 1442)
        return (
            f"SELECT id INTO @partition FROM feedproc_partitions WHERE `key` = '{key}';\n"
            "INSERT INTO feedproc_items (partition_id, gate, status, data, next_attempt_at, created_at, updated_at) "
            f"VALUES (@partition, {gate}, 'available', {data_sql(db_url, text)}, {now}, {now}, {now});\n"
        )
    return (
        "INSERT INTO feedproc_items (partition_id, gate, status, data, next_attempt_at, created_at, updated_at) "
        f"SELECT id, {gate}, 'available', {data_sql(db_url, text)}, {now}, {now}, {now} "
        f"FROM feedproc_partitions WHERE {key_sql(db_url)} = '{key}';\n"
    )


class TwoSteps(Processor):
    """Gate 0 moves an item to gate 1 (recording it), gate 1 completes it."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, bytes]] = []

    def process(self, item: Item) -> Response:
        self.seen.append((item.gate, item.data))
        return Response(gate=1) if item.gate == 0 else Response(done=True)


def test_the_readme_s_sql_producer_runs_as_written_and_its_partition_completes(db_url: str, feed: Feed) -> None:
    run_sql(db_url, readme_sql(dialect_of(db_url)))
    processor = TwoSteps()
    with watching(db_url, processor):
        final = wait_status(feed, "upload-7", "complete")
    assert final.items["complete"] == 2
    assert sorted(data for gate, data in processor.seen if gate == 0) == [
        b'{"kind": "folder", "files": ["a.pdf", "b.pdf"]}',
        b'{"kind": "folder", "files": ["c.pdf"]}',
    ]


def test_items_written_with_sql_at_two_gates_cross_the_barrier_in_order(db_url: str, feed: Feed) -> None:
    now = now_sql(db_url)
    yes, no = ("1", "0") if dialect_of(db_url) == "SQLite" else ("true", "false")
    run_sql(
        db_url,
        "BEGIN;\n"
        f"INSERT INTO feedproc_partitions ({key_sql(db_url)}, queue, status, gate, sealed, manual_checkpoint,"
        f" created_at, updated_at) VALUES ('two-gates', 'default', 'available', 0, {yes}, {no}, {now}, {now});\n"
        + "".join(insert_item_sql(db_url, "two-gates", 0, f'{{"n": {n}}}') for n in range(3))
        + insert_item_sql(db_url, "two-gates", 1, '{"rank": true}')
        + "COMMIT;\n",
    )
    processor = TwoSteps()
    with watching(db_url, processor):
        final = wait_status(feed, "two-gates", "complete")
    assert final.items == {"total": 4, "available": 0, "complete": 4, "failed": 0, "cancelled": 0}
    gates = [gate for gate, _ in processor.seen]
    assert gates[:3] == [0, 0, 0] and sorted(gates[3:]) == [1, 1, 1, 1]  # no gate-1 call before gate 0 drained


def test_an_item_written_with_sql_into_a_waiting_open_partition_is_dispatched(db_url: str, feed: Feed) -> None:
    feed.add_partition("open", [(0, b'{"first": 1}')], sealed=False)
    processor = TwoSteps()
    with watching(db_url, processor):
        wait_until(lambda: feed.status("open").items["complete"] == 1, what="the first item to complete")
        run_sql(db_url, insert_item_sql(db_url, "open", 1, '{"second": 2}'))  # the partition's gate is 1 now
        wait_until(lambda: feed.status("open").items["complete"] == 2, what="the SQL item to complete")
        feed.seal("open")
        wait_status(feed, "open", "complete")
    assert (1, b'{"second": 2}') in processor.seen


def test_an_item_written_with_sql_above_the_current_gate_does_not_make_the_partition_ready(
    db_url: str, feed: Feed
) -> None:
    """The trigger only ever marks a partition ready for an item at its current gate: an item
    further on waits for the gate rules (the barrier), as one added through feedproc does."""
    feed.add_partition("held", [(0, b"{}")], sealed=False, not_before=None)
    before = _ready_at(feed, "held")
    run_sql(db_url, insert_item_sql(db_url, "held", 3, "{}"))
    assert _ready_at(feed, "held") == before is not None
    assert feed.status("held").gate == 0


def _ready_at(feed: Feed, key: str) -> Any:
    from sqlalchemy import select

    from feedproc.store.schema import partitions

    with feed.store.read() as conn:
        return conn.execute(select(partitions.c.ready_at).where(partitions.c.key == key)).scalar_one()


@pytest.mark.sqlite_only
def test_text_data_and_second_precision_clocks_written_with_sql_on_sqlite_still_work(db_url: str, feed: Feed) -> None:
    """A SQLite producer that skips the CAST to BLOB and writes CURRENT_TIMESTAMP: the processor
    still gets the data as bytes (its UTF-8), and the item is due and dispatched."""
    run_sql(
        db_url,
        "BEGIN;"
        "INSERT INTO feedproc_partitions (key, queue, status, gate, sealed, manual_checkpoint, created_at, updated_at)"
        " VALUES ('plain', 'default', 'available', 1, 1, 0, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP);"
        "INSERT INTO feedproc_items (partition_id, gate, status, data, next_attempt_at, created_at, updated_at)"
        " SELECT id, 1, 'available', '{\"é\": 1}', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP"
        " FROM feedproc_partitions WHERE key = 'plain';"
        "COMMIT;",
    )
    processor = TwoSteps()
    with watching(db_url, processor):
        wait_status(feed, "plain", "complete")
    assert processor.seen == [(1, '{"é": 1}'.encode())]
