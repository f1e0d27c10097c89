"""`feedproc bench --quick` end to end, in a subprocess: it completes, on SQLite, PostgreSQL and
MariaDB, and every item of every workload is processed exactly once. It never asserts a speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from ..conftest import _require_pg
from ..support import run_process


def _mariadb_admin_url(request: pytest.FixtureRequest) -> str | None:
    """The MariaDB server's URL, or None when there is none (the fixture skips then; it fails when
    FEEDPROC_REQUIRE_MARIADB=1, and that failure stands)."""
    try:
        return str(request.getfixturevalue("mariadb_admin_url"))
    except pytest.skip.Exception:
        return None


def quick_bench(cwd: Path, *args: str, timeout: float = 360) -> subprocess.CompletedProcess[str]:
    """`feedproc bench --quick ARGS` in a subprocess (its databases only where --db says): it succeeded."""
    env = {k: v for k, v in os.environ.items() if k != "FEEDPROC_DATABASE_URL"}
    command = [sys.executable, "-m", "feedproc", "bench", "--quick", *args]
    done = run_process(command, cwd=cwd, env=env, timeout=timeout, guard=True)  # its watchers and handler too
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_bench_quick_processes_every_item_exactly_once(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    admin_url = request.getfixturevalue("pg_admin_url")
    if admin_url is None and _require_pg():
        pytest.fail("PostgreSQL is required (FEEDPROC_REQUIRE_PG=1) but none is reachable")
    mariadb_url = _mariadb_admin_url(request)
    places = ["--db", "sqlite"] + (["--db", admin_url] if admin_url else [])
    places += ["--db", mariadb_url] if mariadb_url else []
    report_file = tmp_path / "bench.json"
    markdown_file = tmp_path / "bench.md"
    done = quick_bench(tmp_path, *places, "--json", str(report_file), "--markdown", str(markdown_file))

    report = json.loads(report_file.read_text())
    dbs = ["sqlite"] + (["postgresql"] if admin_url else []) + (["mariadb"] if mariadb_url else [])
    assert sorted((r["db"], r["workload"]) for r in report["runs"]) == sorted(
        (db, workload) for db in dbs for workload in ("flat", "fan", "http", "http-batch", "pull")
    )
    for run in report["runs"]:
        where = f"{run['db']} {run['workload']}"
        assert run["problems"] == [], where
        assert run["complete"] and run["exactly_once"], where
        deliveries = run["deliveries"]
        assert deliveries["items"] >= run["items"] > 0, where  # the backlog, plus the paced phase's items
        assert deliveries["calls"] == deliveries["items"], where
        assert deliveries["redelivered"] == deliveries["never_called"] == deliveries["unknown"] == 0, where
        assert run["watchers"] == 1
    assert report["peers"] == []

    table = markdown_file.read_text()
    assert table == done.stdout
    for db in dbs:
        assert f"| {db} | fan | 1 |" in table

    # The throwaway databases are gone.
    listings = {
        admin_url: "SELECT datname FROM pg_database",
        mariadb_url: "SELECT schema_name FROM information_schema.schemata",
    }
    for url, listing in listings.items():
        if url is None:
            continue
        admin = create_engine(url)
        try:
            with admin.connect() as conn:
                names = conn.execute(text(listing)).scalars().all()
        finally:
            admin.dispose()
        assert not [name for name in names if name.startswith(f"bench_{report['meta']['run_id']}_")], url


def test_fill_finished_puts_complete_rows_before_the_runs_own(db_url: str) -> None:
    from feedproc import Feed
    from feedproc.bench import fill_finished, read_db

    last_partition, last_item = fill_finished(db_url, 12_345)
    with Feed(db_url) as feed:
        summary = feed.summary()
        feed.add_partition("run-0", [(0, b"{}")] * 3)
    assert summary.partitions["complete"] == 2  # 10,000 + 2,345
    assert summary.items["complete"] == summary.items["total"] == 12_345
    facts = read_db(db_url, (last_partition, last_item))
    assert [row.status for row in facts.items] == ["available"] * 3
    assert [key for key, _ in facts.partitions.values()] == ["run-0"]


@pytest.mark.slow
def test_bench_runs_the_fan_through_one_handler_and_through_a_pipeline(tmp_path: Path) -> None:
    report_file = tmp_path / "bench.json"
    quick_bench(tmp_path, "--db", "sqlite", "--workload", "http-fan,pipeline", "--json", str(report_file), timeout=300)
    runs = json.loads(report_file.read_text())["runs"]
    assert [r["workload"] for r in runs] == ["http-fan", "pipeline"]
    for run in runs:
        assert run["problems"] == [] and run["complete"] and run["exactly_once"], run["workload"]
        deliveries = run["deliveries"]
        assert deliveries["items"] >= run["items"] > 0  # the backlog, plus the paced phase's items
        assert deliveries["calls"] == deliveries["items"] and deliveries["redelivered"] == 0


@pytest.mark.slow
def test_bench_runs_flat_accumulate_beside_flat_and_checks_the_accumulators(tmp_path: Path) -> None:
    report_file, markdown = tmp_path / "bench.json", tmp_path / "bench.md"
    args = ("--db", "sqlite", "--workload", "flat,flat-accumulate", "--json", str(report_file))
    quick_bench(tmp_path, *args, "--markdown", str(markdown), timeout=300)
    runs = json.loads(report_file.read_text())["runs"]
    assert [r["workload"] for r in runs] == ["flat", "flat-accumulate"]
    for run in runs:
        assert run["problems"] == [] and run["complete"] and run["exactly_once"], run["workload"]
    assert runs[1]["accumulated_exact"] is True  # every partition's pages and max_score, as its items answered
    assert "| sqlite | 1 |" in markdown.read_text().split("flat-accumulate ÷ flat")[1]


@pytest.mark.slow
def test_bench_collect_reads_every_result_once_at_the_fan_in(db_url: str, tmp_path: Path) -> None:
    report_file = tmp_path / "bench.json"
    markdown_file = tmp_path / "bench.md"
    # 1,500: more than a page (1,000) of collected results, and more than a request carries inline.
    command = ["--db", db_url, "--workload", "collect,collect-http", "--sizes", "5,1500"]
    done = quick_bench(tmp_path, *command, "--json", str(report_file), "--markdown", str(markdown_file))

    runs = json.loads(report_file.read_text())["runs"]
    assert [(r["workload"], r["size"], r["watchers"]) for r in runs] == [
        (workload, size, 1) for workload in ("collect", "collect-http") for size in (5, 1500)
    ]
    for run in runs:
        size, where = run["size"], f"{run['workload']} {run['size']}"
        assert run["problems"] == [] and run["complete"] and run["exactly_once"], where
        assert run["read"] == {"count": size, "len": size, "twice": 0, "sum": size * (size + 1) // 2}, where
        assert run["deliveries"] == {"calls": 2, "items": 2, "fan_in_calls": 1}, where
        fan_in = run["fan_in"]
        assert fan_in["barrier_to_call_ms"] > 0 and fan_in["barrier_to_answer_seconds"] > 0, where
        assert fan_in["iterate_seconds"] >= 0 and max(run["peak_rss_mb"]) > 0, where
    assert [run["pages"] for run in runs] == [None, None, 0, 2]  # collect-http: inline, then by its results URL
    table = markdown_file.read_text()
    assert table == done.stdout
    assert f"| {runs[0]['db']} | collect | 1,500 |" in table and "| barrier → fan-in call ms |" in table


def test_bench_refuses_collect_sizes_that_are_not_positive_integers(tmp_path: Path) -> None:
    for sizes in ("0,10", "1k"):
        command = [sys.executable, "-m", "feedproc", "bench", "--workload", "collect", "--sizes", sizes]
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and "--sizes" in done.stderr and "positive integers" in done.stderr, sizes
