"""Hostile input at the door (issue 18), through the real command line and the real HTTP API on
SQLite (the checks are the same on every database): random bytes and random JSON as items give a
clear refusal (exit 2, a 4xx JSON error) or a partition, never a traceback or a 500, and a refusal
writes nothing."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feedproc import Feed

from ..api_support import ApiServer
from ..support import db_state, run_cli

pytestmark = pytest.mark.sqlite_only
FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=12,
)
rows = st.one_of(
    st.fixed_dictionaries({"gate": st.integers(), "data": json_values}),
    st.dictionaries(st.text(max_size=6), json_values, max_size=3),
    json_values,
)


@pytest.fixture
def api(db_url: str) -> Iterator[ApiServer]:
    server = ApiServer(db_url)
    yield server
    server.close()


def _lines(values: list[Any]) -> bytes:
    return b"\n".join(json.dumps(v).encode("utf-8", "surrogatepass") for v in values) + b"\n"


@FUZZ
@given(st.binary(max_size=200) | st.lists(rows, min_size=1, max_size=3).map(_lines))
def test_add_takes_an_items_file_or_refuses_it_in_one_line(
    db_url: str, feed: Feed, tmp_path: Path, content: bytes
) -> None:
    path = tmp_path / "items.jsonl"
    path.write_bytes(content)
    before = db_state(feed)
    # A key per run: hypothesis may replay an input, and a key made from it would exist already.
    result = run_cli(db_url, "add", f"fuzz-{uuid.uuid4().hex}", "--items", str(path))
    assert result.returncode in (0, 2), result.stderr
    assert "Traceback" not in result.stderr
    if result.returncode == 2:
        assert result.stderr.startswith("feedproc: error: ") and result.stderr.count("\n") == 1, result.stderr
        assert db_state(feed) == before  # refused: nothing written


@FUZZ
@given(
    st.binary(max_size=300)
    | st.fixed_dictionaries({"key": st.text(max_size=8), "items": st.lists(rows, max_size=3)}).map(
        lambda body: json.dumps(body).encode("utf-8", "surrogatepass")
    )
)
def test_the_api_takes_a_partition_or_refuses_it_with_a_json_error(api: ApiServer, feed: Feed, body: bytes) -> None:
    before = db_state(feed)
    response = api.post("/api/v1/partitions", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code in (201, 400, 409, 422), response.text
    if response.status_code != 201:
        assert set(response.json()) == {"error"}
        assert db_state(feed) == before
