"""A database conflict inside the caller's transaction (`connection=`) is the caller's to handle:
MariaDB rolls the whole transaction back on a deadlock, so running feedproc's part again alone
would write into a transaction that no longer holds the caller's work."""

from __future__ import annotations

from typing import Any

import pytest

from feedproc.core.errors import DatabaseConflict
from feedproc.feed import retried


def conflicting(calls: list[Any]) -> Any:
    @retried
    def add(*, connection: Any = None) -> None:
        calls.append(connection)
        raise DatabaseConflict("deadlock")

    return add


def test_a_conflict_in_the_callers_transaction_is_raised_at_once() -> None:
    calls: list[Any] = []
    with pytest.raises(DatabaseConflict):
        conflicting(calls)(connection=object())
    assert len(calls) == 1


def test_a_conflict_in_feedprocs_own_transaction_is_run_again() -> None:
    calls: list[Any] = []
    with pytest.raises(DatabaseConflict):
        conflicting(calls)()
    assert len(calls) > 1
