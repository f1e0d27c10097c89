"""A pipeline version's router (no database): the attempts it charges lost deliveries against."""

from __future__ import annotations

from feedproc.core.pipelines import parse_toml
from feedproc.core.policy import RetryPolicy
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
