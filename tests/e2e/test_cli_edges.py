"""The command line's edges found by trying it as a newcomer (issue 18): database URLs that are not
usable, stray SQLite files, ages without units, a cleanup that can be rehearsed, a migrate that says
what it did, and a `Feed()` that reads the environment as the CLI does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import update

from feedproc import Feed
from feedproc.store.foundations import seconds_from_now
from feedproc.store.schema import partitions

from ..support import run_cli
from .test_cli import assert_error, ok


def cli(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m feedproc ARGS` with no database configured at all (unless `env` says)."""
    base = {k: v for k, v in os.environ.items() if k != "FEEDPROC_DATABASE_URL"}
    return subprocess.run(
        [sys.executable, "-m", "feedproc", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


@pytest.mark.sqlite_only
@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("mssql://x/y", "unsupported database 'mssql'"),
        ("feedproc.db", "not a database URL"),
        ("postgresql://u@[::1/x", "not a database URL"),
    ],
)
def test_an_unusable_database_url_is_one_line_and_exit_2(url: str, says: str, tmp_path: Path) -> None:
    assert_error(cli("--db", url, "status", cwd=tmp_path), 2, says)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.sqlite_only
@pytest.mark.parametrize("where", ["--db before the command", "--db after it", "FEEDPROC_DATABASE_URL"])
def test_a_malformed_database_url_is_one_line_without_its_password_wherever_it_is_given(
    where: str, tmp_path: Path
) -> None:
    url = "postgresql://feedproc:s3cret@db.internal:99999/feedproc"
    if where == "FEEDPROC_DATABASE_URL":
        result = cli("status", cwd=tmp_path, FEEDPROC_DATABASE_URL=url)
    else:
        result = cli(*(["--db", url, "status"] if where == "--db before the command" else ["status", "--db", url]))
    line = assert_error(result, 2, "port 99999 is out of range")
    assert "s3cret" not in line


@pytest.mark.sqlite_only
def test_postgresql_without_its_driver_says_how_to_install_it(tmp_path: Path) -> None:
    blocker = tmp_path / "sitecustomize.py"  # this interpreter, as if psycopg were not installed
    blocker.write_text("import sys\nsys.modules['psycopg'] = None\n")
    result = cli("--db", "postgresql://u@127.0.0.1:1/x", "status", PYTHONPATH=str(tmp_path))
    assert_error(result, 2, "pip install 'feedproc[postgres]'")


@pytest.mark.sqlite_only
@pytest.mark.parametrize("args", [["status"], ["items", "k"], ["item", "1"], ["queue", "show"], ["wait", "k"]])
def test_read_commands_leave_no_stray_sqlite_file(args: list[str], tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here.db"
    assert_error(cli("--db", f"sqlite:///{missing}", *args), 1, "feedproc migrate")
    assert not missing.exists()


@pytest.mark.sqlite_only
def test_migrate_says_from_which_revision_to_which(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    first = ok(cli("--db", url, "migrate")).strip()
    assert first.startswith("schema migrated from nothing to revision ")
    again = ok(cli("--db", url, "migrate")).strip()
    assert again == f"schema is up to date (revision {first.rsplit(' ', 1)[1]})"


@pytest.mark.sqlite_only
@pytest.mark.parametrize("age", ["7", "30", "1.5"])
def test_an_age_without_a_unit_is_refused(db_url: str, age: str) -> None:
    assert_error(run_cli(db_url, "cleanup", "--older-than", age), 2, "unit")


def test_cleanup_dry_run_counts_and_deletes_nothing(db_url: str, feed: Feed) -> None:
    feed.add_partition("done", [])  # sealed and empty: complete at once
    with feed.store.write() as conn:  # finished an hour ago
        conn.execute(update(partitions).values(updated_at=seconds_from_now(-3600)))
    rehearsal = ok(run_cli(db_url, "cleanup", "--older-than", "30m", "--dry-run"))
    assert rehearsal.startswith("would delete 1 partitions, 0 items")
    assert feed.status("done").status == "complete"
    assert ok(run_cli(db_url, "cleanup", "--older-than", "30m")).startswith("deleted 1 partitions")


def test_feed_without_a_url_reads_the_environment(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEEDPROC_DATABASE_URL", db_url)
    with Feed() as feed:
        feed.add_partition("from-env", [(0, b"1")])
    with Feed(db_url) as same:
        assert same.status("from-env").key == "from-env"


@pytest.mark.sqlite_only
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["watch", "--handler", "http://"], "with a host"),
        (["watch", "--handler", "http://h:99999/"], "with a host"),
        (["watch", "--handler", "http://h/", "--callback-url", "ftp://x/"], "--callback-url"),
        (["watch", "--handler", "http://h/", "--header", "X-Token: a\rInjected: b"], "CR, LF"),
        (["work", "--api", "https://", "--processor", "m:a"], "--api"),
        (
            ["watch", "--handler", "http://u:p@h/", "--header", "Authorization: Bearer abcdef"],
            "handler http://***@h/ has credentials in its URL and an Authorization header is given too",
        ),
    ],
)
def test_unusable_urls_and_headers_are_refused_at_start(db_url: str, args: list[str], says: str) -> None:
    assert_error(run_cli(db_url, *args), 2, says)


