"""A rolling upgrade on PostgreSQL: the previous release (`upgrade_support.py`) migrates the
database and runs watchers on a fan-out; this checkout's `feedproc migrate` runs while they work;
a previous-release watcher started after it runs on the newer schema, saying so; this release's
watchers join, the old ones are stopped one at a time, and the fan-out completes with every child
delivered exactly once and nothing failed."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from feedproc import Feed

from ..support import WatcherProcesses, feedproc_env, run_cli, spawn, stop_group, wait_until
from ..upgrade_support import Release, previous_release

pytestmark = pytest.mark.postgres_only

PARTITIONS, ROOTS, CHILDREN = 10, 4, 3  # FansOutThenLogs: each root moves to gate 1 with 3 children


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    return previous_release(tmp_path_factory.mktemp("previous-release"))


def old_feedproc(release: Release, url: str, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(release.python), "-m", "feedproc", *args],
        env=feedproc_env(url),
        input=input,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=release.source,
    )


def delivered(log: Path) -> Counter[str]:
    """Deliveries of gate-1 children by item id (the processor's log: pid partition id gate attempt)."""
    return Counter(line.split()[2] for line in log.read_text().splitlines()) if log.exists() else Counter()


def test_the_previous_release_keeps_working_through_migrate_and_is_replaced_one_watcher_at_a_time(
    unmigrated_url: str, release: Release, tmp_path: Path
) -> None:
    url = unmigrated_url
    migrated = old_feedproc(release, url, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert f"to revision {release.revision}" in migrated.stdout, migrated.stdout
    rows = "".join(json.dumps({"gate": 0, "data": {"root": r}}) + "\n" for r in range(ROOTS))
    for n in range(PARTITIONS):  # the previous release's producer
        added = old_feedproc(release, url, "add", f"upload-{n}", "--items", "-", input=rows)
        assert added.returncode == 0, added.stderr
    log = tmp_path / "deliveries.log"
    env = feedproc_env(url, FEEDPROC_TEST_DELIVERY_LOG=str(log), FEEDPROC_TEST_DELAY="0.25")
    args = ["watch", "--processor", "cli_processors:FansOutThenLogs", "--concurrency", "2", "--poll-interval", "0.2"]
    old: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []

    def start_old() -> subprocess.Popen[bytes]:
        logs.append(tmp_path / f"old-{len(old)}.log")
        with open(logs[-1], "ab") as out:
            old.append(
                spawn(
                    [str(release.python), "-m", "feedproc", *args],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=release.source,
                )
            )
        return old[-1]

    new = WatcherProcesses(url, tmp_path)
    total = PARTITIONS * ROOTS * (1 + CHILDREN)  # the roots move to gate 1 beside their children
    try:
        start_old(), start_old()
        wait_until(lambda: len(delivered(log)) >= total // 6, timeout=60, what="a sixth of the children delivered")
        began = time.monotonic()
        upgraded = run_cli(url, "migrate", timeout=120)  # this release's, while the old watchers work
        migrate_seconds = time.monotonic() - began
        assert upgraded.returncode == 0, upgraded.stderr
        assert all(process.poll() is None for process in old), "an old watcher exited during migrate"
        late = start_old()  # the previous release on the newer schema: declared compatible, so it runs
        wait_until(
            lambda: "declares feedproc from schema" in logs[-1].read_text(),
            timeout=30,
            what="the late old watcher's note",
        )
        assert late.poll() is None, logs[-1].read_text()
        for _ in range(2):
            new.start(*args[1:], FEEDPROC_TEST_DELIVERY_LOG=str(log), FEEDPROC_TEST_DELAY="0.25")
        with Feed(url) as feed:
            wait_until(
                lambda: sum(w.revision is not None and w.alive for w in feed.watchers()) == 2,
                timeout=30,
                what="2 new watchers",
            )
            for process in old:  # replaced one at a time, as a deployment would
                process.send_signal(signal.SIGTERM)
                assert process.wait(timeout=60) == 0
            wait_until(
                lambda: all(feed.status(f"upload-{n}").status == "complete" for n in range(PARTITIONS)),
                timeout=120,
                what="every partition complete",
            )
            statuses = [feed.status(f"upload-{n}") for n in range(PARTITIONS)]
    finally:
        for process in old:
            stop_group(process, grace=20)
        new.stop_all()
    print(f"migrate took {migrate_seconds:.2f}s while the previous release's watchers worked")
    counts = delivered(log)
    assert len(counts) == total and set(counts.values()) == {1}, [i for i, c in counts.items() if c != 1]
    assert all(s.items["failed"] == 0 and s.items["complete"] == ROOTS * (1 + CHILDREN) for s in statuses)
    assert "Traceback" not in "".join(p.read_text() for p in logs) + new.logs()
