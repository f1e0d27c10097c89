"""A handler service written for Go Feed runs unchanged under `feedproc watch --request raw`.

The handler below knows nothing of feedproc: as under Go Feed's HTTP processor, it reads each
request body as its own JSON data and answers Go Feed's response object, written the way Go's
encoding/json writes Go Feed's `response` struct: `{"gate":N,"complete":b,"response":{...},"error":null}`.
A real `feedproc watch` process drives a three-gate fan-in through it, on every database.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from feedproc import Feed

from ..support import WatcherProcesses, run_cli, wait_until

FAST = ("--poll-interval", "0.1", "--lease-seconds", "5", "--retry-delay", "0.1")
FILES = [f"scan-{n}.pdf" for n in range(6)]


@dataclass
class Call:
    """One request as the handler served it: the data it read, its content type, when it ran."""

    data: dict[str, Any]
    content_type: str
    start: float
    end: float = 0.0


class GoFeedHandler:
    """A Go Feed handler service: the data is `{"file", "step"}`. Step 0 (OCR) moves the item to
    gate 1, step 1 (classify) to gate 2, step 2 (file it) completes it; each answer's `response` is
    the data with the step done. Work takes longer for some files, so a gate's items finish apart."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.lock = threading.Lock()
        service = self

        class _Request(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                call = Call(
                    json.loads(self.rfile.read(int(self.headers["Content-Length"]))),
                    self.headers.get("Content-Type", ""),
                    time.time(),
                )
                body = json.dumps(service.process(call.data), separators=(",", ":")).encode()
                # Stamped before the answer leaves (after, this thread could run late): the watcher
                # cannot act on the answer before this moment.
                call.end = time.time()
                with service.lock:
                    service.calls.append(call)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Request)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/process"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @staticmethod
    def process(data: dict[str, Any]) -> dict[str, Any]:
        step = data["step"]
        time.sleep(0.02 + 0.08 * (FILES.index(data["file"]) % 3))
        by_step: dict[int, dict[str, Any]] = {
            0: {"text": f"text of {data['file']}"},
            1: {"label": "invoice"},
            2: {"filed": True},
        }
        done = by_step[step]
        response = {**data, **done, "step": step + 1}
        return {"gate": min(step + 1, 2), "complete": step == 2, "response": response, "error": None}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def gofeed_handler() -> Iterator[GoFeedHandler]:
    service = GoFeedHandler()
    yield service
    service.close()


@pytest.mark.slow
def test_a_go_feed_handler_drives_a_three_gate_fan_in_under_request_raw(
    db_url: str, feed: Feed, gofeed_handler: GoFeedHandler, watchers: WatcherProcesses
) -> None:
    items = "".join(json.dumps({"data": {"file": name, "step": 0}}) + "\n" for name in FILES)
    added = run_cli(db_url, "add", "folder-1", "--items", "-", input=items)
    assert added.returncode == 0, added.stderr
    watchers.start("--handler", gofeed_handler.url, "--request", "raw", *FAST)
    wait_until(lambda: feed.status("folder-1").status == "complete", timeout=60, what=f"the folder\n{watchers.logs()}")

    calls = sorted(gofeed_handler.calls, key=lambda c: c.start)
    by_step = {step: [c for c in calls if c.data["step"] == step] for step in (0, 1, 2)}
    for step in (0, 1, 2):  # every file once at each gate, nothing delivered twice
        assert sorted(c.data["file"] for c in by_step[step]) == FILES
    for step in (0, 1):  # the barrier: no item at gate N+1 was sent before every item at gate N had answered
        assert min(c.start for c in by_step[step + 1]) >= max(c.end for c in by_step[step])
    assert {c.content_type for c in calls} == {"application/json"}

    status = feed.status("folder-1")
    assert (status.gate, status.items["complete"], status.failed_items) == (2, len(FILES), ())
    stored = sorted((json.loads(item.data) for item in feed.items("folder-1")), key=lambda data: data["file"])
    assert stored == [
        {"file": name, "step": 3, "text": f"text of {name}", "label": "invoice", "filed": True} for name in FILES
    ]
