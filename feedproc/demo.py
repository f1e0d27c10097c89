"""`feedproc demo`: the folder -> classify -> rank scenario, end to end, on a throwaway SQLite file.

Starts the example handler service (cmds/example_handler.py) and one `feedproc watch` process,
submits a few folder partitions, draws a progress bar per partition from the database, and ends
with a summary. Everything it starts is stopped; the temporary directory is removed unless --keep.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .core.errors import FeedprocError
from .feed import Feed


def example_handler_path() -> Path:
    """The example handler script: inside the installed package, or in the checkout's cmds/."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_examples" / "example_handler.py", here.parent / "cmds" / "example_handler.py"):
        if candidate.is_file():
            return candidate
    raise FeedprocError("the example handler is missing from this installation")


def _start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            args,
            stdout=subprocess.PIPE if "example_handler" in args[1] else out,
            stderr=out,
            env=env,
            start_new_session=True,
        )


def _stop(process: subprocess.Popen[bytes] | None) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


def run_demo(
    *,
    partitions: int = 3,
    files: int = 40,
    delay: float = 0.02,
    concurrency: int = 8,
    keep: bool = False,
    console: Console | None = None,
) -> dict[str, Any]:
    """Run the demo; returns the final status of each partition."""
    console = console or Console()
    workdir = Path(tempfile.mkdtemp(prefix="feedproc-demo-"))
    db_url = f"sqlite:///{workdir / 'demo.db'}"
    env = dict(os.environ, FEEDPROC_DATABASE_URL=db_url, PYTHONUNBUFFERED="1")
    handler = watcher = None
    feed = Feed(db_url)
    try:
        feed.migrate()
        handler = _start(
            [sys.executable, str(example_handler_path()), "--port", "0", "--db", db_url, "--delay", str(delay)],
            workdir / "handler.log",
            env,
        )
        assert handler.stdout is not None
        line = handler.stdout.readline().decode().strip()
        if not line.startswith("listening on "):
            raise FeedprocError(f"the example handler did not start (see {workdir / 'handler.log'})")
        url = line.removeprefix("listening on ")
        console.print(f"[bold]feedproc demo[/] in {workdir}")
        console.print(f"  handler  {url}  (cmds/example_handler.py)")
        watcher = _start(
            [
                sys.executable,
                "-m",
                "feedproc",
                "watch",
                "--handler",
                url,
                "--concurrency",
                str(concurrency),
                "--poll-interval",
                "0.2",
            ],
            workdir / "watcher.log",
            env,
        )
        console.print(f"  watcher  pid {watcher.pid}  (feedproc watch --handler {url})")
        keys = []
        for n in range(partitions):
            key = f"upload-{n + 1}"
            names = [f"scan-{n + 1}-{i:03d}.pdf" for i in range(files + 10 * n)]
            feed.add_partition(
                key,
                [
                    (0, json.dumps({"kind": "folder", "files": names}).encode()),
                    (2, json.dumps({"kind": "rank", "top": 3}).encode()),
                ],
                priority=partitions - n,
            )
            keys.append(key)
        console.print(
            f"  submitted {partitions} folders: gate 0 lists files, gate 1 classifies each, "
            "gate 2 ranks them once all are classified\n"
        )
        started = time.monotonic()
        final = _show_progress(feed, keys, watcher, console)
        elapsed = time.monotonic() - started
        _summary(final, elapsed, console)
        return final
    finally:
        _stop(watcher)
        _stop(handler)
        feed.close()
        if keep:
            console.print(f"kept {workdir} (database demo.db, handler.log, watcher.log)")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _show_progress(feed: Feed, keys: list[str], watcher: subprocess.Popen[bytes], console: Console) -> dict[str, Any]:
    columns = (
        TextColumn("{task.description:<10}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[state]}"),
        TimeElapsedColumn(),
    )
    final: dict[str, Any] = {}
    with Progress(*columns, console=console, transient=False) as progress:
        tasks = {key: progress.add_task(key, total=None, state="waiting") for key in keys}
        deadline = time.monotonic() + 300
        while len(final) < len(keys) and time.monotonic() < deadline:
            if watcher.poll() is not None:
                raise FeedprocError("the watcher exited early; run with --keep and read watcher.log")
            for key in keys:
                if key in final:
                    continue
                status = feed.status(key)
                items = status["items"]
                done = items["complete"] + items["failed"] + items["cancelled"]
                state = f"{status['status']} at gate {status['gate']}"
                progress.update(tasks[key], total=items["total"], completed=done, state=state)
                if status["status"] != "available":
                    ranked = feed.items(key, gate=2, limit=1)
                    status["rank_top"] = json.loads(ranked[0]["data"]).get("top", []) if ranked else []
                    final[key] = status
            time.sleep(0.1)
    return final


def _summary(final: dict[str, Any], elapsed: float, console: Console) -> None:
    table = Table(title="summary")
    for column in ("partition", "status", "items", "top files by score"):
        table.add_column(column)
    total = 0
    for key, status in final.items():
        total += status["items"]["complete"]
        top = ", ".join(f"{t['name']} ({t['score']:.2f})" for t in status.get("rank_top", [])) or "-"
        table.add_row(key, status["status"], str(status["items"]["total"]), top)
    console.print(table)
    console.print(f"{total} items completed in {elapsed:.1f}s ({total / max(elapsed, 1e-9):.0f} items/s)")
