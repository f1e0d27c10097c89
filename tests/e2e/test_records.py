"""Every delivery is on record, with real watcher processes and signals: a delivery abandoned by a
watcher stopped past its shutdown grace is in `feedproc item ID` as abandoned, and the item is
delivered again; the deliveries of a watcher stalled past its lease (SIGSTOP) are charged to their
items as lost by the watcher that takes over, also when the stalled watcher's clock is an hour
behind (libfaketime: leases are judged on the database's clock only), whether it then wakes up
(SIGCONT) or dies (SIGKILL)."""

from __future__ import annotations

import glob
import json
import os
import signal
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from feedproc import Feed
from feedproc.core.records import ABANDONED, GIVEN_BACK, Unanswered

from ..api_support import ApiServer
from ..cli_processors import DELAY_VARIABLE, HOLD_VARIABLE, LOG_VARIABLE
from ..support import A, WatcherProcesses, register, run_cli, wait_status, wait_until

pytestmark = pytest.mark.slow

HELD = ["--processor", "cli_processors:LoggedSlow", "--concurrency", "5", "--poll-interval", "0.1"]


def deliveries(log: Path) -> list[tuple[int, int, int]]:
    """(watcher pid, item id, attempt) of every delivery the processors logged."""
    if not log.exists():
        return []
    rows = [line.split() for line in log.read_text().splitlines()]
    return [(int(pid), int(item), int(attempt)) for pid, _key, item, _gate, attempt in rows]


def records(db_url: str, item_id: int) -> list[dict[str, Any]]:
    """The item's deliveries as `feedproc item ID --json` shows them."""
    shown = run_cli(db_url, "item", str(item_id), "--json")
    assert shown.returncode == 0, shown.stderr
    history: list[dict[str, Any]] = json.loads(shown.stdout)["history"]
    return history


@pytest.fixture
def held(tmp_path: Path) -> dict[str, str]:
    """The processors' environment: deliveries logged, and held while the hold file exists."""
    hold = tmp_path / "hold"
    hold.touch()
    return {LOG_VARIABLE: str(tmp_path / "deliveries.log"), HOLD_VARIABLE: str(hold), DELAY_VARIABLE: "0"}


def test_a_watcher_stopped_past_its_grace_records_each_abandoned_delivery_and_the_item_is_delivered_again(
    db_url: str, feed: Feed, watchers: WatcherProcesses, held: dict[str, str]
) -> None:
    log = Path(held[LOG_VARIABLE])
    feed.add_partition("p", [(0, json.dumps({"n": n}).encode()) for n in range(7)])
    first = watchers.start(*HELD, "--shutdown-grace", "1", **held)
    wait_until(lambda: len(deliveries(log)) == 5, timeout=30, what="five deliveries running")
    first.send_signal(signal.SIGINT)
    assert first.wait(timeout=30) == 0
    running = {item for _, item, _ in deliveries(log)}
    for item in running:
        (record,) = records(db_url, item)
        assert (record["n"], record["attempt"], record["outcome"]) == (1, 1, "abandoned"), record
        assert f":{first.pid}:" in record["watcher"] and record["started_at"] and record["ended_at"]
        assert record["duration"] >= 1.0  # it ran through the grace period
        assert "stopped during delivery 1: still running after the shutdown grace" in record["error"]
    others = [i.id for i in feed.items("p") if i.id not in running]
    assert len(others) == 2 and all(records(db_url, item) == [] for item in others)  # taken, never started

    Path(held[HOLD_VARIABLE]).unlink()
    second = watchers.start(*HELD, **held)
    wait_status(feed, "p", "complete", timeout=60)
    again = {item: attempt for pid, item, attempt in deliveries(log) if pid == second.pid}
    assert again == {**dict.fromkeys(running, 2), **dict.fromkeys(others, 1)}
    for item in running:
        assert [(r["outcome"], r["attempt"]) for r in records(db_url, item)] == [("abandoned", 1), ("done", 2)]


