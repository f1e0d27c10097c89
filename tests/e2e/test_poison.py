"""A poison item cannot loop: an item whose processing kills its watcher (os._exit, with real
watcher processes) fails after --max-attempts deliveries, every other item completes, and the
watchers that survive keep working."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from feedproc import Feed

from ..cli_processors import LOG_VARIABLE
from ..support import WatcherProcesses, json_of, wait_status

pytestmark = pytest.mark.slow


def deliveries(log: Path) -> list[tuple[int, str, int]]:
    """(watcher pid, partition, item id) of every delivery the processors logged."""
    if not log.exists():
        return []
    rows = [line.split() for line in log.read_text().splitlines()]
    return [(int(pid), key, int(item)) for pid, key, item, _gate, _attempt in rows]


def test_an_item_that_kills_its_watcher_fails_after_max_attempts_and_the_rest_completes(
    db_url: str, feed: Feed, watchers: WatcherProcesses, tmp_path: Path
) -> None:
    log = tmp_path / "deliveries.log"
    rows: list[dict[str, Any]] = [{"gate": 0, "data": {"n": n}} for n in range(40)]
    rows[17] = {"gate": 0, "data": {"poison": True}}
    feed.add_partition("poisoned", [(r["gate"], json.dumps(r["data"]).encode()) for r in rows])
    feed.add_partition("healthy", [(0, json.dumps({"n": n}).encode()) for n in range(40)])
    args = ["--processor", "cli_processors:DiesOnPoison", "--concurrency", "8", "--max-attempts", "2"]
    args += ["--lease-seconds", "2", "--poll-interval", "0.1", "--retry-delay", "0.1"]
    processes = [watchers.start(*args, **{LOG_VARIABLE: str(log)}) for _ in range(3)]

    final = wait_status(feed, "poisoned", "failed", timeout=90)
    (failed,) = final.failed_items
    poison = next(i for i in feed.items("poisoned") if json_of(i.data) == {"poison": True})
    assert failed.id == poison.id and failed.attempts == 2
    assert "died or stalled during delivery 2" in (failed.last_error or ""), failed
    assert "delivered alone" in (failed.last_error or ""), failed
    assert final.items["complete"] == 39  # every other item of the poisoned partition completed
    wait_status(feed, "healthy", "complete", timeout=60)

    killed = [p for p in processes if p.poll() is not None]
    assert len(killed) == 2 and all(p.returncode == 1 for p in killed)  # one death per delivery of the poison
    assert sorted(pid for pid, _, item in deliveries(log) if item == poison.id) == sorted(p.pid for p in killed)
    history = [h.outcome for h in feed.item(poison.id).history]
    assert history == ["lost", "lost"]

    feed.add_partition("afterwards", [(0, b'{"n": 1}')] * 5)  # the survivor keeps working
    wait_status(feed, "afterwards", "complete", timeout=30)
    (survivor,) = [p for p in processes if p.poll() is None]
    assert {pid for pid, key, _ in deliveries(log) if key == "afterwards"} == {survivor.pid}
