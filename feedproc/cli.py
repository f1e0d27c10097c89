"""The `feedproc` command line (also `python -m feedproc`).

Errors are one line on stderr; exit 2 for malformed input, 1 for a refused or failed operation.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import math
import os
import signal
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from typer.exceptions import Abort, TyperException

from . import logs
from ._version import __version__
from .core.errors import FeedprocError, InvalidInput, Refused
from .core.models import NewItem, check_key, item_from_row

DEFAULT_DB = "sqlite:///feedproc.db"
ITEMS_PAGE = 1000  # items read per query by `feedproc items`

app = typer.Typer(
    name="feedproc",
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    help="Partitioned fan-out/fan-in workflows on SQLite or PostgreSQL.",
)
_global: dict[str, str | None] = {"db": None}

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db", metavar="URL", help="Database URL (env FEEDPROC_DATABASE_URL; default sqlite:///feedproc.db)."
    ),
]
LogLevelOption = Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")]
LogFormatOption = Annotated[
    str,
    typer.Option(
        metavar="text|json",
        envvar="FEEDPROC_LOG_FORMAT",
        help="Log lines as text, or one JSON object per line (env FEEDPROC_LOG_FORMAT).",
    ),
]
ItemsOption = Annotated[
    str | None,
    typer.Option("--items", metavar="FILE|-", help='JSON Lines: one {"gate": int, "data": ...} per line.'),
]


def database_url(db: str | None) -> str:
    return db or _global["db"] or os.environ.get("FEEDPROC_DATABASE_URL") or DEFAULT_DB


def _feed(db: str | None) -> Any:
    from .feed import Feed

    return Feed(database_url(db))


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"feedproc {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(
    db: DbOption = None,
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    _global["db"] = db


# ---------------------------------------------------------------- input


def read_items(source: str | None) -> Iterator[NewItem]:
    """Items from a JSON Lines file (or `-` for standard input); errors name the line."""
    if source is None:
        return
    if source == "-":
        lines: Any = sys.stdin
    else:
        path = Path(source)
        if not path.is_file():
            raise InvalidInput(f"--items {source}: no such file")
        lines = path.open(encoding="utf-8")
    with lines if source != "-" else contextlib.nullcontext(lines):
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise InvalidInput(f"line {number}: invalid JSON: {error.msg} at column {error.colno}") from None
            yield item_from_row(row, where=f"line {number}: ")


def parse_time(value: str | None) -> datetime | None:
    """ISO 8601; a time without a zone is UTC."""
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise InvalidInput(f"--not-before {value!r} is not an ISO 8601 time") from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value: str, option: str) -> float:
    """`90`, `90s`, `15m`, `12h`, `7d`, `2w` -> seconds."""
    text = value.strip().lower()
    number, unit = (text[:-1], text[-1]) if text and text[-1] in _UNITS else (text, "s")
    try:
        seconds = float(number) * _UNITS[unit]
    except ValueError:
        raise InvalidInput(f"{option} {value!r}: expected a duration like 90s, 15m, 12h or 7d") from None
    if not 0 < seconds < math.inf:
        raise InvalidInput(f"{option} {value!r}: must be a positive, finite duration")
    return seconds


# ---------------------------------------------------------------- commands


@app.command()
def migrate(db: DbOption = None) -> None:
    """Create or upgrade the schema (idempotent)."""
    with _feed(db) as feed:
        feed.migrate()
    typer.echo("schema is up to date")


@app.command()
def add(
    key: str,
    items: ItemsOption = None,
    queue: Annotated[str, typer.Option(help="Queue of the partition.")] = "default",
    priority: Annotated[int, typer.Option(help="Higher is leased first.")] = 0,
    open_: Annotated[bool, typer.Option("--open", help="Leave unsealed: more items may be added.")] = False,
    manual_checkpoint: Annotated[
        bool, typer.Option(help="Hold each drained gate until `feedproc checkpoint`.")
    ] = False,
    not_before: Annotated[str | None, typer.Option(help="ISO 8601 time before which nothing is dispatched.")] = None,
    weight: Annotated[int, typer.Option(min=1, help="Share of the queue's concurrency limit per item in flight.")] = 1,
    item_timeout: Annotated[
        str | None, typer.Option(metavar="S", help="A processor call taking longer is a transient failure.")
    ] = None,
    window: Annotated[
        list[str] | None, typer.Option(metavar="HH:MM-HH:MM", help="Dispatch only in this window (repeatable).")
    ] = None,
    timezone: Annotated[str | None, typer.Option(metavar="ZONE", help="Time zone of --window (default UTC).")] = None,
    db: DbOption = None,
) -> None:
    """Create partition KEY with its items, in one transaction."""
    when = parse_time(not_before)
    timeout = parse_duration(item_timeout, "--item-timeout") if item_timeout is not None else None
    with _feed(db) as feed:
        count = feed.add_partition(
            key,
            read_items(items),
            queue=queue,
            priority=priority,
            sealed=not open_,
            manual_checkpoint=manual_checkpoint,
            not_before=when,
            weight=weight,
            item_timeout=timeout,
            windows=window or None,
            window_tz=timezone,
        )
    typer.echo(f"added partition {key} with {count} items")


@app.command("add-items")
def add_items(key: str, items: ItemsOption = None, db: DbOption = None) -> None:
    """Add items to an open partition."""
    if items is None:
        raise InvalidInput("add-items needs --items FILE (or - for standard input)")
    with _feed(db) as feed:
        count = feed.add_items(key, read_items(items))
    typer.echo(f"added {count} items to {key}")


@app.command()
def seal(key: str, db: DbOption = None) -> None:
    """Mark that no more items will be added to KEY."""
    with _feed(db) as feed:
        feed.seal(key)
    typer.echo(f"sealed {key}")


@app.command()
def retry(key: str, db: DbOption = None) -> None:
    """Put a failed partition and its failed items back to work."""
    with _feed(db) as feed:
        count = feed.retry(key)
    typer.echo(f"retrying {key}: {count} failed items are available again")


@app.command()
def cancel(key: str, db: DbOption = None) -> None:
    """Cancel KEY and its available items."""
    with _feed(db) as feed:
        feed.cancel(key)
    typer.echo(f"cancelled {key}")


@app.command()
def checkpoint(key: str, db: DbOption = None) -> None:
    """Advance a manual-checkpoint partition whose gate has drained."""
    with _feed(db) as feed:
        gate = feed.checkpoint(key)
    typer.echo(f"{key} moved to gate {gate}")


@app.command()
def cleanup(
    older_than: Annotated[str, typer.Option(help="Age of the last change, e.g. 7d, 12h, 30m.")],
    include_failed: Annotated[bool, typer.Option(help="Delete failed partitions too.")] = False,
    db: DbOption = None,
) -> None:
    """Delete finished partitions with their items and history, in bounded batches."""
    seconds = parse_duration(older_than, "--older-than")
    with _feed(db) as feed:
        deleted = feed.cleanup(seconds, include_failed=include_failed)
    typer.echo(f"deleted {deleted['partitions']} partitions, {deleted['items']} items, {deleted['events']} events")


@app.command()
def status(
    key: Annotated[str | None, typer.Argument(help="A partition; omit for a summary of all.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    history: Annotated[int, typer.Option("--history", help="Also show the last N history events.")] = 0,
    db: DbOption = None,
) -> None:
    """Show one partition, or a summary of all."""
    from .report import print_partition, print_summary

    with _feed(db) as feed:
        if key is None:
            summary = feed.summary(recent=0 if as_json else 20)
            if as_json:
                typer.echo(json.dumps(summary))
            else:
                print_summary(summary)
            return
        result = feed.status(key, history=history)
    if as_json:
        typer.echo(json.dumps(result))
    else:
        print_partition(result)


@app.command("items")
def list_items(
    key: Annotated[str, typer.Argument(help="The partition.")],
    gate: Annotated[int | None, typer.Option(min=0, help="Only items at this gate.")] = None,
    status_filter: Annotated[
        str | None, typer.Option("--status", metavar="STATUS", help="available, complete, failed or cancelled.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON Lines: one item per line, data included.")] = False,
    db: DbOption = None,
) -> None:
    """List a partition's items (a finished partition's results are read this way), a page at a time."""
    from .core.models import STATUSES
    from .report import item_json, print_items

    check_key(key)
    if status_filter is not None and status_filter not in STATUSES:
        raise InvalidInput(f"--status {status_filter!r}: use one of {', '.join(STATUSES)}")
    after, first = 0, True
    with _feed(db) as feed:
        while True:  # keyset pages: memory stays flat however many items the partition has
            rows = feed.items(key, gate=gate, status=status_filter, after_id=after, limit=ITEMS_PAGE)
            if as_json:
                for row in rows:
                    typer.echo(json.dumps(item_json(row), ensure_ascii=False))
            elif rows or first:
                print_items(rows, header=first)
            first = False
            if len(rows) < ITEMS_PAGE:
                return
            after = rows[-1]["id"]


@app.command("item")
def show_item(
    item_id: Annotated[int, typer.Argument(metavar="ID", help="The item's id.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    db: DbOption = None,
) -> None:
    """Show one item: its data and every delivery (attempt, gate, watcher, times, outcome, error)."""
    from .report import item_json, print_item

    if not 0 < item_id < 2**63:
        raise InvalidInput(f"item id {item_id} is out of range")
    with _feed(db) as feed:
        item = feed.item(item_id)
    if as_json:
        typer.echo(json.dumps(item_json(item), ensure_ascii=False))
    else:
        print_item(item)


queue_app = typer.Typer(no_args_is_help=True, help="Queue settings: global concurrency limit and time windows.")
app.add_typer(queue_app, name="queue")


@queue_app.command("set")
def queue_set(
    name: str,
    limit: Annotated[
        int | None, typer.Option(help="Sum of weights in flight across all watchers at most (< 1: no limit).")
    ] = None,
    window: Annotated[
        list[str] | None,
        typer.Option(metavar="HH:MM-HH:MM", help="Dispatch only in this window of the day (repeatable)."),
    ] = None,
    timezone: Annotated[
        str | None, typer.Option(metavar="ZONE", help="Time zone of the windows (default UTC).")
    ] = None,
    no_windows: Annotated[bool, typer.Option("--no-windows", help="Remove the queue's windows.")] = False,
    db: DbOption = None,
) -> None:
    """Store queue NAME's concurrency limit and/or windows (options not given keep their value)."""
    with _feed(db) as feed:
        settings = feed.set_queue(name, limit=limit, windows=window, window_tz=timezone, clear_windows=no_windows)
    limit_text = f"limit {settings.limit}" if settings.limited else "no limit"
    windows_text = f"windows {settings.windows} {settings.window_tz or 'UTC'}" if settings.windows else "no windows"
    typer.echo(f"queue {name}: {limit_text}, {windows_text}")


