#!/usr/bin/env python3
"""An example feedproc handler service: folder -> OCR -> classify -> rank (standard library only).

    python cmds/example_handler.py --port 8080                      # one service, no pipeline
    python cmds/example_handler.py --serve list,rank --port 8081    # the pipeline's services
    python cmds/example_handler.py --serve ocr --port 8082
    python cmds/example_handler.py --serve classify --port 8083

It answers each item by its data's ``kind`` (the HTTP handler contract, docs/reference/handler-contract.md), so the same
code serves a queue without a pipeline (gates by number) and the ``uploads`` pipeline of docs/guides/pipelines.md
(gates by name: list 0, ocr 1, classify 2, rank 3; the request still carries the gate's number):

* list, ``{"kind": "folder", "files": ["a.pdf", ...]}`` (or ``"path": "/some/dir"``: its files):
  fans out one child ``{"kind": "file", "name": "a.pdf"}`` per file, to gate ``ocr`` (by name)
  with ``--serve``, to gate 1 without, and answers ``{"done": true, "items": [...]}``.
* ocr, a file without ``text``: a fake OCR; adds ``"text"`` and ``"pages"`` to the file's data,
  moves it to gate ``classify`` (``{"gate": "classify", "data": ...}``) and accumulates its pages
  (``"accumulate": {"pages": 7}``: the gate declares ``pages`` a sum, the folder's total).
* classify, a file: a score derived from its name and a label, answered as the file's ``result``
  (its data stays as it was).
* rank, ``{"kind": "rank", "top": 3}``: runs only after every file is classified (the fan-in
  barrier), at a gate that collects ``classify``: the request carries the files' results (inline,
  or past the inline bound a ``results_url`` to page) and the folder's ``accumulated`` pages. It
  answers done with the top N as its result. No database: everything arrives in the request.

``--serve`` names the steps this process answers (comma-separated); an item of another step gets
a 422. Without it the process is the whole example without a pipeline and without the OCR step:
folder at gate 0, files classified (and their pages accumulated) at gate 1, rank at gate 2
(added with ``"collect": 1``; the queue declares ``pages`` with ``feedproc queue set QUEUE
--accumulate pages=sum``). ``--delay`` makes each file's first step (OCR; without ``--serve``,
classification) take that many seconds, to watch the progress; ``--fail`` names a file whose first
step fails permanently (HTTP 422), to try ``feedproc retry``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

STEPS = ("list", "ocr", "classify", "rank")


def score_of(name: str) -> float:
    """A stable pseudo-score in [0, 1) for a file name."""
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) / 0x1_0000_0000


def label_of(score: float) -> str:
    return "invoice" if score >= 0.5 else "letter"


def pages_of(name: str) -> int:
    """A stable pseudo page count, 1 to 20, for a file name."""
    return 1 + int(score_of("pages of " + name) * 20)


def collected_results(collected: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every result a fan-in request collected: inline, or page after page from its results_url
    (each page's "next" until it is null)."""
    if "results" in collected:
        yield from collected["results"]
        return
    url = collected.get("results_url")
    while url:
        with urllib.request.urlopen(url, timeout=30) as page:
            body = json.load(page)
        yield from body["results"]
        url = body.get("next")


