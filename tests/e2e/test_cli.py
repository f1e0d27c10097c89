"""The `feedproc` command line (CONTRACT.md section 2), run as real `python -m feedproc` processes.

Every command's happy path, malformed input (exit 2) and refusals (exit 1) with exactly one line on
stderr and nothing written, and end-to-end runs with real watcher subprocesses, real signals and
every database. Set-up and "nothing changed" checks read the database in-process through `Feed`;
the command under test always runs as its own process.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, inspect, select

import feedproc
from feedproc import Feed
from feedproc.store.schema import items, partitions

from ..cli_processors import DELAY_VARIABLE, HOLD_VARIABLE, LOG_VARIABLE
from ..support import HandlerService, WatcherProcesses, db_state, json_of, lease_of, run_cli, wait_until

UNREACHABLE = "postgresql://postgres@127.0.0.1:1/x"
# Input rejected before any database access (argument parsing, key syntax, processor loading) behaves
# the same on every database: those tests run on SQLite only, to keep the suite fast.
before_any_database_access = pytest.mark.sqlite_only
FAST = ("--poll-interval", "0.1", "--lease-seconds", "5", "--retry-delay", "0.1")


# ---------------------------------------------------------------- helpers


def ok(result: subprocess.CompletedProcess[str]) -> str:
    """The stdout of a command that must have succeeded."""
    assert result.returncode == 0, f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    return result.stdout


def assert_error(result: subprocess.CompletedProcess[str], code: int, *fragments: str) -> str:
    """Exit `code`, exactly one non-empty line on stderr (containing each fragment), nothing on stdout."""
    assert result.returncode == code, (
        f"expected exit {code}, got {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    )
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{result.stderr}"
    line = lines[0]
    assert line.strip()
    for fragment in fragments:
        assert fragment.lower() in line.lower(), f"{fragment!r} not in {line!r}"
    assert not result.stdout.strip(), f"unexpected stdout on error: {result.stdout!r}"
    return line


def status_json(db_url: str, key: str, *extra: str) -> dict[str, Any]:
    return json.loads(ok(run_cli(db_url, "status", key, "--json", *extra)))


def stored_items(feed: Feed, key: str) -> list[dict[str, Any]]:
    """The items of partition `key` as stored, oldest first, with their data parsed."""
    query = (
        select(items.c.id, items.c.gate, items.c.status, items.c.attempts, items.c.data)
        .select_from(items.join(partitions, items.c.partition_id == partitions.c.id))
        .where(partitions.c.key == key)
        .order_by(items.c.id)
    )
    with feed.store.engine.connect() as conn:
        return [
            {"id": r.id, "gate": r.gate, "status": r.status, "attempts": r.attempts, "data": json_of(r.data)}
            for r in conn.execute(query)
        ]


def write_lines(path: Path, *rows: Any) -> str:
    """A JSON Lines file: dicts are dumped, strings written as they are."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def kinds(status: dict[str, Any]) -> list[str]:
    return [event["kind"] for event in status.get("history", [])]


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def not_yet(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The handler's "ask me again later" answer: the item stays at its gate, the lease stays held."""
    return 200, {"gate": body["gate"], "retry_after": 0.1}


# ---------------------------------------------------------------- migrate, --version, database URL


def test_migrate_is_idempotent_and_keeps_the_data(db_url: str, feed: Feed) -> None:
    feed.add_partition("before-migrate", [(0, b"{}")])
    before = db_state(feed)
    assert ok(run_cli(db_url, "migrate")).strip()  # the database is at the newest schema already
    assert db_state(feed) == before


def test_version_flag_prints_the_version() -> None:
    result = subprocess.run([sys.executable, "-m", "feedproc", "--version"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    assert feedproc.__version__ in result.stdout


@pytest.mark.parametrize("position", ["before-subcommand", "after-subcommand"])
def test_db_option_is_used_before_or_after_the_subcommand(db_url: str, feed: Feed, position: str) -> None:
    # The environment points at an unreachable database: only --db can make this succeed.
    args = (
        ["--db", db_url, "add", "via-flag", "--open"]
        if position == "before-subcommand"
        else ["add", "via-flag", "--open", "--db", db_url]
    )
    ok(run_cli(UNREACHABLE, *args))
    assert feed.status("via-flag").key == "via-flag"


def test_database_url_comes_from_the_environment_without_db(db_url: str, feed: Feed, tmp_path: Path) -> None:
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    ok(run_cli(db_url, "add", "via-env", "--open", cwd=cwd))
    assert feed.status("via-env").key == "via-env"
    assert not (cwd / "feedproc.db").exists()  # the default database was not used


# ---------------------------------------------------------------- add, add-items, seal


def test_add_reads_items_from_a_file(db_url: str, feed: Feed, tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "items.jsonl",
        {"gate": 1, "data": {"file": "a.pdf", "size": 3}},
        "",  # blank lines are skipped
        {"data": ["no", "gate"]},
        {"gate": 4},
        {"gate": 1, "data": "ünïcode"},
    )
    out = ok(run_cli(db_url, "add", "from-file", "--items", path))
    assert "from-file" in out
    assert [(i["gate"], i["data"]) for i in stored_items(feed, "from-file")] == [
        (1, {"file": "a.pdf", "size": 3}),
        (0, ["no", "gate"]),
        (4, None),
        (1, "ünïcode"),
    ]
    status = feed.status("from-file")
    assert (status.gate, status.sealed, status.status) == (0, True, "available")  # lowest gate; sealed


def test_add_puts_a_row_without_a_gate_at_gate_0(db_url: str, feed: Feed) -> None:
    ok(run_cli(db_url, "add", "no-gate", "--items", "-", input='{"data": {"file": "a.pdf"}}\n'))
    assert [(i["gate"], i["data"]) for i in stored_items(feed, "no-gate")] == [(0, {"file": "a.pdf"})]


def test_add_reads_items_from_standard_input(db_url: str, feed: Feed) -> None:
    lines = '{"gate": 2, "data": {"n": 1}}\n{"gate": 3, "data": {"n": 2}}\n'
    ok(run_cli(db_url, "add", "from-stdin", "--items", "-", input=lines))
    assert [(i["gate"], i["data"]) for i in stored_items(feed, "from-stdin")] == [(2, {"n": 1}), (3, {"n": 2})]
    assert feed.status("from-stdin").gate == 2


def test_add_without_items_is_refused_unless_the_partition_stays_open(db_url: str, feed: Feed) -> None:
    assert_error(run_cli(db_url, "add", "empty"), 2, "--items")  # sealed and empty: it would complete at once
    ok(run_cli(db_url, "add", "empty", "--open"))
    status = feed.status("empty")
    assert (status.status, status.sealed, status.items["total"]) == ("available", False, 0)


@pytest.mark.parametrize("given", ["2031-05-06T07:08:09", "2031-05-06T09:08:09+02:00"])
def test_add_options_set_queue_priority_open_manual_checkpoint_and_not_before(db_url: str, given: str) -> None:
    options = ["--queue", "q.high", "--priority", "7", "--open", "--manual-checkpoint", "--not-before", given]
    ok(run_cli(db_url, "add", "opts", *options, "--items", "-", input='{"gate": 0, "data": 1}\n'))
    status = status_json(db_url, "opts")
    assert status["queue"] == "q.high"
    assert status["priority"] == 7
    assert status["sealed"] is False
    assert status["manual_checkpoint"] is True
    # A time without a zone is UTC; one with a zone is converted; printed as ...Z.
    assert status["not_before"].startswith("2031-05-06T07:08:09") and status["not_before"].endswith("Z")


def test_add_defaults_are_queue_default_priority_zero_sealed(db_url: str, feed: Feed) -> None:
    ok(run_cli(db_url, "add", "defaults", "--items", "-", input='{"data": 1}\n'))
    status = feed.status("defaults")
    expected = {"queue": "default", "priority": 0, "sealed": True, "manual_checkpoint": False, "not_before": None}
    assert {name: getattr(status, name) for name in expected} == expected


@pytest.mark.parametrize("source", ["file", "stdin"])
def test_add_items_appends_to_an_open_partition(db_url: str, feed: Feed, tmp_path: Path, source: str) -> None:
    feed.add_partition("open-1", [(0, b'"first"')], sealed=False)
    rows = [{"gate": 0, "data": "second"}, {"gate": 5, "data": "later"}]
    if source == "file":
        result = run_cli(db_url, "add-items", "open-1", "--items", write_lines(tmp_path / "more.jsonl", *rows))
    else:
        result = run_cli(
            db_url, "add-items", "open-1", "--items", "-", input="".join(json.dumps(r) + "\n" for r in rows)
        )
    assert "2" in ok(result)
    assert [(i["gate"], i["data"]) for i in stored_items(feed, "open-1")] == [(0, "first"), (0, "second"), (5, "later")]
    assert feed.status("open-1").items["available"] == 3


def test_seal_marks_an_open_partition_sealed(db_url: str, feed: Feed) -> None:
    feed.add_partition("to-seal", [(0, b"1")], sealed=False)
    ok(run_cli(db_url, "seal", "to-seal"))
    status = feed.status("to-seal")
    assert (status.sealed, status.status) == (True, "available")


def test_seal_completes_a_drained_open_partition(db_url: str, feed: Feed) -> None:
    feed.add_partition("empty-open", sealed=False)
    assert feed.status("empty-open").status == "available"  # unsealed: waits for more items
    ok(run_cli(db_url, "seal", "empty-open"))
    assert feed.status("empty-open").status == "complete"


# ---------------------------------------------------------------- status


def test_status_of_a_key_prints_a_table_of_its_gates(db_url: str, feed: Feed) -> None:
    feed.add_partition("human-1", [(2, b"1"), (2, b"2"), (7, b"3")], priority=4)
    out = ok(run_cli(db_url, "status", "human-1"))
    assert "human-1" in out
    assert "gate" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split() and line.split()[0].isdigit()}
    assert set(rows) == {"2", "7"}, out
    assert rows["2"][1] == "2" and rows["7"][1] == "1"  # available counts per gate
    assert rows["2"][-1] == "<" and rows["7"][-1] != "<"  # the current gate is marked


def test_status_names_every_column_of_the_gate_table(db_url: str, feed: Feed) -> None:
    feed.add_partition("human-1", [(2, b"1")])
    header, rule, row = ok(run_cli(db_url, "status", "human-1")).splitlines()[-3:]
    assert header.split("  ")[-1] == "current" and row.endswith("<")
    assert len(header.split()) - 1 == len(rule.split())  # "in progress" is one column of two words


def test_status_of_a_key_as_json_has_the_documented_shape(db_url: str, feed: Feed) -> None:
    feed.add_partition("json-1", [(0, b"1"), (0, b"2"), (3, b"3")], queue="qj", priority=-2, sealed=False)
    status = status_json(db_url, "json-1")
    assert {"key", "queue", "status", "gate", "priority", "sealed", "items", "gates", "failed_items"} <= set(status)
    expected = {"key": "json-1", "queue": "qj", "status": "available", "gate": 0, "priority": -2, "sealed": False}
    assert {name: status[name] for name in expected} == expected
    assert status["items"] == {"total": 3, "available": 3, "complete": 0, "failed": 0, "cancelled": 0}
    zero = {"available": 0, "complete": 0, "failed": 0, "cancelled": 0}
    assert status["gates"] == {"0": {**zero, "available": 2}, "3": {**zero, "available": 1}}
    assert status["failed_items"] == []
    for stamp in ("created_at", "updated_at"):
        assert status[stamp].endswith("Z")


def test_status_without_key_as_json_summarises_everything(db_url: str, feed: Feed) -> None:
    feed.add_partition("sum-a", [(0, b"1"), (1, b"2")])
    feed.add_partition("sum-b", [(0, b"3")])
    feed.add_partition("sum-done")
    feed.cancel("sum-b")
    summary = json.loads(ok(run_cli(db_url, "status", "--json")))
    assert summary["partitions"] == {"available": 1, "complete": 1, "failed": 0, "cancelled": 1}
    assert summary["items"] == {"total": 3, "available": 2, "complete": 0, "failed": 0, "cancelled": 1}
    # what the table shows too: the recently updated partitions and the watchers
    assert {p["key"] for p in summary["recent"]} == {"sum-a", "sum-b", "sum-done"} and summary["watchers"] == []


def test_status_without_key_prints_counts(db_url: str, feed: Feed) -> None:
    feed.add_partition("plain-sum", [(0, b"1")])
    out = ok(run_cli(db_url, "status"))
    assert "1 available" in out and "plain-sum" in out


def test_queue_show_prints_times_as_status_does_in_utc_with_z(db_url: str, feed: Feed) -> None:
    later = (datetime.now(UTC) + timedelta(hours=12)).hour  # a one-minute window that is closed now
    feed.set_queue("q", windows=f"{later:02d}:00-{later:02d}:01", paused=True)
    shown = ok(run_cli(db_url, "queue", "show", "q"))
    moment = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
    assert re.search(f"closed, opens {moment}\\), paused since {moment} by ", shown), shown


def test_status_history_shows_the_last_events(db_url: str, feed: Feed) -> None:
    feed.add_partition("hist", [(0, b"1")], sealed=False)
    feed.add_items("hist", [(0, b"2")])
    feed.seal("hist")
    out = ok(run_cli(db_url, "status", "hist", "--history", "10"))
    for kind in ("created", "items_added", "sealed"):
        assert kind in out, out
    assert kinds(status_json(db_url, "hist", "--history", "2")) == ["items_added", "sealed"]  # the last N, in order


# ---------------------------------------------------------------- retry, cancel, checkpoint


@pytest.mark.slow
def test_retry_puts_a_failed_partition_back_to_work(
    db_url: str, feed: Feed, handler: HandlerService, watchers: WatcherProcesses
) -> None:
    healed = threading.Event()
    handler.behavior = lambda body: (
        (200, {"done": True}) if healed.is_set() or body["data"] == "fine" else (400, {"error": "bad input"})
    )
    feed.add_partition("to-retry", [(0, b'"fine"'), (0, b'"broken"')])
    watchers.start("--handler", handler.url, *FAST)
    wait_until(lambda: feed.status("to-retry").status == "failed", timeout=20, what="the partition to fail")
    assert feed.status("to-retry").failed_items[0].attempts >= 1

    healed.set()
    out = ok(run_cli(db_url, "retry", "to-retry"))
    assert "1" in out
    wait_until(lambda: feed.status("to-retry").status == "complete", timeout=20, what="the retried partition")
    broken = [i for i in stored_items(feed, "to-retry") if i["data"] == "broken"]
    assert broken[0]["status"] == "complete"
    assert kinds(feed.status("to-retry", history=50).to_json()).count("retried") == 1


def test_cancel_cancels_the_partition_and_its_available_items(db_url: str, feed: Feed) -> None:
    feed.add_partition("to-cancel", [(0, b"1"), (0, b"2"), (4, b"3")])
    ok(run_cli(db_url, "cancel", "to-cancel"))
    status = feed.status("to-cancel")
    assert status.status == "cancelled"
    assert status.items == {"total": 3, "available": 0, "complete": 0, "failed": 0, "cancelled": 3}


def test_cancel_of_a_cancelled_partition_is_a_no_op(db_url: str, feed: Feed) -> None:
    feed.add_partition("twice", [(0, b"1")])
    feed.cancel("twice")
    before = db_state(feed)
    ok(run_cli(db_url, "cancel", "twice"))
    assert db_state(feed) == before


def test_checkpoint_advances_a_drained_manual_checkpoint_partition(db_url: str, feed: Feed) -> None:
    feed.add_partition("manual", sealed=False, manual_checkpoint=True)
    feed.add_items("manual", [(2, b"1"), (5, b"2")])
    assert feed.status("manual").gate == 0  # gate 0 has drained (it is empty) but waits for the operator
    out = ok(run_cli(db_url, "checkpoint", "manual"))
    assert "2" in out
    status = feed.status("manual")
    assert (status.gate, status.status) == (2, "available")


# ---------------------------------------------------------------- malformed input: exit 2, nothing written


def test_malformed_json_line_is_rejected_naming_the_line(db_url: str, feed: Feed) -> None:
    before = db_state(feed)
    lines = '{"gate": 0, "data": 1}\n{"gate": 0, "data": 2}\n{"gate": 0, "data": \n'
    assert_error(run_cli(db_url, "add", "bad-json", "--items", "-", input=lines), 2, "line 3")
    assert db_state(feed) == before
    assert_error(run_cli(db_url, "status", "bad-json"), 1, "bad-json")


# Parsing a line does not depend on the database; that a rejected line leaves nothing written is
# checked on both databases by the two tests around this one.
@before_any_database_access
@pytest.mark.parametrize(
    "line",
    [
        pytest.param("[0, 1]", id="not-an-object"),
        pytest.param('{"gate": 0, "data": 1, "colour": "red"}', id="unknown-field"),
        pytest.param('{"gate": -1, "data": 1}', id="negative-gate"),
        pytest.param('{"gate": 1.5, "data": 1}', id="fractional-gate"),
        pytest.param('{"gate": "1", "data": 1}', id="string-gate"),
        pytest.param('{"gate": true, "data": 1}', id="boolean-gate"),
    ],
)
def test_invalid_item_line_is_rejected_naming_the_line(db_url: str, feed: Feed, tmp_path: Path, line: str) -> None:
    path = write_lines(tmp_path / "items.jsonl", {"gate": 0, "data": "ok"}, line)
    before = db_state(feed)
    assert_error(run_cli(db_url, "add", "bad-line", "--items", path), 2, "line 2")
    assert db_state(feed) == before


def test_malformed_add_items_adds_nothing(db_url: str, feed: Feed) -> None:
    feed.add_partition("open-bad", [(0, b"1")], sealed=False)
    before = db_state(feed)
    lines = '{"gate": 0, "data": "fine"}\n{"gate": -3}\n'
    assert_error(run_cli(db_url, "add-items", "open-bad", "--items", "-", input=lines), 2, "line 2")
    assert db_state(feed) == before


@before_any_database_access
def test_missing_items_file_is_malformed_input(db_url: str, feed: Feed, tmp_path: Path) -> None:
    before = db_state(feed)
    assert_error(run_cli(db_url, "add", "nofile", "--items", str(tmp_path / "nope.jsonl")), 2, "nope.jsonl")
    assert db_state(feed) == before


@before_any_database_access
@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["add", "k", "--bogus"], id="add"),
        pytest.param(["status", "--frobnicate"], id="status"),
        pytest.param(["watch", "--handler", "http://127.0.0.1:9/", "--nope"], id="watch"),
    ],
)
def test_unknown_option_is_malformed_input(db_url: str, feed: Feed, args: list[str]) -> None:
    before = db_state(feed)
    assert_error(run_cli(db_url, *args, timeout=20), 2, args[-1])
    assert db_state(feed) == before


