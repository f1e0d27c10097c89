"""Fixtures of the end-to-end doors' tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from feedproc.cli import main


@pytest.fixture
def cli(db_url: str, capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """`feedproc --db URL ARGS` in this process (`feedproc.cli.main`, what the console script calls):
    its exit code, standard output and standard error."""

    def run(*args: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as exited:
            main(["--db", db_url, *args])
        out = capsys.readouterr()
        return int(exited.value.code or 0), out.out, out.err

    return run
