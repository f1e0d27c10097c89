"""Pipelines (issue 22): each gate routed to its own handler with its own settings, gate names in
items, answers and children, a change applied while watchers run, and a Python `Pipeline`; on every
database. Gate limits across several watcher processes are checked with real `feedproc watch`."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from feedproc import Feed, Item, Pipeline, Response
from feedproc.core.pipelines import parse_toml

from ..api_support import free_port
from ..support import HandlerService, feedproc_env, json_of, run_cli, spawn, wait_status, wait_until, watching
from .test_scheduling import ConcurrencyMeter


def js(value: Any) -> bytes:
    return json.dumps(value).encode()


def apply(feed: Feed, toml: str) -> int:
    return feed.apply_pipeline(parse_toml(toml)).version


@pytest.fixture
def second() -> Any:
    service = HandlerService()
    yield service
    service.close()


def list_then(first: str, second: str, *, name: str = "ocr", number: int = 1, settings: str = "") -> str:
    """A pipeline's TOML: gate 0 `list` served by `first`, then gate `name` (`number`) by `second`,
    with that gate's `settings` lines."""
    return (
        f'[[gate]]\nname = "list"\nnumber = 0\nhandler = "{first}"\n'
        f'[[gate]]\nname = "{name}"\nnumber = {number}\nhandler = "{second}"\n{settings}'
    )


def folder_then_files(body: dict[str, Any]) -> tuple[Any, ...]:
    """Gate `list`: one child per file at gate `classify`, by name."""
    files = body["data"]["files"]
    return (200, {"done": True, "items": [{"gate": "classify", "data": {"file": f}} for f in files]})


def test_each_gate_goes_to_its_own_handler(db_url: str, feed: Feed, handler: HandlerService, second: Any) -> None:
    handler.behavior = folder_then_files
    apply(feed, list_then(handler.url, second.url, name="classify"))
    feed.add_partition("upload", [{"gate": "list", "data": {"files": ["a", "b", "c"]}}])
    with watching(db_url, None):
        wait_status(feed, "upload", "complete")
    assert [d.gate for d in handler.deliveries] == [0]
    assert sorted(d.body["data"]["file"] for d in second.deliveries) == ["a", "b", "c"]
    assert {d.gate for d in second.deliveries} == {1}


def test_readiness_probes_each_gates_handler_service(db_url: str, feed: Feed, handler: HandlerService) -> None:
    from feedproc.health import WatcherProbe

    dead = free_port()  # nothing listens there
    apply(feed, list_then(handler.url, f"http://user:pw@127.0.0.1:{dead}/ocr"))
    with watching(db_url, None) as running:
        wait_until(lambda: running.watcher.router.version == 1, what="the watcher to follow the pipeline")
        status, _, body = WatcherProbe(running.watcher).ready()
    reasons = json.loads(body)["reasons"]
    assert status == 503
    assert len(reasons) == 1 and reasons[0].startswith(f"handler http://127.0.0.1:{dead}/:")  # not the live one
    assert b"pw" not in body


def test_an_answer_may_name_the_gate_it_moves_to(db_url: str, feed: Feed, handler: HandlerService) -> None:
    handler.behavior = lambda body: (200, {"gate": "rank"} if body["gate"] == 0 else {"done": True})
    apply(feed, list_then(handler.url, handler.url, name="rank", number=7))
    feed.add_partition("p", [{"gate": 0, "data": 1}])
    with watching(db_url, None):
        wait_status(feed, "p", "complete")
    assert [d.gate for d in handler.deliveries] == [0, 7]


