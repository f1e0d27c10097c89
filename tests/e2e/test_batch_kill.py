"""A watcher killed (SIGKILL) while its batch request is at the handler: the items of the batch are
charged one lost delivery each, another watcher delivers them again, and each completes exactly
once. Real watcher processes, a real handler over loopback, every database."""

from __future__ import annotations

import json
import os
import signal
import threading
from typing import Any

import pytest

from feedproc import Feed

from ..support import HandlerService, WatcherProcesses, wait_status, wait_until

pytestmark = pytest.mark.slow


def test_a_watcher_killed_mid_batch_loses_the_batch_once_and_each_item_completes_once(
    feed: Feed, watchers: WatcherProcesses, handler: HandlerService
) -> None:
    held, release = threading.Event(), threading.Event()

    def hold_the_first_batch(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if not held.is_set():
            held.set()
            release.wait(30)  # the watcher that sent it is killed meanwhile: nobody reads this answer
        return 200, {"answers": [{"done": True} for _ in body["items"]]}

    handler.behavior = hold_the_first_batch
    feed.add_partition("scans", [(0, json.dumps({"n": n}).encode()) for n in range(20)])
    args = ["--handler", handler.url, "--batch", "20", "--batch-wait-ms", "500", "--lease-seconds", "2"]
    args += ["--poll-interval", "0.1", "--retry-delay", "0.1"]
    first = watchers.start(*args)
    wait_until(held.is_set, timeout=30, what="the first batch at the handler")
    os.killpg(first.pid, signal.SIGKILL)
    assert first.wait(timeout=10) == -signal.SIGKILL
    release.set()

    watchers.start(*args)
    final = wait_status(feed, "scans", "complete", timeout=60)
    assert final.items["complete"] == 20
    with handler.lock:
        sent = [[body["id"] for body in d.body["items"]] for d in handler.deliveries]
    first_batch = sent[0]
    assert len(first_batch) == 20  # the batch the killed watcher had sent
    delivered = [item_id for batch in sent for item_id in batch]
    assert sorted(delivered) == sorted(first_batch * 2)  # every item: once to each watcher, no more
    for item in feed.items("scans"):
        outcomes = [h.outcome for h in feed.item(item.id).history]
        assert outcomes == ["lost", "done"], (item.id, outcomes)
