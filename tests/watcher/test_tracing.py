"""Tracing (issue 14, feedproc/tracing.py): a span per delivery and group commit, a W3C
`traceparent` on handler requests, and nothing at all when OpenTelemetry is off or absent."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from feedproc import logs, tracing

TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")  # version-trace-span-flags


@pytest.fixture
def provider() -> Iterator[TracerProvider]:
    """An SDK tracer provider of the test's own (not the global one), exporting to memory."""
    exporter = InMemorySpanExporter()
    sdk = TracerProvider()
    sdk.add_span_processor(SimpleSpanProcessor(exporter))
    sdk.exporter = exporter  # type: ignore[attr-defined]
    tracing.enable(sdk)
    yield sdk
    tracing.reset()
    sdk.shutdown()


def spans(provider: TracerProvider) -> list[Any]:  # ReadableSpans, whose attributes the tests index
    return list(provider.exporter.get_finished_spans())  # type: ignore[attr-defined]


def test_a_delivery_span_carries_item_partition_queue_gate_attempt_and_outcome(provider: TracerProvider) -> None:
    with tracing.delivery(42, "upload-7", "ocr", 1, 3) as span:
        span.outcome("done")
    [done] = spans(provider)
    assert done.name == "feedproc.deliver" and done.kind == SpanKind.CONSUMER
    assert dict(done.attributes) == {
        "feedproc.item.id": 42,
        "feedproc.partition": "upload-7",
        "feedproc.queue": "ocr",
        "feedproc.gate": 1,
        "feedproc.attempt": 3,
        "feedproc.outcome": "done",
    }
    assert done.status.status_code == StatusCode.UNSET
    assert done.end_time is not None


@pytest.mark.parametrize("kind", ["retry", "fail", "lost"])
def test_retries_failures_and_lost_leases_are_errors_without_credentials(provider: TracerProvider, kind: str) -> None:
    logs.add_secret("tok-secret-123")  # forgotten after the test (tests/conftest.py)
    with tracing.delivery(1, "p", "default", 0, 1) as span:
        span.outcome(kind, "HTTP 503 from http://user:pw@ocr/ with tok-secret-123")
    [failed] = spans(provider)
    assert failed.attributes["feedproc.outcome"] == kind
    assert failed.status.status_code == StatusCode.ERROR
    assert failed.status.description == "HTTP 503 from http://***@ocr/ with ***"


def test_an_exception_inside_a_delivery_is_recorded_redacted(provider: TracerProvider) -> None:
    with pytest.raises(RuntimeError), tracing.delivery(1, "p", "default", 0, 1):
        raise RuntimeError("cannot reach http://user:pw@ocr/")
    [failed] = spans(provider)
    assert failed.attributes["feedproc.outcome"] == "error" and failed.status.status_code == StatusCode.ERROR
    [event] = failed.events
    assert event.name == "exception"
    assert event.attributes["exception.message"] == "cannot reach http://***@ocr/"
    assert "pw@" not in event.attributes["exception.stacktrace"]


def test_the_delivery_span_is_current_and_inject_gives_its_traceparent(provider: TracerProvider) -> None:
    headers: dict[str, str] = {"content-type": "application/json"}
    with tracing.delivery(5, "p", "default", 0, 1) as span:
        current = trace.get_current_span().get_span_context()
        tracing.inject(headers)
        span.outcome("done")
    [delivered] = spans(provider)
    assert current.span_id == delivered.context.span_id
    match = TRACEPARENT.match(headers["traceparent"])
    assert match, headers
    assert match.group(1) == format(delivered.context.trace_id, "032x")
    assert match.group(2) == format(delivered.context.span_id, "016x")
    assert int(match.group(3), 16) & 1  # sampled
    assert trace.get_current_span().get_span_context().is_valid is False  # detached after the block


def test_inject_outside_a_span_adds_nothing(provider: TracerProvider) -> None:
    headers: dict[str, str] = {}
    tracing.inject(headers)
    assert headers == {}


def test_a_group_commit_span_counts_its_answers(provider: TracerProvider) -> None:
    with tracing.group_commit(128):
        pass
    [commit] = spans(provider)
    assert commit.name == "feedproc.group_commit" and commit.attributes["feedproc.answers"] == 128


def test_disabled_tracing_returns_one_shared_no_op_and_injects_nothing(provider: TracerProvider) -> None:
    tracing.disable()
    first, second = tracing.delivery(1, "p", "q", 0, 1), tracing.delivery(2, "p", "q", 0, 1)
    assert first is second is tracing.group_commit(3)
    with first as span:
        span.outcome("retry", "error")
    headers: dict[str, str] = {}
    with provider.get_tracer("someone-else").start_as_current_span("theirs"):
        tracing.inject(headers)
    assert headers == {}
    assert [s.name for s in spans(provider)] == ["theirs"]


