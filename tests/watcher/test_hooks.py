"""Completion hooks delivered by watchers (every database): an HTTP hook is POSTed the partition's
summary, signed with the watcher's secret and keyed by its id; an endpoint that answers an error or
is down is called again with backoff until it takes the hook; one out of attempts stays failed; a
Python hook's function is called in the watcher that has it."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from feedproc import Feed, Item, PermanentError, Pipeline, Processor, Response
from feedproc.core.hooks import SIGNATURE_HEADER, verify

from ..hooks_support import closed_port, receiving
from ..support import Done, wait_until, watching

SECRET = "whsec-test"
LATER = datetime.now(UTC) + timedelta(hours=1)  # a partition not started before it is cancelled


class FailsOdd(Processor):
    """Fails (permanently) the items whose data is an odd number; completes the others."""

    def process(self, item: Item) -> Response:
        if int(item.data) % 2:
            raise PermanentError(f"odd: {int(item.data)}")
        return Response(done=True)


def test_a_completed_partition_is_posted_its_signed_summary(db_url: str, feed: Feed) -> None:
    with receiving() as receiver:
        feed.set_queue("default", hooks={"on_complete": receiver.url})
        with watching(db_url, Done(), hook_secret=SECRET):
            feed.add_partition("upload-1", [(0, b"2"), (0, b"4"), (1, b"6")])
            wait_until(lambda: receiver.received, timeout=30, what="the hook")
            wait_until(lambda: feed.store.hooks(status="sent"), timeout=30, what="the hook recorded sent")

        [request] = receiver.received
        body = request.json()
        assert (body["hook"], body["key"], body["status"], body["items"]) == ("on_complete", "upload-1", "complete", 3)
        assert [(g["gate"], g["complete"]) for g in body["gates"]] == [(0, 2), (1, 1)]
        assert request.id == str(body["id"])
        assert request.headers["Content-Type"] == "application/json"
        assert verify(SECRET, request.headers[SIGNATURE_HEADER], request.body, now=time.time())
        assert not verify("another secret", request.headers[SIGNATURE_HEADER], request.body, now=time.time())
        [sent] = feed.store.hooks()
        assert (sent["status"], sent["attempts"], sent["response_status"]) == ("sent", 1, 200)


def test_a_failed_partition_calls_on_fail_with_its_first_error(db_url: str, feed: Feed) -> None:
    with receiving() as receiver:
        feed.set_queue("default", hooks={"on_complete": receiver.url, "on_fail": receiver.url + "/failed"})
        with watching(db_url, FailsOdd(), hook_secret=SECRET):
            feed.add_partition("upload-2", [(0, b"2"), (0, b"3")])
            wait_until(lambda: receiver.received, timeout=30, what="the hook")

        [request] = receiver.received
        assert request.path == "/hooks/failed"
        body = request.json()
        assert (body["hook"], body["status"]) == ("on_fail", "failed")
        assert body["first_error"]["error"].endswith("odd: 3")


def test_an_endpoint_answering_errors_gets_the_hook_again_until_it_takes_it(db_url: str, feed: Feed) -> None:
    with receiving() as receiver:
        receiver.status = 503
        feed.set_queue("default", hooks={"on_cancel": receiver.url})
        with watching(db_url, Done(), hook_secret=SECRET, hook_max_delay=0.2):
            feed.add_partition("upload-3", [(0, b"1")], not_before=LATER)
            feed.cancel("upload-3")
            wait_until(lambda: len(receiver.received) >= 3, timeout=30, what="three attempts")
            receiver.status = 200
            [sent] = wait_until(lambda: feed.store.hooks(status="sent"), timeout=30, what="the hook taken")

        assert len({r.id for r in receiver.received}) == 1  # one hook, one idempotency key
        assert sent["attempts"] == len(receiver.received)
        attempts = [int(r.headers["Feedproc-Attempt"]) for r in receiver.received]
        assert attempts == list(range(1, len(attempts) + 1))


def test_an_endpoint_that_is_down_gets_the_hook_once_it_is_up(db_url: str, feed: Feed) -> None:
    port = closed_port()
    feed.set_queue("default", hooks={"on_cancel": f"http://127.0.0.1:{port}/hooks"})
    with watching(db_url, Done(), hook_max_delay=0.3):
        feed.add_partition("upload-4", [(0, b"1")], not_before=LATER)
        feed.cancel("upload-4")
        wait_until(lambda: any(h["attempts"] >= 2 for h in feed.store.hooks()), timeout=30, what="two failed attempts")
        [pending] = feed.store.hooks(status="pending")
        assert pending["last_error"].startswith("ConnectError"), pending

        with receiving(port) as receiver:  # the endpoint is up again
            wait_until(lambda: feed.store.hooks(status="sent"), timeout=30, what="the hook delivered")
    assert [r.json()["key"] for r in receiver.received] == ["upload-4"]


def test_a_hook_out_of_attempts_stays_failed_until_retried(db_url: str, feed: Feed) -> None:
    with receiving() as receiver:
        receiver.status = 500
        feed.set_queue("default", hooks={"on_cancel": receiver.url})
        with watching(db_url, Done(), hook_attempts=2, hook_max_delay=0.1):
            feed.add_partition("upload-5", [(0, b"1")], not_before=LATER)
            feed.cancel("upload-5")
            [failed] = wait_until(lambda: feed.store.hooks(status="failed"), timeout=30, what="the hook failed")
            assert (failed["attempts"], failed["last_error"], failed["response_status"]) == (
                2,
                "answered HTTP 500",
                500,
            )
            receiver.status = 200
            assert feed.store.retry_hooks([failed["id"]]) == 1
            wait_until(lambda: feed.store.hooks(status="sent"), timeout=30, what="the retried hook sent")
        assert len(receiver.received) == 3


def test_a_pipelines_python_hook_is_called_in_its_watcher(db_url: str, feed: Feed) -> None:
    pipeline = Pipeline("default")
    called: list[dict[str, Any]] = []
    done = threading.Event()

    @pipeline.gate("only", 0)
    def only(item: Item) -> Response:
        return Response(done=True)

    @pipeline.on_complete
    def completed(summary: dict[str, Any]) -> None:
        called.append(summary)
        done.set()

    feed.apply_pipeline(pipeline.spec)
    assert feed.queue("default").hooks == {"on_complete": "python"}
    with watching(db_url, pipeline):
        feed.add_partition("upload-6", [(0, b"1")])
        assert done.wait(30)
        wait_until(lambda: feed.store.hooks(status="sent"), timeout=30, what="the hook recorded sent")
    assert [(s["hook"], s["key"], s["status"]) for s in called] == [("on_complete", "upload-6", "complete")]


def test_a_python_hook_that_raises_is_retried(db_url: str, feed: Feed) -> None:
    calls: list[str] = []

    def flaky(summary: dict[str, Any]) -> None:
        calls.append(summary["key"])
        if len(calls) < 3:
            raise RuntimeError("the mail server is down")

    feed.set_queue("default", hooks={"on_cancel": "python"})
    with watching(db_url, Done(), hooks={"on_cancel": flaky}, hook_max_delay=0.1):
        feed.add_partition("upload-7", [(0, b"1")], not_before=LATER)
        feed.cancel("upload-7")
        [sent] = wait_until(lambda: feed.store.hooks(status="sent"), timeout=30, what="the hook sent")
    assert (calls, sent["attempts"]) == (["upload-7"] * 3, 3)


def test_a_watcher_without_the_function_leaves_a_python_hook_to_one_that_has_it(db_url: str, feed: Feed) -> None:
    with receiving() as receiver:
        feed.set_queue("default", hooks={"on_cancel": "python", "on_complete": receiver.url})
        feed.add_partition("upload-8", [(0, b"1")], not_before=LATER)
        feed.cancel("upload-8")
        with watching(db_url, Done()):
            feed.add_partition("upload-9", [(0, b"1")])
            # Its hook loop has claimed since the cancel: upload-9's HTTP hook is sent.
            wait_until(lambda: feed.store.hooks(status="sent"), timeout=30, what="the HTTP hook sent")
            assert [(h["key"], h["attempts"]) for h in feed.store.hooks(status="pending")] == [("upload-8", 0)]
    seen: list[str] = []
    with watching(db_url, Done(), hooks={"on_cancel": lambda summary: seen.append(summary["key"])}):
        wait_until(lambda: len(feed.store.hooks(status="sent")) == 2, timeout=30, what="the Python hook sent")
    assert seen == ["upload-8"]