def test_the_api_and_the_item_page_show_deliveries_abandoned_and_given_back(db_url: str, feed: Feed) -> None:
    feed.add_partition("p", [(0, b"{}"), (0, b"{}")])
    register(feed.store, A)
    feed.store.acquire(A, "default", 1, 30)
    running, unwritable = feed.store.fetch_ready(A, 10)
    started_us = int(datetime.now(UTC).timestamp() * 1e6) - 90_000_000
    given = [
        Unanswered(running.id, running.version, ABANDONED, started_us, 90_000_000),
        Unanswered(unwritable.id, unwritable.version, GIVEN_BACK, started_us, 2_500_000, "answer {attempt} unwritable"),
    ]
    feed.store.release(A, feed.store.owned(A), abandoned={running.partition_id: given})
    api = ApiServer(db_url)
    try:
        for item, outcome, took, error in (
            (running, "abandoned", "1m 30s", "stopped during delivery 1"),
            (unwritable, "given back", "2.5s", "answer 1 unwritable"),
        ):
            (shown,) = api.get(f"/api/v1/items/{item.id}").json()["history"]
            assert (shown["outcome"], shown["watcher"], shown["attempt"]) == (outcome, A, 1)
            page = api.get(f"/items/{item.id}").text
            assert f'<tr data-outcome="{outcome}"><td>1</td><td>1</td>' in page
            assert f"<td>{outcome}</td>" in page and f"<td>{took}</td>" in page and error in page
    finally:
        api.close()


def faketime_library() -> str:
    """libfaketime (the Debian package `faketime`), which the clock-skew test preloads."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1") + glob.glob("/usr/lib/faketime/libfaketime.so.1"))
    if not found:
        pytest.fail("libfaketime is missing: apt-get install faketime")
    return found[0]


def clock_of(member_log: str) -> float:
    """Seconds the clock of the watcher that wrote `member_log` (JSON lines) is behind ours, from its first line."""
    first = json.loads(member_log.splitlines()[0])
    stamped = datetime.strptime(first["time"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    return datetime.now(UTC).timestamp() - stamped.timestamp()


@pytest.mark.servers_only  # SQLite's clock is each process's own: a skewed process skews its database too
@pytest.mark.parametrize("wakes", [True, False], ids=["then-continued", "then-killed"])
def test_a_stalled_watcher_an_hour_behind_has_each_of_its_deliveries_charged_as_lost_by_the_one_taking_over(
    db_url: str, feed: Feed, watchers: WatcherProcesses, held: dict[str, str], tmp_path: Path, wakes: bool
) -> None:
    log = Path(held[LOG_VARIABLE])
    feed.add_partition("p", [(0, json.dumps({"n": n}).encode()) for n in range(5)])
    args = [*HELD, "--lease-seconds", "4", "--log-format", "json"]
    skewed = watchers.start(*args, **held, LD_PRELOAD=faketime_library(), FAKETIME="-1h")
    wait_until(lambda: len(deliveries(log)) == 5, timeout=30, what="five deliveries running")
    behind = clock_of((tmp_path / "watch-0.log").read_text())
    assert 3500 < behind < 3700, behind  # the watcher's clock really is an hour behind

    os.killpg(skewed.pid, signal.SIGSTOP)
    try:
        taker = watchers.start(*args, **held)
        items = [i.id for i in feed.items("p")]
        wait_until(
            lambda: all(feed.item(item).history for item in items), timeout=60, what="the stalled deliveries charged"
        )
        wait_until(lambda: len(deliveries(log)) == 10, timeout=30, what="the items delivered again")
    finally:
        os.killpg(skewed.pid, signal.SIGCONT if wakes else signal.SIGKILL)
    Path(held[HOLD_VARIABLE]).unlink()  # the stalled calls return too (when continued): their answers come late
    wait_status(feed, "p", "complete", timeout=60)

    assert sorted(deliveries(log)) == sorted(
        [(skewed.pid, item, 1) for item in items] + [(taker.pid, item, 2) for item in items]
    )
    for item in items:
        shown = [(r["outcome"], r["attempt"], r["watcher"].split(":")[1]) for r in records(db_url, item)]
        assert shown == [("lost", 1, str(skewed.pid)), ("done", 2, str(taker.pid))], shown
        assert feed.item(item).attempts == 1