def test_by_default_tracing_is_on_only_with_a_configured_tracer_provider(
    monkeypatch: pytest.MonkeyPatch, provider: TracerProvider
) -> None:
    monkeypatch.delenv("FEEDPROC_OTEL", raising=False)
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: trace.ProxyTracerProvider())
    tracing.reset()
    assert not tracing.enabled()
    assert tracing.delivery(1, "p", "q", 0, 1) is tracing._NOOP
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    tracing.reset()
    assert tracing.enabled()
    with tracing.delivery(1, "p", "q", 0, 1):
        pass
    assert len(spans(provider)) == 1


@pytest.mark.parametrize(("setting", "on"), [("0", False), ("off", False), ("1", True)])
def test_feedproc_otel_overrides_the_default(
    monkeypatch: pytest.MonkeyPatch, provider: TracerProvider, setting: str, on: bool
) -> None:
    monkeypatch.setenv("FEEDPROC_OTEL", setting)
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: trace.ProxyTracerProvider())
    tracing.reset()
    assert tracing.enabled() is on


def test_without_opentelemetry_everything_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")]:
        monkeypatch.setitem(sys.modules, name, None)  # `import opentelemetry...` raises ImportError
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    monkeypatch.setattr(tracing, "_api", None)
    monkeypatch.setenv("FEEDPROC_OTEL", "1")
    tracing.reset()
    try:
        assert tracing.delivery(1, "p", "q", 0, 1) is tracing._NOOP
        headers: dict[str, str] = {}
        tracing.inject(headers)
        assert headers == {} and not tracing.enabled()
        with pytest.raises(ImportError, match=r"feedproc\[otel\]"):
            tracing.enable()
    finally:
        tracing.reset()


def test_a_handler_request_carries_the_traceparent_of_its_delivery_span(
    provider: TracerProvider, db_url: str, handler: Any
) -> None:
    """End to end: a real watcher, the HTTP processor and a handler on loopback."""
    from feedproc import Feed, HTTPProcessor

    from ..support import wait_status, watching

    handler.behavior = lambda body: (200, {"done": True}) if body["gate"] else (200, {"gate": 1})
    with Feed(db_url) as feed:
        feed.add_partition("traced", [(0, b"{}")])
        with watching(db_url, HTTPProcessor(handler.url)):
            wait_status(feed, "traced", "complete")
    finished = spans(provider)
    deliveries = sorted((s for s in finished if s.name == "feedproc.deliver"), key=lambda s: s.start_time)
    assert [s.attributes["feedproc.outcome"] for s in deliveries] == ["move", "done"]
    for delivery, request in zip(deliveries, handler.deliveries, strict=True):
        parent = TRACEPARENT.match(request.headers["traceparent"])
        assert parent, request.headers["traceparent"]
        trace_id, span_id, _ = parent.groups()
        assert int(trace_id, 16) == delivery.context.trace_id and int(span_id, 16) == delivery.context.span_id
    assert any(s.name == "feedproc.group_commit" for s in finished)


def test_a_batch_is_one_span_whose_traceparent_its_request_carries(
    provider: TracerProvider, db_url: str, handler: Any
) -> None:
    from feedproc import Feed, HTTPProcessor

    from ..support import wait_status, watching

    handler.behavior = lambda body: (200, {"answers": [{"done": True} for _ in body["items"]]})
    with Feed(db_url) as feed:
        feed.add_partition("batched", [(0, b"{}")] * 5)
        ids = [item.id for item in feed.items("batched")]
        with watching(db_url, HTTPProcessor(handler.url), batch=5, batch_wait=0.3, concurrency=1):
            wait_status(feed, "batched", "complete")
    [batch] = [s for s in spans(provider) if s.name == "feedproc.deliver_batch"]
    assert sorted(batch.attributes["feedproc.item.ids"]) == ids and batch.attributes["feedproc.batch.size"] == 5
    assert batch.attributes["feedproc.partition"] == "batched" and batch.attributes["feedproc.outcome"] == "done"
    [request] = handler.deliveries
    parent = TRACEPARENT.match(request.headers["traceparent"])
    assert parent, request.headers["traceparent"]
    trace_id, span_id, _ = parent.groups()
    assert int(trace_id, 16) == batch.context.trace_id and int(span_id, 16) == batch.context.span_id
