"""`feedproc demo` (a fan-out/fan-in on a throwaway database) and `feedproc bench` (feedproc's
workloads, and its peers', measured on your databases)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from .app import app, global_options


@app.command()
def demo(
    partitions: Annotated[int, typer.Option(min=1, max=20, help="Folders to submit.")] = 3,
    files: Annotated[int, typer.Option(min=1, max=5000, help="Files in the first folder.")] = 40,
    delay: Annotated[float, typer.Option(min=0.0, help="Seconds each OCR call takes.")] = 0.02,
    keep: Annotated[bool, typer.Option(help="Keep the temporary database and logs.")] = False,
) -> None:
    """Run a fan-out/fan-in example end to end on a throwaway SQLite database."""
    from ..demo import run_demo

    final = run_demo(partitions=partitions, files=files, delay=delay, keep=keep)
    if any(status["status"] != "complete" for status in final.values()):
        raise typer.Exit(1)


@app.command()
def bench(
    ctx: typer.Context,
    db: Annotated[
        list[str] | None,
        typer.Option(
            "--db",
            metavar="URL",
            help="Where to benchmark (repeatable): sqlite (a temporary file), sqlite:///DIR/X.db (a new file "
            "beside it), postgresql://... or mysql://... (MariaDB/MySQL; a throwaway database created on that "
            "server, dropped after). Default: sqlite, plus FEEDPROC_DATABASE_URL when it is a server.",
        ),
    ] = None,
    workload: Annotated[
        str,
        typer.Option(
            help="Comma-separated: flat, fan, http, http-batch (--batch 100), pull (feedproc work through serve); "
            "also http-fan (fan's partitions through one --handler), pipeline (the same, each gate to its own "
            "handler through a stored pipeline), collect and collect-http (N items fanning in to one item that "
            "collects them, read by a Python processor or an HTTP handler; see --sizes), and flat-accumulate "
            "(flat, every answer carrying accumulate numbers: pages summed, max_score kept greatest; each "
            "partition's accumulator checked)."
        ),
    ] = "flat,fan,http,http-batch,pull",
    watchers: Annotated[
        str | None, typer.Option(help="Comma-separated numbers of watcher processes (default 1,2,4; --quick 1).")
    ] = None,
    partitions: Annotated[int | None, typer.Option(min=1, help="Partitions per run (default 20; --quick 2).")] = None,
    items: Annotated[
        int | None, typer.Option(min=1, help="Items per partition (default 1000; --quick 10); fan: 3 gates x N/3 + 1.")
    ] = None,
    quick: Annotated[
        bool, typer.Option(help="Tiny sizes, one watcher, no peers: checks completion and exactly-once only.")
    ] = False,
    against: Annotated[
        str | None, typer.Option(metavar="PEERS", help="Also run the flat drain with: pgqueuer,procrastinate.")
    ] = None,
    json_file: Annotated[Path | None, typer.Option("--json", metavar="FILE", help="Write the results as JSON.")] = None,
    markdown: Annotated[Path | None, typer.Option(metavar="FILE", help="Write the Markdown tables.")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="`feedproc watch --concurrency` of each watcher.")] = 50,
    poll_interval: Annotated[float, typer.Option(min=0.01, help="`feedproc watch --poll-interval`.")] = 0.1,
    latency_seconds: Annotated[
        float | None,
        typer.Option(min=0.0, help="Length of the half-load latency phase (default 5; --quick 0.5; 0: none)."),
    ] = None,
    pgqueuer_batches: Annotated[str, typer.Option(help="PgQueuer batch sizes to run (comma-separated).")] = "10,500",
    procrastinate_jobs: Annotated[int, typer.Option(min=1, help="Jobs for Procrastinate at most (it is slow).")] = 5000,
    timeout: Annotated[float, typer.Option(min=1.0, help="Seconds one phase of a run may take.")] = 900.0,
    finished: Annotated[
        int,
        typer.Option(min=0, metavar="N", help="Finished items put in the tables before each run (flat-cost check)."),
    ] = 0,
    keep: Annotated[
        bool, typer.Option(help="Keep the throwaway databases and logs (their paths go in the JSON).")
    ] = False,
    sizes: Annotated[
        str | None,
        typer.Option(
            metavar="N,...",
            help="The collect workload's sizes: items fanning in to one collecting item, a run each "
            "(default 1000,100000,1000000; --quick 10).",
        ),
    ] = None,
    queue_setting: Annotated[
        list[str] | None,
        typer.Option(
            metavar="KEY=VALUE",
            help="A setting of the benchmark's queue before each run (repeatable): limit, partition_limit, "
            "group_limit, rate, group_rate, aging; e.g. rate=100000/s (the cost of a setting).",
        ),
    ] = None,
    groups: Annotated[
        int, typer.Option(min=0, metavar="N", help="Put the partitions in N concurrency groups, in turn (0: none).")
    ] = 0,
) -> None:
    """Measure throughput and latency on SQLite, PostgreSQL or MariaDB/MySQL (and of PgQueuer, Procrastinate)."""
    from ..bench import parse_options, run_bench

    options = parse_options(
        db=db,
        fallback_db=global_options(ctx).db or os.environ.get("FEEDPROC_DATABASE_URL"),
        workload=workload,
        watchers=watchers,
        partitions=partitions,
        items=items,
        quick=quick,
        against=against,
        concurrency=concurrency,
        poll_interval=poll_interval,
        latency_seconds=latency_seconds,
        pgqueuer_batches=pgqueuer_batches,
        procrastinate_jobs=procrastinate_jobs,
        timeout=timeout,
        keep=keep,
        finished=finished,
        sizes=sizes,
        queue_settings=queue_setting or [],
        groups=groups,
        json_path=json_file,
        markdown_path=markdown,
        command=" ".join(["feedproc", *sys.argv[1:]]),
    )
    run_bench(options)