@before_any_database_access
def test_unknown_command_is_malformed_input(db_url: str) -> None:
    assert_error(run_cli(db_url, "frobnicate"), 2, "frobnicate")


@before_any_database_access
def test_non_integer_priority_is_malformed_input(db_url: str, feed: Feed) -> None:
    before = db_state(feed)
    assert_error(run_cli(db_url, "add", "k", "--priority", "high"), 2, "priority")
    assert db_state(feed) == before


@before_any_database_access
@pytest.mark.parametrize("when", ["yesterday", "2031-13-01T00:00:00"])
def test_bad_not_before_is_malformed_input(db_url: str, feed: Feed, when: str) -> None:
    before = db_state(feed)
    assert_error(run_cli(db_url, "add", "k", "--not-before", when), 2, "not-before")
    assert db_state(feed) == before


@before_any_database_access
@pytest.mark.parametrize(
    "key",
    [
        pytest.param("has space", id="space"),
        pytest.param("star*", id="star"),
        pytest.param("ключ", id="non-ascii"),
        pytest.param("x" * 201, id="too-long"),
        pytest.param("", id="empty"),
    ],
)
def test_bad_key_characters_are_malformed_input(db_url: str, feed: Feed, key: str) -> None:
    before = db_state(feed)
    assert_error(run_cli(db_url, "add", key, "--items", "-", input='{"data": 1}\n'), 2, "key")
    assert db_state(feed) == before


