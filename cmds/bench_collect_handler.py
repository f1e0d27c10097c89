#!/usr/bin/env python3
"""The HTTP handler of `feedproc bench --workload collect-http`: a fan-in read over HTTP.

    python cmds/bench_collect_handler.py --port 0 --dir FOLDER   # prints "listening on http://127.0.0.1:PORT/"

An item at gate 0 is answered with its data as its result. An item that collects reads every
result: inline in its request when they fit, else every page of its `results_url` (on `feedproc
serve`, one keep-alive connection, following `next`), counting them, the ids seen twice (a byte per
id since the first) and the sum of their `n`. Like the Python processor of `collect`, it appends
`<item id> <gate> <attempt> <unix time at receipt>` per request to FOLDER/calls-handler.log and one
JSON object per fan-in request (when it was received, the reading's time, the counts, the pages)
to FOLDER/collect-handler.jsonl. Standard library only; two requests a run, so `http.server` is
not what is measured.
"""

from __future__ import annotations

import argparse
import http.client
import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


class Reading:
    """Counts of one collection as it is read: results, ids seen twice, the sum of their `n`."""

    def __init__(self) -> None:
        self.seen = bytearray()
        self.first: int | None = None
        self.count = self.twice = self.total = self.pages = 0

    def add(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self.first = row["id"] if self.first is None else self.first
            offset = row["id"] - self.first
            if offset >= len(self.seen):
                self.seen.extend(bytes(offset - len(self.seen) + 65536))
            self.twice += self.seen[offset]
            self.seen[offset] = 1
            self.count += 1
            self.total += (row.get("result") or {}).get("n", 0)

    def pages_of(self, url: str) -> None:
        """Follow `url` and each page's `next` to the end, on one connection."""
        parts = urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=600)
        try:
            next_url: str | None = url
            while next_url:
                target = urlsplit(next_url)
                conn.request("GET", f"{target.path}?{target.query}")
                response = conn.getresponse()
                body = response.read()
                if response.status != 200:
                    raise RuntimeError(f"GET {target.path}: {response.status} {body[:200]!r}")
                page = json.loads(body)
                self.add(page["results"])
                self.pages += 1
                next_url = page["next"]
        finally:
            conn.close()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    folder: Path

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        received = time.time()
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open(self.folder / "calls-handler.log", "a") as log:
            log.write(f"{body['id']} {body['gate']} {body['attempt']} {received:.6f}\n")
        collected = body.get("collected")
        answer: dict[str, Any] = {"done": True, "result": body.get("data")}
        if collected is not None:
            started = time.perf_counter()
            reading = Reading()
            if "results" in collected:
                reading.add(collected["results"])
            else:
                reading.pages_of(collected["results_url"])
            record = {
                "id": body["id"],
                "entered": received,
                "iterate_seconds": time.perf_counter() - started,
                "count": reading.count,
                "len": collected["count"] + collected["failed"],
                "twice": reading.twice,
                "sum": reading.total,
                "pages": reading.pages,
            }
            with open(self.folder / "collect-handler.jsonl", "a") as log:
                log.write(json.dumps(record) + "\n")
            answer["result"] = {"count": reading.count, "twice": reading.twice, "sum": reading.total}
        out = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--dir", type=Path, required=True, help="where the call log and the fan-in record go")
    args = parser.parse_args()
    Handler.folder = args.dir
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}/", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
