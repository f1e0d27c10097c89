"""A partition's progress on the dashboard (no database): items done out of all, counted as its gate
bars count them, and a failed or cancelled partition reads how far it got."""

from __future__ import annotations

import pytest

from feedproc.dashboard import overall


def items(available: int = 0, complete: int = 0, failed: int = 0, cancelled: int = 0) -> dict[str, int]:
    total = available + complete + failed + cancelled
    return {"total": total, "available": available, "complete": complete, "failed": failed, "cancelled": cancelled}


def test_a_failed_partition_with_nothing_complete_reads_0_percent() -> None:
    assert overall(items(available=1, failed=2), "failed") == 0


def test_a_failed_partition_reads_its_complete_items_not_those_cancelled_with_it() -> None:
    assert overall(items(complete=1, failed=3, cancelled=6), "failed") == 10


def test_a_cancelled_partition_reads_its_complete_items() -> None:
    assert overall(items(complete=1, cancelled=3), "cancelled") == 25


def test_a_running_partition_counts_cancelled_items_done_and_failed_ones_apart() -> None:
    assert overall(items(available=2, complete=1, failed=4, cancelled=1), "available") == 25


@pytest.mark.parametrize("counts", [items(complete=3), items(complete=2, failed=1), items()])
def test_a_complete_partition_reads_100_percent(counts: dict[str, int]) -> None:
    assert overall(counts, "complete") == 100  # tolerated failures included
