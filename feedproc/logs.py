"""Logging of `feedproc watch` and `feedproc serve`: plain text (the default) or one JSON object per
line for log shippers, identical warnings rate-limited, and secrets never written.

`configure()` installs one handler on the root logger. Its formatter writes either

    2025-01-01 12:00:00,123 WARNING feedproc.watcher: retrying item 7 ...

or (`fmt="json"`)

    {"time": "2025-01-01T12:00:00.123Z", "level": "WARNING", "logger": "feedproc.watcher",
     "message": "retrying item 7 ...", "event": "item_retried", "key": "p", "gate": 0, "item": 7, ...}

where `event`, `key`, `gate`, `item`, `attempt`, `error`, `watcher`, `handler`, `partitions` and
`count` appear when the call passed them (`log.warning(..., extra={"event": ..., ...})`), and
`exception` holds the traceback of `log.exception(...)`. Formatting never raises: a value JSON
cannot hold is written as its `str()`, a message whose arguments do not fit its format as both.

Every line, text or JSON (message, fields and traceback alike), goes through `redact()`: the
strings registered with `add_secret()` (header values, API tokens, URL passwords) become `***`, and
so does the user information of any URL (`http://user:pass@host/` -> `http://***@host/`).

A handler outage makes every delivery fail the same way. `RateLimit` lets `burst` identical
warnings through per `window` seconds and counts the rest; once the window is over it writes one
line `suppressed N similar messages: <the first of them>` (`event` = `suppressed`, `count` = N).
Records are identical when they share logger, level, `event` and `error` (or, without an `event`,
their message). INFO and DEBUG records are never limited.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import re
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TextIO
from urllib.parse import unquote

from .core.redaction import redact_text, url_secrets
from .core.redaction import redact_url as redact_url  # shown URLs: one implementation, in core/redaction.py

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FORMATS = ("text", "json")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# Fields a log call may pass as `extra`; the JSON formatter writes those present on the record.
FIELDS = ("event", "key", "gate", "item", "attempt", "error", "watcher", "handler", "partitions", "count")
QUIET = ("httpx", "httpcore", "alembic")  # chatty libraries: WARNING and above only
SECRET_ENV = (
    "FEEDPROC_API_TOKEN",
    "FEEDPROC_WORKER_TOKEN",
    "FEEDPROC_READ_TOKENS",
    "FEEDPROC_OPERATE_TOKENS",
    "FEEDPROC_ADMIN_TOKENS",
    "FEEDPROC_WORKER_TOKENS",
)
# A secret shorter than this is not registered: replacing every "1" or "on" would garble all lines,
# and no credential is that short.
MIN_SECRET = 4
SUPPRESSED = "suppressed"

# ---------------------------------------------------------------- secrets

_secrets: set[str] = set()
_secret_pattern: re.Pattern[str] | None = None
_secrets_lock = threading.Lock()


def add_secret(value: str | None) -> None:
    """Never write `value` (nor its percent-decoded form) in a log line: it becomes `***`.

    For `Scheme credentials` (an `Authorization` value) the credentials alone are registered too.
    Empty and very short values (under 4 characters) are ignored."""
    global _secret_pattern
    if not value:
        return
    text = str(value).strip()
    candidates = {text, unquote(text)}
    _, _, credentials = text.partition(" ")
    if credentials.strip():
        candidates.add(credentials.strip())
    fresh = {c for c in candidates if len(c) >= MIN_SECRET} - _secrets
    if not fresh:
        return
    with _secrets_lock:
        _secrets.update(fresh)
        # Longest first, so a secret containing another one is replaced whole.
        ordered = sorted(_secrets, key=len, reverse=True)
        _secret_pattern = re.compile("|".join(re.escape(s) for s in ordered))


def add_url_secrets(url: str | None) -> None:
    """Register the password (and user information) of `url`, raw and percent-decoded."""
    for secret in url_secrets(url or ""):
        add_secret(secret)


def clear_secrets() -> None:
    """Forget every registered secret (tests)."""
    global _secret_pattern
    with _secrets_lock:
        _secrets.clear()
        _secret_pattern = None


def redact(text: str) -> str:
    """`text` with every registered secret and every URL's user information replaced by `***`."""
    pattern = _secret_pattern
    if pattern is not None:
        text = pattern.sub("***", text)
    return redact_text(text)


