"""A completion hooks' receiver for tests: a real HTTP server on loopback, in a thread, that keeps
every request it gets and answers as told (a status code, or holding the request until released)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    """One request the receiver got."""

    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def id(self) -> str:
        """The hook's idempotency key."""
        return self.headers["Idempotency-Key"]


class Receiver:
    """Answers `status` (default 200) to every POST, or holds requests while `hold` is set."""

    def __init__(self, port: int = 0) -> None:
        self.received: list[Received] = []
        self.status = 200
        self.hold = threading.Event()  # set: requests wait until it is cleared (or the test ends)
        self.held = threading.Event()  # set once a request is being held
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver._lock:
                    receiver.received.append(Received(self.path, dict(self.headers.items()), body))
                while receiver.hold.is_set() and not receiver.closing.is_set():
                    receiver.held.set()
                    receiver.closing.wait(0.05)
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.closing = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def bodies(self) -> list[Any]:
        with self._lock:
            return [r.json() for r in self.received]

    def close(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def receiving(port: int = 0) -> Iterator[Receiver]:
    """A receiver for the block, on `port` (0: any free one)."""
    receiver = Receiver(port)
    try:
        yield receiver
    finally:
        receiver.close()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then let go): a hook endpoint that is down."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
