"""`feedproc.testing` (issue 32): a user's test runs a pipeline or a processor in-process with the
real store, gate rules and watcher. SQLite only, by design: the harness's database is a throwaway
SQLite file (the store it drives is tested on every database in tests/store/test_pending.py)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from feedproc import Item, PermanentError, Pipeline, Processor, Response
from feedproc.core.pipelines import parse_toml
from feedproc.testing import Harness, NotDrained


def three_gates() -> Pipeline:
    """A folder fans out to files, each file is read (its result kept), then labelled."""
    pipeline = Pipeline("scans")

    @pipeline.gate("list", 0)
    def list_files(item: Item) -> Response:
        return Response(done=True, items=[{"gate": "read", "data": {"file": f}} for f in item.json()["files"]])

    @pipeline.gate("read", 1)
    async def read(item: Item) -> Response:
        return Response(gate="label", result={"file": item.json()["file"], "size": len(item.json()["file"])})

    @pipeline.gate("label", 2)
    def label(item: Item) -> Response:
        return Response(done=True)

    return pipeline


@pytest.fixture
def scans(tmp_path: Path) -> Iterator[Harness]:
    with Harness(three_gates(), directory=tmp_path) as harness:
        yield harness


def test_a_pipeline_drains_through_every_gate(scans: Harness) -> None:
    scans.add("folder-1", [{"gate": "list", "data": {"files": ["a.pdf", "bb.pdf"]}}])
    drained = scans.drain()
    scans.assert_complete("folder-1")
    assert drained.finished == ("folder-1",) and drained.unfinished == ()
    assert drained.deliveries == 1 + 2 + 2  # the folder once, each file at read and at label
    assert scans.results("folder-1", "label") == [{"file": "a.pdf", "size": 5}, {"file": "bb.pdf", "size": 6}]
    kinds = [event.kind for event in scans.history("folder-1")]
    assert kinds[0] == "created" and kinds[-1] == "completed"


def test_a_hundred_items_through_three_gates_drain_in_one_step(scans: Harness) -> None:
    files = [f"{n}.pdf" for n in range(100)]
    scans.add("folder-2", [{"gate": "list", "data": {"files": files}}])
    drained = scans.drain()
    assert (drained.steps, drained.deliveries, drained.waited) == (1, 201, 0.0)
    assert len(scans.items("folder-2", gate="label", status="complete")) == 100


def test_a_processor_that_raises_fails_its_item_with_its_error_and_traceback() -> None:
    class Refuses(Processor):
        def process(self, item: Item) -> Response:
            raise PermanentError("not a scan")

    with Harness(Refuses) as harness:
        harness.add("doc-1", [(0, b"{}")])
        harness.drain()
        harness.assert_failed("doc-1", error="not a scan")
        [failed] = harness.items("doc-1", status="failed")
        [delivery] = harness.item(failed.id).history
    assert delivery.outcome == "failed" and "in process" in (delivery.error or "")  # where it was raised


def test_retries_with_backoff_are_waited_out_on_the_fake_clock_not_slept() -> None:
    def flaky(item: Item) -> Response:
        raise RuntimeError("service down")

    with Harness(flaky, max_attempts=4, retry_delay=60) as harness:  # 60 s, 120 s, 240 s (+ jitter)
        harness.add("doc-2", [(0, b"{}")])
        started = time.monotonic()
        drained = harness.drain()
        elapsed = time.monotonic() - started
        harness.assert_failed("doc-2", error="RuntimeError: service down")
        assert harness.item(1).deliveries == 4
    assert drained.steps == 4 and drained.waited >= 420
    assert elapsed < drained.waited / 10


def test_a_retry_is_not_delivered_before_its_backoff_has_passed() -> None:
    answers: Iterator[Exception | Response] = iter([RuntimeError("once"), Response(done=True)])

    def once_then_done(item: Item) -> Response:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    with Harness(once_then_done, retry_delay=30) as harness:
        harness.add("doc-3", [(0, b"{}")])
        first = harness.step()
        assert first.deliveries == 1 and first.next_due is not None and 29 < first.next_due <= 38
        assert harness.step().deliveries == 0  # the clock did not move: not due yet
        harness.advance(first.next_due)
        assert harness.step().finished == ("doc-3",)
        harness.assert_complete("doc-3")


def test_a_not_yet_answer_is_asked_again_once_its_delay_has_passed_on_the_fake_clock() -> None:
    asked: list[int] = []

    def not_yet_then_done(item: Item) -> Response:
        asked.append(item.attempt)
        return Response(done=True) if len(asked) > 1 else Response(gate=item.gate, retry_after=300)

    with Harness(not_yet_then_done) as harness:
        harness.add("doc-11", [(0, b"{}")])
        drained = harness.drain()
        harness.assert_complete("doc-11")
    assert asked == [1, 1] and drained.steps == 2 and drained.waited >= 300  # "not yet" is no failed attempt


def test_collected_results_reach_the_fan_in_function() -> None:
    pipeline = Pipeline("words")

    @pipeline.gate("measure", 0)
    def measure(item: Item) -> Response:
        word = item.json()["word"]
        return Response(done=True, result={"word": word, "letters": len(word)})

    @pipeline.gate("report", 1, collect="measure")
    def report(item: Item) -> Response:
        rows = [row.json() for row in item.collected]
        return Response(
            done=True, result={"words": [r["word"] for r in rows], "letters": sum(r["letters"] for r in rows)}
        )

    with Harness(pipeline) as harness:
        words = [{"gate": "measure", "data": {"word": w}} for w in ("fan", "in")]
        harness.add("text-1", [*words, {"gate": "report", "data": {}}])
        harness.drain()
        assert harness.results("text-1", "report") == [{"words": ["fan", "in"], "letters": 5}]


def test_tolerated_failures_let_the_partition_complete_and_are_collected_with_their_errors() -> None:
    pipeline = Pipeline("words")

    @pipeline.gate("measure", 0)
    def measure(item: Item) -> Response:
        if not item.json()["word"]:
            raise PermanentError("an empty word")
        return Response(done=True, result={"word": item.json()["word"]})

    @pipeline.gate("report", 1, collect="measure")
    def report(item: Item) -> Response:
        return Response(done=True, result={"failed": [row.error for row in item.collected if row.failed]})

    with Harness(pipeline) as harness:
        words = [{"gate": "measure", "data": {"word": w}} for w in ("join", "")]
        harness.add("text-2", [*words, {"gate": "report", "data": {}}], tolerate=1)
        harness.drain()
        harness.assert_complete("text-2")
        assert harness.errors("text-2", gate="measure") == ["an empty word"]
        assert harness.results("text-2", "report") == [{"failed": ["an empty word"]}]


def test_a_call_past_its_item_timeout_is_a_retried_failure() -> None:
    async def hangs(item: Item) -> Response:
        await asyncio.sleep(3600)
        return Response(done=True)

    with Harness(hangs, item_timeout=0.05, max_attempts=2) as harness:
        harness.add("doc-4", [(0, b"{}")])
        assert harness.drain().steps == 2
        harness.assert_failed("doc-4", error="timed out after 0.05s")


def test_an_answer_that_is_not_a_response_fails_as_in_a_watcher() -> None:
    def answers_a_dict(item: Item) -> Response:
        return {"done": True}  # type: ignore[return-value]

    with Harness(answers_a_dict, max_attempts=1) as harness:
        harness.add("doc-5", [(0, b"{}")])
        harness.drain()
        harness.assert_failed("doc-5", error="process() returned dict, not a feedproc.Response")


def test_a_processor_that_always_says_not_yet_does_not_drain_and_says_which_partition() -> None:
    with Harness(lambda item: Response(gate=item.gate)) as harness:  # "not yet": ask again later
        harness.add("doc-6", [(0, b"{}")])
        with pytest.raises(NotDrained, match="did not drain within 5 steps") as raised:
            harness.drain(max_steps=5)
    assert "partition 'doc-6': available at gate 0" in str(raised.value)


def test_a_call_that_hangs_without_a_timeout_fails_the_step_clearly() -> None:
    async def hangs(item: Item) -> Response:
        await asyncio.sleep(3600)
        return Response(done=True)

    with Harness(hangs, shutdown_grace=0.1) as harness:
        harness.add("doc-7", [(0, b"{}")])
        with pytest.raises(NotDrained, match=r"still had items due after 0\.2s"):
            harness.step(timeout=0.2)


def test_an_unsealed_partition_is_left_unfinished_and_the_failure_says_why() -> None:
    with Harness(lambda item: Response(done=True)) as harness:
        harness.add("batch-1", [(0, b"{}")], sealed=False)
        drained = harness.drain()
        assert drained.unfinished == ("batch-1",)
        with pytest.raises(AssertionError, match="not sealed: it waits for more items"):
            harness.assert_complete("batch-1")


def test_a_failure_message_names_the_failed_items_and_their_errors() -> None:
    def refuses(item: Item) -> Response:
        raise PermanentError(f"no {json.loads(item.data)['file']}")

    with Harness(refuses) as harness:
        harness.add("doc-8", [(0, b'{"file": "a.pdf"}')])
        harness.drain()
        with pytest.raises(AssertionError) as raised:
            harness.assert_complete("doc-8")
    assert "expected partition 'doc-8' to be complete" in str(raised.value)
    assert "item 1 at gate 0: failed after 1 deliveries (1 failed attempts): no a.pdf" in str(raised.value)


def test_a_processor_start_that_raises_is_raised_by_the_step() -> None:
    class CannotStart(Processor):
        async def start(self) -> None:
            raise ConnectionError("no model server")

    with Harness(CannotStart()) as harness:
        harness.add("doc-9", [(0, b"{}")])
        with pytest.raises(ConnectionError, match="no model server"):
            harness.step()


def test_an_async_test_may_drain() -> None:
    async def a_test() -> None:
        with Harness(lambda item: Response(done=True)) as harness:
            harness.add("doc-10", [(0, b"{}")])
            harness.drain()  # its watcher runs on a loop of its own, not the test's
            harness.assert_complete("doc-10")

    asyncio.run(a_test())


def test_the_database_is_kept_in_a_given_directory_and_removed_otherwise(tmp_path: Path) -> None:
    with Harness(lambda item: Response(done=True), directory=tmp_path) as kept:
        pass
    with Harness(lambda item: Response(done=True)) as removed:
        pass
    assert kept.path.parent == tmp_path and kept.path.exists()
    assert not removed.path.parent.exists()


def test_a_pipeline_serves_its_own_queue_only() -> None:
    with pytest.raises(ValueError, match="serves queue 'scans', not 'other'"):
        Harness(three_gates(), queue="other")


def test_a_stored_pipeline_routes_each_gate_to_its_own_processor() -> None:
    """A TOML pipeline served as a fleet serves it: each gate by the processor it names."""
    spec = parse_toml(
        """
        queue = "labels"

        [[gate]]
        name = "label"
        number = 0
        processor = "tests.cli_processors:Joins"

        [[gate]]
        name = "join"
        number = 1
        processor = "tests.cli_processors:Joins"
        collect = "label"
        """
    )
    with Harness(spec) as harness:
        harness.add("files-1", [{"gate": "label", "data": {"file": "a.pdf"}}, {"gate": "join", "data": {}}])
        harness.drain()
        [joined] = harness.results("files-1", "join")
    assert [row[1] for row in joined["rows"]] == [{"label": "A.PDF"}]


def test_a_harness_takes_a_watcher_setting_by_its_old_name_with_a_deprecation_warning(tmp_path: Path) -> None:
    with pytest.warns(DeprecationWarning, match=r"capacity=.*use max_partitions="):
        harness = Harness(lambda item: Response(done=True), directory=tmp_path, capacity=5)
    with harness:
        assert harness.config.max_partitions == 5


def test_a_pipelines_python_hook_is_called_by_the_step_that_finished_its_partition() -> None:
    pipeline, finished = three_gates(), []
    pipeline.on_complete(lambda summary: finished.append((summary["key"], summary["items"])))
    with Harness(pipeline) as harness:
        harness.add("scan-1", [{"gate": "list", "data": {"files": ["a.pdf", "bb.pdf"]}}])

        harness.drain()

        assert finished == [("scan-1", 3)]
        assert [(h.key, h.hook, h.status) for h in harness.hooks()] == [("scan-1", "on_complete", "sent")]


def test_a_harness_takes_functions_for_the_queues_python_hooks() -> None:
    cancelled: list[str] = []
    with Harness(
        lambda item: Response(done=True), hooks={"on_cancel": lambda s: cancelled.append(s["key"])}
    ) as harness:
        harness.feed.set_queue(harness.queue, hooks={"on_cancel": "python"})
        harness.add("job", [{"data": {}}], sealed=False)
        harness.feed.cancel("job")

        harness.step()

        assert cancelled == ["job"]