def test_an_unknown_gate_name_in_an_answer_is_an_invalid_answer(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    handler.behavior = lambda body: (200, {"gate": "nowhere"})
    apply(feed, f'[[gate]]\nname = "list"\nnumber = 0\nhandler = "{handler.url}"\nmax_attempts = 1\n')
    feed.add_partition("p", [(0, b"1")])
    with watching(db_url, None):
        status = wait_status(feed, "p", "failed")
    [failed] = status.failed_items
    assert "unknown gate 'nowhere'" in (failed.last_error or "") and "list" in (failed.last_error or "")


def test_a_gate_name_unknown_to_the_pipeline_is_refused_when_adding_items(feed: Feed) -> None:
    from feedproc import InvalidInput

    apply(feed, '[[gate]]\nname = "list"\nnumber = 0\n')
    with pytest.raises(InvalidInput, match="unknown gate 'ocr'"):
        feed.add_partition("p", [{"gate": "ocr", "data": 1}])
    with pytest.raises(InvalidInput, match="no pipeline"):
        feed.add_partition("q", [{"gate": "list", "data": 1}], queue="other")
    assert feed.partitions() == []


def test_a_gates_attempts_and_item_timeout_are_its_own(db_url: str, feed: Feed, handler: HandlerService) -> None:
    handler.behavior = lambda body: (200, {"done": True}, {}, 2.0 if body["gate"] == 1 else 0)
    apply(
        feed,
        f"""
        [[gate]]
        name = "quick"
        number = 0
        handler = "{handler.url}"
        [[gate]]
        name = "slow"
        number = 1
        handler = "{handler.url}"
        item_timeout = 0.3
        max_attempts = 2
        retry_delay = 0
        """,
    )
    feed.add_partition("p", [(0, b"1"), (1, b"2")])
    with watching(db_url, None, max_attempts=5):
        status = wait_status(feed, "p", "failed", timeout=60)
    [failed] = status.failed_items
    assert failed.gate == 1 and failed.attempts == 2
    assert "timed out after 0.3s" in (failed.last_error or "")
    assert len(feed.item(failed.id).history) == 2  # two deliveries at the slow gate, not the watcher's 5


def test_a_gates_handler_timeout_is_its_own(db_url: str, feed: Feed, handler: HandlerService) -> None:
    handler.behavior = lambda body: (200, {"done": True}, {}, 1.5)
    apply(
        feed,
        f'[[gate]]\nname = "g"\nnumber = 0\nhandler = "{handler.url}"\ntimeout = 0.2\nmax_attempts = 1\n',
    )
    feed.add_partition("p", [(0, b"1")])
    with watching(db_url, None):
        status = wait_status(feed, "p", "failed", timeout=60)
    assert "timed out" in (status.failed_items[0].last_error or "")


def test_a_pipeline_applied_while_watchers_run_reaches_them(
    db_url: str, feed: Feed, handler: HandlerService, second: Any
) -> None:
    released = threading.Event()

    def hold(body: dict[str, Any]) -> tuple[Any, ...]:
        released.wait(30)
        return (200, {"done": True})

    handler.behavior = hold
    template = '[[gate]]\nname = "g"\nnumber = 0\nhandler = "{url}"\n'
    assert apply(feed, template.format(url=handler.url)) == 1
    feed.add_partition("before", [(0, b"1")])
    with watching(db_url, None, poll_interval=0.1) as running:
        wait_until(lambda: handler.deliveries or running.watcher.busy, what="the first delivery to start")
        assert apply(feed, template.format(url=second.url)) == 2
        wait_until(lambda: running.watcher.router.version == 2, what="the watcher to follow version 2")
        feed.add_partition("after", [(0, b"2")])
        wait_status(feed, "after", "complete")
        released.set()  # the delivery that started under version 1 finishes there
        wait_status(feed, "before", "complete")
    assert [d.body["partition"] for d in second.deliveries] == ["after"]
    assert [d.body["partition"] for d in handler.deliveries] == ["before"]


def test_a_removed_pipeline_stops_delivery_without_failing_items_until_one_is_applied(
    db_url: str, feed: Feed, handler: HandlerService
) -> None:
    text = f'[[gate]]\nname = "g"\nnumber = 0\nhandler = "{handler.url}"\n'
    apply(feed, text)
    with watching(db_url, None, poll_interval=0.1) as running:
        feed.add_partition("first", [(0, b"1")])
        wait_status(feed, "first", "complete")
        feed.remove_pipeline("default")
        wait_until(lambda: running.watcher.router.spec is None, what="the watcher to see the removal")
        feed.add_partition("waits", [(0, b"2")])
        time.sleep(1.0)  # ten polls: nothing may be delivered or failed meanwhile
        assert feed.status("waits").items["available"] == 1 and len(handler.deliveries) == 1
        apply(feed, text)
        wait_status(feed, "waits", "complete")


def test_applying_the_same_pipeline_again_keeps_its_version(feed: Feed) -> None:
    text = '[[gate]]\nname = "g"\nnumber = 0\n'
    assert apply(feed, text) == 1
    assert apply(feed, text) == 1
    assert apply(feed, text + 'handler = "http://127.0.0.1:1/"\n') == 2


def test_a_watcher_with_its_own_handler_sends_every_gate_there_under_the_pipelines_settings(
    db_url: str, feed: Feed, handler: HandlerService, second: Any
) -> None:
    from feedproc import HTTPProcessor

    handler.behavior = lambda body: (500, "no")
    apply(feed, f'[[gate]]\nname = "g"\nnumber = 0\nhandler = "{second.url}"\nmax_attempts = 1\n')
    feed.add_partition("p", [(0, b"1")])
    with watching(db_url, HTTPProcessor(handler.url), max_attempts=5):
        wait_status(feed, "p", "failed")
    assert len(handler.deliveries) == 1 and second.deliveries == []


# ---------------------------------------------------------------- a Python Pipeline

uploads = Pipeline("uploads")


@uploads.gate("list", 0)
def list_folder(item: Item) -> Response:
    return Response(done=True, items=[{"gate": "ocr", "data": {"file": f}} for f in item.json()["files"]])


@uploads.gate("ocr", 1, max_attempts=1)
async def ocr(item: Item) -> Response:
    if item.json()["file"] == "bad":
        raise ValueError("unreadable")
    return Response(gate="rank", data={"text": item.json()["file"].upper()})


@uploads.gate("rank", 2)
def rank(item: Item) -> Response:
    return Response(done=True)


def test_a_python_pipeline_routes_each_gate_to_its_function(db_url: str, feed: Feed) -> None:
    feed.apply_pipeline(uploads.spec)
    feed.add_partition("ok", [{"gate": "list", "data": {"files": ["a", "b"]}}], queue="uploads")
    feed.add_partition("bad", [{"gate": "list", "data": {"files": ["bad"]}}], queue="uploads")
    with watching(db_url, uploads, queue="uploads", max_attempts=5):
        wait_status(feed, "ok", "complete")
        failed = wait_status(feed, "bad", "failed")
    assert sorted(json_of(i.data)["text"] for i in feed.items("ok", gate=2)) == ["A", "B"]
    assert failed.failed_items[0].attempts == 1  # the ocr gate's max_attempts, not the watcher's 5


def test_a_pipelines_settings_are_checked_where_it_is_written() -> None:
    from feedproc import InvalidInput

    pipeline = Pipeline("q")
    with pytest.raises(InvalidInput, match="limit must be an integer"):
        pipeline.gate("g", 0, limit=0)(lambda item: Response(done=True))


def test_pipeline_apply_from_a_python_pipeline_and_watch_serve_it(db_url: str, feed: Feed, tmp_path: Any) -> None:
    module = tmp_path / "my_uploads.py"
    module.write_text(
        "from feedproc import Pipeline, Response\n"
        "pipeline = Pipeline('uploads')\n"
        "@pipeline.gate('list', 0, limit=2)\n"
        "def list_folder(item):\n    return Response(done=True, items=[{'gate': 'ocr', 'data': 1}])\n"
        "@pipeline.gate('ocr', 3)\n"
        "def ocr(item):\n    return Response(done=True)\n"
    )
    result = run_cli(db_url, "pipeline", "apply", "--from", "my_uploads:pipeline", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "version 1" in result.stdout and "0=list, 3=ocr" in result.stdout
    shown = json.loads(run_cli(db_url, "pipeline", "show", "uploads", "--json").stdout)
    assert shown["gate"][0] == {"name": "list", "number": 0, "limit": 2}
    feed.add_partition("p", [{"gate": "list", "data": 1}], queue="uploads")
    process = spawn(
        [sys.executable, "-m", "feedproc", "watch", "--processor", "my_uploads:pipeline", "--poll-interval", "0.1"],
        cwd=tmp_path,
        env=feedproc_env(db_url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_status(feed, "p", "complete", timeout=60)
    finally:
        process.terminate()
        _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err.decode()[-2000:]
    assert [i.gate for i in feed.items("p")] == [0, 3]


def test_watch_without_a_handler_needs_a_pipeline(db_url: str) -> None:
    result = run_cli(db_url, "watch", "--queue", "nothing-here")
    assert result.returncode == 1
    assert "queue 'nothing-here' has no pipeline" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_pipeline_apply_refuses_a_bad_file_and_stores_nothing(db_url: str, feed: Feed, tmp_path: Any) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('[[gate]]\nname = "g"\nnumber = -1\n')
    result = run_cli(db_url, "pipeline", "apply", str(path))
    assert result.returncode == 2
    assert "gate 'g': number: gate must be an integer >= 0" in result.stderr
    assert feed.pipelines() == []


# ---------------------------------------------------------------- gate limits across processes


@pytest.mark.slow
def test_a_gates_limit_holds_exactly_across_three_watcher_processes(
    db_url: str, feed: Feed, handler: HandlerService, second: Any, watchers: Any
) -> None:
    limit, seconds = 3, 0.2
    meter = ConcurrencyMeter(seconds)
    second.behavior = meter
    handler.behavior = lambda body: (200, {"done": True, "items": [{"gate": "ocr", "data": {}}] * 6})
    apply(feed, list_then(handler.url, second.url, settings=f"limit = {limit}\n"))
    for n in range(6):
        feed.add_partition(f"p{n}", [{"gate": "list", "data": {}}] * 2)
    for _ in range(3):
        watchers.start("--concurrency", "5", "--poll-interval", "0.05")
    for n in range(6):
        wait_status(feed, f"p{n}", "complete", timeout=120)
    print(f"\ngate limit {limit}: observed peak {meter.peak}, mean {meter.mean_weight():.2f} in flight at the gate")
    assert meter.peak == limit  # never above, and reached
    assert len(second.deliveries) == 72
    wait_until(lambda: not _gate_slots_held(feed), timeout=10, what="the gate's slots to come back")


def _gate_slots_held(feed: Feed) -> bool:
    from sqlalchemy import select

    from feedproc.store.schema import watchers

    with feed.store.read() as conn:
        rows = conn.execute(select(watchers.c.gate_slots)).scalars().all()
    return any(row and json.loads(row) for row in rows)


# ---------------------------------------------------------------- schedules, served by watchers


def test_three_watchers_start_each_tick_of_a_schedule_once(db_url: str, feed: Feed, handler: HandlerService) -> None:
    apply(
        feed,
        f"""
        [[gate]]
        name = "g"
        number = 0
        handler = "{handler.url}"
        [[schedule]]
        name = "every-second"
        cron = "* * * * * *"
        key = "tick-{{date:%H%M%S}}"
        items = [{{gate = "g", data = {{from = "schedule"}}}}]
        """,
    )
    with watching(db_url, None), watching(db_url, None), watching(db_url, None):
        wait_until(lambda: len(feed.partitions()) >= 4, timeout=60, what="four ticks' partitions")
    keys = [p.key for p in feed.partitions(limit=500)]
    assert len(keys) == len(set(keys)) >= 4
    for key in keys:
        created = [e for e in feed.status(key, history=50).history or () if e.kind == "created"]
        assert len(created) == 1, (key, created)  # started by one watcher, not three
    assert {d.body["data"]["from"] for d in handler.deliveries} == {"schedule"}


def test_a_gates_batch_setting_is_its_own(db_url: str, feed: Feed, handler: HandlerService) -> None:
    def answer(body: dict[str, Any]) -> tuple[Any, ...]:
        if "items" in body:  # a batch request: {"items": [...]} -> {"answers": [...]}
            return (200, {"answers": [{"id": item["id"], "done": True} for item in body["items"]]})
        return (200, {"done": True})

    handler.behavior = answer
    apply(
        feed,
        f"""
        [[gate]]
        name = "one"
        number = 0
        handler = "{handler.url}"
        [[gate]]
        name = "bulk"
        number = 1
        handler = "{handler.url}"
        batch = 5
        """,
    )
    feed.add_partition("p", [(0, b"1"), (0, b"2"), *[(1, b"3")] * 10])
    with watching(db_url, None):
        wait_status(feed, "p", "complete")
    singles = [d for d in handler.deliveries if "items" not in d.body]
    batches = [len(d.body["items"]) for d in handler.deliveries if "items" in d.body]
    assert [d.body["gate"] for d in singles] == [0, 0]
    assert sum(batches) == 10 and max(batches) <= 5 and len(batches) >= 2


def test_a_gate_outside_its_windows_is_not_dispatched(db_url: str, feed: Feed, handler: HandlerService) -> None:
    from datetime import UTC, datetime, timedelta

    later = datetime.now(UTC) + timedelta(hours=6)
    window = f"{later:%H:%M}-{later + timedelta(minutes=1):%H:%M}"  # a minute, six hours from now
    apply(
        feed,
        f"""
        [[gate]]
        name = "now"
        number = 0
        handler = "{handler.url}"
        [[gate]]
        name = "tonight"
        number = 1
        handler = "{handler.url}"
        windows = ["{window}"]
        """,
    )
    feed.add_partition("waits", [(1, b"1")], priority=9)
    feed.add_partition("goes", [(0, b"2")])
    with watching(db_url, None, poll_interval=0.1):
        wait_status(feed, "goes", "complete")
        time.sleep(0.5)  # five more polls: the closed gate's item must still not start
    assert feed.status("waits").items["available"] == 1
    assert [d.body["partition"] for d in handler.deliveries] == ["goes"]
