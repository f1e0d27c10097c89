"""`feedproc serve` cannot be starved (issue 30): slow or silent clients, more connections than file
descriptors, many large bodies at once and many whole-table reads at once each leave /healthz
answering within two seconds, and the process within its connections and memory. Real processes and
sockets; SQLite (what is bounded is the server, not the database)."""

from __future__ import annotations

import json
import re
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from feedproc import Feed
from feedproc.serving import BACKLOG

from ..api_support import AUTH, TOKEN, ServeProcess, Slowloris, open_descriptors, probe_for
from ..support import wait_until

pytestmark = [pytest.mark.sqlite_only, pytest.mark.slow]

HEADER_TIMEOUT = 10.0  # serve's (feedproc.api.HEADER_TIMEOUT): the tests outlast it


@pytest.fixture
def serve(db_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ServeProcess]:
    args, nofile = getattr(request, "param", ((), None))
    process = ServeProcess(db_url, tmp_path, *args, nofile=nofile, FEEDPROC_API_TOKEN=TOKEN)
    yield process
    process.stop()


def closed_by_server(sock: socket.socket, timeout: float) -> bytes:
    """Whatever the server sent before closing `sock` (a socket.timeout when it does not close it)."""
    sock.settimeout(timeout)
    received = b""
    with sock:
        while chunk := sock.recv(4096):
            received += chunk
    return received


def port_of(serve: ServeProcess) -> int:
    return int(serve.url.rsplit(":", 1)[1])


@pytest.mark.parametrize("serve", [(("--max-connections", "32"), None)], indirect=True)
def test_slowloris_connections_are_closed_and_healthz_answers_throughout(serve: ServeProcess) -> None:
    """Three times the cap of connections trickling a header line a second, for longer than the header
    deadline: /healthz answers 200 within two seconds throughout, a request on a new connection is
    served (it closes the oldest one still sending headers), the trickling connections are closed
    by the server, the silent one too, and the process never holds many more sockets than the cap."""
    silent = socket.create_connection(("127.0.0.1", port_of(serve)))
    opened = time.monotonic()
    baseline = open_descriptors(serve.process.pid)
    loris = Slowloris(port_of(serve), 96)
    most, silent_closed = 0, None
    try:
        wait_until(lambda: loris.opened >= 96, timeout=30, what="96 slow connections")
        deadline = time.monotonic() + HEADER_TIMEOUT + 3
        problems: list[str] = []
        while time.monotonic() < deadline:
            problems += probe_for(f"{serve.url}/healthz", 1.0)
            most = max(most, open_descriptors(serve.process.pid))
            if silent_closed is None and select.select([silent], [], [], 0)[0]:
                silent_closed = time.monotonic()
        assert problems == []
        assert httpx.get(f"{serve.url}/api/v1/queues", timeout=5).status_code == 200
        assert loris.closed > 0, "no slow connection was closed"
        print(f"most descriptors: {most} ({baseline} before)")
        assert most <= baseline + 32 + BACKLOG, most  # the cap, and newcomers not read yet
    finally:
        loris.close()
    assert silent_closed is not None and silent_closed - opened < HEADER_TIMEOUT + 2
    said = closed_by_server(silent, timeout=5)
    assert said == b"" or said.startswith(b"HTTP/1.1 503 "), said  # closed at its deadline, or evicted with a 503


@pytest.mark.parametrize("serve", [((), 256)], indirect=True)
def test_more_connections_than_file_descriptors_leave_healthz_answering(serve: ServeProcess) -> None:
    """Under `ulimit -n 256`, 300 slow connections: serve lowers its cap to fit (and says so), never
    runs out of descriptors, and /healthz answers throughout."""
    loris = Slowloris(port_of(serve), 300)
    most = 0
    try:
        wait_until(lambda: loris.opened >= 300, timeout=60, what="300 slow connections")
        deadline = time.monotonic() + HEADER_TIMEOUT + 3
        problems: list[str] = []
        while time.monotonic() < deadline:
            problems += probe_for(f"{serve.url}/healthz", 1.0)
            most = max(most, open_descriptors(serve.process.pid))
        assert problems == []
    finally:
        loris.close()
    assert most < 256, most
    assert "Too many open files" not in serve.log()
    assert re.search(r"only 256 file descriptors .*: serving at most \d+ connections instead of 256", serve.log())