# ---------------------------------------------------------------- formatters


# C0 controls but tab, DEL, C1 controls and the Unicode line separators: in a text log each of
# them can end a line early (a handler's error with "\n2025-01-01 ... ERROR" forged a whole record),
# or drive a terminal (ANSI escapes).
_CONTROLS = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r"}


def escape_controls(text: str) -> str:
    """`text` on one line: newlines as `\\n`, other control characters as `\\xNN` / `\\uNNNN`."""
    return _CONTROLS.sub(lambda m: _NAMED.get(m[0]) or m[0].encode("unicode_escape").decode("ascii"), text)


def _continuation(block: str) -> str:
    """A traceback or stack below a text record: each line indented, so none of them (an exception
    message with a forged newline included) can pass for a record of its own; controls escaped."""
    return "\n".join("  " + escape_controls(line) for line in block.splitlines())


def _safe_str(value: Any) -> str:
    try:
        return str(value)
    except Exception:
        return f"<unprintable {type(value).__name__}>"


def _message(record: logging.LogRecord) -> str:
    """The record's message; when its arguments do not fit the format, both, instead of raising."""
    try:
        return record.getMessage()
    except Exception:
        return f"{_safe_str(record.msg)} {_safe_str(record.args)}"


def _jsonable(value: Any, depth: int = 0) -> Any:
    """`value` as something `json.dumps` writes without failing, its strings redacted."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if depth < 3 and isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v, depth + 1) for v in value]
    if depth < 3 and isinstance(value, dict):
        return {redact(_safe_str(k)): _jsonable(v, depth + 1) for k, v in value.items()}
    return redact(_safe_str(value))


def _utc(created: float, msecs: float) -> str:
    return datetime.fromtimestamp(created, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{int(msecs):03d}Z"


class TextFormatter(logging.Formatter):
    """`TEXT_FORMAT`, redacted; a record that cannot be formatted still gives a line. The message is
    one line (control characters escaped); a traceback follows on indented lines."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        try:
            record.message = escape_controls(_message(record))
            record.asctime = self.formatTime(record)
            line = self.formatMessage(record)
            extra = self._traceback(record)
            if extra:
                line = f"{line}\n{_continuation(extra)}"
        except Exception as error:
            line = f"{record.levelname} {record.name}: unformattable log record ({type(error).__name__})"
        return redact(line)

    def _traceback(self, record: logging.LogRecord) -> str:
        parts = []
        try:
            if record.exc_info and not record.exc_text:
                record.exc_text = self.formatException(record.exc_info)
        except Exception:
            record.exc_text = "<traceback unavailable>"
        if record.exc_text:
            parts.append(record.exc_text)
        if record.stack_info:
            parts.append(self.formatStack(record.stack_info))
        return "\n".join(parts)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the `FIELDS` present, exception."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {}
        try:
            line["time"] = _utc(record.created, record.msecs)
            line["level"] = record.levelname
            line["logger"] = record.name
            line["message"] = redact(_message(record))
            fields = record.__dict__
            for name in FIELDS:
                if name in fields:
                    line[name] = _jsonable(fields[name])
            if record.exc_info or record.exc_text:
                try:
                    text = record.exc_text or self.formatException(record.exc_info)  # type: ignore[arg-type]
                except Exception:
                    text = "<traceback unavailable>"
                line["exception"] = redact(text)
            if record.stack_info:
                line["stack"] = redact(self.formatStack(record.stack_info))
            return json.dumps(line, ensure_ascii=False)
        except Exception as error:  # never lose the line: write what is certain to serialise
            return json.dumps(
                {
                    "time": _utc(time.time(), 0),
                    "level": _safe_str(getattr(record, "levelname", "ERROR")),
                    "logger": _safe_str(getattr(record, "name", "?")),
                    "message": f"unformattable log record ({type(error).__name__})",
                }
            )


