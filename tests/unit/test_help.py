"""What `feedproc --help` and each command's help say (no database): the three databases named
together wherever one of the servers is."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import typer

from feedproc.cli import app, main


def commands(command: Any, path: str = "feedproc") -> Iterator[tuple[str, Any]]:
    """Every command of the app, groups included, with its full name."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from commands(sub, f"{path} {name}")


def help_texts(command: Any) -> str:
    return " ".join([command.help or "", *(getattr(p, "help", None) or "" for p in command.params)])


def test_the_main_help_names_sqlite_postgresql_and_mariadb(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "SQLite, PostgreSQL or MariaDB/MySQL" in " ".join(capsys.readouterr().out.split())


EVERY_COMMAND = [pytest.param(name, command, id=name) for name, command in commands(typer.main.get_command(app))]


@pytest.mark.parametrize(("name", "command"), EVERY_COMMAND)
def test_a_help_that_names_postgresql_names_mariadb_too(name: str, command: Any) -> None:
    text = help_texts(command)
    assert "PostgreSQL" not in text or "MariaDB" in text, f"{name}: {text}"
