"""The README's examples run as written (issue 18): its Python files (blocks whose first line is
`# NAME.py`) with a real watcher, and its command-line session, each in a fresh directory."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ..support import ROOT, WatcherProcesses, feedproc_env

pytestmark = [pytest.mark.slow, pytest.mark.sqlite_only]
README = (ROOT / "README.md").read_text()
BIN = Path(sys.executable).parent


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README, re.S | re.M)


def python_files() -> dict[str, str]:
    """The README's Python blocks that are whole files: {"classify.py": source, ...}."""
    found = {}
    for block in blocks("python"):
        first = block.splitlines()[0]
        if re.fullmatch(r"# [a-z_]+\.py", first):
            found[first[2:]] = block
    return found


def test_the_python_api_example_runs_as_two_files_with_a_watcher(tmp_path: Path) -> None:
    files = python_files()
    assert {"classify.py", "produce.py"} <= set(files)
    for name, source in files.items():
        (tmp_path / name).write_text(source)
    url = f"sqlite:///{tmp_path / 'feedproc.db'}"
    env = {**feedproc_env(url), "PYTHONPATH": str(tmp_path)}
    subprocess.run([sys.executable, "-m", "feedproc", "migrate"], env=env, check=True, capture_output=True)
    watchers = WatcherProcesses(url, tmp_path)
    try:
        watchers.start("--processor", "classify:Classify", "--poll-interval", "0.1", PYTHONPATH=str(tmp_path))
        produced = subprocess.run(
            [sys.executable, "produce.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
    finally:
        watchers.stop_all()
    assert produced.returncode == 0, produced.stderr + watchers.logs()
    first, last = produced.stdout.strip().splitlines()
    assert first == "available"
    assert last.startswith("complete [") and last.count("'label': 'invoice'") == 3, last
    assert "exists already" not in watchers.logs()  # importing classify.py produced nothing


def test_the_command_line_session_runs_as_written(tmp_path: Path) -> None:
    session = next(block for block in blocks("sh") if block.startswith("feedproc migrate\n"))
    (tmp_path / "cmds").symlink_to(ROOT / "cmds")
    script = (
        "set -e\n"
        + session
        + "feedproc wait upload-42 --timeout 60\n"  # then stop the two background jobs it started
        + "kill $(jobs -p)\nwait || true\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "FEEDPROC_DATABASE_URL"}
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"  # "with the virtualenv active"
    result = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "complete" in result.stdout
