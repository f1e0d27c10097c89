"""An item may leave its gate out: it is at gate 0, the same at every door (no database). A JSON
Lines row of `feedproc add` and an item of the HTTP API are read by `item_from_row`, a `Feed`
item by `NewItem.coerce`, a handler's or a processor's child by the answer's reader."""

from __future__ import annotations

from feedproc import Response
from feedproc.api.partitions import ItemIn
from feedproc.core.models import NewItem, item_from_row
from feedproc.processors import response_from_json


def test_a_json_lines_row_without_a_gate_is_at_gate_0() -> None:
    assert item_from_row({"data": {"file": "a.pdf"}}) == NewItem(0, b'{"file":"a.pdf"}')


def test_an_api_item_without_a_gate_is_at_gate_0() -> None:
    assert ItemIn.model_validate({"data": {"file": "a.pdf"}}).gate == 0


def test_a_feed_item_without_a_gate_is_at_gate_0() -> None:
    assert NewItem.coerce({"data": {"file": "a.pdf"}}).gate == 0


def test_a_handlers_child_without_a_gate_is_at_gate_0() -> None:
    [child] = response_from_json({"done": True, "items": [{"data": {"file": "a.pdf"}}]}).children
    assert child.gate == 0


def test_a_processors_child_without_a_gate_is_at_gate_0() -> None:
    [child] = Response(done=True, items=[{"data": {"file": "a.pdf"}}]).children
    assert child.gate == 0
