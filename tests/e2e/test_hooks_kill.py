"""Completion hooks through SIGKILL (every database, real `feedproc watch` processes, a real HTTP
receiver): a watcher killed while its hook's call is under way leaves the hook to the next watcher,
which delivers it again with the same idempotency key and records it once; a watcher killed in the
middle of a partition invents no hook, and the watcher that finishes the partition delivers exactly
one; a hook's secret never reaches the logs."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from feedproc import Feed
from feedproc.core.hooks import SIGNATURE_HEADER, verify

from ..cli_processors import DELAY_VARIABLE, LOG_VARIABLE
from ..hooks_support import receiving
from ..support import WatcherProcesses, wait_status, wait_until

# On MariaDB too in the full tier: exactly once through SIGKILL, on each database's transactions.
pytestmark = [pytest.mark.slow, pytest.mark.every_database]

SECRET = "whsec-kill-test-5f1c"
FAST = ("--poll-interval", "0.1", "--lease-seconds", "2", "--retry-delay", "0.1")
HOOKS = ("--hook-timeout", "1", "--hook-max-delay", "0.2")
PROCESSOR = ("--processor", "cli_processors:LoggedSlow")


def killed(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    assert process.wait(timeout=10) == -signal.SIGKILL


def test_a_watcher_killed_while_calling_a_hook_leaves_it_to_the_next_one(
    feed: Feed, watchers: WatcherProcesses, tmp_path: Path
) -> None:
    env = {LOG_VARIABLE: str(tmp_path / "log"), DELAY_VARIABLE: "0", "FEEDPROC_HOOK_SECRET": SECRET}
    with receiving() as receiver:
        receiver.hold.set()  # the first call is held: the watcher is killed mid-call
        feed.set_queue("default", hooks={"on_complete": receiver.url})
        first = watchers.start(*PROCESSOR, *FAST, *HOOKS, **env)
        feed.add_partition("upload", [(0, b"1"), (0, b"2"), (1, b"3")])
        wait_status(feed, "upload", "complete", timeout=60)
        assert receiver.held.wait(30), "the hook was called"
        killed(first)
        [claimed] = feed.store.hooks()
        assert (claimed["status"], claimed["attempts"]) == ("pending", 1)

        receiver.hold.clear()
        watchers.start(*PROCESSOR, *FAST, *HOOKS, **env)
        [sent] = wait_until(lambda: feed.store.hooks(status="sent"), timeout=60, what="the hook delivered again")

    assert sent["attempts"] == 2
    assert [r.id for r in receiver.received] == [str(sent["id"])] * 2  # one hook, called twice, one key
    assert [r.json()["key"] for r in receiver.received] == ["upload", "upload"]
    for request in receiver.received:
        assert verify(SECRET, request.headers[SIGNATURE_HEADER], request.body, now=time.time())
    assert SECRET not in watchers.logs()


def test_a_watcher_killed_mid_partition_invents_no_hook_and_loses_none(
    feed: Feed, watchers: WatcherProcesses, tmp_path: Path
) -> None:
    env = {LOG_VARIABLE: str(tmp_path / "log"), DELAY_VARIABLE: "0.1"}
    with receiving() as receiver:
        feed.set_queue("default", hooks={"on_complete": receiver.url, "on_fail": receiver.url})
        first = watchers.start(*PROCESSOR, "--concurrency", "2", *FAST, *HOOKS, **env)
        feed.add_partition("upload", [(0, str(n).encode()) for n in range(40)])
        wait_until(lambda: feed.status("upload").items["complete"] >= 10, timeout=60, what="answers written")
        killed(first)
        assert feed.status("upload").status == "available"
        assert feed.store.hooks() == []  # not finished: no hook

        watchers.start(*PROCESSOR, "--concurrency", "4", *FAST, *HOOKS, **env)
        wait_status(feed, "upload", "complete", timeout=90)
        wait_until(lambda: feed.store.hooks(status="sent"), timeout=60, what="the hook delivered")

    assert [(h["key"], h["hook"], h["attempts"]) for h in feed.store.hooks()] == [("upload", "on_complete", 1)]
    assert [r.json()["status"] for r in receiver.received] == ["complete"]
