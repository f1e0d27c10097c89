"""Accumulate exactly once through a SIGKILL and a steal (every database): real watcher processes
whose Python processor answers every item with accumulate {"n": 1}. However the partition's items
move between watchers (a watcher killed with answers in flight and unwritten, its partition taken
over and those items delivered again; a partition stolen for a fair share mid-way), the accumulator
ends at exactly the item count, and the fan-in item receives that value."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import pytest

from feedproc import Feed

from ..cli_processors import DELAY_VARIABLE, HOLD_VARIABLE, LOG_VARIABLE
from ..support import WatcherProcesses, json_of, wait_status, wait_until

pytestmark = pytest.mark.slow

FAST = ("--poll-interval", "0.1", "--lease-seconds", "2", "--retry-delay", "0.1")
PROCESSOR = ("--processor", "cli_processors:Accumulates")


def scans(count: int) -> list[dict[str, object]]:
    """`count` items at gate 0, and the item at gate 1 that collects them (and the accumulator)."""
    return [*({"gate": 0, "data": {"n": n}} for n in range(count)), {"gate": 1, "data": {}, "collect": 0}]


def delivered(log: Path) -> list[list[str]]:
    return [line.split() for line in log.read_text().splitlines()]


def test_a_watcher_killed_mid_partition_leaves_each_answer_accumulated_once(
    feed: Feed, watchers: WatcherProcesses, tmp_path: Path
) -> None:
    count = 60
    feed.set_queue("default", accumulate={"n": "sum"})
    feed.add_partition("scans", scans(count))
    log = tmp_path / "deliveries.log"
    log.touch()
    env = {LOG_VARIABLE: str(log), DELAY_VARIABLE: "0.2"}  # 60 items, 4 at a time: 3 s
    first = watchers.start(*PROCESSOR, "--concurrency", "4", *FAST, **env)
    # Killed once some answers are written and others are being delivered or wait for their commit.
    wait_until(lambda: feed.status("scans").items["complete"] >= 15, timeout=60, what="answers written")
    os.killpg(first.pid, signal.SIGKILL)
    assert first.wait(timeout=10) == -signal.SIGKILL
    written = feed.status("scans").items["complete"]
    assert 15 <= written < count, written  # mid-partition
    assert feed.status("scans").accumulated == {"n": written}

    second = watchers.start(*PROCESSOR, "--concurrency", "6", *FAST, **env)
    final = wait_status(feed, "scans", "complete", timeout=90)
    assert final.accumulated == {"n": count}
    fan_in = feed.items("scans")[-1]
    assert json_of(fan_in.result) == {"accumulated": {"n": count}}
    lines = delivered(log)
    by_pid = Counter(int(fields[0]) for fields in lines)
    assert set(by_pid) == {first.pid, second.pid}, by_pid
    again = [item for item, n in Counter(fields[2] for fields in lines).items() if n > 1]
    assert again, "the killed watcher's unwritten deliveries were delivered again"


def test_partitions_stolen_mid_way_accumulate_each_answer_once(
    feed: Feed, watchers: WatcherProcesses, tmp_path: Path
) -> None:
    feed.set_queue("default", accumulate={"n": "sum"})
    keys = [f"share-{n:02}" for n in range(8)]
    for key in keys:
        feed.add_partition(key, scans(8))
    log = tmp_path / "deliveries.log"
    log.touch()
    hold = tmp_path / "hold"
    hold.touch()
    env = {LOG_VARIABLE: str(log), DELAY_VARIABLE: "0.1", HOLD_VARIABLE: str(hold)}
    # Concurrency 3 lets one watcher lease every partition: the second gets work only by a steal,
    # which the first honours between items (as test_cli's fair-share test).
    args = (*PROCESSOR, "--concurrency", "3", *FAST)
    first = watchers.start(*args, **env)
    wait_until(lambda: log.read_text().strip(), timeout=20, what="the first watcher's first delivery")
    second = watchers.start(*args, **env)
    wait_until(lambda: sum(w.alive for w in feed.watchers()) == 2, timeout=30, what="the second watcher")
    hold.unlink()
    wait_until(lambda: all(feed.status(k).status == "complete" for k in keys), timeout=90, what="completion")
    by_pid = Counter(int(fields[0]) for fields in delivered(log))
    assert set(by_pid) == {first.pid, second.pid}, by_pid
    stolen = [k for k in keys if any(e.kind == "stolen" for e in feed.status(k, history=100).history or ())]
    assert stolen, "a partition was stolen"
    for key in keys:
        assert feed.status(key).accumulated == {"n": 8}, key
        assert json_of(feed.items(key)[-1].result) == {"accumulated": {"n": 8}}
