"""What a fan-in item collects, without a database: which gate (a pipeline gate's `collect`, else the
item's own), how a collection iterates its pages (short ones too) and how a request carries it."""

from __future__ import annotations

import asyncio

import pytest

from feedproc.core.errors import InvalidInput
from feedproc.core.fanin import Collected, CollectedResult, inline_results
from feedproc.core.models import NewItem, item_from_row
from feedproc.core.pipelines import Collects, collects, parse_toml

SPEC = parse_toml(
    """
    [[gate]]
    name = "classify"
    number = 2
    [[gate]]
    name = "rank"
    number = 3
    collect = "classify"
    collect_inline = 50
    [[gate]]
    name = "report"
    number = 4
    """
)


def test_a_pipeline_gates_collect_wins_over_the_items_own() -> None:
    assert collects(SPEC, 3, None) == Collects(2, "classify", 50)
    assert collects(SPEC, 3, 0) == Collects(2, "classify", 50)
    assert collects(SPEC, 4, 2) == Collects(2, "classify", 1000)  # the item's own, named by the pipeline
    assert collects(SPEC, 4, None) is None
    assert collects(None, 7, 5) == Collects(5, None, 1000)
    assert collects(None, 7, None) is None


def rows(*ids: int) -> list[CollectedResult]:
    return [CollectedResult(i, b"%d" % i) for i in ids]


def test_iterating_reads_pages_until_the_count_however_short_they_are() -> None:
    pages = {None: rows(1, 2), 2: rows(5), 5: rows(7, 9, 10)}  # a page cut short by its bytes: read on
    asked: list[tuple[int | None, int]] = []

    def read_page(after: int | None, limit: int) -> list[CollectedResult]:
        asked.append((after, limit))
        return pages[after]

    collected = Collected(2, count=6, failed=0, read_page=read_page, page=3)
    assert [r.id for r in collected] == [1, 2, 5, 7, 9, 10]
    assert asked == [(None, 3), (2, 3), (5, 3)]  # no read past the count
    assert len(collected) == 6


def test_async_iteration_gives_the_same_and_stops_at_an_empty_page() -> None:
    collected = Collected(2, count=5, failed=0, read_page=inline_results(rows(1, 2, 3)), page=2)

    async def read() -> list[int]:
        return [r.id async for r in collected]

    assert asyncio.run(read()) == [1, 2, 3]  # the collection had fewer than counted: it ends


def test_a_request_carries_results_inline_or_their_url() -> None:
    failed = CollectedResult(8, error="unreadable", failed=True)
    inline = Collected(2, 1, 1, inline_results([]), gate_name="classify", inline=[*rows(7), failed])
    assert inline.to_json() == {
        "gate": "classify",
        "count": 1,
        "failed": 1,
        "results": [{"id": 7, "result": 7}, {"id": 8, "error": "unreadable"}],
    }
    paged = Collected(2, 5000, 0, inline_results([]), results_url="http://serve/api/v1/items/9/collected?token=t")
    assert paged.to_json() == {"gate": 2, "count": 5000, "failed": 0, "results_url": paged.results_url}


def test_an_item_row_takes_collect_below_its_gate() -> None:
    assert item_from_row({"gate": 3, "data": 1, "collect": 1}) == NewItem(3, b"1", 1)
    assert NewItem.coerce({"gate": 3, "collect": 0}) == NewItem(3, b"null", 0)
    for bad in ({"gate": 3, "collect": 3}, {"gate": 0, "collect": 0}, {"gate": 3, "collect": True}):
        with pytest.raises(InvalidInput, match="collect"):
            item_from_row(bad)