def fill(db_url: str, count: int) -> None:
    """A partition of `count` complete items, inserted by SQLite itself (seconds, not minutes)."""
    import sqlite3

    with Feed(db_url) as feed:
        feed.add_partition("big", [(0, b"{}")])
    connection = sqlite3.connect(db_url.removeprefix("sqlite:///"))
    connection.execute(
        """WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
        INSERT INTO feedproc_items (partition_id, gate, status, data, next_attempt_at, created_at, updated_at)
        SELECT (SELECT id FROM feedproc_partitions), 0, 'complete', x'7b7d', '2024-01-01', '2024-01-01',
            '2024-01-01' FROM n""",
        (count,),
    )
    connection.commit()
    connection.close()


def test_twenty_status_reads_at_once_leave_healthz_answering(db_url: str, tmp_path: Path) -> None:
    """20 clients reading /api/v1/status (a count over 2M items) over and over: a few run at once,
    the others are answered 503 busy with Retry-After, and /healthz answers within two seconds."""
    fill(db_url, 2_000_000)
    serve = ServeProcess(db_url, tmp_path)
    stop = threading.Event()
    answers: list[httpx.Response] = []

    def read() -> None:
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                answers.append(client.get(f"{serve.url}/api/v1/status"))

    readers = [threading.Thread(target=read) for _ in range(20)]
    try:
        for reader in readers:
            reader.start()
        wait_until(lambda: answers, timeout=60, what="a first status answer")
        problems = probe_for(f"{serve.url}/healthz", 10.0)
    finally:
        stop.set()
        for reader in readers:
            reader.join(timeout=60)
        serve.stop()
    assert problems == []
    for answer in answers:
        if answer.status_code == 503:
            assert answer.json()["error"].startswith("busy:") and answer.headers["retry-after"]
        else:
            assert answer.status_code == 200 and answer.json()["items"]["total"] == 2_000_001


def test_ten_large_bodies_at_once_stay_within_the_memory_bound(serve: ServeProcess) -> None:
    """Ten concurrent 8 MB bodies of 78,000 items each: read and parsed a budget's worth at a time,
    the rest answered 503 busy with Retry-After; the process's peak RSS stays far below the 1.2 GB
    they took when all were parsed at once (one such body adds ~120 MB)."""

    def body(n: int) -> bytes:
        items = [
            {
                "gate": 0,
                "data": {"file": f"uploads/2024/batch-{n:03d}/document-{i:07d}.pdf", "pages": i % 97, "ok": True},
            }
            for i in range(78_000)
        ]
        return json.dumps({"key": f"big-{n}", "items": items}).encode()

    bodies = [body(n) for n in range(10)]
    assert all(7_500_000 < len(b) < 8_500_000 for b in bodies)
    answers: list[httpx.Response] = []

    def send(content: bytes) -> None:
        headers = {**AUTH, "Content-Type": "application/json"}
        answers.append(httpx.post(f"{serve.url}/api/v1/partitions", content=content, headers=headers, timeout=120))

    senders = [threading.Thread(target=send, args=(b,)) for b in bodies]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(timeout=180)
    peak_mb = peak_rss_mb(serve.process.pid)
    statuses = sorted(a.status_code for a in answers)
    print(f"peak RSS {peak_mb} MB; answers {statuses}")
    assert peak_mb < 400, peak_mb
    assert len(answers) == 10 and 201 in statuses, statuses
    for answer in answers:
        assert answer.status_code == 201 or (
            answer.status_code == 503
            and answer.json()["error"].startswith("server busy")
            and answer.headers["retry-after"]
        ), answer.text


def peak_rss_mb(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) // 1024  # type: ignore[union-attr]