# ---------------------------------------------------------------- rate limiting


class _Window:
    __slots__ = ("count", "first", "start", "suppressed")

    def __init__(self, start: float) -> None:
        self.start = start
        self.count = 0  # records of this key in the window
        self.suppressed = 0
        self.first: logging.LogRecord | None = None  # the first suppressed record


class RateLimit(logging.Filter):
    """A handler filter: `burst` identical WARNING+ records per `window` seconds, then one summary.

    O(1) per record; memory bounded by `max_keys` windows (least recently seen dropped first, its
    summary written if it had suppressed records). A summary is written when a record of any kind
    arrives after its window ended, or by a timer thread (`timer=True`) when none does.
    """

    def __init__(
        self,
        burst: int = 5,
        window: float = 10.0,
        *,
        level: int = logging.WARNING,
        max_keys: int = 1024,
        clock: Callable[[], float] = time.monotonic,
        timer: bool = True,
    ) -> None:
        super().__init__()
        self.burst = burst
        self.window = window
        self.level = level
        self.max_keys = max_keys
        self.clock = clock
        self.timer = timer
        self.handler: logging.Handler | None = None
        self._lock = threading.Lock()
        self._windows: OrderedDict[tuple[Any, ...], _Window] = OrderedDict()
        self._pending: OrderedDict[tuple[Any, ...], _Window] = OrderedDict()  # windows with suppressed records
        self._armed: threading.Timer | None = None

    def attach(self, handler: logging.Handler) -> RateLimit:
        """Filter `handler`'s records and write the summaries to it."""
        self.handler = handler
        handler.addFilter(self)
        return self

    def filter(self, record: logging.LogRecord) -> bool:
        event = getattr(record, "event", None)
        if event == SUPPRESSED:
            return True
        if record.levelno < self.level and not self._pending:
            return True
        now = self.clock()
        due: list[logging.LogRecord] = []
        keep = True
        with self._lock:
            if self._pending:
                self._collect_due(now, due)
            if record.levelno >= self.level:
                keep = self._count(record, event, now, due)
        for summary in due:
            self._emit(summary)
        return keep

    def flush(self) -> None:
        """Write the summaries of every window with suppressed records now."""
        due: list[logging.LogRecord] = []
        with self._lock:
            while self._pending:
                _, window = self._pending.popitem(last=False)
                due.append(self._summary(window))
        for summary in due:
            self._emit(summary)

    def _count(self, record: logging.LogRecord, event: Any, now: float, due: list[logging.LogRecord]) -> bool:
        if event is not None:
            error = _safe_str(getattr(record, "error", ""))
            key: tuple[Any, ...] = (record.name, record.levelno, _safe_str(event), error)
        else:
            key = (record.name, record.levelno, None, _message(record))
        window = self._windows.get(key)
        if window is None:
            window = self._windows[key] = _Window(now)
            if len(self._windows) > self.max_keys:
                old_key, old = self._windows.popitem(last=False)
                if self._pending.pop(old_key, None) is not None:
                    due.append(self._summary(old))
        else:
            self._windows.move_to_end(key)
            if now - window.start >= self.window:
                if self._pending.pop(key, None) is not None:
                    due.append(self._summary(window))
                window.start, window.count = now, 0
        window.count += 1
        if window.count <= self.burst:
            return True
        if window.suppressed == 0:
            window.first = record
            self._pending[key] = window
            self._arm(now)
        window.suppressed += 1
        return False

    def _collect_due(self, now: float, due: list[logging.LogRecord]) -> None:
        while self._pending:
            key, window = next(iter(self._pending.items()))
            if now - window.start < self.window:
                return
            del self._pending[key]
            due.append(self._summary(window))

    def _summary(self, window: _Window) -> logging.LogRecord:
        """The `suppressed N similar messages` record of a window (resets its suppressed count)."""
        first = window.first
        assert first is not None
        count, window.suppressed, window.first = window.suppressed, 0, None
        summary = logging.LogRecord(
            first.name,
            first.levelno,
            first.pathname,
            first.lineno,
            "suppressed %d similar messages: %s",
            (count, _message(first)),
            None,
            first.funcName,
        )
        summary.event = SUPPRESSED
        summary.count = count
        for name in ("error", "watcher", "handler"):
            if name in first.__dict__:
                setattr(summary, name, first.__dict__[name])
        return summary

    def _emit(self, record: logging.LogRecord) -> None:
        if self.handler is not None:
            self.handler.handle(record)

    def _arm(self, now: float) -> None:
        """Start a timer for the oldest pending window, unless one runs (called with the lock held)."""
        if not self.timer or self._armed is not None or not self._pending:
            return
        window = next(iter(self._pending.values()))
        delay = max(0.0, window.start + self.window - now) + 0.01
        self._armed = threading.Timer(delay, self._tick)
        self._armed.daemon = True
        self._armed.name = "feedproc-log-summary"
        self._armed.start()

    def _tick(self) -> None:
        due: list[logging.LogRecord] = []
        with self._lock:
            self._armed = None
            now = self.clock()
            self._collect_due(now, due)
            self._arm(now)
        for summary in due:
            self._emit(summary)