@pytest.mark.sqlite_only
def test_a_pipeline_whose_handler_has_credentials_and_an_authorization_header_is_refused(
    db_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "p.toml"
    path.write_text(
        '[defaults]\nheaders = {authorization = "Bearer abcdef"}\n'
        '[[gate]]\nname = "ocr"\nnumber = 0\nhandler = "http://u:s3cret@ocr/"\n'
    )
    result = run_cli(db_url, "pipeline", "apply", str(path))
    assert_error(result, 2, "gate 'ocr': handler http://***@ocr/ has credentials in its URL and an Authorization")
    assert "s3cret" not in result.stderr


@pytest.mark.sqlite_only
@pytest.mark.parametrize("token", ["", "   ", "short", "has a space in it 123456"])
def test_serve_refuses_an_unusable_api_token(db_url: str, token: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "feedproc", "--db", db_url, "serve", "--port", "0"],
        env={**os.environ, "FEEDPROC_API_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert_error(result, 2, "FEEDPROC_API_TOKEN")


@pytest.mark.sqlite_only
def test_help_names_arguments_plainly_and_gives_flags_no_type() -> None:
    for command in ([], ["add"], ["status"], ["watch"], ["item"]):
        text = cli(*command, "--help").stdout
        assert "<bool>" not in text and "{key}" not in text.lower(), text
    assert "Usage: feedproc add [OPTIONS] [KEY] " in cli("add", "--help").stdout


@pytest.mark.sqlite_only
@pytest.mark.parametrize(
    ("items", "args", "says"),
    [
        (b'{"gate": 0, "data": NaN}\n', (), "NaN or Infinity"),
        (b'{"gate": 0, "data": "\\ud800"}\n', (), "lone surrogate"),
        (b'{"gate": 0, "data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", (), "nests too deeply"),
        (b'{"gate": 0, "data": ' + b"[" * 65 + b"]" * 65 + b"}\n", (), "deeper than 64 levels"),
        (b'{"gate": 0, "data": "\xff\xfe"}\n', (), "not UTF-8"),
        (b'{"gate": 0, "data": 1}\n', ("--priority", "99999999999999999999"), "priority must be an integer from"),
        (b'{"gate": 0, "data": 1}\n', ("--weight", "99999999999999999999"), "weight must be an integer from 1"),
        (b'{"gate": 0, "data": 1}\n', ("--not-before", "0001-01-01T00:00:00+14:00"), "out of range"),
    ],
)
def test_add_refuses_what_other_parsers_or_the_columns_cannot_take(
    db_url: str, tmp_path: Path, items: bytes, args: tuple[str, ...], says: str
) -> None:
    path = tmp_path / "items.jsonl"
    path.write_bytes(items)
    assert_error(run_cli(db_url, "add", "k", "--items", str(path), *args), 2, says)
    assert Feed(db_url).partitions() == []


@pytest.mark.sqlite_only
def test_numbers_beyond_the_columns_are_refused_in_one_line(db_url: str) -> None:
    assert_error(run_cli(db_url, "queue", "set", "q", "--limit", "99999999999999999999"), 2, "limit must be")
    assert_error(run_cli(db_url, "status", "k", "--history", "-1"), 2, "history must be")


@pytest.mark.sqlite_only
def test_a_processor_module_that_raises_on_import_is_one_line_naming_where(db_url: str, tmp_path: Path) -> None:
    (tmp_path / "brokenmod.py").write_text("x = 1\nraise RuntimeError('no model file')\n")
    result = subprocess.run(
        [sys.executable, "-m", "feedproc", "watch", "--processor", "brokenmod:Classify"],
        env={**os.environ, "FEEDPROC_DATABASE_URL": db_url, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert_error(result, 2, "importing 'brokenmod' raised RuntimeError: no model file")
    assert "brokenmod.py line 2" in result.stderr


@pytest.mark.sqlite_only
def test_every_watch_option_has_an_environment_variable_and_the_readme_names_it() -> None:
    import re

    from typer.main import get_command

    from feedproc.cli import app

    watch = get_command(app).commands["watch"]  # type: ignore[attr-defined]
    options = [p for p in watch.params if p.opts and p.opts[0].startswith("--")]
    by_option = {p.opts[0]: p.envvar for p in options if not p.hidden}
    deprecated = {p.opts[0]: p.envvar for p in options if p.hidden}  # earlier spellings, kept working
    by_option["--header"] = "FEEDPROC_HEADERS"  # read by watch itself: one header per line
    by_option["--db"] = by_option["--db"] or "FEEDPROC_DATABASE_URL"  # read where every command reads it
    missing = sorted(option for option, env in by_option.items() if not env)
    assert missing == [], f"watch options without an environment variable: {missing}"
    from .. import docs_support

    # The options' table, under its heading on whichever page holds it.
    table = docs_support.text().split("`feedproc watch` options\n", 1)[1].split("With the defaults", 1)[0]
    documented = dict(re.findall(r"^\| `(--[a-z-]+)[^|]*\| `(FEEDPROC_[A-Z_]+)`", table, re.M))
    assert {k: v for k, v in by_option.items() if k != "--db"} == documented
    assert all(f"`{option}`" in table and f"`{env}`" in table for option, env in deprecated.items())


@pytest.mark.slow
@pytest.mark.sqlite_only
def test_a_watcher_configured_by_the_environment_alone(db_url: str, tmp_path: Path) -> None:
    from ..support import WatcherProcesses, wait_until

    feed = Feed(db_url)
    feed.add_partition("p", [(0, b"1")], queue="from-env")
    watchers = WatcherProcesses(db_url, tmp_path)
    try:
        watchers.start(
            FEEDPROC_PROCESSOR="cli_processors:LoggedSlow",
            FEEDPROC_QUEUE="from-env",
            FEEDPROC_CONCURRENCY="3",
            FEEDPROC_POLL_INTERVAL="0.1",
            FEEDPROC_TEST_DELIVERY_LOG=str(tmp_path / "deliveries"),
        )
        wait_until(lambda: feed.status("p").status == "complete", what="the partition to complete")
        (watcher,) = feed.watchers()
        assert (watcher.queue, watcher.concurrency) == ("from-env", 3)
    finally:
        watchers.stop_all()
        feed.close()
