"""Fan-in that joins, seen from outside (every database unless said): results shown by `feedproc
items` / `item`, the API and the dashboard; a handler in a process of its own reading 50,000
collected results a page at a time over its results URL, each exactly once; `feedproc work`
processors iterating `item.collected` inline and by pages; a Python processor iterating a million
results with the watcher's peak RSS under 200 MB (115 MB on PostgreSQL, 143 on SQLite and MariaDB;
23-41 s a database on this machine, the million rows written included)."""

from __future__ import annotations

import base64
import functools
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from feedproc import Feed
from feedproc.core.pipelines import parse_toml
from feedproc.core.records import Kind
from feedproc.store.foundations import db_now

from ..api_support import ApiServer, ServeProcess
from ..support import (
    ROOT,
    A,
    WatcherProcesses,
    answer,
    feedproc_env,
    json_of,
    lease_and_fetch,
    register,
    run_cli,
    spawn,
    stop_group,
    wait_until,
)

WORKER_TOKEN = "fan-in-worker-token-4242"


def with_results(feed: Feed) -> list[int]:
    """Partition "p": three items answered, each with its data kept and a result (the last one's
    not JSON); a fourth, unanswered, that collects gate 0."""
    feed.add_partition("p", [(0, b'{"file":"a"}'), (0, b'{"file":"<b>"}'), (0, b"{}"), {"gate": 1, "collect": 0}])
    register(feed.store, A)
    results = [b'{"label":"invoice","score":0.9}', b'{"label":"<i>x</i>"}', b"\x00\xff"]
    feed.store.apply(
        A, [answer(r, Kind.DONE, result=v) for r, v in zip(lease_and_fetch(feed.store), results, strict=True)]
    )
    return [i.id for i in feed.items("p")]


# ---------------------------------------------------------------- shown


def test_items_and_item_show_each_items_result_beside_its_data(db_url: str, feed: Feed) -> None:
    ids = with_results(feed)
    rows = [json.loads(line) for line in run_cli(db_url, "items", "p", "--json").stdout.splitlines()]
    assert [(r["data"], r.get("result"), r.get("result_base64")) for r in rows] == [
        ({"file": "a"}, {"label": "invoice", "score": 0.9}, None),
        ({"file": "<b>"}, {"label": "<i>x</i>"}, None),
        ({}, None, base64.b64encode(b"\x00\xff").decode()),
        (None, None, None),
    ]
    table = run_cli(db_url, "items", "p")
    assert table.returncode == 0 and "result" in table.stdout.splitlines()[0] and '{"label":"invoice"' in table.stdout
    shown = run_cli(db_url, "item", str(ids[0]))
    assert shown.returncode == 0, shown.stderr
    assert 'data:\n{\n  "file": "a"\n}\nresult:\n{\n  "label": "invoice",\n  "score": 0.9\n}' in shown.stdout
    assert "collects the results of gate 0" in run_cli(db_url, "item", str(ids[3])).stdout
    as_json = json.loads(run_cli(db_url, "item", str(ids[2]), "--json").stdout)
    assert as_json["result_base64"] == "AP8=" and as_json["data"] == {} and as_json["collect"] is None


def test_the_api_shows_each_items_result(db_url: str, feed: Feed) -> None:
    ids = with_results(feed)
    api = ApiServer(db_url)
    try:
        page = api.get("/api/v1/items", params={"key": "p"}).json()["items"]
        assert [(r["data"], r["result"]) for r in page[:2]] == [
            ({"file": "a"}, {"label": "invoice", "score": 0.9}),
            ({"file": "<b>"}, {"label": "<i>x</i>"}),
        ]
        assert page[2]["result_base64"] == "AP8=" and "result" not in page[2] and page[3]["result"] is None
        one = api.get(f"/api/v1/items/{ids[3]}").json()
        assert (one["collect"], one["result"]) == (0, None)
    finally:
        api.close()


def test_the_dashboards_item_page_pretty_prints_the_result(db_url: str, feed: Feed) -> None:
    ids = with_results(feed)
    api = ApiServer(db_url)
    try:
        page = api.get(f"/items/{ids[1]}")
        assert page.status_code == 200
        assert "<h2>Result" in page.text and "&lt;i&gt;x&lt;/i&gt;" in page.text and "<i>x</i>" not in page.text
        assert "{\n  &#34;label&#34;: &#34;&lt;i&gt;x&lt;/i&gt;&#34;\n}" in page.text  # pretty-printed, escaped
        assert "<h2>Result" not in api.get(f"/items/{ids[3]}").text  # no result, no section
        assert "collects gate <b>0</b>" in api.get(f"/items/{ids[3]}").text
    finally:
        api.close()


# ---------------------------------------------------------------- collected at scale


def completed(feed: Feed, key: str) -> bool:
    return feed.status(key).status == "complete"


