"""No process outlives a killed pytest: a watcher a test started, and a shell's background job, end
when the pytest that ran the test is killed with SIGKILL (nothing of it runs a cleanup), also under
xdist, whose workers outlive their controller unless told otherwise (tests/conftest.py)."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ..support import ROOT, spawn, stop_group, wait_until

INNER = """
import os, sys
from pathlib import Path

from feedproc.store import Store
from tests.support import WatcherProcesses, feedproc_env, run_process

PIDS = Path(os.environ["PIDS"])


def published(name, pid):
    (PIDS / f"{name}.tmp").write_text(str(pid))
    (PIDS / f"{name}.tmp").rename(PIDS / name)  # whole, or not there


def test_blocks(tmp_path):
    url = f"sqlite:///{tmp_path / 'feedproc.db'}"
    Store(url).migrate()
    watcher = WatcherProcesses(url, tmp_path).start("--handler", "http://127.0.0.1:9/handle")
    published("watcher", watcher.pid)
    job = f"{sys.executable} -m feedproc watch --handler http://127.0.0.1:9/handle & "
    job += f"echo $! > {PIDS}/job.tmp && mv {PIDS}/job.tmp {PIDS}/job; wait"
    run_process(["bash", "-c", job], env=feedproc_env(url), timeout=600, guard=True)
"""


def written_or_exited(path: Path, process: subprocess.Popen[bytes]) -> bool:
    return path.exists() or process.poll() is not None


def started_at(pid: int) -> str | None:
    """The start time of a live process (not a zombie), None when there is none with that pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else fields[19]


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
@pytest.mark.parametrize("workers", ["0", "1"], ids=["without-xdist", "xdist-worker"])
def test_processes_a_test_started_end_when_its_pytest_is_killed(tmp_path: Path, workers: str) -> None:
    (tmp_path / "test_inner.py").write_text(INNER)
    pids = tmp_path / "pids"
    pids.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # not this run's worker
    env.update(PIDS=str(pids), PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "pytest", "-c", os.devnull, "--rootdir", str(tmp_path), "-p", "tests.conftest"]
    command += ["-p", "no:cacheprovider", "-n", workers, "-q", str(tmp_path / "test_inner.py")]
    with open(tmp_path / "inner.log", "wb") as log:
        inner = spawn(command, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    started: dict[int, str | None] = {}
    try:
        for name in ("watcher", "job"):
            path = pids / name
            wait_until(functools.partial(written_or_exited, path, inner), timeout=120, what=f"the {name}")
            assert path.exists(), (tmp_path / "inner.log").read_text()
            pid = int(path.read_text())
            started[pid] = started_at(pid)
            assert started[pid] is not None, f"the {name} ended before pytest was killed"

        os.kill(inner.pid, signal.SIGKILL)  # the controller, when there are workers

        def left() -> list[int]:
            return [pid for pid, at in started.items() if started_at(pid) == at]

        wait_until(lambda: not left(), timeout=60, what="the processes the killed pytest's test started to end")
    finally:
        for pid, at in started.items():
            if started_at(pid) == at:
                os.kill(pid, signal.SIGKILL)
        stop_group(inner, grace=0)  # the workers, if the test failed
