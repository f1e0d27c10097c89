"""`feedproc demo`: the folder -> OCR -> classify -> rank pipeline, end to end, on a throwaway SQLite file.

Starts the example handler (cmds/example_handler.py) as the pipeline's three services (list and
rank, OCR, classify), applies the `uploads` pipeline of docs/guides/pipelines.md with their URLs,
starts one `feedproc watch --queue uploads` (no handler: it serves the stored pipeline), submits a few folder
partitions with named gates, draws a progress bar per partition from the database, and ends with
a summary. Everything it starts is stopped; the temporary directory is removed unless --keep.
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
from .core.pipelines import PipelineSpec, parse_toml
from .feed import Feed

#: The pipeline guide's uploads.toml, without its schedule, with the services' URLs filled in.
PIPELINE = """\
queue = "uploads"

[defaults]
max_attempts = 8
retry_delay = 2

[[gate]]
name = "list"
number = 0
handler = "{list}"

[[gate]]
name = "ocr"
number = 1
handler = "{ocr}"
limit = 8
timeout = 120
accumulate = {{pages = "sum"}}

[[gate]]
name = "classify"
number = 2
handler = "{classify}"

[[gate]]
name = "rank"
number = 3
handler = "{list}"
collect = "classify"
"""

#: The example handler's services: what each answers (its --serve), and its log's name.
SERVICES = {"list": "list,rank", "ocr": "ocr", "classify": "classify"}


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
    handlers: list[subprocess.Popen[bytes]] = []
    watcher = None
    feed = Feed(db_url)
    try:
        feed.migrate()
        urls = {}
        for role, steps in SERVICES.items():
            args = [sys.executable, str(example_handler_path()), "--serve", steps, "--port", "0"]
            if role == "ocr":
                args += ["--delay", str(delay)]
            log = workdir / f"handler-{role}.log"
            handlers.append(_start(args, log, env))
            urls[role] = _listening(handlers[-1], log)
        spec = feed.apply_pipeline(parse_toml(PIPELINE.format(**urls), source="the demo's pipeline"))
        console.print(f"[bold]feedproc demo[/] in {workdir}")
        for role, steps in SERVICES.items():
            console.print(f"  handler   {urls[role]}  answers {steps.replace(',', ', '):<10}  (example_handler.py)")
        console.print(f"  pipeline  {_described(spec)}")
        watcher = _start(
            [
                sys.executable,
                "-m",
                "feedproc",
                "watch",
                "--queue",
                spec.queue,
                "--concurrency",
                str(concurrency),
                "--poll-interval",
                "0.2",
            ],
            workdir / "watcher.log",
            env,
        )
        console.print(f"  watcher   pid {watcher.pid}  (feedproc watch --queue {spec.queue}, no --handler)")
        keys = []
        for n in range(partitions):
            key = f"upload-{n + 1}"
            names = [f"scan-{n + 1}-{i:03d}.pdf" for i in range(files + 10 * n)]
            feed.add_partition(
                key,
                [
                    {"gate": "list", "data": {"kind": "folder", "files": names}},
                    {"gate": "rank", "data": {"kind": "rank", "top": 3}},
                ],
                queue=spec.queue,
                priority=partitions - n,
            )
            keys.append(key)
        console.print(f"  submitted {partitions} folders: files go list -> ocr -> classify, rank waits for all\n")
        started = time.monotonic()
        final = _show_progress(feed, keys, watcher, spec, console)
        elapsed = time.monotonic() - started
        _summary(final, elapsed, console)
        return final
    finally:
        _stop(watcher)
        for handler in handlers:
            _stop(handler)
        feed.close()
        if keep:
            console.print(f"kept {workdir} (database demo.db, handler-*.log, watcher.log)")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _listening(handler: subprocess.Popen[bytes], log: Path) -> str:
    """The URL a handler service printed as it started ("listening on URL")."""
    assert handler.stdout is not None
    line = handler.stdout.readline().decode().strip()
    if not line.startswith("listening on "):
        raise FeedprocError(f"the example handler did not start (see {log})")
    return line.removeprefix("listening on ")


def _described(spec: PipelineSpec) -> str:
    gates = [f"{gate.number} {gate.name}" + (f" (limit {gate.limit})" if gate.limit else "") for gate in spec.gates]
    return f"{spec.queue} v{spec.version}: " + ", ".join(gates)


def _show_progress(
    feed: Feed, keys: list[str], watcher: subprocess.Popen[bytes], spec: PipelineSpec, console: Console
) -> dict[str, Any]:
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
                status = feed.status(key).to_json()  # kept as JSON, with its ranking added
                items = status["items"]
                done = items["complete"] + items["failed"] + items["cancelled"]
                state = f"{status['status']} at gate {status['gate']} ({spec.numbers.get(status['gate'], '?')})"
                progress.update(tasks[key], total=items["total"], completed=done, state=state)
                if status["status"] != "available":
                    ranked = feed.items(key, gate=spec.names["rank"], limit=1)
                    result = ranked[0].result if ranked else None
                    status["rank"] = json.loads(result) if result else {}
                    final[key] = status
            time.sleep(0.1)
    return final


def _summary(final: dict[str, Any], elapsed: float, console: Console) -> None:
    table = Table(title="summary")
    for column in ("partition", "status", "items", "pages", "top files by score"):
        table.add_column(column)
    total = 0
    for key, status in final.items():
        total += status["items"]["complete"]
        rank = status.get("rank", {})
        top = ", ".join(f"{t['name']} ({t['score']:.2f})" for t in rank.get("top", [])) or "-"
        table.add_row(key, status["status"], str(status["items"]["total"]), str(rank.get("pages", "-")), top)
    console.print(table)
    console.print(f"{total} items completed in {elapsed:.1f}s ({total / max(elapsed, 1e-9):.0f} items/s)")