def complete_items(feed: Feed, key: str, gate: int, count: int) -> None:
    """`count` complete items at `gate` of partition `key`, results `{"n": 1}` .. `{"n": count}`,
    written in one statement (a million in seconds)."""
    store = feed.store
    now = str(db_now().compile(dialect=store.engine.dialect))
    columns = "partition_id, gate, status, data, result, next_attempt_at, created_at, updated_at"
    with store.write() as conn:
        pid = conn.execute(text('SELECT id FROM feedproc_partitions WHERE "key" = :key'), {"key": key}).scalar_one()
        params = {"pid": pid, "gate": gate, "count": count}
        if store.dialect.name == "postgresql":
            series = "generate_series(1, :count) AS s(n)"
            result = "convert_to('{\"n\":' || n || '}', 'UTF8')"
            data = "'\\x7b7d'::bytea"
        elif store.dialect.name == "mysql":
            series = f"seq_1_to_{int(count)} AS s"
            result, data = "CONCAT('{\"n\":', s.seq, '}')", "'{}'"
        else:
            conn.execute(
                text(
                    "CREATE TEMP TABLE series AS WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL "
                    "SELECT n + 1 FROM s WHERE n < :count) SELECT n FROM s"
                ),
                params,
            )
            series, result, data = "series", "CAST('{\"n\":' || n || '}' AS BLOB)", "X'7b7d'"
        conn.execute(
            text(
                f"INSERT INTO feedproc_items ({columns}) SELECT :pid, :gate, 'complete', {data}, {result},"
                f" {now}, {now}, {now} FROM {series}"
            ),
            params,
        )


@pytest.fixture
def serve(db_url: str, tmp_path: Path) -> Iterator[ServeProcess]:
    server = ServeProcess(db_url, tmp_path, FEEDPROC_WORKER_TOKEN=WORKER_TOKEN)
    yield server
    server.stop()