@before_any_database_access
def test_longest_key_with_every_allowed_character_is_accepted(db_url: str, feed: Feed) -> None:
    key = ("Az09._:/-" * 23)[:200]
    ok(run_cli(db_url, "add", key, "--open"))
    assert feed.status(key).key == key


@before_any_database_access
def test_watch_refuses_both_a_handler_and_a_processor(db_url: str) -> None:
    args = ["--handler", "http://127.0.0.1:9/", "--processor", "cli_processors:LoggedSlow"]
    assert_error(run_cli(db_url, "watch", *args, timeout=20), 2, "--handler", "--processor")


def test_watch_with_neither_serves_the_pipeline_and_refuses_a_queue_without_one(db_url: str) -> None:
    assert_error(run_cli(db_url, "watch", timeout=20), 1, "has no pipeline", "--handler", "--processor")


@before_any_database_access
@pytest.mark.parametrize(
    ("path", "named"),
    [
        pytest.param("nosuchmodule:X", "nosuchmodule", id="no-module"),
        pytest.param("os:nosuchattr", "nosuchattr", id="no-attribute"),
        pytest.param("no-colon", "no-colon", id="no-colon"),
    ],
)
def test_watch_with_a_bad_processor_path_is_malformed_input(db_url: str, path: str, named: str) -> None:
    assert_error(run_cli(db_url, "watch", "--processor", path, timeout=20), 2, named)


