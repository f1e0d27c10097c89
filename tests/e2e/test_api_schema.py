"""Property-based run of schemathesis against the OpenAPI document of a running API (issue 6): for
generated valid and invalid requests to every operation, with the token, the server never answers
5xx. Bounded: a fixed number of examples per operation and a fixed seed."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from feedproc import Feed

from ..api_support import TOKEN, ApiServer

MAX_EXAMPLES = int(os.environ.get("FEEDPROC_SCHEMATHESIS_EXAMPLES", "20"))
# The servers only: they are the stricter databases (integer ranges, NUL in text, lengths), and time
# is bounded.
pytestmark = [pytest.mark.slow, pytest.mark.servers_only]


@pytest.fixture
def api(db_url: str) -> Iterator[ApiServer]:
    server = ApiServer(db_url)
    yield server
    server.close()


def test_no_generated_request_gets_a_server_error(api: ApiServer, feed: Feed, tmp_path: Path) -> None:
    feed.add_partition("seed/1", [(0, b"{}"), (1, b"[1]")], sealed=False)  # something to find and change
    cli = Path(sys.executable).with_name("schemathesis")
    result = subprocess.run(
        [
            str(cli),
            "run",
            f"{api.url}/api/v1/openapi.json",
            "--checks",
            "not_a_server_error",
            "--phases",
            "examples,fuzzing",
            "--max-examples",
            str(MAX_EXAMPLES),
            "--seed",
            "6",
            "--workers",
            "1",
            "--request-timeout",
            "30",
            "--suppress-health-check",
            "all",
            "-H",
            f"Authorization: Bearer {TOKEN}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]
