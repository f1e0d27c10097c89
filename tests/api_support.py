"""Helpers for the HTTP tests: the `feedproc serve` application on a real socket (in a thread, or as
a real `feedproc serve` process), a free port for `watch --health-port`, and slow clients."""

from __future__ import annotations

import os
import re
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from .support import feedproc_env, spawn, stop_group, wait_until

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
        access: Any = None,
        **limits: int,
    ) -> None:
        import uvicorn

        from feedproc import Feed
        from feedproc.api import DEFAULT_MAX_BODY, create_app

        self.feed = Feed(db_url)
        app = create_app(
            self.feed,
            token=token,
            worker_token=worker_token,
            max_body=max_body or DEFAULT_MAX_BODY,
            access=access,
            **limits,
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
    """A real `feedproc serve --port 0` process; its URL is read from its first line of output.
    `nofile`: its file descriptors, soft and hard (`ulimit -n`)."""

    def __init__(self, db_url: str, log_dir: Path, *args: str, nofile: int | None = None, **env: str) -> None:
        self.log_path = log_dir / "serve.log"
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child

        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.process = spawn(
            [sys.executable, "-m", "feedproc", "serve", "--port", "0", *args],
            env=feedproc_env(db_url, **env),
            preexec_fn=limit,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        port = wait_until(self._port, timeout=60, what="feedproc serve to print its address")
        self.url = f"http://127.0.0.1:{port}"  # on loopback, also when it listens on 0.0.0.0
        wait_until(self._answers, timeout=30, what="feedproc serve to answer")

    def _port(self) -> str | None:
        if self.process.poll() is not None:
            raise AssertionError(f"feedproc serve exited {self.process.returncode}:\n{self.log()}")
        found = re.search(r"http://(?:127\.0\.0\.1|0\.0\.0\.0):(\d+)/", self.log())
        return found.group(1) if found else None

    def _answers(self) -> bool:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=5).status_code in (200, 503)
        except httpx.HTTPError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_group(self.process)


class Slowloris:
    """`count` connections to 127.0.0.1:`port` that each send a request line, then one more header
    line every `every` seconds, never ending the request; a connection the server closes is opened
    again (so there are always more than a cap). One thread; `closed` counts the server's closes."""

    def __init__(self, port: int, count: int, *, path: str = "/api/v1/queues", every: float = 1.0) -> None:
        self.port, self.count, self.path, self.every = port, count, path, every
        self.opened = self.closed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _open(self) -> socket.socket | None:
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=1)
            sock.sendall(f"GET {self.path} HTTP/1.1\r\nHost: x\r\n".encode())
        except OSError:
            return None
        self.opened += 1
        return sock

    def _run(self) -> None:
        socks: list[socket.socket | None] = [None] * self.count
        try:
            while not self._stop.is_set():
                for n, sock in enumerate(socks):
                    if self._stop.is_set():
                        break
                    if sock is None:
                        socks[n] = self._open()
                        continue
                    try:
                        sock.sendall(b"X-Slow: 1\r\n")
                    except OSError:  # the server closed it (a first send after the close may still pass)
                        self.closed += 1
                        sock.close()
                        socks[n] = self._open()
                self._stop.wait(self.every)
        finally:
            for sock in socks:
                if sock is not None:
                    sock.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def probe_for(url: str, seconds: float, *, within: float = 2.0) -> list[str]:
    """GET `url` on a new connection every 0.2 s for `seconds`; what went wrong (a status other than
    200, an error, or an answer slower than `within` seconds), if anything."""
    problems: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.monotonic()
        try:
            status: object = httpx.get(url, timeout=within + 5).status_code
        except httpx.HTTPError as error:
            status = type(error).__name__
        elapsed = time.monotonic() - started
        if status != 200 or elapsed > within:
            problems.append(f"{status} after {elapsed:.2f}s")
        time.sleep(0.2)
    return problems


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))