@before_any_database_access
@pytest.mark.parametrize("header", ["no colon here", "Bad Name: value"])
def test_watch_with_a_bad_header_is_malformed_input(db_url: str, header: str) -> None:
    assert_error(
        run_cli(db_url, "watch", "--handler", "http://127.0.0.1:9/", "--header", header, timeout=20), 2, "header"
    )


@before_any_database_access
@pytest.mark.parametrize(
    "args", [["--batch", "0"], ["--batch", "1001"], ["--batch-wait-ms", "-1"], ["--batch-wait", "-1"], ["--batch", "x"]]
)
def test_watch_with_a_bad_batch_setting_is_malformed_input(db_url: str, args: list[str]) -> None:
    assert_error(run_cli(db_url, "watch", "--handler", "http://127.0.0.1:9/", *args, timeout=20), 2, args[0])


def batch_answers(body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return 200, {"answers": [{"done": True} for _ in body["items"]]} if "items" in body else {"done": True}


@pytest.mark.parametrize(
    ("args", "env", "deprecated"),
    [
        pytest.param(["--batch-wait-ms", "60000"], {}, False, id="batch-wait-ms"),
        pytest.param([], {"FEEDPROC_BATCH_WAIT_MS": "60000"}, False, id="FEEDPROC_BATCH_WAIT_MS"),
        pytest.param(["--batch-wait", "60000"], {}, True, id="old-flag"),
        pytest.param([], {"FEEDPROC_BATCH_WAIT": "60000"}, True, id="old-env"),
    ],
)
def test_a_batch_short_of_its_size_waits_for_more_items_by_batch_wait_ms_or_its_deprecated_spelling(
    feed: Feed,
    watchers: WatcherProcesses,
    handler: HandlerService,
    args: list[str],
    env: dict[str, str],
    deprecated: bool,
) -> None:
    handler.behavior = batch_answers
    feed.add_partition("scans", [(0, b'{"n": 1}')], sealed=False)
    # One worker: with more, an idle one would take the second item into a batch of its own.
    watchers.start("--handler", handler.url, "--batch", "2", "--concurrency", "1", *args, *FAST, **env)
    wait_until(feed.leases, timeout=30, what="the partition leased (its first item fetched with it)")
    feed.add_items("scans", [(0, b'{"n": 2}')])  # the batch of one waits (up to a minute) for this one
    wait_until(lambda: feed.status("scans").items["complete"] == 2, timeout=30, what="both items complete")
    with handler.lock:
        sent = [len(d.body.get("items", [d.body])) for d in handler.deliveries]
    assert sent == [2]
    said = "--batch-wait (FEEDPROC_BATCH_WAIT) is deprecated: use --batch-wait-ms (FEEDPROC_BATCH_WAIT_MS)"
    assert (said in watchers.logs()) is deprecated


# ---------------------------------------------------------------- refusals: exit 1, nothing changed


@pytest.mark.parametrize("command", ["status", "seal", "retry", "cancel", "checkpoint", "add-items"])
def test_unknown_key_is_refused(db_url: str, feed: Feed, tmp_path: Path, command: str) -> None:
    feed.add_partition("someone-else", [(0, b"1")], sealed=False)
    extra = ["--items", write_lines(tmp_path / "i.jsonl", {"data": 1})] if command == "add-items" else []
    before = db_state(feed)
    assert_error(run_cli(db_url, command, "no-such-key", *extra), 1, "no-such-key")
    assert db_state(feed) == before


def test_duplicate_key_is_refused_and_the_first_partition_is_untouched(db_url: str, feed: Feed) -> None:
    ok(run_cli(db_url, "add", "dup", "--priority", "3", "--items", "-", input='{"gate": 1, "data": "original"}\n'))
    before = db_state(feed)
    again = run_cli(
        db_url, "add", "dup", "--priority", "9", "--open", "--items", "-", input='{"gate": 0, "data": "x"}\n'
    )
    assert_error(again, 1, "dup")
    assert db_state(feed) == before
    status = feed.status("dup")
    assert (status.priority, status.gate, status.sealed, status.items["total"]) == (3, 1, True, 1)


def test_add_items_to_a_sealed_partition_is_refused(db_url: str, feed: Feed) -> None:
    feed.add_partition("sealed-1", [(0, b"1")])
    before = db_state(feed)
    assert_error(run_cli(db_url, "add-items", "sealed-1", "--items", "-", input='{"data": 2}\n'), 1, "sealed")
    assert db_state(feed) == before


def test_add_items_to_a_finished_partition_is_refused(db_url: str, feed: Feed) -> None:
    feed.add_partition("cancelled-open", [(0, b"1")], sealed=False)
    feed.cancel("cancelled-open")
    before = db_state(feed)
    assert_error(run_cli(db_url, "add-items", "cancelled-open", "--items", "-", input='{"data": 2}\n'), 1, "cancelled")
    assert db_state(feed) == before


def test_add_items_below_the_current_gate_is_refused(db_url: str, feed: Feed) -> None:
    feed.add_partition("gate-3", [(3, b"1")], sealed=False)
    before = db_state(feed)
    lines = '{"gate": 5, "data": "fine"}\n{"gate": 1, "data": "too low"}\n'
    assert_error(run_cli(db_url, "add-items", "gate-3", "--items", "-", input=lines), 1, "gate 1", "3")
    assert db_state(feed) == before


@pytest.mark.parametrize("state", ["available", "complete", "cancelled"])
def test_retry_of_a_partition_that_has_not_failed_is_refused(db_url: str, feed: Feed, state: str) -> None:
    feed.add_partition("not-failed", [(0, b"1")] if state != "complete" else [])
    if state == "cancelled":
        feed.cancel("not-failed")
    assert feed.status("not-failed").status == state
    before = db_state(feed)
    assert_error(run_cli(db_url, "retry", "not-failed"), 1, state)
    assert db_state(feed) == before


def test_cancel_of_a_complete_partition_is_refused(db_url: str, feed: Feed) -> None:
    feed.add_partition("finished")
    assert feed.status("finished").status == "complete"
    before = db_state(feed)
    assert_error(run_cli(db_url, "cancel", "finished"), 1, "complete")
    assert db_state(feed) == before


@pytest.mark.parametrize(
    ("manual", "reason"),
    [
        pytest.param(True, "available", id="gate-not-drained"),
        pytest.param(False, "manual checkpoint", id="not-a-manual-checkpoint-partition"),
    ],
)
def test_checkpoint_refused(db_url: str, feed: Feed, manual: bool, reason: str) -> None:
    feed.add_partition("cp", [(0, b"1"), (1, b"2")], manual_checkpoint=manual)
    before = db_state(feed)
    assert_error(run_cli(db_url, "checkpoint", "cp"), 1, reason)
    assert db_state(feed) == before
    assert feed.status("cp").gate == 0


def test_checkpoint_with_no_higher_gate_holding_work_is_refused(db_url: str, feed: Feed) -> None:
    feed.add_partition("cp-top", sealed=False, manual_checkpoint=True)
    before = db_state(feed)
    assert_error(run_cli(db_url, "checkpoint", "cp-top"), 1, "cp-top")
    assert db_state(feed) == before


# ---------------------------------------------------------------- the database itself


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["status"], id="status"),
        pytest.param(["add", "k", "--open"], id="add"),
        pytest.param(["migrate"], id="migrate"),
        pytest.param(["watch", "--handler", "http://127.0.0.1:9/"], id="watch"),
    ],
)
def test_unreachable_database_fails_with_one_line(args: list[str]) -> None:
    line = assert_error(run_cli(UNREACHABLE, "--db", UNREACHABLE, *args, timeout=30), 1)
    assert any(word in line.lower() for word in ("unavailable", "unreachable", "refused", "connect")), line