class Handler:
    """The business logic, separate from HTTP so it reads as the contract.

    `serve`: the steps answered (a subset of STEPS, gates named as in the pipeline), or None for
    the example without a pipeline (gates by number, no OCR step)."""

    def __init__(self, delay: float = 0.0, fail: str | None = None, serve: set[str] | None = None) -> None:
        self.delay = delay
        self.fail = fail
        self.serve = serve

    def step_of(self, data: dict[str, Any]) -> str | None:
        """Which step an item's data asks for."""
        kind = data.get("kind")
        if kind == "folder":
            return "list"
        if kind == "rank":
            return "rank"
        if kind == "file":
            return "ocr" if self.serve is not None and "text" not in data else "classify"
        return None

    def answer(self, item: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        data = item.get("data") or {}
        step = self.step_of(data)
        if step is None:
            return 422, {"error": f"unknown item kind {data.get('kind')!r}"}
        if self.serve is not None and step not in self.serve:
            served = ", ".join(s for s in STEPS if s in self.serve)
            return 422, {"error": f"this service answers {served}, not {step} (gate {item.get('gate')})"}
        steps = {"list": self.list_folder, "ocr": self.ocr, "classify": self.classify, "rank": self.rank}
        return steps[step](item, data)

    def list_folder(self, item: dict[str, Any], data: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if "path" in data:
            try:
                files = sorted(e.name for e in os.scandir(data["path"]) if e.is_file())
            except OSError as error:
                return 422, {"error": f"cannot list {data['path']}: {error.strerror}"}
        else:
            files = data.get("files", [])
        gate: int | str = "ocr" if self.serve is not None else 1
        children = [{"gate": gate, "data": {"kind": "file", "name": name}} for name in files]
        return 200, {"done": True, "items": children, "data": {**data, "listed": len(files)}}

    def ocr(self, item: dict[str, Any], data: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if self.delay:
            time.sleep(self.delay)
        if data.get("name") == self.fail:
            return 422, {"error": f"cannot read {data['name']}"}
        pages = pages_of(data["name"])
        return 200, {
            "gate": "classify",
            "data": {**data, "text": f"the text of {data['name']}", "pages": pages},
            "accumulate": {"pages": pages},
        }

    def classify(self, item: dict[str, Any], data: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        answer: dict[str, Any] = {"done": True}
        if self.serve is None:  # the first step of a file without a pipeline: its pages too
            if self.delay:
                time.sleep(self.delay)
            if data.get("name") == self.fail:
                return 422, {"error": f"cannot read {data['name']}"}
            answer["accumulate"] = {"pages": pages_of(data["name"])}
        score = round(score_of(data["name"]), 4)
        answer["result"] = {"name": data["name"], "score": score, "label": label_of(score)}
        return 200, answer

    def rank(self, item: dict[str, Any], data: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        collected = item.get("collected")
        if collected is None:
            return 422, {"error": "rank needs its gate to collect the classified files (collect)"}
        scores = [
            (row["result"]["score"], row["result"]["name"])
            for row in collected_results(collected)
            if isinstance(row.get("result"), dict) and "score" in row["result"]
        ]
        top = sorted(scores, reverse=True)[: int(data.get("top", 3))]
        pages = (item.get("accumulated") or {}).get("pages", 0)
        result = {"ranked": len(scores), "pages": pages, "top": [{"name": n, "score": s} for s, n in top]}
        return 200, {"done": True, "result": result}


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


def parse_steps(value: str) -> set[str]:
    steps = {part.strip() for part in value.split(",") if part.strip()}
    if "all" in steps:
        return set(STEPS)
    unknown = steps - set(STEPS)
    if unknown or not steps:
        raise argparse.ArgumentTypeError(f"steps are {', '.join(STEPS)} or all, got {value!r}")
    return steps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    parser.add_argument(
        "--serve",
        type=parse_steps,
        default=None,
        metavar="STEPS",
        help="the pipeline steps to answer, comma-separated: list, ocr, classify, rank (or all); "
        "omitted: the example without a pipeline (gates 0, 1, 2 by number, no OCR)",
    )
    parser.add_argument("--delay", type=float, default=0.0, help="seconds each file's OCR (or classification) takes")
    parser.add_argument("--fail", default=None, help="a file name whose OCR (or classification) fails")
    args = parser.parse_args(argv)
    # One thread per keep-alive connection: with the default 5 ms GIL switch interval, a thread
    # woken by a request waits behind the others; a short interval keeps answers prompt.
    sys.setswitchinterval(0.0002)
    handler = Handler(args.delay, args.fail, args.serve)
    server = serve(handler, args.host, args.port)
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
