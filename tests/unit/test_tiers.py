"""The suite's tiers (tests/conftest.py, README: Development): a bare `pytest` selects the fast tier,
`--tier full` CI's (the end-to-end tests on MariaDB only where marked), `--tier all` everything on
every database, and a path given selects exactly that. Checked by
collecting two files in a pytest of its own, as if they were the whole suite (`testpaths`)."""

from __future__ import annotations

import os
import sys

from ..support import ROOT, run_process

FILES = ["tests/store/test_migrations.py", "tests/e2e/test_limits.py"]
SMOKE = {"test_feedproc_migrate_command_is_idempotent", "test_migrated_schema_matches_the_metadata"}


def collected(*args: str) -> list[tuple[str, str]]:
    """(test file, test:database) of each test a pytest with these arguments would run, as its xdist
    worker collected them (the worker's tier comes from the controller); --setup-plan runs nothing."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    command = [sys.executable, "-m", "pytest", "-n", "1", "-v", "--setup-plan", "-p", "no:cacheprovider", *args]
    result = run_process(command, cwd=ROOT, env=env, timeout=120)
    assert result.returncode in (0, 5), result.stdout + result.stderr  # 5: "no tests ran", as planned
    tests = []
    for line in result.stdout.splitlines():
        if line.startswith("tests/") and "::" in line:
            path, name = line.strip().split("::")
            database = name.partition("[")[2].partition("]")[0].split("-")[0] or "-"
            tests.append((path, f"{name.partition('[')[0]}:{database}"))
    assert f"1 worker [{len(tests)} items]" in result.stdout, result.stdout
    return tests


def test_a_bare_run_is_sqlite_and_the_smoke_tests_on_the_servers_without_the_end_to_end_tests() -> None:
    tests = collected("-o", f"testpaths={' '.join(FILES)}")
    assert tests and {path for path, _ in tests} == {FILES[0]}
    servers = {test for _, test in tests if not test.endswith(":sqlite")}
    assert servers == {f"{name}:{db}" for name in SMOKE for db in ("postgresql", "mariadb")}


def test_the_full_tier_runs_the_end_to_end_tests_on_sqlite_and_postgresql_and_the_rest_everywhere() -> None:
    full = collected("-o", f"testpaths={' '.join(FILES)}", "--tier", "full")
    assert {path for path, _ in full} == set(FILES)
    databases = {path: {test.rpartition(":")[2] for p, test in full if p == path} for path in FILES}
    assert databases == {FILES[0]: {"sqlite", "postgresql", "mariadb"}, FILES[1]: {"sqlite", "postgresql"}}


def test_the_all_tier_and_a_path_given_run_everything_on_every_database() -> None:
    everything = collected("-o", f"testpaths={' '.join(FILES)}", "--tier", "all")
    end_to_end = {test.rpartition(":")[2] for path, test in everything if path == FILES[1]}
    assert end_to_end == {"sqlite", "postgresql", "mariadb"}
    assert collected(*FILES) == everything