def test_migrate_creates_the_schema_in_an_empty_database(unmigrated_url: str) -> None:
    assert ok(run_cli(unmigrated_url, "migrate")).strip()
    summary = json.loads(ok(run_cli(unmigrated_url, "status", "--json")))
    assert summary["partitions"] == {"available": 0, "complete": 0, "failed": 0, "cancelled": 0}


def table_names(url: str) -> list[str]:
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        return inspect(engine).get_table_names()
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["status"], id="status"),
        pytest.param(["add", "k", "--open"], id="add"),
        pytest.param(["watch", "--handler", "http://127.0.0.1:9/", "--poll-interval", "0.1"], id="watch"),
    ],
)
def test_unmigrated_database_says_to_run_feedproc_migrate(unmigrated_url: str, args: list[str]) -> None:
    assert_error(run_cli(unmigrated_url, *args, timeout=30), 1, "feedproc migrate")
    assert table_names(unmigrated_url) == []  # nothing written


# ---------------------------------------------------------------- end to end, with watcher processes


@pytest.mark.slow
def test_folder_fans_out_to_files_and_fans_in_to_a_rank_item(
    db_url: str, handler: HandlerService, watchers: WatcherProcesses
) -> None:
    files = ["a.txt", "b.txt", "c.txt", "d.txt"]

    def behave(body: dict[str, Any]) -> tuple[Any, ...]:
        data, gate = body["data"], body["gate"]
        if gate == 0:  # the folder: list its files (gate 1), come back as the rank step (gate 2)
            return 200, {"gate": 2, "items": [{"gate": 1, "data": {"file": name}} for name in data["files"]]}
        if gate == 1:  # one file: the first takes longest, so a rank that did not wait would show
            pause = 0.6 if data["file"] == "a.txt" else 0.05
            return 200, {"done": True, "data": {"file": data["file"], "words": 3}}, {}, pause
        return 200, {"done": True, "data": {"ranked": True}}

    handler.behavior = behave
    ok(run_cli(db_url, "add", "folder-1", "--items", "-", input=json.dumps({"data": {"files": files}}) + "\n"))
    watchers.start("--handler", handler.url, *FAST)
    wait_until(lambda: status_json(db_url, "folder-1")["status"] == "complete", timeout=30, what="the folder")

    by_gate: dict[int, list[Any]] = {0: [], 1: [], 2: []}
    for delivery in handler.of("folder-1"):
        by_gate[delivery.gate].append(delivery)
    assert len(by_gate[0]) == 1 and len(by_gate[2]) == 1
    assert sorted(d.body["data"]["file"] for d in by_gate[1]) == files  # each child exactly once
    assert min(d.start for d in by_gate[1]) >= by_gate[0][0].end
    assert by_gate[2][0].start >= max(d.end for d in by_gate[1])  # the barrier held
    assert by_gate[2][0].body["id"] == by_gate[0][0].body["id"]  # the folder item came back as the rank item

    status = status_json(db_url, "folder-1", "--history", "100")
    assert status["items"] == {"total": 5, "available": 0, "complete": 5, "failed": 0, "cancelled": 0}
    assert status["gates"]["1"]["complete"] == 4 and status["gates"]["2"]["complete"] == 1
    assert status["gate"] == 2 and status["lease"] is None
    assert kinds(status).count("gate_advanced") == 2


