"""Which processors complete in their answer's transaction (issue 33), decided without a database:
a `TransactionalProcessor` or any processor saying `transactional = True`, a Pipeline's gates
declared so; a stored pipeline's gate cannot say it (its handler is not feedproc's database)."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import Connection

from feedproc import InvalidInput, Item, Pipeline, Processor, Response, TransactionalProcessor
from feedproc.core.pipelines import from_mapping
from feedproc.processors.transactional import check_transactional, is_transactional


class Book(TransactionalProcessor):
    def process(self, item: Item, connection: Connection) -> Response:
        return Response(done=True)


class Plain(Processor):
    def process(self, item: Item) -> Response:
        return Response(done=True)


def test_a_transactional_processor_is_one_at_every_gate_and_a_plain_one_at_none() -> None:
    assert is_transactional(Book(), 0) and is_transactional(Book(), 7)
    assert not is_transactional(Plain(), 0)
    assert check_transactional(Book(), batch=1) and not check_transactional(Plain(), batch=8)


def test_a_pipeline_is_transactional_at_the_gates_declared_so_only() -> None:
    pipeline = Pipeline("orders")

    @pipeline.gate("split", 0)
    def split(item: Item) -> Response:
        return Response(done=True)

    @pipeline.gate("book", 1, transactional=True)
    def book(item: Item, connection: Connection) -> Response:
        return Response(done=True)

    assert [is_transactional(pipeline, gate) for gate in (0, 1)] == [False, True]
    assert not hasattr(pipeline.spec.gates[1], "transactional")  # the code's, not stored
    with pytest.raises(InvalidInput, match="cannot take --batch"):
        check_transactional(pipeline, batch=4)


def test_a_stored_pipeline_gate_cannot_be_transactional() -> None:
    document = {"queue": "q", "gate": [{"name": "a", "number": 0, "handler": "http://x/", "transactional": True}]}
    with pytest.raises(InvalidInput, match="transactional is not a stored setting"):
        from_mapping(document, source="p.toml")
