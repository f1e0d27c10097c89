"""A pipeline version's router (no database): the attempts it charges lost deliveries against, and
the HTTP processors it makes for its gates."""

from __future__ import annotations

import dataclasses

import pytest

from feedproc.core.errors import InvalidInput
from feedproc.core.pipelines import parse_toml
from feedproc.core.policy import RetryPolicy
from feedproc.processors import HTTPOptions, HTTPProcessor
from feedproc.processors.pipeline import GateRouter

UPLOADS = """
queue = "uploads"
[[gate]]
name = "list"
number = 0
[[gate]]
name = "ocr"
number = 1
max_attempts = 2
[[gate]]
name = "rank"
number = 2
max_attempts = 5
"""


def test_a_router_names_the_gates_whose_attempts_differ_from_the_watchers() -> None:
    router = GateRouter(parse_toml(UPLOADS), None, RetryPolicy(max_attempts=5), route=False)
    assert router.attempts == {1: 2}  # gate 0 inherits 5; gate 2 sets the watcher's own 5


def test_a_router_without_a_pipeline_has_no_gate_attempts() -> None:
    assert GateRouter(None, None, RetryPolicy(max_attempts=3)).attempts == {}


def test_gates_sent_to_the_same_service_share_one_client() -> None:
    pipeline = parse_toml(
        '[[gate]]\nname = "a"\nnumber = 0\nhandler = "http://127.0.0.1:9/h"\n'
        '[[gate]]\nname = "b"\nnumber = 1\nhandler = "http://127.0.0.1:9/h"\n'
        '[[gate]]\nname = "c"\nnumber = 2\nhandler = "http://127.0.0.1:9/h"\ntimeout = 5\n'
    )
    router = GateRouter(pipeline, None, RetryPolicy())
    a, b, c = (router.route(n).processor for n in range(3))
    assert a is b and c is not a  # gate c's own timeout needs a client of its own


def test_a_gates_http_processor_has_the_watchers_http_options_and_the_gates_own_timeout_and_headers() -> None:
    pipeline = parse_toml(
        '[[gate]]\nname = "a"\nnumber = 0\nhandler = "http://127.0.0.1:9/a"\n'
        '[[gate]]\nname = "b"\nnumber = 1\nhandler = "http://127.0.0.1:9/b"\ntimeout = 5\n'
        'headers = { "X-Gate" = "b", "X-Both" = "gate" }\n'
    )
    options = HTTPOptions(timeout=12.0, headers={"X-Both": "watcher"}, max_answer_bytes=1000, max_children=3)
    router = GateRouter(pipeline, None, RetryPolicy(), http_options=options)
    a, b = (router.route(n).processor for n in range(2))
    assert isinstance(a, HTTPProcessor) and isinstance(b, HTTPProcessor)
    assert (a.timeout, a.max_answer_bytes, a.max_children, a.headers["X-Both"]) == (12.0, 1000, 3, "watcher")
    assert (b.timeout, b.max_answer_bytes, b.headers["X-Both"], b.headers["X-Gate"]) == (5, 1000, "gate", "b")


def test_http_options_are_frozen_headers_included() -> None:
    options = HTTPOptions(headers={"X-A": "1"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.timeout = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        options.headers["X-A"] = "2"  # type: ignore[index]


def test_a_gate_bounds_not_yet_answers_where_it_says_and_inherits_the_watchers_bound_elsewhere() -> None:
    spec = parse_toml(UPLOADS.replace("max_attempts = 2", "max_not_yet = 20"))
    base = RetryPolicy(max_not_yet=1000)
    assert [gate.policy(base).max_not_yet for gate in spec.gates] == [1000, 20, 1000]


def test_max_not_yet_must_be_a_positive_integer() -> None:
    with pytest.raises(InvalidInput, match="max_not_yet must be an integer from 1"):
        parse_toml(UPLOADS.replace("max_attempts = 2", "max_not_yet = 0"))


def test_max_time_is_a_gates_positive_number_of_seconds() -> None:
    spec = parse_toml(UPLOADS.replace("max_attempts = 2", "max_time = 90"))
    assert [gate.max_time for gate in spec.gates] == [None, 90.0, None]
    with pytest.raises(InvalidInput, match="max_time must be more than 0 seconds"):
        parse_toml(UPLOADS.replace("max_attempts = 2", "max_time = 0"))
