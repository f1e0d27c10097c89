"""Database URLs as a user types them (no database): a malformed one is refused in one line that
names the problem, before any driver sees it, and never shows its password."""

from __future__ import annotations

from pathlib import Path

import pytest

from feedproc import Feed
from feedproc.cli import main
from feedproc.core.errors import InvalidInput


@pytest.mark.parametrize(
    "url", ["sqlite:///feedproc.db", "sqlite:////var/lib/feedproc.db", "sqlite://", "sqlite:///:memory:"]
)
def test_sqlite_urls_with_three_or_four_slashes_are_accepted(url: str) -> None:
    Feed.check_url(url)


@pytest.mark.parametrize(
    ("url", "like"),
    [("sqlite://feedproc.db", "sqlite:///feedproc.db"), ("sqlite://data/feedproc.db", "sqlite:///data/feedproc.db")],
)
def test_a_sqlite_url_with_two_slashes_is_refused_with_the_url_it_meant(url: str, like: str) -> None:
    with pytest.raises(InvalidInput, match=f"is not a SQLite URL: .* like {like} "):
        Feed.check_url(url)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("feedproc.db", "is not a database URL"),
        ("postgresql://u@[::1/x", "is not a database URL"),  # a port that is not a number
        ("postgresql://u@h:abc/x", "is not a database URL"),
        ("postgresql://u@h:99999/x", "port 99999 is out of range"),
        ("mysql://u@h:0/x", "port 0 is out of range"),
        ("mssql://h/x", "unsupported database 'mssql'"),
    ],
)
def test_a_malformed_database_url_is_refused_naming_the_problem(url: str, says: str) -> None:
    with pytest.raises(InvalidInput, match=says):
        Feed.check_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:s3cret@[::1/x",
        "postgresql://u:s3cret@h:abc/x",
        "postgresql://u:s3cret@h:99999/x",
        "mysql://u:s3c/ret@h:0/x",
        "sqlite://u:s3cret@h/feedproc.db",
        "mssql://u:s3cret@h/x",
        "postgresql://h:99999/x?password=s3cret",
    ],
)
def test_a_malformed_database_url_is_refused_without_its_password(url: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        Feed.check_url(url)
    assert "s3c" not in str(refused.value)


#: Every command that reads --db, with arguments it accepts: a malformed --db must be what it says.
COMMANDS_WITH_A_DATABASE = [
    ["migrate"],
    ["add", "k", "--open"],
    ["add-items", "k", "--items", "-"],
    ["seal", "k"],
    ["retry", "k"],
    ["cancel", "k"],
    ["checkpoint", "k"],
    ["cleanup", "--older-than", "7d"],
    ["status"],
    ["items", "k"],
    ["item", "1"],
    ["hooks"],
    ["hooks", "show", "1"],
    ["hooks", "retry", "--failed"],
    ["wait", "k"],
    ["watch", "--handler", "http://127.0.0.1:1/"],
    ["serve"],
    ["queue", "set", "q", "--limit", "1"],
    ["queue", "pause", "q"],
    ["queue", "resume", "q"],
    ["queue", "show"],
    ["pipeline", "show"],
    ["pipeline", "remove", "q"],
    ["schedule", "list"],
]


@pytest.mark.parametrize("args", COMMANDS_WITH_A_DATABASE, ids=" ".join)
def test_every_command_refuses_a_sqlite_url_with_two_slashes_in_one_line_and_exit_2(
    args: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(["--db", "sqlite://feedproc.db", *args])
    out, err = capsys.readouterr()
    assert exited.value.code == 2 and out == ""
    assert err.splitlines() == [
        "feedproc: error: 'sqlite://feedproc.db' is not a SQLite URL: a file's URL has three slashes, like "
        "sqlite:///feedproc.db (four before an absolute path: sqlite:////var/lib/feedproc.db)"
    ]
    assert list(tmp_path.iterdir()) == []  # no file by the name it was given either