@pytest.mark.slow
def test_sigterm_stops_the_watcher_which_yields_its_leases(
    db_url: str, feed: Feed, handler: HandlerService, watchers: WatcherProcesses
) -> None:
    handler.behavior = not_yet  # the watcher keeps its partitions leased
    keys = [f"held-{n}" for n in range(3)]
    for key in keys:
        feed.add_partition(key, [(0, b"1"), (0, b"2")])
    watcher = watchers.start("--handler", handler.url, *FAST)

    def all_held() -> bool:
        return all(feed.status(k).lease is not None and handler.of(k) for k in keys)

    wait_until(all_held, timeout=20, what="the watcher to lease and serve every partition")
    owner = lease_of(feed.status(keys[0])).owner
    assert f":{watcher.pid}:" in owner

    started = time.monotonic()
    watcher.send_signal(signal.SIGTERM)
    assert watcher.wait(timeout=15) == 0, watchers.logs()
    assert time.monotonic() - started < 5, "the watcher took too long to stop"

    for key in keys:
        status = status_json(db_url, key, "--history", "100")
        assert status["lease"] is None
        assert status["status"] == "available"
        yielded = [e for e in status["history"] if e["kind"] == "yielded"]
        assert yielded and yielded[-1]["watcher"] == owner
    assert "Traceback" not in watchers.logs()


