"""Helpers for the HTTP tests: the `feedproc serve` application on a real socket (in a thread, or as
a real `feedproc serve` process), and a free port for `watch --health-port`."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx

from .support import feedproc_env, wait_until

TOKEN = "test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ApiServer:
    """`create_app` served by uvicorn in a thread, on 127.0.0.1 and a port of its own (`limits`:
    create_app's max_items, max_children)."""

    def __init__(
        self,
        db_url: str,
        *,
        token: str | None = TOKEN,
        worker_token: str | None = None,
        max_body: int | None = None,
        **limits: int,
    ) -> None:
        import uvicorn

        from feedproc import Feed
        from feedproc.api import DEFAULT_MAX_BODY, create_app

        self.feed = Feed(db_url)
        app = create_app(
            self.feed, token=token, worker_token=worker_token, max_body=max_body or DEFAULT_MAX_BODY, **limits
        )
        sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started, timeout=30, what="the API server to start")
        self.client = httpx.Client(base_url=self.url, timeout=30)

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.client.get(path, **kwargs)

    def post(self, path: str, json: Any = None, *, auth: bool = True, **kwargs: Any) -> httpx.Response:
        headers = {**(AUTH if auth else {}), **kwargs.pop("headers", {})}
        return self.client.post(path, json=json, headers=headers, **kwargs)

    def close(self) -> None:
        self.client.close()
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.feed.close()


class ServeProcess:
    """A real `feedproc serve --port 0` process; its URL is read from its first line of output."""

    def __init__(self, db_url: str, log_dir: Path, *args: str, **env: str) -> None:
        self.log_path = log_dir / "serve.log"
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        self.process = subprocess.Popen(
            [sys.executable, "-m", "feedproc", "serve", "--port", "0", *args],
            env=feedproc_env(db_url, **env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        match = wait_until(self._address, timeout=60, what="feedproc serve to print its address")
        self.url = match.group(0).rstrip("/")
        wait_until(self._answers, timeout=30, what="feedproc serve to answer")

    def _address(self) -> re.Match[str] | None:
        if self.process.poll() is not None:
            raise AssertionError(f"feedproc serve exited {self.process.returncode}:\n{self.log()}")
        return re.search(r"http://127\.0\.0\.1:\d+/", self.log())

    def _answers(self) -> bool:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=5).status_code in (200, 503)
        except httpx.HTTPError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
