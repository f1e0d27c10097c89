#!/usr/bin/env python3
"""A fast local HTTP handler for `feedproc bench --workload http,http-batch`: answers every item `{"done": true}`.

    python cmds/bench_handler.py --port 0 --log calls.log     # prints "listening on http://127.0.0.1:PORT/"

Why not `http.server`: `ThreadingHTTPServer` costs a thread and a full `BaseHTTPRequestHandler`
parse per request and speaks HTTP/1.0 by default (a new connection per item), so it, not feedproc,
would be measured. This is a raw asyncio `Protocol` speaking just enough HTTP/1.1 for a keep-alive
client (Content-Length bodies, pipelining tolerated): no task, no framework and no routing per
request, a few microseconds of Python each. It runs on uvloop when installed (the `bench` extra
installs it), else on the standard asyncio loop; no other dependency.

With `--log FILE` it appends one line per request, `<item id> <gate> <attempt> <unix time at
receipt>`: the benchmark reads dispatch times and counts deliveries (exactly once) from it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from typing import IO, Any

ANSWER_BODY = b'{"done":true}'
ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
    + str(len(ANSWER_BODY)).encode()
    + b"\r\n\r\n"
    + ANSWER_BODY
)
BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
MAX_HEAD = 64 * 1024


class HandlerProtocol(asyncio.Protocol):
    """One keep-alive connection: parse requests off the byte stream, answer each at once."""

    def __init__(self, log: IO[str] | None) -> None:
        self.log = log
        self.buffer = bytearray()
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD:
                    self._fail()
                return
            length = content_length(bytes(self.buffer[:end]))
            if length is None:
                self._fail()
                return
            total = end + 4 + length
            if len(self.buffer) < total:
                return
            body = bytes(self.buffer[end + 4 : total])
            del self.buffer[:total]
            self._answer(body)

    def _answer(self, body: bytes) -> None:
        if body.startswith(b'{"items":'):  # a batch (`feedproc watch --batch N`): one answer per item
            return self._answer_batch(body)
        if self.log is not None:
            received = time.time()
            try:
                item = json.loads(body)
                self.log.write(f"{item['id']} {item.get('gate', 0)} {item.get('attempt', 1)} {received:.6f}\n")
            except (ValueError, KeyError, TypeError):
                self.log.write(f"? 0 0 {received:.6f}\n")
        self.transport.write(ANSWER)

    def _answer_batch(self, body: bytes) -> None:
        received = time.time()
        try:
            items = json.loads(body)["items"]
        except (ValueError, KeyError, TypeError):
            return self._fail()
        if self.log is not None:
            self.log.write(
                "".join(f"{i['id']} {i.get('gate', 0)} {i.get('attempt', 1)} {received:.6f}\n" for i in items)
            )
        answer = b'{"answers":[' + b",".join([ANSWER_BODY] * len(items)) + b"]}"
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(answer)
        self.transport.write(head + answer)

    def _fail(self) -> None:
        self.transport.write(BAD_REQUEST)
        self.transport.close()


def content_length(head: bytes) -> int | None:
    """The Content-Length of a request head (0 when absent); None if malformed or chunked."""
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            try:
                length = int(value.strip())
            except ValueError:
                return None
        elif name == b"transfer-encoding":
            return None  # feedproc's client always sends a Content-Length
    return length if length >= 0 else None


async def serve(host: str, port: int, log_path: str | None) -> None:
    log = open(log_path, "a", buffering=1 << 16) if log_path else None  # noqa: SIM115 - closed below
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: HandlerProtocol(log), host, port, backlog=1024)
    bound = server.sockets[0].getsockname()
    print(f"listening on http://{bound[0]}:{bound[1]}/", flush=True)
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        server.close()
        if log is not None:
            log.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    parser.add_argument("--log", help="append one line per request: id gate attempt time")
    args = parser.parse_args()
    runner: Any = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop

        runner = uvloop.run
    runner(serve(args.host, args.port, args.log))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
