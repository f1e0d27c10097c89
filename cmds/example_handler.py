#!/usr/bin/env python3
"""An example feedproc handler service: folder -> classify each file -> rank (standard library only).

    python cmds/example_handler.py --port 8080 --db sqlite:///feedproc.db

Items and what the handler answers (the HTTP handler contract, see README):

* gate 0, ``{"kind": "folder", "files": ["a.pdf", ...]}``: fans out one child per file to gate 1
  and answers ``{"done": true, "items": [...]}``.
* gate 1, ``{"kind": "file", "name": "a.pdf"}``: "classifies" the file (a score derived from its
  name) and answers ``{"done": true, "data": {..., "score": 0.73}}``.
* gate 2, ``{"kind": "rank", "top": 3}``: runs only after every file is classified (the fan-in
  barrier). Reads the scores through the feedproc Python API and answers done with the top N.

``--delay`` makes each classification take that many seconds, to watch the progress; ``--fail``
names a file whose classification fails permanently (HTTP 422), to try ``feedproc retry``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def score_of(name: str) -> float:
    """A stable pseudo-score in [0, 1) for a file name."""
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) / 0x1_0000_0000


class Handler:
    """The business logic, separate from HTTP so it reads as the contract."""

    def __init__(self, db_url: str | None, delay: float = 0.0, fail: str | None = None) -> None:
        self.db_url = db_url
        self.delay = delay
        self.fail = fail
        self._feed: Any = None
        self._lock = threading.Lock()

    def feed(self) -> Any:
        with self._lock:
            if self._feed is None:
                from feedproc import Feed

                self._feed = Feed(self.db_url)
            return self._feed

    def answer(self, item: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        data = item.get("data") or {}
        kind = data.get("kind")
        if kind == "folder":
            files = data.get("files", [])
            children = [{"gate": 1, "data": {"kind": "file", "name": name}} for name in files]
            return 200, {"done": True, "items": children, "data": {**data, "listed": len(files)}}
        if kind == "file":
            if self.delay:
                time.sleep(self.delay)
            if data.get("name") == self.fail:
                return 422, {"error": f"cannot read {data['name']}"}
            return 200, {"done": True, "data": {**data, "score": round(score_of(data["name"]), 4)}}
        if kind == "rank":
            if self.db_url is None:
                return 422, {"error": "rank needs --db to read the scores"}
            scores = []
            after = 0
            while page := self.feed().items(item["partition"], gate=1, after_id=after, limit=1000):
                for row in page:
                    child = json.loads(row["data"])
                    if "score" in child:
                        scores.append((child["score"], child["name"]))
                after = page[-1]["id"]
            top = sorted(scores, reverse=True)[: int(data.get("top", 3))]
            return 200, {
                "done": True,
                "data": {**data, "ranked": len(scores), "top": [{"name": n, "score": s} for s, n in top]},
            }
        return 422, {"error": f"unknown item kind {kind!r}"}


class Server(ThreadingHTTPServer):
    request_queue_size = 1024  # the default backlog of 5 resets bursts of new connections


def serve(handler: Handler, host: str, port: int) -> ThreadingHTTPServer:
    class Request(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # One send per answer and no Nagle delay: over keep-alive, headers and body written
        # separately otherwise wait ~40 ms for the client's delayed ACK.
        disable_nagle_algorithm = True
        wbufsize = 1 << 16

        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            try:
                item = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                status, body = handler.answer(item)
            except Exception as error:  # a bug here is a transient failure for feedproc
                status, body = 500, {"error": repr(error)}
            out = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def do_GET(self) -> None:
            out = b'{"ok": true}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    server = Server((host, port), Request)
    server.daemon_threads = True
    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    parser.add_argument("--db", default=None, help="feedproc database URL (for the rank step)")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds each classification takes")
    parser.add_argument("--fail", default=None, help="a file name whose classification fails")
    args = parser.parse_args(argv)
    # One thread per keep-alive connection: with the default 5 ms GIL switch interval, a thread
    # woken by a request waits behind the others; a short interval keeps answers prompt.
    sys.setswitchinterval(0.0002)
    server = serve(Handler(args.db, args.delay, args.fail), args.host, args.port)
    print(f"listening on http://{args.host}:{server.server_address[1]}/", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    sys.exit(0)


if __name__ == "__main__":
    main()
