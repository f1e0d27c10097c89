"""Answers too large to take, refused in bounded memory by real processes: a handler's 9.9 MB answer of
900,000 children fails its item in a `feedproc watch` that stays far below the 1.4 GB it reached
writing them, and a worker's 3 MB answer of 1,000,000 `{}` children is a 413 from a `feedproc serve`
that stays far below the 1.65 GB it reached."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx

from feedproc import Feed

from ..api_support import ServeProcess
from ..support import HandlerService, WatcherProcesses, wait_status

#: Peak resident memory allowed (MB): idle, a watcher or serve holds about 90; reading the answer
#: costs its body and its parse (about 180 MB for 900,000 objects), never the children it would make.
BOUND_MB = 600


def peak_rss_mb(process: subprocess.Popen[bytes]) -> int:
    """The process's peak resident memory so far (Linux: VmHWM)."""
    for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no VmHWM")


def test_a_handlers_answer_of_900_000_children_fails_its_item_in_bounded_memory(
    db_url: str, feed: Feed, handler: HandlerService, watchers: WatcherProcesses
) -> None:
    answer = b'{"done":true,"items":[%s]}' % b",".join([b'{"gate":1}'] * 900_000)
    assert 9_900_000 < len(answer) < 10 * 1024 * 1024  # within --max-answer-bytes: the children are refused
    handler.behavior = lambda body: (200, answer)
    feed.add_partition("fan", [(0, b"{}")])
    watcher = watchers.start("--handler", handler.url, "--max-attempts", "5", "--poll-interval", "0.1")
    status = wait_status(feed, "fan", "failed", timeout=60)
    peak = peak_rss_mb(watcher)
    (failed,) = status.failed_items
    assert (failed.attempts, failed.last_error) == (
        1,
        "answer has 900000 children; the limit is 100000 (--max-children)",
    )
    assert status.items["total"] == 1 and len(handler.deliveries) == 1
    assert peak < BOUND_MB, f"the watcher reached {peak} MB"


def test_a_workers_answer_of_1_000_000_children_is_413_in_bounded_memory(
    db_url: str, feed: Feed, tmp_path: Path
) -> None:
    token = "worker-token-9876543210"
    feed.set_queue("gpu", mode="pull")
    feed.add_partition("fan", [(0, b"{}")], queue="gpu")
    server = ServeProcess(db_url, tmp_path, FEEDPROC_WORKER_TOKEN=token)
    try:
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
            (item,) = client.post("/api/v1/queues/gpu/claim", json={"worker": "w"}).json()["items"]
            children = b",".join([b"{}"] * 1_000_000)
            body = b'{"token": "%s", "done": true, "items": [%s]}' % (item["token"].encode(), children)
            response = client.post(
                f"/api/v1/items/{item['id']}/answer", content=body, headers={"Content-Type": "application/json"}
            )
            peak = peak_rss_mb(server.process)
    finally:
        server.stop()
    assert response.status_code == 413
    assert response.json() == {"error": "answer has 1000000 children; the limit is 100000 (--max-children)"}
    assert feed.status("fan").items == {"total": 1, "available": 1, "complete": 0, "failed": 0, "cancelled": 0}
    assert peak < BOUND_MB, f"serve reached {peak} MB"
