"""The documentation's examples run as written (issue 18), wherever they are shown: the README and
the site's pages under docs/ (issue 32; tests/docs_support.py reads them). Its Python files (blocks
whose first line is `# NAME.py`) with a real watcher, its command-line session, and its pipeline
(issue 22) as the TOML file with three handler services and as a Python `Pipeline`, each in a fresh
directory; its standard-library handler answering the curl request as shown and serving the
partition its SQL producer writes; its pull worker session with curl (issue 32: the examples agree
on data shapes)."""

from __future__ import annotations

import json
import os
import re
import runpy
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from feedproc import Feed
from feedproc.core.hooks import sign
from feedproc.core.pipelines import parse_toml

from ..docs_support import blocks, python_files, sh_block
from ..support import ROOT, WatcherProcesses, feedproc_env, json_of, run_process, spawn, stop_group, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.sqlite_only]
BIN = Path(sys.executable).parent
#: The example handler's fake page count of a file, which its ocr step accumulates.
pages_of = runpy.run_path(str(ROOT / "cmds" / "example_handler.py"))["pages_of"]


def run_session(
    script: str, cwd: Path, timeout: float = 180, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A shell session as a reader runs it, with the virtualenv active, in `cwd` (with `env` added);
    the jobs it started in the background are stopped at its end, and killed with its process group
    when it failed or timed out first (or this pytest was killed: a guard process)."""
    env = {**{k: v for k, v in os.environ.items() if k != "FEEDPROC_DATABASE_URL"}, **(env or {})}
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"  # "with the virtualenv active"
    script = "set -e\n" + script + 'started=$(jobs -p); [ -z "$started" ] || kill $started\nwait || true\n'
    return run_process(["bash", "-c", script], cwd=cwd, env=env, timeout=timeout, guard=True)


def free_ports(count: int) -> list[int]:
    """Ports free now, for the documentation's fixed ones (CI may have those taken)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def answers_on(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def background(command: list[str] | str, cwd: Path, port: int, **env: str) -> Iterator[subprocess.Popen[bytes]]:
    """A process of the documentation's (a handler, `feedproc serve`) started in `cwd`, once it answers on
    `port`; stopped at the end."""
    environment = {k: v for k, v in os.environ.items() if k != "FEEDPROC_DATABASE_URL"}
    environment["PATH"] = f"{BIN}{os.pathsep}{environment['PATH']}"
    process = spawn(command, cwd=cwd, env={**environment, **env}, shell=isinstance(command, str), guard=True)
    try:
        wait_until(lambda: answers_on(port) or process.poll() is not None, timeout=30, what=f"port {port}")
        assert process.poll() is None, f"{command} exited {process.returncode}"
        yield process
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        stop_group(process)


def stdlib_handler(port: int) -> str:
    """The documentation's complete handler in Python (standard library only), answering on `port`."""
    [block] = [block for block in blocks("python") if 'item["gate"] == 0' in block and "HTTPServer" in block]
    assert '("127.0.0.1", 8080)' in block
    return block.replace('("127.0.0.1", 8080)', f'("127.0.0.1", {port})')


SPACE = re.compile(r"\s*")


def json_values(text: str) -> list[Any]:
    """The JSON values printed one after another (by curl, without newlines between them)."""
    decoder, values, at = json.JSONDecoder(), [], 0
    text = text.strip()
    while at < len(text):
        value, end = decoder.raw_decode(text, at)
        values.append(value)
        at = SPACE.match(text, end).end()  # type: ignore[union-attr]
    return values


def uploads_toml() -> str:
    [block] = [block for block in blocks("toml") if block.startswith("# uploads.toml\n")]
    return block


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
    """The folder fans out, each file is classified and its pages accumulated, and rank, collecting
    the classified files, ranks them without a database."""
    session = sh_block("feedproc add upload-42")
    (tmp_path / "cmds").symlink_to(ROOT / "cmds")
    result = run_session(session + "feedproc wait upload-42 --timeout 60\n", tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "complete" in result.stdout
    with Feed(f"sqlite:///{tmp_path / 'feedproc.db'}") as feed:
        [ranked] = feed.items("upload-42", gate=2)
    ranking = json_of(ranked.result)
    assert ranking["ranked"] == 2 and len(ranking["top"]) == 1
    assert ranking["pages"] == pages_of("a.pdf") + pages_of("b.pdf")


def test_the_partition_limit_session_runs_as_written(tmp_path: Path) -> None:
    session = sh_block("--partition-limit 8")
    result = run_session("feedproc migrate\n" + session, tmp_path)  # migrated earlier, in "Try it"
    assert result.returncode == 0, result.stdout + result.stderr
    with Feed(f"sqlite:///{tmp_path / 'feedproc.db'}") as feed:
        assert feed.queue("ocr").partition_limit == 8
        assert feed.status("upload-7").schedule.partition_limit == 2


def test_the_flow_control_session_runs_as_written(tmp_path: Path) -> None:
    session = sh_block("--group-limit 4 --rate 600/min")
    result = run_session("feedproc migrate\n" + session, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    with Feed(f"sqlite:///{tmp_path / 'feedproc.db'}") as feed:
        ocr, scans = feed.queue("ocr"), feed.queue("scans")
        assert (ocr.group_limit, ocr.rate, scans.rate) == (4, "10/s", "ocr-api")
        assert feed.status("upload-8").group == "acme"
        assert [(rate.name, rate.rate) for rate in feed.rates()] == [("ocr-api", "100/min")]


def test_the_fan_in_section_runs_as_written(tmp_path: Path) -> None:
    """words.py: results collected by the report (text-1), a tolerated failure seen with its error
    (text-2), and the accumulator in the report and in status."""
    (tmp_path / "words.py").write_text(python_files()["words.py"])
    session = "".join(sh_block(marker) for marker in ("add text-1", "add text-2", "status text-1 --json"))
    result = run_session(session, tmp_path, env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stdout + result.stderr
    with Feed(f"sqlite:///{tmp_path / 'feedproc.db'}") as feed:
        first, second = (json_of(feed.items(key, gate=1)[0].result) for key in ("text-1", "text-2"))
        tolerated = feed.status("text-2")
    assert first == {"words": ["fan", "in"], "failed": [], "letters": 5, "longest": 3}
    assert second["words"] == ["join"] and len(second["failed"]) == 1 and "an empty word" in second["failed"][0]
    assert second["letters"] == 4 and tolerated.status == "complete"
    assert "1 failed, tolerated: 1 allowed" in result.stdout
    [status] = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"key": "text-1"')]
    assert status["accumulated"] == {"letters": 5, "longest": 3}


def test_the_pipeline_runs_as_written_with_three_handler_services(tmp_path: Path) -> None:
    """uploads.toml, the three example handler services, `pipeline apply`, `watch --queue uploads`
    without a handler and `add` with named gates: a folder through list, ocr, classify and rank."""
    toml, session = uploads_toml(), sh_block("feedproc pipeline apply uploads.toml")
    for readme_port, port in zip(("8081", "8082", "8083"), free_ports(3), strict=True):
        assert f":{readme_port}/" in toml and f"--port {readme_port}" in session
        toml, session = toml.replace(readme_port, str(port)), session.replace(readme_port, str(port))
    (tmp_path / "uploads.toml").write_text(toml)
    (tmp_path / "cmds").symlink_to(ROOT / "cmds")
    result = run_session(session, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "pipeline version 1 (gates 0=list, 1=ocr, 2=classify, 3=rank, 1 schedule(s))" in result.stdout
    [ranking] = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"id"')]
    pages = sum(pages_of(name) for name in ("a.pdf", "b.pdf", "c.pdf"))  # accumulated by the ocr gate
    assert ranking["gate"] == 3 and ranking["result"]["ranked"] == 3 and len(ranking["result"]["top"]) == 2
    assert ranking["result"]["pages"] == pages
    with Feed(f"sqlite:///{tmp_path / 'feedproc.db'}") as feed:
        assert feed.status("scan-7").status == "complete"
        files = [row for row in feed.items("scan-7") if json_of(row.data)["kind"] == "file"]
        assert len(files) == 3
        for row in files:  # each file went to the ocr service, then to the classify service
            assert [delivery.gate for delivery in feed.item(row.id).history] == [1, 2]
            assert "text" in json_of(row.data) and "score" in json_of(row.result)


def test_the_demo_runs_the_readmes_pipeline() -> None:
    """`feedproc demo` applies uploads.toml's gates and settings (with its services' URLs)."""
    from feedproc.demo import PIPELINE

    readme = parse_toml(uploads_toml())
    urls = {gate.name: gate.handler for gate in readme.gates}
    demo = parse_toml(PIPELINE.format(**urls))
    assert demo.queue == readme.queue and demo.gates == readme.gates


def test_the_python_pipeline_runs_as_written(tmp_path: Path) -> None:
    """uploads_pipeline.py served by `feedproc watch --processor uploads_pipeline:pipeline`, stored
    with `pipeline apply --from`, and a folder added with named gates."""
    (tmp_path / "uploads_pipeline.py").write_text(python_files()["uploads_pipeline.py"])
    session = sh_block("feedproc watch --processor uploads_pipeline:pipeline")
    result = run_session("feedproc migrate\n" + session, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    with Feed(f"sqlite:///{tmp_path / 'feedproc.db'}") as feed:
        final = feed.status("scan-8")
        [ranked] = feed.items("scan-8", gate=3)
        [stored] = feed.pipelines()
    assert final.status == "complete", final
    ranking = json_of(ranked.result)
    assert ranking["top"][0]["file"] in {"a.pdf", "b.pdf"}
    assert ranking["pages"] == len("a.pdf") + len("b.pdf")  # each file's fake page count, summed
    assert stored.queue == "uploads" and [g.name for g in stored.gates] == ["list", "ocr", "classify", "rank"]
    gate = stored.gate(1)
    assert gate is not None and gate.limit == 8
    assert [s.name for s in stored.schedules] == ["nightly"]


def test_the_testing_example_passes_under_pytest(tmp_path: Path) -> None:
    """test_uploads.py, copied next to uploads_pipeline.py, passes when run with pytest: the
    pipeline drained in-process by feedproc.testing, its retries waited out on the fake clock."""
    files = python_files()
    for name in ("uploads_pipeline.py", "test_uploads.py"):
        (tmp_path / name).write_text(files[name])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FEEDPROC_", "PYTEST_"))}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_uploads.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout


def test_the_stdlib_handler_answers_the_curl_request_as_shown(tmp_path: Path) -> None:
    [port] = free_ports(1)
    (tmp_path / "handler.py").write_text(stdlib_handler(port))
    session = sh_block("curl -s -X POST http://127.0.0.1:8080/")
    [shown] = [line[2:] for line in session.splitlines() if line.startswith("# {")]
    with background([sys.executable, "handler.py"], tmp_path, port):
        result = run_session(session.replace(":8080/", f":{port}/"), tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == json.loads(shown)


def test_the_sql_producers_partition_is_served_by_the_stdlib_handler(tmp_path: Path) -> None:
    """The SQLite block of "Producing with SQL", run as printed, then `feedproc watch` with the
    README's handler: each folder fans out its files at gate 1, each file is labelled."""
    [port] = free_ports(1)
    (tmp_path / "handler.py").write_text(stdlib_handler(port))
    url = f"sqlite:///{tmp_path / 'feedproc.db'}"
    subprocess.run(
        [sys.executable, "-m", "feedproc", "migrate"], env=feedproc_env(url), check=True, capture_output=True
    )
    [sql] = [block for block in blocks("sql") if block.startswith("-- SQLite: ")]
    with sqlite3.connect(tmp_path / "feedproc.db", isolation_level=None) as conn:
        conn.executescript(sql)
    watchers = WatcherProcesses(url, tmp_path)
    try:
        with background([sys.executable, "handler.py"], tmp_path, port):
            watchers.start("--handler", f"http://127.0.0.1:{port}/", "--poll-interval", "0.1")
            with Feed(url) as feed:
                final = feed.wait("upload-7", timeout=60)
                files = [json_of(row.data) for row in feed.items("upload-7", gate=1)]
    finally:
        watchers.stop_all()
    assert final.status == "complete", watchers.logs()
    assert sorted(files, key=str) == [{"file": name, "label": "invoice"} for name in ("a.pdf", "b.pdf", "c.pdf")]


def test_the_pull_session_with_curl_runs_as_written(tmp_path: Path) -> None:
    """The pull-mode set-up (`queue set --mode pull`, a worker token, `serve`), then the curl
    session: job-1 added, its item claimed, heartbeated and answered, the answers as shown."""
    [port] = free_ports(1)
    setup, session = sh_block("feedproc queue set gpu --mode pull"), sh_block("feedproc add job-1")
    token = "readme-worker-token-0123456789abcdef"
    assert "$(openssl rand -hex 24)" in setup and "feedproc serve --port 8000" in setup
    setup = setup.replace("$(openssl rand -hex 24)", token).replace("--port 8000", f"--port {port}")
    session = session.replace(":8000/", f":{port}/")
    claim_shown, answer_shown = [json.loads(line[2:]) for line in session.splitlines() if line.startswith("# {")]
    lines = session.splitlines(keepends=True)
    claim = next(n for n, line in enumerate(lines) if line.startswith('# {"items"'))
    claiming, answering = "".join(lines[:claim]), "".join(lines[claim + 1 :])
    exported = f"export FEEDPROC_WORKER_TOKEN={token}\n"  # as the set-up left it in the reader's shell
    subprocess.run(
        [sys.executable, "-m", "feedproc", "migrate"],
        cwd=tmp_path,
        env=feedproc_env("sqlite:///feedproc.db"),
        check=True,
    )
    with background(setup, tmp_path, port):
        claimed = run_session(exported + claiming, tmp_path, timeout=60)
        assert claimed.returncode == 0, claimed.stderr
        [item] = json.loads(claimed.stdout.splitlines()[-1])["items"]
        variables = next(line for line in lines if line.startswith("API="))  # still set in the reader's shell
        answered = run_session(exported + variables + answering.replace("pR3…", item["token"]), tmp_path, timeout=60)
    assert answered.returncode == 0, answered.stderr
    [shown] = claim_shown["items"]
    assert set(item) == set(shown)
    assert {k: v for k, v in item.items() if k not in ("token", "lease_expires_at")} == {
        k: v for k, v in shown.items() if k not in ("token", "lease_expires_at")
    }
    heartbeat, answer = json_values(answered.stdout)  # curl ends no answer with a newline
    assert "lease_expires_at" in heartbeat and answer == answer_shown


def test_the_enqueue_in_your_transaction_example_commits_both_or_neither(tmp_path: Path) -> None:
    """signup.py commits its upload's row and partition together; run again, its INSERT fails and
    the block rolls back, so neither is there twice."""
    (tmp_path / "signup.py").write_text(python_files()["signup.py"])
    url = f"sqlite:///{tmp_path / 'feedproc.db'}"
    run = [sys.executable, "signup.py"]
    first = subprocess.run(run, cwd=tmp_path, env=feedproc_env(url), capture_output=True, text=True, timeout=120)
    assert first.returncode == 0 and first.stdout == "available\n", first.stderr
    again = subprocess.run(run, cwd=tmp_path, env=feedproc_env(url), capture_output=True, text=True, timeout=120)
    assert again.returncode != 0 and "UNIQUE constraint failed: uploads.name" in again.stderr
    with sqlite3.connect(tmp_path / "feedproc.db") as db:
        assert db.execute("SELECT name FROM uploads").fetchall() == [("upload-43",)]
        assert db.execute("SELECT key FROM feedproc_partitions").fetchall() == [("upload-43",)]


def test_the_hook_verification_snippet_verifies_what_watchers_sign() -> None:
    """verify_hook.py (README, Completion hooks): true for a body signed with the secret now; false
    for another secret, a changed body, an old timestamp or a malformed header."""
    verify_hook: dict[str, Any] = {}
    exec(python_files()["verify_hook.py"], verify_hook)  # the documentation's own code
    check = verify_hook["verify_hook"]
    body = b'{"id":1,"hook":"on_complete","key":"k"}'
    now = int(time.time())
    header = sign("whsec", now, body)

    assert check("whsec", header, body)
    assert not check("other", header, body)
    assert not check("whsec", header, body + b" ")
    assert not check("whsec", sign("whsec", now - 301, body), body)
    assert check("whsec", f"{sign('old', now, body)},v1={header.partition(',v1=')[2]}", body)  # rotation
    assert not check("whsec", "garbage", body)


def test_the_hook_receiver_prints_the_completed_partition_once(tmp_path: Path) -> None:
    """The Completion hooks session: hook_receiver.py (with verify_hook.py) takes the signed hook of
    text-9 and prints it; the watcher records it sent."""
    [port] = free_ports(1)
    for name in ("verify_hook.py", "words.py"):
        (tmp_path / name).write_text(python_files()[name])
    receiver = python_files()["hook_receiver.py"]
    assert '("127.0.0.1", 8090)' in receiver
    (tmp_path / "hook_receiver.py").write_text(receiver.replace("8090", str(port)))
    session = sh_block("python hook_receiver.py &")
    secret_line, receiver_line, rest = session.split("\n", 2)
    assert receiver_line == "python hook_receiver.py &"
    env = {"FEEDPROC_DATABASE_URL": f"sqlite:///{tmp_path / 'feedproc.db'}"}
    printed = tmp_path / "receiver.out"
    with background(f"{secret_line} && exec python hook_receiver.py > {printed}", tmp_path, port):
        result = run_session(f"{secret_line}\n{rest.replace(':8090/', f':{port}/')}", tmp_path, env=env)
        assert result.returncode == 0, result.stdout + result.stderr
        wait_until(lambda: "text-9" in printed.read_text(), timeout=60, what="the receiver's line")
    assert printed.read_text() == "text-9 complete 1\n"


def test_the_complete_in_your_transaction_example_books_each_order_once(tmp_path: Path) -> None:
    """ledger.py's processor books each order in its answer's transaction: two rows, both complete."""
    (tmp_path / "ledger.py").write_text(python_files()["ledger.py"])
    url = f"sqlite:///{tmp_path / 'unused.db'}"  # the example's harness makes its own database
    run = subprocess.run(
        [sys.executable, "ledger.py"], cwd=tmp_path, env=feedproc_env(url), capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0 and run.stdout == "(2, 4250)\n", run.stderr


#: The whole-file examples the tests above run, each by its name.
RUN_HERE = {
    "classify.py",
    "produce.py",
    "words.py",
    "uploads_pipeline.py",
    "test_uploads.py",
    "signup.py",
    "verify_hook.py",
    "hook_receiver.py",
    "ledger.py",
}


def test_every_example_file_in_the_documentation_is_run() -> None:
    """A Python file added to any page (`# name.py` on its first line) needs a test above that runs
    it; one that left the documentation leaves this list too."""
    assert set(python_files()) == RUN_HERE
