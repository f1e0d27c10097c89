"""Logging (issue 14): JSON lines for log shippers, identical warnings rate-limited, secrets never
written (feedproc/logs.py), and the `--log-format` option of `watch` and `serve`."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from feedproc import logs
from feedproc.logs import RateLimit

from ..support import run_cli, wait_until

SECRET = "s3cr3t-t0ken-value"
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    """`logs.configure()` writing to a buffer; everything it installed is removed afterwards."""
    root = logging.getLogger()
    level = root.level
    out = io.StringIO()  # (secrets an earlier test registered are forgotten by tests/conftest.py)
    yield out
    logs.unconfigure()
    root.setLevel(level)


def lines(out: io.StringIO) -> list[str]:
    return [line for line in out.getvalue().splitlines() if line]


def records(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines(out)]


class Odd:
    def __str__(self) -> str:
        return f"odd {SECRET}"


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no")


def test_json_lines_carry_time_level_logger_message_and_the_fields_given(stream: io.StringIO) -> None:
    logs.configure("DEBUG", "json", stream)
    log = logging.getLogger("feedproc.watcher")
    log.warning(
        "retrying item %d of %s",
        7,
        "p",
        extra={
            "event": "item_retried",
            "key": "p",
            "gate": 1,
            "item": 7,
            "attempt": 2,
            "error": "HTTP 503",
            "watcher": "w-1",
            "handler": "http://ocr:8080/",
        },
    )
    log.info("leased", extra={"event": "partitions_leased", "partitions": ["a", "b"], "count": 2})
    log.debug("plain")
    first, second, third = records(stream)
    assert TIME.match(first.pop("time"))
    assert first == {
        "level": "WARNING",
        "logger": "feedproc.watcher",
        "message": "retrying item 7 of p",
        "event": "item_retried",
        "key": "p",
        "gate": 1,
        "item": 7,
        "attempt": 2,
        "error": "HTTP 503",
        "watcher": "w-1",
        "handler": "http://ocr:8080/",
    }
    assert second["partitions"] == ["a", "b"] and second["count"] == 2 and second["level"] == "INFO"
    assert set(third) == {"time", "level", "logger", "message"}  # no field that was not given


def test_json_never_raises_on_odd_values_and_carries_tracebacks(stream: io.StringIO) -> None:
    logs.configure("INFO", "json", stream)
    # Not propagated to pytest's own capturing handler, which would raise on the malformed ones.
    log = logging.getLogger("feedproc.test.odd")
    log.propagate = False
    log.handlers = logging.getLogger().handlers[-1:]  # the one configure() added
    log.warning("odd", extra={"key": Odd(), "gate": float("nan"), "item": Unprintable(), "partitions": {1: {2}}})
    log.warning("too few %s %s", "arguments")
    log.warning("wrong %d", "type")
    try:
        raise ValueError("broken")
    except ValueError:
        log.exception("failed", extra={"event": "internal_error"})
    odd, few, wrong, failed = records(stream)  # every line parses
    assert odd["gate"] == "nan" and odd["item"] == "<unprintable Unprintable>" and odd["partitions"] == {"1": [2]}
    assert "too few" in few["message"] and "arguments" in few["message"]
    assert "wrong" in wrong["message"]
    assert failed["level"] == "ERROR" and failed["event"] == "internal_error"
    assert failed["exception"].startswith("Traceback") and "ValueError: broken" in failed["exception"]


def test_text_is_the_default_and_keeps_its_format(stream: io.StringIO) -> None:
    logs.configure(stream=stream)
    logging.getLogger("feedproc.test").warning("hello %s", "there", extra={"event": "greeting", "key": "p"})
    logging.getLogger("feedproc.test").debug("not at INFO")
    [line] = lines(stream)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING feedproc\.test: hello there", line), line


def test_configure_is_idempotent_and_quiets_chatty_libraries(stream: io.StringIO) -> None:
    logs.configure("INFO", "text", stream)
    logs.configure("DEBUG", "json", stream)
    ours = [h for h in logging.getLogger().handlers if isinstance(h.formatter, logs.TextFormatter | logs.JsonFormatter)]
    assert len(ours) == 1 and isinstance(ours[0].formatter, logs.JsonFormatter)
    assert logging.getLogger().level == logging.DEBUG
    assert all(logging.getLogger(name).level == logging.WARNING for name in ("httpx", "httpcore", "alembic"))
    logging.getLogger("feedproc.test").info("once")
    assert len(lines(stream)) == 1
    with pytest.raises(ValueError):
        logs.configure("INFO", "xml", stream)


# ---------------------------------------------------------------- a text line is one record


def test_a_text_message_stays_on_its_line_with_control_characters_escaped(stream: io.StringIO) -> None:
    logs.configure("INFO", "text", stream)
    forged = "2025-01-01 00:00:00,000 ERROR feedproc.watcher: forged"
    logging.getLogger("feedproc.test").warning("handler said %s", f"no\n{forged}\r\x1b[31mred\x00\u2028end")
    [line] = lines(stream)
    assert line.endswith(f"handler said no\\n{forged}\\r\\x1b[31mred\\x00\\u2028end")


def test_a_traceback_below_a_text_record_cannot_pass_for_a_record(stream: io.StringIO) -> None:
    logs.configure("INFO", "text", stream)
    try:
        raise ValueError("bad\n2025-01-01 00:00:00,000 ERROR feedproc.watcher: forged\x1b[2J")
    except ValueError:
        logging.getLogger("feedproc.test").exception("delivery failed")
    first, *below = lines(stream)
    assert first.endswith("feedproc.test: delivery failed")
    assert (
        below[0] == "  Traceback (most recent call last):"
        and below[-1] == "  2025-01-01 00:00:00,000 ERROR feedproc.watcher: forged\\x1b[2J"
    )
    assert all(line.startswith("  ") for line in below)


# ---------------------------------------------------------------- secrets


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_registered_secret_never_appears(stream: io.StringIO, fmt: str) -> None:
    logs.configure("INFO", fmt, stream)
    logs.add_secret(f"Bearer {SECRET}")
    log = logging.getLogger("feedproc.test")
    log.warning("message %s", SECRET)
    log.warning("fields", extra={"error": f"rejected {SECRET}", "key": Odd(), "partitions": [{"t": SECRET}]})
    try:
        raise RuntimeError(f"handler said {SECRET}")
    except RuntimeError:
        log.exception("traceback")
    text = stream.getvalue()
    assert SECRET not in text
    if fmt == "json":  # text lines do not show the fields
        message, fields, traceback = records(stream)
        assert message["message"] == "message ***" and fields["error"] == "rejected ***"
        assert fields["key"] == "odd ***" and fields["partitions"] == [{"t": "***"}]
        assert traceback["exception"].endswith("RuntimeError: handler said ***")
    else:
        assert text.count("***") == 2


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_url_credentials_are_never_shown(stream: io.StringIO, fmt: str) -> None:
    logs.configure("INFO", fmt, stream)
    logging.getLogger("feedproc.test").warning(
        "cannot reach http://user:pa55word@ocr:8080/x", extra={"handler": "https://tok@h/"}
    )
    text = stream.getvalue()
    assert "pa55word" not in text and "user" not in text and "tok@" not in text
    assert "http://***@ocr:8080/x" in text
    if fmt == "json":
        assert records(stream)[0]["handler"] == "https://***@h/"


def test_configure_registers_the_api_tokens_from_the_environment(
    stream: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FEEDPROC_API_TOKEN", "api-token-1234")
    monkeypatch.setenv("FEEDPROC_WORKER_TOKEN", "worker-token-5678")
    logs.configure("INFO", "text", stream)
    logging.getLogger("feedproc.test").warning("api-token-1234 and worker-token-5678")
    assert lines(stream)[0].endswith("feedproc.test: *** and ***")


def test_configure_registers_each_token_of_the_scoped_token_lists(
    stream: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FEEDPROC_READ_TOKENS", "read-token-one-1234,read-token-two-5678")
    monkeypatch.setenv("FEEDPROC_WORKER_TOKENS", "gpu+ocr:worker-token-9012, any-worker-3456")
    monkeypatch.setenv("FEEDPROC_ADMIN_TOKENS", "admin-token-7890123")
    logs.configure("INFO", "text", stream)
    logging.getLogger("feedproc.test").warning(
        "read-token-one-1234 read-token-two-5678 worker-token-9012 any-worker-3456 admin-token-7890123"
    )
    assert lines(stream)[0].endswith("feedproc.test: *** *** *** *** ***")


def test_url_secrets_are_registered_raw_and_decoded(stream: io.StringIO) -> None:
    logs.configure("INFO", "text", stream)
    logs.add_url_secrets("http://bob:p%40ss-word@host/")
    logging.getLogger("feedproc.test").warning("p@ss-word p%40ss-word")
    assert "ss-word" not in stream.getvalue()


def test_redact_url() -> None:
    assert logs.redact_url("http://user:pass@host/x") == "http://***@host/x"
    assert logs.redact_url("https://token@host:8443/a?b=c") == "https://***@host:8443/a?b=c"
    assert logs.redact_url("http://u:p@ss@host/") == "http://***@host/"  # the last @ ends the user information
    assert logs.redact_url("http://host:8080/x?mail=a@b") == "http://host:8080/x?mail=a@b"


def test_short_values_are_not_secrets() -> None:
    """A header like `X-Debug: 1` must not turn every digit 1 into ***."""
    logs.add_secret("1")
    logs.add_secret("")
    logs.add_secret(None)
    assert logs.redact("version 1.1") == "version 1.1"


# ---------------------------------------------------------------- rate limiting


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


Limited = tuple[logging.Logger, io.StringIO, Clock, RateLimit]  # the logger, its output, its clock, its limiter


@pytest.fixture
def limited() -> Iterator[Limited]:
    """A logger of its own, its handler rate-limited on a fake clock (JSON lines)."""
    out, clock = io.StringIO(), Clock()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.JsonFormatter())
    limiter = RateLimit(burst=5, window=10.0, clock=clock, timer=False).attach(handler)
    log = logging.getLogger(f"feedproc.test.limited.{id(out)}")
    log.propagate, log.level = False, logging.DEBUG
    log.addHandler(handler)
    yield log, out, clock, limiter
    log.removeHandler(handler)


def retry(log: logging.Logger, item: int, error: str = "HTTP 503") -> None:
    log.warning("retrying item %d: %s", item, error, extra={"event": "item_retried", "item": item, "error": error})


def test_identical_warnings_beyond_a_burst_are_counted_and_summarised(limited: Limited) -> None:
    log, out, clock, _ = limited
    for item in range(1000):
        retry(log, item)
    assert [r["item"] for r in records(out)] == [0, 1, 2, 3, 4]
    clock.now += 10.0
    retry(log, 1000)
    *_, summary, after = records(out)
    assert summary["event"] == "suppressed" and summary["count"] == 995 and summary["level"] == "WARNING"
    assert summary["message"] == "suppressed 995 similar messages: retrying item 5: HTTP 503"
    assert summary["error"] == "HTTP 503"
    assert after["item"] == 1000  # a new window: the burst passes again


def test_rate_limit_keys_on_event_and_error_or_message(limited: Limited) -> None:
    log, out, _, _ = limited
    for item in range(10):
        retry(log, item, "HTTP 503")
        retry(log, item, "connection refused")
        log.warning("database unavailable")
        log.error("database unavailable")  # another level: another key
    assert len(records(out)) == 4 * 5


def test_info_and_debug_are_never_limited(limited: Limited) -> None:
    log, out, _, _ = limited
    for _ in range(50):
        log.info("gate advanced", extra={"event": "gate_advanced"})
        log.debug("delivered")
    assert len(records(out)) == 100


def test_a_summary_is_written_when_any_record_follows_the_window(limited: Limited) -> None:
    log, out, clock, _ = limited
    for item in range(8):
        retry(log, item)
    clock.now += 11.0
    log.info("partition completed", extra={"event": "partition_completed"})
    *_, summary, info = records(out)
    assert summary["count"] == 3 and info["event"] == "partition_completed"


def test_rate_limit_memory_is_bounded(limited: Limited) -> None:
    log, out, _, limiter = limited
    limiter.max_keys = 16
    for n in range(1000):
        for _ in range(7):
            log.warning("message %d", n)
    assert len(limiter._windows) <= 16
    # A window dropped with suppressed records still gets its summary.
    summaries = [r for r in records(out) if r.get("event") == "suppressed"]
    assert len(summaries) >= 1000 - 16 and all(r["count"] == 2 for r in summaries)


def test_a_timer_writes_the_summary_when_nothing_else_is_logged(stream: io.StringIO) -> None:
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter())
    RateLimit(burst=2, window=0.2).attach(handler)
    log = logging.getLogger("feedproc.test.timer")
    log.propagate = False
    log.addHandler(handler)
    try:
        for item in range(6):
            retry(log, item)
        wait_until(lambda: '"suppressed"' in stream.getvalue(), timeout=10, what="the summary")
        assert records(stream)[-1]["count"] == 4
    finally:
        log.removeHandler(handler)


def test_configure_rate_limits_warnings(stream: io.StringIO) -> None:
    logs.configure("INFO", "json", stream)
    for item in range(100):
        retry(logging.getLogger("feedproc.test"), item)
    logs.unconfigure()  # flushes the pending summary
    *shown, summary = records(stream)
    assert len(shown) == 5 and summary["count"] == 95


# ---------------------------------------------------------------- the command line


@pytest.mark.parametrize("command", [["watch", "--handler", "http://127.0.0.1:9/"], ["serve"]])
def test_a_bad_log_format_exits_2_with_one_line(tmp_path: Path, command: list[str]) -> None:
    result = run_cli(f"sqlite:///{tmp_path / 'x.db'}", *command, "--log-format", "xml")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["feedproc: error: --log-format 'xml': use text or json"]


def test_uncaught_exceptions_go_through_the_handler(stream: io.StringIO) -> None:
    logs.configure("INFO", "json", stream)
    logs.add_secret(SECRET)
    try:
        raise KeyError(SECRET)
    except KeyError:
        sys.excepthook(*sys.exc_info())
    [crash] = records(stream)
    assert crash["level"] == "CRITICAL" and crash["event"] == "crash" and SECRET not in stream.getvalue()
