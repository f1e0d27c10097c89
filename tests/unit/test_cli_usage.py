"""What the command line says when a command is given too little (no database: it says so before
opening one): one usage line on stderr, exit 2."""

from __future__ import annotations

import pytest

from feedproc.cli import main


def test_item_without_an_id_says_how_it_is_used_in_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["item"])
    out, err = capsys.readouterr()
    assert exited.value.code == 2 and out == ""
    assert err.splitlines() == [
        "feedproc: error: usage: feedproc item ID (show one item), "
        "or feedproc item retry|skip|cancel ID... | --partition KEY [--gate G]"
    ]


def test_an_item_action_without_ids_or_a_partition_asks_for_one_of_them(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["item", "retry"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines() == ["feedproc: error: retry: name the items (IDs) or --partition KEY"]
