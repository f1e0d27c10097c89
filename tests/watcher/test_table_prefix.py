"""Several feeds in one database (docs/guides/gofeed.md, "Several feeds in one database"): under different table
prefixes, each feed has its own tables, version, trigger and wake-ups, and its watchers see only
its own work."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, make_url, text

from feedproc import Feed
from feedproc.core.errors import InvalidInput

from ..support import Done, feedproc_env, wait_status, watching


def prefixed(db_url: str, prefix: str) -> Feed:
    feed = Feed(db_url, table_prefix=prefix)
    feed.migrate()
    return feed


def test_two_prefixes_share_one_database_and_each_watcher_serves_only_its_own(db_url: str, feed: Feed) -> None:
    alpha, beta = prefixed(db_url, "alpha_"), prefixed(db_url, "beta_")
    try:
        alpha.add_partition("same-key", [(0, b'"alpha"')])
        beta.add_partition("same-key", [(0, b'"beta 1"'), (0, b'"beta 2"')])
        served = Done()
        with watching(db_url, served, table_prefix="alpha_"):
            wait_status(alpha, "same-key", "complete")
        assert served.seen == [b'"alpha"']
        assert beta.status("same-key").items["available"] == 2  # untouched by alpha's watcher
        with pytest.raises(KeyError):
            feed.status("same-key")  # the default feed has no such partition
        with watching(db_url, Done(), table_prefix="beta_"):
            wait_status(beta, "same-key", "complete")
        assert alpha.status("same-key").items["total"] == 1
    finally:
        alpha.close()
        beta.close()


def test_each_prefix_has_its_own_tables_and_version(db_url: str) -> None:
    prefixed(db_url, "gamma_").close()
    names = set(inspect(create_engine(db_url)).get_table_names())
    assert {"gamma_partitions", "gamma_items", "gamma_version", "feedproc_items", "feedproc_version"} <= names
    with Feed(db_url, table_prefix="gamma_") as gamma:
        assert gamma.store.schema_revision() == Feed(db_url).store.schema_revision()
        assert gamma.migrate() is not None  # a second migrate of the prefix changes nothing, and says so


@pytest.mark.parametrize("prefix", ["", "Alpha_", "1abc", "a-b", "a b", "x" * 25, "feed\n"])
def test_a_prefix_that_cannot_begin_a_table_name_is_invalid_input(db_url: str, prefix: str) -> None:
    with pytest.raises(InvalidInput, match="table prefix"):
        Feed(db_url, table_prefix=prefix)


def test_the_command_line_takes_the_prefix_as_an_option_or_from_the_environment(db_url: str, tmp_path: Path) -> None:
    def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "feedproc", *args],
            env=feedproc_env(db_url, **env),
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert cli("--table-prefix", "delta_", "migrate").returncode == 0
    (tmp_path / "items.jsonl").write_text('{"gate": 0, "data": 1}\n')
    assert cli("--table-prefix", "delta_", "add", "k", "--items", str(tmp_path / "items.jsonl")).returncode == 0
    assert '"total": 1' in cli("status", "k", "--json", FEEDPROC_TABLE_PREFIX="delta_").stdout
    assert cli("status", "k").returncode == 1  # not in the default feed
    bad = cli("--table-prefix", "Bad-Prefix", "status")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "table prefix" in bad.stderr


@pytest.mark.postgres_only
def test_notifications_stay_within_their_prefix(db_url: str) -> None:
    alpha, beta = prefixed(db_url, "alpha_"), prefixed(db_url, "beta_")
    woken = threading.Event()
    stop = alpha.listen_ready(woken.set)
    assert stop is not None
    try:
        woken.wait(2)  # the listener calls once when it starts listening (anything it missed)
        woken.clear()
        beta.add_partition("b", [(0, b"1")])
        assert not woken.wait(1.0), "alpha's listener was woken by beta's work"
        alpha.add_partition("a", [(0, b"1")])
        assert woken.wait(5.0), "alpha's listener was not woken by alpha's work"
    finally:
        stop()
        alpha.close()
        beta.close()


@pytest.mark.postgres_only
def test_a_postgresql_schema_in_the_search_path_keeps_a_feed_apart(db_url: str) -> None:
    schema = f"feed_{uuid.uuid4().hex[:8]}"
    engine = create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    url = make_url(db_url).update_query_dict({"options": f"-csearch_path={schema}"})
    in_schema = Feed(url.render_as_string(hide_password=False))
    try:
        in_schema.migrate()
        in_schema.add_partition("s", [(0, b"1")])
        with watching(url.render_as_string(hide_password=False), Done()):
            wait_status(in_schema, "s", "complete")
        assert "feedproc_items" in inspect(engine).get_table_names(schema=schema)
        with Feed(db_url) as public, pytest.raises(KeyError):
            public.status("s")
    finally:
        in_schema.close()
        engine.dispose()