@pytest.mark.slow
@pytest.mark.every_database
def test_kill_9_of_a_watcher_lets_another_take_over_after_the_lease_expires(
    db_url: str, feed: Feed, handler: HandlerService, watchers: WatcherProcesses
) -> None:
    finish = threading.Event()
    handler.behavior = lambda body: (200, {"done": True}) if finish.is_set() else not_yet(body)
    keys = ["orphan-a", "orphan-b"]
    for key in keys:
        feed.add_partition(key, [(0, b"1"), (0, b"2"), (1, b"3")])
    short = ("--poll-interval", "0.1", "--lease-seconds", "2", "--retry-delay", "0.1")
    first = watchers.start("--handler", handler.url, *short)
    wait_until(
        lambda: all(feed.status(k).lease is not None and handler.of(k) for k in keys),
        timeout=20,
        what="the first watcher to hold both partitions",
    )
    owner = lease_of(feed.status(keys[0])).owner
    assert f":{first.pid}:" in owner

    os.kill(first.pid, signal.SIGKILL)
    assert first.wait(timeout=10) == -signal.SIGKILL
    held = {k: lease_of(feed.status(k)) for k in keys}
    assert all(lease.owner == owner for lease in held.values())  # nothing was released

    finish.set()
    second = watchers.start("--handler", handler.url, *short)
    wait_until(
        lambda: all(feed.status(k).status == "complete" for k in keys),
        timeout=30,
        what="the second watcher to finish everything",
    )
    for key in keys:
        status = status_json(db_url, key, "--history", "100")
        assert status["items"]["complete"] == 3
        expired = [e for e in status["history"] if e["kind"] == "expired"]
        assert len(expired) == 1, status["history"]
        assert f":{second.pid}:" in expired[0]["watcher"]
        assert expired[0]["detail"]["previous"] == owner
        assert parse_time(expired[0]["at"]) >= parse_time(held[key].expires_at or "")  # not before the lease ran out


