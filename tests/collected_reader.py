"""A fan-in handler in a process of its own (`python tests/collected_reader.py`): it prints its URL,
then answers each request. An item that collects reads every page of its `results_url` (following
`next`, with httpx) and answers with what it read: how many results, how many ids came twice, the
sum of their `n` and the pages; any other item is done."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx


def read_all(url: str) -> dict[str, Any]:
    seen: set[int] = set()
    twice = total = pages = 0
    with httpx.Client(timeout=60) as client:
        while url:
            page = client.get(url)
            page.raise_for_status()
            body = page.json()
            for row in body["results"]:
                twice += row["id"] in seen
                seen.add(row["id"])
                total += row["result"]["n"]
            pages += 1
            url = body["next"]
    return {"count": len(seen) + twice, "twice": twice, "sum": total, "pages": pages}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        collected = body.get("collected")
        answer: dict[str, Any] = {"done": True}
        if collected is not None:
            answer["result"] = {"collected": {k: v for k, v in collected.items() if k != "results_url"}}
            answer["result"]["read"] = read_all(collected["results_url"])
        out = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"http://127.0.0.1:{server.server_address[1]}/", flush=True)
    server.serve_forever()
