"""The pure rules of fan-in (core/fanin.py): tolerances, accumulate declarations and merging, and
collected results read a page at a time."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from feedproc.core.fanin import Collected, CollectedResult, Tolerance, check_accumulate, check_operations, merge
from feedproc.core.pipelines import parse_toml


@pytest.mark.parametrize(
    ("given_", "failed", "total", "exceeded"),
    [("5%", 2, 40, False), ("5%", 3, 40, True), ("0%", 1, 1000, True), ("100%", 10, 10, False), (2, 2, 5, False)],
)
def test_a_tolerance_lets_its_share_of_failures_pass(given_: object, failed: int, total: int, exceeded: bool) -> None:
    assert Tolerance.parse(given_).exceeded(failed, total) is exceeded


@pytest.mark.parametrize("bad", ["-1", "101%", "five", "5.5", True, -3, "nan%", None])
def test_a_tolerance_is_a_count_or_a_percentage(bad: object) -> None:
    with pytest.raises(ValueError, match="tolerate must be"):
        Tolerance.parse(bad)


def test_a_tolerance_reads_back_as_it_was_given() -> None:
    assert [str(Tolerance.parse(v)) for v in ("5%", "2.5 %", 3, "7")] == ["5%", "2.5%", "3", "7"]


@given(st.floats(0, 100), st.integers(0, 10_000))
def test_a_percentage_never_allows_more_than_its_share(percent: float, total: int) -> None:
    allowed = Tolerance(percent=percent).allowed(total)
    assert 0 <= allowed <= total and allowed <= percent * total / 100 + 1e-6


def test_each_operation_merges_its_numbers() -> None:
    ops = {"pages": "sum", "low": "min", "high": "max", "files": "count"}
    into: dict[str, float] = {}
    for answer in ({"pages": 3, "low": 0.5, "high": 0.5, "files": 9}, {"pages": 4, "low": 0.2, "high": 0.9}, {"x": 1}):
        merge(ops, into, answer)
    assert into == {"pages": 7, "low": 0.2, "high": 0.9, "files": 1}


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ([1], "must be an object"),
        ({"pages": "12"}, "pages must be a number"),
        ({"pages": True}, "pages must be a number"),
        ({"pages": 10**400}, "finite"),
        ({"1st": 1}, "is not a name"),
        ({f"n{i}": i for i in range(33)}, "at most 32"),
    ],
)
def test_an_answers_accumulate_is_checked(value: object, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        check_accumulate(value)


def test_a_declaration_names_an_operation_per_name() -> None:
    assert check_operations({"pages": "sum"}) == {"pages": "sum"}
    with pytest.raises(ValueError, match="one of sum, min, max, count"):
        check_operations({"pages": "avg"})


def test_a_pipeline_gate_collects_an_earlier_gate_by_name() -> None:
    spec = parse_toml(
        '[[gate]]\nname = "classify"\nnumber = 2\ntolerate = "5%"\naccumulate = {pages = "sum"}\n'
        '[[gate]]\nname = "rank"\nnumber = 3\ncollect = "classify"\n'
    )
    classify, rank = spec.gates
    assert (rank.collect, classify.operations, str(classify.tolerance)) == (2, {"pages": "sum"}, "5%")


@pytest.mark.parametrize(("collect", "says"), [('"rank"', "earlier gate"), ('"nope"', "unknown gate 'nope'")])
def test_a_gate_collects_only_an_earlier_gate_of_its_pipeline(collect: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_toml(f'[[gate]]\nname = "rank"\nnumber = 3\ncollect = {collect}\n')


def _pages(total: int) -> tuple[Collected, list[int | None]]:
    asked: list[int | None] = []

    def read_page(after: int | None, limit: int) -> list[CollectedResult]:
        asked.append(after)
        start = (after or 0) + 1
        return [CollectedResult(i, b"%d" % i) for i in range(start, min(start + limit, total + 1))]

    return Collected(gate=2, count=total, failed=0, read_page=read_page, page=10), asked


def test_collected_results_are_read_a_page_at_a_time_each_once() -> None:
    collected, asked = _pages(25)
    assert [r.id for r in collected] == list(range(1, 26))
    assert asked == [None, 10, 20]


def test_collected_results_are_read_the_same_way_in_async_code() -> None:
    collected, _ = _pages(20)

    async def read() -> list[int]:
        return [r.id async for r in collected]

    assert asyncio.run(read()) == list(range(1, 21))


def test_a_collected_result_is_json_or_base64_and_a_failure_its_error() -> None:
    assert CollectedResult(1, b'{"score": 1}').to_json() == {"id": 1, "result": {"score": 1}}
    assert CollectedResult(2, b"\xff").to_json() == {"id": 2, "result_base64": "/w=="}
    assert CollectedResult(3, error="bad scan", failed=True).to_json() == {"id": 3, "error": "bad scan"}


def test_a_collected_result_parses_as_json_and_a_failed_one_is_none() -> None:
    assert CollectedResult(7, b'{"word": "fan"}').json() == {"word": "fan"}
    assert CollectedResult(8, None, "an empty word", failed=True).json() is None