def test_a_watcher_process_keeps_its_start_up_objects_out_of_full_garbage_collections(
    feed: Feed, tmp_path: Path, watchers: WatcherProcesses
) -> None:
    """A full collection walks every tracked object with the GIL held: with the ~10^5 that imports
    leave, each one stalled dispatch for 85-210 ms (measured). `feedproc watch` freezes them."""
    log = tmp_path / "frozen.log"
    feed.add_partition("frozen", [(0, b"x")])
    watchers.start("--processor", "cli_processors:ReportsFrozenObjects", *FAST, **{LOG_VARIABLE: str(log)})
    wait_until(lambda: log.exists() and log.read_text().strip(), timeout=20, what="the delivery")
    assert int(log.read_text().split()[0]) > 10_000


@pytest.mark.slow
@pytest.mark.every_database
def test_two_watchers_share_the_work_and_deliver_every_item_exactly_once(
    db_url: str, feed: Feed, tmp_path: Path, watchers: WatcherProcesses
) -> None:
    log = tmp_path / "deliveries.log"
    log.touch()
    keys = [f"share-{n:02}" for n in range(10)]
    for key in keys:
        feed.add_partition(key, [(0, json.dumps({"n": n}).encode()) for n in range(8)])
    expected = {i["id"] for key in keys for i in stored_items(feed, key)}
    hold = tmp_path / "hold"
    hold.touch()
    env = {LOG_VARIABLE: str(log), DELAY_VARIABLE: "0.2", HOLD_VARIABLE: str(hold)}
    # Concurrency 3 lets one watcher lease all 10 partitions (capacity 12): the second gets work
    # only by asking for a fair share (a steal), which the first honours between items. The first's
    # deliveries are held until the second is registered, so a slow start cannot find the work done.
    args = ("--processor", "cli_processors:LoggedSlow", "--concurrency", "3", *FAST)
    first = watchers.start(*args, **env)
    wait_until(lambda: log.read_text().strip(), timeout=20, what="the first watcher's first delivery")
    second = watchers.start(*args, **env)
    wait_until(lambda: sum(w.alive for w in feed.watchers()) == 2, timeout=30, what="the second watcher to register")
    hold.unlink()
    wait_until(
        lambda: all(feed.status(k).status == "complete" for k in keys),
        timeout=60,
        what="all partitions to complete",
    )

    lines = [line.split() for line in log.read_text().splitlines()]
    delivered = Counter(int(fields[2]) for fields in lines)
    assert set(delivered) == expected
    assert [item for item, n in delivered.items() if n != 1] == []  # exactly once
    by_pid = Counter(int(fields[0]) for fields in lines)
    assert set(by_pid) == {first.pid, second.pid}, by_pid
    assert any("stolen" in kinds(feed.status(k, history=100).to_json()) for k in keys)
    summary = json.loads(ok(run_cli(db_url, "status", "--json")))
    assert summary["items"]["complete"] == summary["items"]["total"] == 80