# ---------------------------------------------------------------- set-up

_handler: logging.Handler | None = None
_limiter: RateLimit | None = None
_format = "text"


def configure(level: str = "INFO", fmt: str = "text", stream: TextIO | None = None) -> None:
    """Log to `stream` (standard error by default) at `level` in `fmt` (`text` or `json`).

    Idempotent: a second call replaces the handler of the first. Chatty libraries (httpx, httpcore,
    alembic) log WARNING and above only; Python warnings are logged; FEEDPROC_API_TOKEN and
    FEEDPROC_WORKER_TOKEN, when set, are registered as secrets."""
    global _handler, _limiter, _format
    fmt = fmt.lower()
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: use text or json")
    if level.upper() not in LEVELS:
        raise ValueError(f"log level {level!r}: use DEBUG, INFO, WARNING or ERROR")
    for name in SECRET_ENV:
        value = os.environ.get(name)
        add_secret(value)
        for entry in (value or "").split(","):  # a list of [QUEUES:]TOKEN: each token is a secret
            add_secret(entry.rsplit(":", 1)[-1].strip())
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    limiter = RateLimit().attach(handler)
    root = logging.getLogger()
    if _handler is not None:
        if _limiter is not None:
            _limiter.flush()
        root.removeHandler(_handler)
    else:
        atexit.register(_flush)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.captureWarnings(True)
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _log_uncaught
    _handler, _limiter, _format = handler, limiter, fmt


def unconfigure() -> None:
    """Remove what `configure()` installed (tests): its handler, the uncaught-exception hook."""
    global _handler, _limiter, _format
    if _limiter is not None:
        _limiter.flush()
    if _handler is not None:
        logging.getLogger().removeHandler(_handler)
    if sys.excepthook is _log_uncaught:
        sys.excepthook = sys.__excepthook__
    logging.captureWarnings(False)
    _handler, _limiter, _format = None, None, "text"


def is_json() -> bool:
    """Whether `configure()` chose JSON lines."""
    return _handler is not None and _format == "json"


def _log_uncaught(kind: type[BaseException], error: BaseException, tb: Any) -> None:
    """An exception nobody caught: through the handler (redacted; a JSON line in JSON mode)."""
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, error, tb)
        return
    logging.getLogger("feedproc").critical("uncaught exception", exc_info=(kind, error, tb), extra={"event": "crash"})


def _flush() -> None:
    if _limiter is not None:
        _limiter.flush()
