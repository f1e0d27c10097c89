"""Pull workers over the API (every database): the worker API of `feedproc serve` through real HTTP,
and `feedproc work` processes claiming from `feedproc serve` processes, killed with real signals.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from feedproc import Feed

from ..api_support import AUTH, ApiServer, ServeProcess
from ..cli_processors import DELAY_VARIABLE, LOG_VARIABLE
from ..support import feedproc_env, json_of, spawn, stop_group, wait_until

WORKER_TOKEN = "worker-token-9876543210"
WORKER_AUTH = {"Authorization": f"Bearer {WORKER_TOKEN}"}
QUEUE = "gpu"


@pytest.fixture
def api(db_url: str) -> Iterator[ApiServer]:
    feed = Feed(db_url)
    feed.set_queue(QUEUE, mode="pull")
    feed.close()
    server = ApiServer(db_url, worker_token=WORKER_TOKEN)
    yield server
    server.close()


def claim(api: ApiServer, **fields: object) -> httpx.Response:
    body = {"worker": "w1", **fields}
    return api.client.post(f"/api/v1/queues/{QUEUE}/claim", json=body, headers=WORKER_AUTH)


def add(api: ApiServer, key: str, *data: object) -> None:
    response = api.post("/api/v1/partitions", {"key": key, "queue": QUEUE, "items": [{"data": d} for d in data]})
    assert response.status_code == 201, response.text


# ---------------------------------------------------------------- the worker API


def test_a_worker_claims_heartbeats_and_answers_over_http(api: ApiServer) -> None:
    add(api, "doc-1", {"page": 1})
    response = claim(api, max=5, lease_seconds=30)
    assert response.status_code == 200, response.text
    (item,) = response.json()["items"]
    assert (item["partition"], item["queue"], item["gate"], item["attempt"], item["data"]) == (
        "doc-1",
        QUEUE,
        0,
        1,
        {"page": 1},
    )
    beat = api.client.post(
        f"/api/v1/items/{item['id']}/heartbeat", json={"token": item["token"], "progress": 0.5}, headers=WORKER_AUTH
    )
    assert beat.status_code == 200 and beat.json()["lease_expires_at"] >= item["lease_expires_at"]
    done = api.client.post(
        f"/api/v1/items/{item['id']}/answer",
        json={"token": item["token"], "done": True, "data": {"label": "invoice"}},
        headers=WORKER_AUTH,
    )
    assert done.status_code == 200 and done.json()["outcome"] == "done"
    assert api.get("/api/v1/partitions/doc-1").json()["status"] == "complete"
    assert api.get(f"/api/v1/items/{item['id']}").json()["data"] == {"label": "invoice"}


def test_a_stale_token_is_409_with_its_reason_and_changes_nothing(api: ApiServer) -> None:
    add(api, "doc-1", 1)
    (item,) = claim(api).json()["items"]
    api.post("/api/v1/partitions/doc-1/cancel")
    refused = api.client.post(
        f"/api/v1/items/{item['id']}/answer", json={"token": item["token"], "done": True}, headers=WORKER_AUTH
    )
    assert refused.status_code == 409
    assert refused.json()["reason"] == "cancelled" and "cancelled" in refused.json()["error"]
    assert api.get(f"/api/v1/items/{item['id']}").json()["status"] == "cancelled"


def test_a_malformed_answer_is_400_and_the_claim_still_holds(api: ApiServer) -> None:
    add(api, "doc-1", 1)
    (item,) = claim(api).json()["items"]
    url = f"/api/v1/items/{item['id']}/answer"
    bad = api.client.post(url, json={"token": item["token"], "gate": "two"}, headers=WORKER_AUTH)
    assert bad.status_code == 400 and "gate" in bad.json()["error"]
    missing = api.client.post(url, json={"done": True}, headers=WORKER_AUTH)
    assert missing.status_code == 400 and "token" in missing.json()["error"]
    ok = api.client.post(url, json={"token": item["token"], "done": True}, headers=WORKER_AUTH)
    assert ok.status_code == 200


def test_text_with_nul_in_an_answer_or_a_worker_name_is_kept_escaped_and_fails_nothing(api: ApiServer) -> None:
    """PostgreSQL refuses NUL in text: it used to fail the claim, or the whole batch of answers (500)."""
    add(api, "doc-1", 1, 2, 3)
    response = claim(api, worker="gpu\x00box", max=3)
    assert response.status_code == 200, response.text
    nul, *others = response.json()["items"]
    answers = [{"id": nul["id"], "token": nul["token"], "error": "x\x00y"}]
    answers += [{"id": item["id"], "token": item["token"], "done": True} for item in others]
    answered = api.client.post("/api/v1/answers", json={"answers": answers}, headers=WORKER_AUTH)
    assert answered.status_code == 200, answered.text
    assert [r["status"] for r in answered.json()["results"]] == [200, 200, 200]
    (failed,) = api.get(f"/api/v1/items/{nul['id']}").json()["history"]
    assert (failed["error"], failed["watcher"]) == ("x\\u0000y", "gpu\\u0000box")


def test_an_answer_with_more_children_than_the_limit_is_413_and_the_claim_still_holds(db_url: str, feed: Feed) -> None:
    server = ApiServer(db_url, worker_token=WORKER_TOKEN, max_children=2)
    try:
        feed.set_queue(QUEUE, mode="pull")
        add(server, "doc-1", 1)
        (item,) = claim(server).json()["items"]
        url = f"/api/v1/items/{item['id']}/answer"
        three = {"token": item["token"], "done": True, "items": [{"gate": 1}] * 3}
        refused = server.client.post(url, json=three, headers=WORKER_AUTH)
        assert refused.status_code == 413
        assert refused.json() == {"error": "answer has 3 children; the limit is 2 (--max-children)"}
        assert server.get("/api/v1/partitions/doc-1").json()["items"]["total"] == 1
        two = {**three, "items": [{"gate": 1}] * 2}
        assert server.client.post(url, json=two, headers=WORKER_AUTH).json()["outcome"] == "done"
    finally:
        server.close()


def test_a_batch_answer_over_the_children_limit_is_refused_alone_and_the_others_are_written(
    db_url: str, feed: Feed
) -> None:
    server = ApiServer(db_url, worker_token=WORKER_TOKEN, max_children=2)
    try:
        feed.set_queue(QUEUE, mode="pull")
        add(server, "doc-1", 1, 2)
        first, second = claim(server, max=2).json()["items"]
        answers = [
            {"id": first["id"], "token": first["token"], "done": True, "items": [{"gate": 1}] * 3},
            {"id": second["id"], "token": second["token"], "done": True, "items": [{"gate": 1}] * 2},
        ]
        response = server.client.post("/api/v1/answers", json={"answers": answers}, headers=WORKER_AUTH)
        over, within = response.json()["results"]
        assert over == {
            "id": first["id"],
            "status": 413,
            "error": "answer has 3 children; the limit is 2 (--max-children)",
        }
        assert (within["status"], within["outcome"]) == (200, "done")
        status = server.get("/api/v1/partitions/doc-1").json()
        assert (status["items"]["total"], status["gates"]["0"]["available"]) == (4, 1)  # only the second's children
    finally:
        server.close()


def test_claiming_from_a_push_queue_is_409(api: ApiServer) -> None:
    response = api.client.post("/api/v1/queues/default/claim", json={"worker": "w"}, headers=WORKER_AUTH)
    assert response.status_code == 409 and "pull mode" in response.json()["error"]


@pytest.mark.sqlite_only
def test_the_worker_token_allows_only_the_worker_api(api: ApiServer) -> None:
    assert claim(api).status_code == 200
    producer = api.client.post("/api/v1/partitions", json={"key": "x", "items": []}, headers=WORKER_AUTH)
    assert producer.status_code == 403 and "needs the operate scope" in producer.json()["error"]
    assert api.client.post(f"/api/v1/queues/{QUEUE}/claim", json={"worker": "w"}, headers=AUTH).status_code == 200
    anonymous = api.client.post(f"/api/v1/queues/{QUEUE}/claim", json={"worker": "w"})
    assert anonymous.status_code == 401


@pytest.mark.sqlite_only
def test_the_worker_api_is_in_the_openapi_document(api: ApiServer) -> None:
    paths = api.get("/api/v1/openapi.json").json()["paths"]
    for path in (
        "/api/v1/queues/{queue}/claim",
        "/api/v1/items/{item_id}/heartbeat",
        "/api/v1/items/{item_id}/answer",
        "/api/v1/items/{item_id}/release",
    ):
        assert "post" in paths[path], path


def test_a_long_poll_returns_as_soon_as_work_is_added(api: ApiServer, db_url: str) -> None:
    import threading

    result: dict[str, Any] = {}

    def poll() -> None:
        started = time.monotonic()
        result["response"] = claim(api, wait=20)
        result["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(0.5)  # the poll is waiting (nothing to claim yet); an event cannot say so from outside
    add(api, "late", 1)
    thread.join(timeout=30)
    response = result["response"]
    assert isinstance(response, httpx.Response) and len(response.json()["items"]) == 1
    assert result["seconds"] < 5  # woken by the notification (PostgreSQL) or the 1 s re-claim (SQLite)


# ---------------------------------------------------------------- feedproc work against feedproc serve


class WorkProcess:
    """A real `feedproc work` process."""

    def __init__(self, api_url: str, log_dir: Path, name: str, *args: str, **env: str) -> None:
        self.log_path = log_dir / f"{name}.log"
        out = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        self.process = spawn(
            [sys.executable, "-m", "feedproc", "work", "--api", api_url, "--queue", QUEUE, "--worker", name, *args],
            env=feedproc_env("sqlite:///unused.db", FEEDPROC_WORKER_TOKEN=WORKER_TOKEN, **env),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        out.close()

    def stop(self) -> int:
        stop_group(self.process, grace=30)
        return self.process.returncode


def deliveries(log: Path) -> list[list[str]]:
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


@pytest.mark.every_database
def test_work_processes_drain_a_fan_out_through_two_servers_and_survive_kill_9(db_url: str, tmp_path: Path) -> None:
    feed = Feed(db_url)
    feed.set_queue(QUEUE, mode="pull")
    for n in range(6):
        feed.add_partition(f"upload-{n}", [(0, json.dumps({"upload": n}).encode())], queue=QUEUE)
    log = tmp_path / "deliveries.log"
    env = {LOG_VARIABLE: str(log), DELAY_VARIABLE: "0.3"}
    for n in range(2):
        (tmp_path / f"s{n}").mkdir()
    servers = [ServeProcess(db_url, tmp_path / f"s{n}", FEEDPROC_WORKER_TOKEN=WORKER_TOKEN) for n in range(2)]
    workers: list[WorkProcess] = []
    try:
        args = ("--processor", "cli_processors:FansOutThenLogs", "--lease-seconds", "2", "--concurrency", "3")
        victim = WorkProcess(servers[0].url, tmp_path, "victim", *args, **env)
        wait_until(lambda: deliveries(log), timeout=60, what="the first gate-1 delivery")
        victim.process.send_signal(signal.SIGKILL)  # mid-item: its claims must expire and be retried
        victim.process.wait(timeout=10)
        workers = [WorkProcess(servers[n % 2].url, tmp_path, f"w{n}", *args, **env) for n in range(3)]
        wait_until(lambda: feed.summary().partitions.get("complete") == 6, timeout=120, what="all partitions complete")
        for worker in workers:
            assert worker.stop() == 0, worker.log_path.read_text()
    finally:
        for worker in workers:
            worker.stop()
        for server in servers:
            server.stop()
    calls = Counter(int(fields[2]) for fields in deliveries(log))
    assert len(calls) == 24  # 6 uploads, each moved to gate 1 with its 3 children
    redelivered = [item for item, n in calls.items() if n > 1]
    for item_id in redelivered:  # only what the killed worker held, each with its expired claim on record
        history = feed.item(item_id).history
        assert any("claim by worker victim expired" in (h.error or "") for h in history), history
    for key in (f"upload-{n}" for n in range(6)):
        assert feed.status(key).status == "complete"
    feed.close()


@pytest.mark.sqlite_only
def test_work_drains_its_queue_with_a_worker_token_limited_to_it(db_url: str, tmp_path: Path) -> None:
    feed = Feed(db_url)
    feed.set_queue(QUEUE, mode="pull")
    feed.add_partition("scans", [(0, b"{}"), (0, b"{}")], queue=QUEUE)
    server = ServeProcess(db_url, tmp_path, FEEDPROC_WORKER_TOKENS=f"{QUEUE}+other:{WORKER_TOKEN}")
    env = {LOG_VARIABLE: str(tmp_path / "deliveries.log"), DELAY_VARIABLE: "0"}
    worker = WorkProcess(server.url, tmp_path, "w", "--processor", "cli_processors:LoggedSlow", **env)
    try:
        wait_until(lambda: feed.status("scans").status == "complete", timeout=60, what="the partition done")
        assert worker.stop() == 0, worker.log_path.read_text()
    finally:
        worker.stop()
        server.stop()
        feed.close()


def test_a_work_process_whose_processor_fails_with_nul_loses_nothing_else(db_url: str, tmp_path: Path) -> None:
    """Its error, sent in one request with the other items' answers, used to fail them all on
    PostgreSQL: their claims expired, and the real error was never recorded."""
    feed = Feed(db_url)
    feed.set_queue(QUEUE, mode="pull")
    feed.add_partition("p", [(0, json.dumps({"nul": n == 0}).encode()) for n in range(4)], queue=QUEUE)
    nul = next(item.id for item in feed.items("p") if json_of(item.data)["nul"])
    server = ServeProcess(db_url, tmp_path, FEEDPROC_WORKER_TOKEN=WORKER_TOKEN)
    worker = WorkProcess(
        server.url, tmp_path, "w", "--processor", "cli_processors:FailsOnceWithNul", "--concurrency", "4"
    )
    try:
        wait_until(lambda: feed.status("p").status == "complete", timeout=60, what="p to complete")
        assert worker.stop() == 0, worker.log_path.read_text()
    finally:
        worker.stop()
        server.stop()
    failed, done = feed.item(nul).history
    assert failed.outcome == "retry" and "ValueError: bad\\u0000byte" in (failed.error or ""), failed
    assert done.outcome == "done"
    assert all(item.deliveries == 1 for item in feed.items("p") if item.id != nul)
    feed.close()


def test_a_workers_answer_refused_as_too_large_fails_its_item_at_once_saying_why(db_url: str, tmp_path: Path) -> None:
    feed = Feed(db_url)
    feed.set_queue(QUEUE, mode="pull")
    feed.add_partition("upload", [(0, b"{}")], queue=QUEUE)
    server = ServeProcess(db_url, tmp_path, "--max-children", "2", FEEDPROC_WORKER_TOKEN=WORKER_TOKEN)
    worker = WorkProcess(server.url, tmp_path, "w", "--processor", "cli_processors:FansOutThenLogs")
    try:
        status = wait_until(lambda: (s := feed.status("upload")).status == "failed" and s, timeout=60)
    finally:
        worker.stop()
        server.stop()
        feed.close()
    (failed,) = status.failed_items  # its three children are over serve's --max-children 2
    assert (failed.attempts, failed.last_error) == (1, "answer has 3 children; the limit is 2 (--max-children)")
    assert status.items["total"] == 1


@contextlib.contextmanager
def one_long_item(db_url: str, tmp_path: Path, *worker_args: str) -> Iterator[tuple[Feed, Path, WorkProcess]]:
    """Partition "long" with one item, claimed by a `feedproc work` whose call sleeps until it is
    cancelled (writing `started`/`cancelled` to the call log); yields once the call has started."""
    feed = Feed(db_url)
    feed.set_queue(QUEUE, mode="pull")
    feed.add_partition("long", [(0, b"{}")], queue=QUEUE)
    log = tmp_path / "calls.log"
    server = ServeProcess(db_url, tmp_path, FEEDPROC_WORKER_TOKEN=WORKER_TOKEN)
    worker = WorkProcess(
        server.url,
        tmp_path,
        "w",
        "--processor",
        "cli_processors:SleepsUntilCancelled",
        *worker_args,
        **{LOG_VARIABLE: str(log)},
    )
    try:
        wait_until(lambda: log.exists() and "started" in log.read_text(), timeout=60, what="the call to start")
        yield feed, log, worker
    finally:
        worker.stop()
        server.stop()
        feed.close()


def test_cancelling_a_partition_cancels_the_pull_workers_call(db_url: str, tmp_path: Path) -> None:
    with one_long_item(db_url, tmp_path, "--lease-seconds", "1.5") as (feed, log, worker):
        feed.cancel("long")
        wait_until(lambda: "cancelled" in log.read_text(), timeout=10, what="the call to be cancelled")
        assert worker.stop() == 0
    assert "refused" not in worker.log_path.read_text()  # nothing was sent for it


def test_a_stopping_worker_hands_back_what_it_could_not_finish(db_url: str, tmp_path: Path) -> None:
    with one_long_item(db_url, tmp_path, "--shutdown-grace", "0.5") as (feed, log, worker):
        assert worker.stop() == 0, worker.log_path.read_text()
        assert "cancelled" in log.read_text()  # its call was cancelled at the end of the grace
        (again,) = feed.claim(QUEUE, "next")  # handed back: ready at once, no attempt counted
        assert again["attempt"] == 1


@pytest.mark.sqlite_only
def test_work_refuses_malformed_arguments(tmp_path: Path) -> None:
    for args, code in (
        (["--api", "ftp://x", "--processor", "m:a"], 2),
        (["--api", "http://127.0.0.1:1"], 2),
        (["--api", "http://127.0.0.1:1", "--processor", "m:a", "--handler", "http://x/"], 2),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "feedproc", "work", *args],
            env=dict(os.environ),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == code, (args, result.stderr)
        assert result.stderr.count("\n") == 1, result.stderr


def test_a_work_processs_answers_accumulate_and_its_fan_in_item_receives_the_sum(db_url: str, tmp_path: Path) -> None:
    feed = Feed(db_url)
    feed.set_queue(QUEUE, mode="pull", accumulate={"n": "sum"})
    rows = [*({"gate": 0, "data": {"n": n}} for n in range(6)), {"gate": 1, "data": {}, "collect": 0}]
    feed.add_partition("scans", rows, queue=QUEUE)
    server = ServeProcess(db_url, tmp_path, FEEDPROC_WORKER_TOKENS=WORKER_TOKEN)
    env = {LOG_VARIABLE: str(tmp_path / "deliveries.log"), DELAY_VARIABLE: "0"}
    worker = WorkProcess(server.url, tmp_path, "w", "--processor", "cli_processors:Accumulates", **env)
    try:
        wait_until(lambda: feed.status("scans").status == "complete", timeout=60, what="the partition done")
        assert feed.status("scans").accumulated == {"n": 6}
        assert json_of(feed.items("scans")[-1].result) == {"accumulated": {"n": 6}}
    finally:
        worker.stop()
        server.stop()
        feed.close()
