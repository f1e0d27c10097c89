"""`feedproc serve` delivers completion hooks too (every database): a pull-mode queue has no watcher,
so the serve process calls its HTTP hooks, signed, as a watcher would; `--no-hooks` leaves them."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from feedproc import Feed, verify_signature

from ..api_support import ServeProcess
from ..hooks_support import receiving
from ..support import wait_until

pytestmark = pytest.mark.slow

SECRET = "whsec-serve-test"


def pulled_to_completion(feed: Feed, key: str) -> None:
    """`key`, one item of pull-mode queue "gpu", claimed and answered done by a worker."""
    feed.add_partition(key, [(0, b"1")], queue="gpu")
    [claimed] = feed.claim("gpu", "gpu-7")
    feed.answer(claimed["id"], claimed["token"], {"done": True})
    assert feed.status(key).status == "complete"


def test_serve_calls_the_hooks_of_a_pull_queue(db_url: str, feed: Feed, tmp_path: Path) -> None:
    with receiving() as receiver:
        feed.set_queue("gpu", mode="pull", hooks={"on_complete": receiver.url})
        serve = ServeProcess(db_url, tmp_path, FEEDPROC_HOOK_SECRET=SECRET, FEEDPROC_API_TOKEN="t" * 32)
        try:
            pulled_to_completion(feed, "render-1")
            [sent] = wait_until(lambda: feed.store.hooks(status="sent"), timeout=60, what="serve to send the hook")
        finally:
            serve.stop()
    [request] = receiver.received
    assert (request.json()["key"], request.id) == ("render-1", str(sent["id"]))
    assert verify_signature(SECRET, request.headers["Feedproc-Signature"], request.body, now=time.time())
    assert SECRET not in serve.log()


def test_serve_with_no_hooks_leaves_them_pending(db_url: str, feed: Feed, tmp_path: Path) -> None:
    with receiving() as receiver:
        feed.set_queue("gpu", mode="pull", hooks={"on_complete": receiver.url, "on_fail": receiver.url})
        serve = ServeProcess(db_url, tmp_path, "--no-hooks", FEEDPROC_API_TOKEN="t" * 32)
        try:
            pulled_to_completion(feed, "render-2")
            time.sleep(3)  # an absence: three of a sender's poll intervals pass with the hook due
            [pending] = feed.store.hooks()
            assert (pending["status"], pending["attempts"]) == ("pending", 0)
        finally:
            serve.stop()
    assert receiver.received == []