@pytest.fixture
def reader() -> Iterator[str]:
    """The URL of a handler process of its own that reads collected results by their pages."""
    process = spawn([sys.executable, str(ROOT / "tests" / "collected_reader.py")], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        yield process.stdout.readline().strip()
    finally:
        stop_group(process, grace=10)


@pytest.mark.slow
@pytest.mark.every_database
def test_a_handler_in_another_process_reads_50000_results_by_pages_each_once(
    db_url: str, feed: Feed, serve: ServeProcess, reader: str, watchers: WatcherProcesses
) -> None:
    feed.add_partition("big", [{"gate": 1, "data": {"join": True}, "collect": 0}])
    complete_items(feed, "big", 0, 50_000)
    watchers.start("--handler", reader, "--callback-url", serve.url, "--timeout", "300", "--poll-interval", "0.2")
    wait_until(lambda: feed.status("big").status == "complete", timeout=300, what="the fan-in item answered")
    (fan_in,) = feed.items("big", gate=1)
    result = json_of(fan_in.result)
    assert result["collected"] == {"gate": 0, "count": 50_000, "failed": 0}
    assert result["read"] == {"count": 50_000, "twice": 0, "sum": 50_000 * 50_001 // 2, "pages": 50}


@pytest.mark.slow
def test_a_python_processor_iterates_a_million_results_in_bounded_memory(
    db_url: str, feed: Feed, watchers: WatcherProcesses
) -> None:
    feed.add_partition("huge", [{"gate": 1, "data": {"join": True}, "collect": 0}])
    complete_items(feed, "huge", 0, 1_000_000)  # read at once: the table has no statistics yet
    watchers.start("--processor", "cli_processors:CountsCollected", "--item-timeout", "600")
    wait_until(lambda: feed.status("huge").status == "complete", timeout=600, every=0.5, what="a million read")
    (fan_in,) = feed.items("huge", gate=1)
    result = json_of(fan_in.result)
    print(f"a million collected results read by a Python processor: peak watcher RSS {result['peak_rss_mb']:.0f} MB")
    assert (result["count"], result["twice"], result["sum"]) == (1_000_000, 0, 1_000_000 * 1_000_001 // 2)
    assert result["peak_rss_mb"] < 200


# ---------------------------------------------------------------- pull workers


def test_feedproc_work_processors_iterate_what_they_collect_inline_and_by_pages(
    db_url: str, feed: Feed, serve: ServeProcess, tmp_path: Path
) -> None:
    feed.set_queue("gpu", mode="pull")
    gates = 'queue = "gpu"\n[[gate]]\nname = "classify"\nnumber = 0\n[[gate]]\nname = "rank"\nnumber = 1\n'
    feed.apply_pipeline(parse_toml(gates + 'collect = "classify"\ncollect_inline = 2\n'))
    for key, files in (("inline", ["a", "b"]), ("paged", ["c", "d", "e"])):
        feed.add_partition(key, [*({"gate": 0, "data": {"file": f}} for f in files), {"gate": 1}], queue="gpu")
    worker = spawn(
        [
            sys.executable,
            "-m",
            "feedproc",
            "work",
            "--api",
            serve.url,
            "--queue",
            "gpu",
            "--processor",
            "cli_processors:Joins",
        ],
        env=feedproc_env("sqlite:///unused.db", FEEDPROC_WORKER_TOKEN=WORKER_TOKEN),
        stdout=open(tmp_path / "work.log", "ab"),  # noqa: SIM115 - owned by the child
        stderr=subprocess.STDOUT,
    )
    try:
        for key in ("inline", "paged"):
            wait_until(functools.partial(completed, feed, key), timeout=60, what=f"{key} done")
    finally:
        stop_group(worker, grace=30)
    for key, files in (("inline", ["a", "b"]), ("paged", ["c", "d", "e"])):
        ids = [i.id for i in feed.items(key)]
        joined = json_of(feed.items(key, gate=1)[0].result)
        assert joined == {
            "rows": [[i, {"label": f.upper()}, None] for i, f in zip(ids, files, strict=False)],
            "accumulated": {},
        }


def test_a_claim_carries_what_its_fan_in_item_collects_and_its_token_reads_the_pages(db_url: str, feed: Feed) -> None:
    import httpx

    feed.set_queue("gpu", mode="pull")
    gates = 'queue = "gpu"\n[[gate]]\nname = "classify"\nnumber = 0\n[[gate]]\nname = "rank"\nnumber = 1\n'
    feed.apply_pipeline(parse_toml(gates + 'collect = "classify"\ncollect_inline = 2\n'))
    feed.add_partition("small", [{"gate": 0, "data": {"file": "a"}}, {"gate": 1}], queue="gpu")
    feed.add_partition("large", [*({"gate": 0, "data": {"file": f}} for f in "cde"), {"gate": 1}], queue="gpu")
    api = ApiServer(db_url, worker_token=WORKER_TOKEN)
    auth = {"Authorization": f"Bearer {WORKER_TOKEN}"}
    try:

        def claim() -> list[dict[str, Any]]:
            got = api.post("/api/v1/queues/gpu/claim", {"worker": "w", "max": 10}, headers=auth, auth=False)
            assert got.status_code == 200, got.text
            return got.json()["items"]

        for entry in claim():  # gate 0 of both: results, and nothing collected
            assert "collected" not in entry
            body = {"token": entry["token"], "done": True, "result": entry["data"]["file"]}
            assert api.post(f"/api/v1/items/{entry['id']}/answer", body, headers=auth, auth=False).status_code == 200
        small, large = sorted(claim(), key=lambda e: e["partition"] != "small")
        small_ids, large_ids = ([i.id for i in feed.items(key)] for key in ("small", "large"))
        assert small["collected"] == {
            "gate": "classify",
            "count": 1,
            "failed": 0,
            "results": [{"id": small_ids[0], "result": "a"}],
        }
        assert small["accumulated"] == {} and large["accumulated"] == {}
        url = large["collected"].pop("results_url")
        assert large["collected"] == {"gate": "classify", "count": 3, "failed": 0}
        assert url.startswith(f"{api.url}/api/v1/items/{large['id']}/collected?token={large['token']}&")
        first = httpx.get(url + "&limit=2").json()
        second = httpx.get(first["next"]).json()
        assert [r["result"] for r in first["results"] + second["results"]] == ["c", "d", "e"] and second["next"] is None
        assert [r["id"] for r in first["results"] + second["results"]] == large_ids[:3]
        assert httpx.get(url.replace(large["token"], "x" * 32)).status_code == 404
        api.post(
            f"/api/v1/items/{large['id']}/answer", {"token": large["token"], "done": True}, headers=auth, auth=False
        )
        refused = httpx.get(url)
        assert refused.status_code == 409 and refused.json()["reason"] == "superseded"
    finally:
        api.close()


# ---------------------------------------------------------------- collect as an item field


def test_add_and_the_api_take_collect_as_an_item_field(db_url: str, feed: Feed) -> None:
    rows = '{"gate": 0, "data": {"file": "a"}}\n{"gate": 2, "data": {"join": true}, "collect": 0}\n'
    added = run_cli(db_url, "add", "from-file", "--items", "-", input=rows)
    assert added.returncode == 0, added.stderr
    refused = run_cli(db_url, "add", "wrong", "--items", "-", input='{"gate": 1, "collect": 1}\n')
    assert refused.returncode == 2 and "collect must name an earlier gate" in refused.stderr
    api = ApiServer(db_url)
    try:
        body = {"key": "from-api", "items": [{"gate": 0}, {"gate": 3, "data": None, "collect": 0}]}
        assert api.post("/api/v1/partitions", body).status_code == 201
        bad = api.post("/api/v1/partitions", {"key": "bad", "items": [{"gate": 3, "collect": 4}]})
        assert bad.status_code == 400 and "collect" in bad.json()["error"]
    finally:
        api.close()
    assert [feed.item(i.id).collect for key in ("from-file", "from-api") for i in feed.items(key)] == [
        None,
        0,
        None,
        0,
    ]