@queue_app.command("show")
def queue_show(
    name: Annotated[str | None, typer.Argument(help="One queue; omit for all.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    db: DbOption = None,
) -> None:
    """Show queues' limits, slots in use and windows (with when the next one opens)."""
    with _feed(db) as feed:
        rows = [q for q in feed.queues() if name is None or q["name"] == name]
        if name is not None and not rows:
            rows = [feed.queue(name)]
    if as_json:
        typer.echo(json.dumps(rows[0] if name is not None else rows))
        return
    for q in rows:
        limit_text = f"limit {q['limit']} ({q['slots_in_use']} in use)" if q["limit"] else "no limit"
        if q["windows"]:
            state = "open" if q["window_open"] else f"closed, opens {q['next_window_opens_at']}"
            windows_text = f"windows {q['windows']} {q['timezone']} ({state})"
        else:
            windows_text = "no windows"
        typer.echo(f"{q['name']}: {limit_text}, {windows_text}")


@app.command()
def wait(
    key: str,
    timeout: Annotated[float | None, typer.Option(min=0.0, help="Give up after S seconds (exit 124).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the final status as JSON.")] = False,
    db: DbOption = None,
) -> None:
    """Block until KEY is complete (exit 0), failed or cancelled (exit 1); 124 on timeout."""
    from .report import print_partition

    check_key(key)  # malformed: exit 2 before touching the database
    with _feed(db) as feed:
        try:
            result = feed.wait(key, timeout)
        except TimeoutError as error:
            print(f"feedproc: {error}", file=sys.stderr)
            result = getattr(error, "status", None)
            code = 124
        else:
            code = 0 if result["status"] == "complete" else 1
    if result is not None:
        if as_json:
            typer.echo(json.dumps(result))
        else:
            print_partition(result)
    raise typer.Exit(code)


@app.command()
def watch(
    queue: Annotated[str, typer.Option(help="Queue to serve.")] = "default",
    handler: Annotated[
        str | None,
        typer.Option(
            metavar="URL", envvar="FEEDPROC_HANDLER_URL", help="HTTP handler service (env FEEDPROC_HANDLER_URL)."
        ),
    ] = None,
    processor: Annotated[
        str | None, typer.Option(metavar="MODULE:ATTR", help="A Python Processor to use instead of HTTP.")
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Items processed at once.")] = 10,
    lease_seconds: Annotated[float, typer.Option(min=0.5, help="Lease length; renewed every third of it.")] = 30.0,
    poll_interval: Annotated[float, typer.Option(min=0.01, help="Seconds between polls when idle.")] = 1.0,
    max_attempts: Annotated[int, typer.Option(min=1, help="Deliveries per gate before an item fails.")] = 5,
    retry_delay: Annotated[float, typer.Option(min=0.0, help="First backoff delay; doubles each retry.")] = 1.0,
    max_retry_delay: Annotated[float, typer.Option(min=0.0, help="Longest backoff delay.")] = 600.0,
    max_partitions: Annotated[int | None, typer.Option(min=1, help="Partitions leased at most.")] = None,
    shutdown_grace: Annotated[float, typer.Option(min=0.0, help="Seconds in-flight items get on stop.")] = 30.0,
    item_timeout: Annotated[
        str | None,
        typer.Option(metavar="S", help="A processor call taking longer is abandoned as a transient failure."),
    ] = None,
    timeout: Annotated[
        float,
        typer.Option(min=0.1, help="Seconds one HTTP request may take, from connecting to the answer's last byte."),
    ] = 30.0,
    max_answer_bytes: Annotated[
        int,
        typer.Option(min=1, metavar="N", help="Largest handler answer, in bytes once decompressed (default 10 MiB)."),
    ] = 10 * 1024 * 1024,
    header: Annotated[
        list[str] | None, typer.Option(metavar="'NAME: VALUE'", help="Extra HTTP header for the handler (repeatable).")
    ] = None,
    retention: Annotated[
        str | None, typer.Option(help="Also delete partitions finished longer ago than this (e.g. 7d).")
    ] = None,
    log_level: LogLevelOption = "INFO",
    log_format: LogFormatOption = "text",
    health_port: Annotated[
        int | None,
        typer.Option(min=1, max=65535, metavar="N", help="Serve GET /healthz, /livez and /readyz on this port."),
    ] = None,
    metrics_port: Annotated[
        int | None, typer.Option(min=1, max=65535, metavar="N", help="Serve Prometheus GET /metrics on this port.")
    ] = None,
    monitor_host: Annotated[
        str,
        typer.Option(
            metavar="ADDR", help="Address of the --health-port/--metrics-port server (0.0.0.0 for Kubernetes probes)."
        ),
    ] = "127.0.0.1",
    db: DbOption = None,
) -> None:
    """Run a watcher until SIGINT/SIGTERM; then release its leases and exit 0."""
    from .processors import HTTPProcessor, load_processor
    from .redact import redact_url
    from .watcher import Watcher, WatcherConfig

    if (handler is None) == (processor is None):
        raise InvalidInput("watch needs exactly one of --handler URL or --processor module:attr")
    headers = parse_headers(header or [])
    _check_log_options(log_level, log_format)
    try:
        config = WatcherConfig(
            queue=queue,
            concurrency=concurrency,
            capacity=max_partitions,
            lease_seconds=lease_seconds,
            poll_interval=poll_interval,
            max_attempts=max_attempts,
            retry_delay=retry_delay,
            max_retry_delay=max_retry_delay,
            shutdown_grace=shutdown_grace,
            retention=parse_duration(retention, "--retention") if retention else None,
            item_timeout=parse_duration(item_timeout, "--item-timeout") if item_timeout else None,
        )
    except ValueError as error:
        raise InvalidInput(str(error)) from None
    if processor is not None:
        sys.path.insert(0, os.getcwd())
        target = load_processor(processor)
    else:
        assert handler is not None
        if not handler.startswith(("http://", "https://")):
            raise InvalidInput(f"--handler {redact_url(handler)!r} is not an http:// or https:// URL")
        target = HTTPProcessor(
            handler,
            timeout=timeout,
            headers=headers,
            max_connections=max(concurrency, 10),
            max_answer_bytes=max_answer_bytes,
        )
    logs.configure(log_level, log_format)
    for value in headers.values():
        logs.add_secret(value)
    logs.add_url_secrets(handler)
    logs.add_url_secrets(database_url(db))
    watcher = Watcher.connect(database_url(db), target, config)
    try:
        if handler is not None:
            shown = logs.redact_url(handler)
            logging.getLogger("feedproc.watcher").info("handler %s", shown, extra={"handler": shown})
        monitors = _start_monitors(watcher, handler, monitor_host, health_port, metrics_port)
        _freeze_startup_objects()
        try:
            asyncio.run(_run_watcher(watcher))
        finally:
            for monitor in monitors:
                monitor.close()
    finally:
        watcher.close()
    fatal = getattr(watcher, "fatal", None)
    if fatal:  # the write loop gave up: the watcher released its leases; a supervisor restarts it
        raise Refused(f"watcher stopped: {fatal}")


def _check_log_options(level: str, fmt: str) -> None:
    if level.upper() not in logs.LEVELS:
        raise InvalidInput(f"--log-level {level!r}: use DEBUG, INFO, WARNING or ERROR")
    if fmt.lower() not in logs.FORMATS:
        raise InvalidInput(f"--log-format {fmt!r}: use text or json")


def _start_monitors(
    watcher: Any, handler: str | None, host: str, health_port: int | None, metrics_port: int | None
) -> list[Any]:
    """The watcher's probes (/healthz, /livez, /readyz) and /metrics servers (one server when both
    ports are the same)."""
    from .health import MonitorServer, WatcherProbe

    probe = WatcherProbe(watcher, handler)
    by_port: dict[int, dict[str, Any]] = {}
    if health_port:
        by_port.setdefault(health_port, {}).update(
            {"/healthz": probe.health, "/livez": probe.live, "/readyz": probe.ready}
        )
    if metrics_port:
        by_port.setdefault(metrics_port, {})["/metrics"] = probe.metrics
    servers = []
    try:
        for port, routes in by_port.items():
            servers.append(MonitorServer(host, port, routes).start())
            logging.getLogger("feedproc.watcher").info("serving %s on %s:%d", ", ".join(routes), host, port)
    except OSError as error:
        for server in servers:
            server.close()
        raise Refused(f"cannot listen on {host}: {error}") from None
    return servers


@app.command()
def serve(
    host: Annotated[
        str, typer.Option(help="Address to listen on; other than loopback only with a token.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free port).")] = 8000,
    max_body_bytes: Annotated[int, typer.Option(min=1, help="Largest request body accepted.")] = 10 * 1024 * 1024,
    log_level: LogLevelOption = "INFO",
    log_format: LogFormatOption = "text",
    db: DbOption = None,
) -> None:
    """Serve the HTTP API (/api/v1), the dashboard (/), /healthz and /metrics.

    Mutating API calls need `Authorization: Bearer $FEEDPROC_API_TOKEN`; without the variable the
    server is read-only, and it refuses to listen on anything but loopback.
    """
    import ipaddress
    import socket

    try:
        from .api import create_app, run
    except ImportError as error:
        raise Refused(f"feedproc serve needs the server extra: pip install 'feedproc[server]' ({error})") from None
    from .feed import Feed

    _check_log_options(log_level, log_format)
    token = os.environ.get("FEEDPROC_API_TOKEN") or None
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not token:
        raise Refused(f"refusing to listen on {host} without FEEDPROC_API_TOKEN: set a token, or use 127.0.0.1")
    logs.configure(log_level, log_format)
    logs.add_url_secrets(database_url(db))
    feed = Feed(database_url(db))
    try:
        feed.check_schema()
        try:
            family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
            sock = socket.create_server((host, port), family=family)
        except OSError as error:
            raise Refused(f"cannot listen on {host}:{port}: {error}") from None
        shown = f"[{host}]" if ":" in host else host
        typer.echo(f"feedproc serve: http://{shown}:{sock.getsockname()[1]}/ (API at /api/v1)", err=False)
        sys.stdout.flush()
        run(create_app(feed, token=token, max_body=max_body_bytes), sock, log_level=log_level.lower())
    finally:
        feed.close()


@app.command()
def demo(
    partitions: Annotated[int, typer.Option(min=1, max=20, help="Folders to submit.")] = 3,
    files: Annotated[int, typer.Option(min=1, max=5000, help="Files in the first folder.")] = 40,
    delay: Annotated[float, typer.Option(min=0.0, help="Seconds each classification takes.")] = 0.02,
    keep: Annotated[bool, typer.Option(help="Keep the temporary database and logs.")] = False,
) -> None:
    """Run a fan-out/fan-in example end to end on a throwaway SQLite database."""
    from .demo import run_demo

    final = run_demo(partitions=partitions, files=files, delay=delay, keep=keep)
    if any(status["status"] != "complete" for status in final.values()):
        raise typer.Exit(1)


@app.command()
def bench(
    db: Annotated[
        list[str] | None,
        typer.Option(
            "--db",
            metavar="URL",
            help="Where to benchmark (repeatable): sqlite (a temporary file), sqlite:///DIR/X.db (a new file "
            "beside it) or postgresql://... (a throwaway database created on that server, dropped after). "
            "Default: sqlite, plus FEEDPROC_DATABASE_URL when it is PostgreSQL.",
        ),
    ] = None,
    workload: Annotated[str, typer.Option(help="Comma-separated: flat, fan, http.")] = "flat,fan,http",
    watchers: Annotated[
        str | None, typer.Option(help="Comma-separated numbers of watcher processes (default 1,2,4; --quick 1).")
    ] = None,
    partitions: Annotated[int | None, typer.Option(min=1, help="Partitions per run (default 20; --quick 2).")] = None,
    items: Annotated[
        int | None, typer.Option(min=1, help="Items per partition (default 1000; --quick 10); fan: 3 gates x N/3 + 1.")
    ] = None,
    quick: Annotated[
        bool, typer.Option(help="Tiny sizes, one watcher, no peers: checks completion and exactly-once only.")
    ] = False,
    against: Annotated[
        str | None, typer.Option(metavar="PEERS", help="Also run the flat drain with: pgqueuer,procrastinate.")
    ] = None,
    json_file: Annotated[Path | None, typer.Option("--json", metavar="FILE", help="Write the results as JSON.")] = None,
    markdown: Annotated[Path | None, typer.Option(metavar="FILE", help="Write the Markdown tables.")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="`feedproc watch --concurrency` of each watcher.")] = 50,
    poll_interval: Annotated[float, typer.Option(min=0.01, help="`feedproc watch --poll-interval`.")] = 0.1,
    latency_seconds: Annotated[
        float | None,
        typer.Option(min=0.0, help="Length of the half-load latency phase (default 5; --quick 0.5; 0: none)."),
    ] = None,
    pgqueuer_batches: Annotated[str, typer.Option(help="PgQueuer batch sizes to run (comma-separated).")] = "10,500",
    procrastinate_jobs: Annotated[int, typer.Option(min=1, help="Jobs for Procrastinate at most (it is slow).")] = 5000,
    timeout: Annotated[float, typer.Option(min=1.0, help="Seconds one phase of a run may take.")] = 900.0,
    finished: Annotated[
        int,
        typer.Option(min=0, metavar="N", help="Finished items put in the tables before each run (flat-cost check)."),
    ] = 0,
    keep: Annotated[
        bool, typer.Option(help="Keep the throwaway databases and logs (their paths go in the JSON).")
    ] = False,
) -> None:
    """Measure throughput and latency on SQLite and PostgreSQL, optionally beside PgQueuer and Procrastinate."""
    from .bench import parse_options, run_bench

    options = parse_options(
        db=db,
        fallback_db=_global["db"] or os.environ.get("FEEDPROC_DATABASE_URL"),
        workload=workload,
        watchers=watchers,
        partitions=partitions,
        items=items,
        quick=quick,
        against=against,
        concurrency=concurrency,
        poll_interval=poll_interval,
        latency_seconds=latency_seconds,
        pgqueuer_batches=pgqueuer_batches,
        procrastinate_jobs=procrastinate_jobs,
        timeout=timeout,
        keep=keep,
        finished=finished,
        json_path=json_file,
        markdown_path=markdown,
        command=" ".join(["feedproc", *sys.argv[1:]]),
    )
    run_bench(options)


def _freeze_startup_objects() -> None:
    """Put what start-up allocated (modules, SQLAlchemy's and alembic's structures: ~10^5 objects)
    out of the cyclic garbage collector's reach. A full collection scans every tracked object with
    the GIL held: with them, each one stalled a watcher for 85-210 ms on a busy 2-core machine,
    the whole of its dispatch latency's tail (measured by `feedproc bench`)."""
    gc.collect()
    gc.freeze()


async def _run_watcher(watcher: Any) -> None:
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, watcher.stop)
    await watcher.run()


def parse_headers(values: list[str]) -> dict[str, str]:
    headers = {}
    for value in values:
        name, sep, content = value.partition(":")
        if not sep or not name.strip() or any(c.isspace() for c in name.strip()):
            raise InvalidInput(f"--header {value!r}: expected 'Name: value'")
        headers[name.strip()] = content.strip()
    return headers


# ---------------------------------------------------------------- entry point


def _fail(message: str, code: int) -> NoReturn:
    first = logs.redact(message.strip().splitlines()[0] if message.strip() else "failed")
    if logs.is_json():  # `--log-format json`: every line on standard error is JSON, this one too
        logging.getLogger("feedproc").error("feedproc: error: %s", first, extra={"event": "exit", "error": first})
    else:
        print(f"feedproc: error: {first}", file=sys.stderr)
    raise SystemExit(code)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `feedproc` console script."""
    try:
        code = app(args=argv, prog_name="feedproc", standalone_mode=False)
    except FeedprocError as error:
        _fail(str(error), error.exit_code)
    except TyperException as error:  # usage errors: unknown option, bad value, missing argument
        if type(error).__name__ == "NoArgsIsHelpError":
            raise SystemExit(2) from None
        _fail(error.format_message(), error.exit_code or 2)
    except Abort:
        _fail("aborted", 1)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    raise SystemExit(code if isinstance(code, int) else 0)
