"""Long-running commands and tools: watch, serve, demo, bench."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
from typing import Annotated, Any

import typer

from .. import logs
from ..core.errors import InvalidInput, Refused
from ..core.models import MAX_CHILDREN, check_priority
from ..core.redaction import credentials_conflict
from .app import (
    DbOption,
    HookAttemptsOption,
    HookMaxDelayOption,
    HookTimeoutOption,
    ListenDbOption,
    LogFormatOption,
    LogLevelOption,
    app,
    check_http_url,
    database_url,
    global_options,
    listen_database_url,
    parse_duration,
    parse_headers,
)


@app.command()
def watch(
    ctx: typer.Context,
    queue: Annotated[
        str | None,
        typer.Option(envvar="FEEDPROC_QUEUE", help="Queue to serve (default: default, or a Pipeline's own queue)."),
    ] = None,
    handler: Annotated[
        str | None,
        typer.Option(
            metavar="URL", envvar="FEEDPROC_HANDLER_URL", help="HTTP handler service (env FEEDPROC_HANDLER_URL)."
        ),
    ] = None,
    processor: Annotated[
        str | None,
        typer.Option(
            envvar="FEEDPROC_PROCESSOR", metavar="MODULE:ATTR", help="A Python Processor to use instead of HTTP."
        ),
    ] = None,
    concurrency: Annotated[
        int, typer.Option(envvar="FEEDPROC_CONCURRENCY", min=1, help="Items processed at once.")
    ] = 10,
    lease_seconds: Annotated[
        float, typer.Option(envvar="FEEDPROC_LEASE_SECONDS", min=0.5, help="Lease length; renewed every third of it.")
    ] = 30.0,
    poll_interval: Annotated[
        float, typer.Option(envvar="FEEDPROC_POLL_INTERVAL", min=0.01, help="Seconds between polls when idle.")
    ] = 1.0,
    max_attempts: Annotated[
        int, typer.Option(envvar="FEEDPROC_MAX_ATTEMPTS", min=1, help="Deliveries per gate before an item fails.")
    ] = 5,
    max_not_yet: Annotated[
        int,
        typer.Option(
            envvar="FEEDPROC_MAX_NOT_YET", min=1, help='"Not yet" answers of an item per gate before it fails.'
        ),
    ] = 1000,
    retry_delay: Annotated[
        float, typer.Option(envvar="FEEDPROC_RETRY_DELAY", min=0.0, help="First backoff delay; doubles each retry.")
    ] = 1.0,
    max_retry_delay: Annotated[
        float, typer.Option(envvar="FEEDPROC_MAX_RETRY_DELAY", min=0.0, help="Longest backoff delay.")
    ] = 600.0,
    max_partitions: Annotated[
        int | None, typer.Option(envvar="FEEDPROC_MAX_PARTITIONS", min=1, help="Partitions leased at most.")
    ] = None,
    shutdown_grace: Annotated[
        float, typer.Option(envvar="FEEDPROC_SHUTDOWN_GRACE", min=0.0, help="Seconds in-flight items get on stop.")
    ] = 30.0,
    item_timeout: Annotated[
        str | None,
        typer.Option(
            envvar="FEEDPROC_ITEM_TIMEOUT",
            metavar="S",
            help="A processor call taking longer is abandoned as a transient failure.",
        ),
    ] = None,
    timeout: Annotated[
        float,
        typer.Option(
            envvar="FEEDPROC_TIMEOUT",
            min=0.1,
            help="Seconds one HTTP request may take, from connecting to the answer's last byte.",
        ),
    ] = 30.0,
    max_answer_bytes: Annotated[
        int,
        typer.Option(
            envvar="FEEDPROC_MAX_ANSWER_BYTES",
            min=1,
            metavar="N",
            help="Largest handler answer, in bytes once decompressed (default 10 MiB).",
        ),
    ] = 10 * 1024 * 1024,
    max_children: Annotated[
        int,
        typer.Option(
            envvar="FEEDPROC_MAX_CHILDREN",
            min=0,
            metavar="N",
            help="Most child items one answer may add; an answer with more fails its item (default 100,000).",
        ),
    ] = MAX_CHILDREN,
    header: Annotated[
        list[str] | None, typer.Option(metavar="'NAME: VALUE'", help="Extra HTTP header for the handler (repeatable).")
    ] = None,
    hook_attempts: HookAttemptsOption = 25,
    hook_timeout: HookTimeoutOption = 10.0,
    hook_max_delay: HookMaxDelayOption = 60.0,
    batch: Annotated[
        int,
        typer.Option(
            envvar="FEEDPROC_BATCH",
            min=1,
            max=1000,
            metavar="N",
            help="Deliver up to N items of one partition and gate in one call.",
        ),
    ] = 1,
    batch_wait_ms: Annotated[
        float,
        typer.Option(
            envvar="FEEDPROC_BATCH_WAIT_MS",
            min=0.0,
            metavar="MS",
            help="Milliseconds a batch short of N waits for more items.",
        ),
    ] = 0.0,
    batch_wait: Annotated[  # the old spelling of --batch-wait-ms (also milliseconds): deprecated
        float | None, typer.Option(envvar="FEEDPROC_BATCH_WAIT", min=0.0, metavar="MS", hidden=True)
    ] = None,
    prefetch: Annotated[
        int | None,
        typer.Option(
            envvar="FEEDPROC_PREFETCH",
            min=1,
            max=100_000,
            metavar="N",
            help="Ready items kept fetched ahead (default 4 x concurrency, at least 200); more far from the database.",
        ),
    ] = None,
    callback_url: Annotated[
        str | None,
        typer.Option(
            envvar="FEEDPROC_CALLBACK_URL",
            metavar="URL",
            help="feedproc serve's URL: callbacks (requests carry a token and answer_url; a handler may answer 202 "
            "and later) and paged results (a fan-in item's results_url).",
        ),
    ] = None,
    request: Annotated[
        str | None,
        typer.Option(
            envvar="FEEDPROC_REQUEST",
            metavar="json|raw",
            help="Request body: the JSON of the handler contract (json, the default), or the item's data bytes as "
            "stored (raw, as Go Feed sends them; the item's id, partition, queue, gate and attempt in Feedproc-* "
            "headers).",
        ),
    ] = None,
    retention: Annotated[
        str | None,
        typer.Option(
            envvar="FEEDPROC_RETENTION", help="Also delete partitions finished longer ago than this (e.g. 7d)."
        ),
    ] = None,
    log_level: Annotated[
        str, typer.Option(envvar="FEEDPROC_LOG_LEVEL", help="DEBUG, INFO, WARNING or ERROR.")
    ] = "INFO",
    log_format: LogFormatOption = "text",
    health_port: Annotated[
        int | None,
        typer.Option(
            envvar="FEEDPROC_HEALTH_PORT",
            min=1,
            max=65535,
            metavar="N",
            help="Serve GET /healthz, /livez and /readyz on this port.",
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            envvar="FEEDPROC_METRICS_PORT",
            min=1,
            max=65535,
            metavar="N",
            help="Serve Prometheus GET /metrics on this port.",
        ),
    ] = None,
    monitor_host: Annotated[
        str,
        typer.Option(
            envvar="FEEDPROC_MONITOR_HOST",
            metavar="ADDR",
            help="Address of the --health-port/--metrics-port server (0.0.0.0 for Kubernetes probes).",
        ),
    ] = "127.0.0.1",
    db: DbOption = None,
    listen_db: ListenDbOption = None,
) -> None:
    """Run a watcher until SIGINT/SIGTERM; then release its leases and exit 0."""
    from ..processors import HTTPOptions, load_processor
    from ..watcher import Watcher, WatcherConfig

    if handler is not None and processor is not None:
        raise InvalidInput("watch takes --handler URL or --processor module:attr, not both")
    target: Any = None
    if processor is not None:  # loaded first: a Pipeline names its queue
        sys.path.insert(0, os.getcwd())
        target = load_processor(processor)
    queue = _served_queue(queue, target)
    if not header and os.environ.get("FEEDPROC_HEADERS"):  # one 'Name: value' per line
        header = [line for line in os.environ["FEEDPROC_HEADERS"].splitlines() if line.strip()]
    headers = parse_headers(header or [])
    _check_log_options(log_level, log_format)
    request_format = _request_format(request, processor, batch)
    try:
        config = WatcherConfig(
            queue=queue,
            concurrency=concurrency,
            max_partitions=max_partitions,
            lease_seconds=lease_seconds,
            poll_interval=poll_interval,
            max_attempts=max_attempts,
            max_not_yet=max_not_yet,
            retry_delay=retry_delay,
            max_retry_delay=max_retry_delay,
            shutdown_grace=shutdown_grace,
            retention=parse_duration(retention, "--retention", unit_required=True) if retention else None,
            item_timeout=parse_duration(item_timeout, "--item-timeout") if item_timeout else None,
            batch=batch,
            batch_wait=_batch_wait_ms(ctx, batch_wait_ms, batch_wait) / 1000,
            prefetch=prefetch,
            max_children=max_children,
            hook_attempts=hook_attempts,
            hook_timeout=hook_timeout,
            hook_max_delay=hook_max_delay,
        )
    except ValueError as error:
        raise InvalidInput(str(error)) from None
    http_options = HTTPOptions(
        timeout=timeout,
        headers=headers,
        max_connections=max(concurrency, 10),
        max_answer_bytes=max_answer_bytes,
        callback_url=callback_url,
        max_children=max_children,
    )
    if handler is not None:
        check_http_url(handler, "--handler")
        if conflict := credentials_conflict(handler, headers):
            raise InvalidInput(conflict)
        if callback_url is not None:
            check_http_url(callback_url, "--callback-url")
        target = http_options.processor(handler, request=request_format)
    logs.configure(log_level, log_format)
    if batch_wait is not None:
        logging.getLogger("feedproc").warning(DEPRECATED_BATCH_WAIT)
    for value in headers.values():
        logs.add_secret(value)
    logs.add_url_secrets(handler)
    logs.add_url_secrets(database_url(db))
    if hook_secret := os.environ.get("FEEDPROC_HOOK_SECRET"):  # signs hooks; never logged
        logs.add_secret(hook_secret)
    watcher = Watcher.connect(
        database_url(db),
        target,
        config,
        table_prefix=global_options(ctx).table_prefix,
        http_options=http_options,
        listen_url=listen_database_url(listen_db),
    )
    try:
        if target is None and watcher.store.pipeline_version(queue) == 0:
            raise Refused(
                f"queue {queue!r} has no pipeline: apply one (feedproc pipeline apply FILE.toml) "
                "or give --handler URL or --processor module:attr"
            )
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


DEPRECATED_BATCH_WAIT = (
    "--batch-wait (FEEDPROC_BATCH_WAIT) is deprecated: use --batch-wait-ms (FEEDPROC_BATCH_WAIT_MS), "
    "the same milliseconds"
)


def _batch_wait_ms(ctx: typer.Context, batch_wait_ms: float, old: float | None) -> float:
    """--batch-wait-ms when given (on the command line or in the environment), else the old
    spelling --batch-wait (the same milliseconds), else --batch-wait-ms's default."""
    source = ctx.get_parameter_source("batch_wait_ms")
    if old is not None and (source is None or source.name == "DEFAULT"):
        return old
    return batch_wait_ms


def _served_queue(queue: str | None, processor: Any) -> str:
    """The queue a watcher serves: --queue, else a Pipeline's own queue, else `default`; a --queue
    that is not the Pipeline's is refused (its gates are that queue's)."""
    from ..processors.pipeline import Pipeline

    if isinstance(processor, Pipeline):
        if queue is not None and queue != processor.queue:
            raise InvalidInput(f"--queue {queue!r}: the pipeline given serves queue {processor.queue!r}")
        return processor.queue
    return queue if queue is not None else "default"


def _request_format(request: str | None, processor: str | None, batch: int) -> str:
    """`--request` checked against the other options: json (the default) or raw, for --handler only,
    and raw only one item per request (a batch's body is the contract's JSON)."""
    from ..processors.http import REQUEST_FORMATS

    if request is None:
        return REQUEST_FORMATS[0]
    chosen = request.strip().lower()
    if chosen not in REQUEST_FORMATS:
        raise InvalidInput(f"--request {request!r}: use {' or '.join(REQUEST_FORMATS)}")
    if processor is not None:
        raise InvalidInput("--request applies to --handler only: a --processor gets each item in Python")
    if chosen == "raw" and batch > 1:
        raise InvalidInput(f"--request raw sends one item per request: it cannot be used with --batch {batch}")
    return chosen


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
    from ..health import MonitorServer, WatcherProbe

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
def work(
    api: Annotated[str, typer.Option(metavar="URL", help="The feedproc serve to claim from (its base URL).")],
    queue: Annotated[str, typer.Option(help="Pull-mode queue to work on.")] = "default",
    handler: Annotated[
        str | None, typer.Option(metavar="URL", help="Hand each item to this HTTP handler service.")
    ] = None,
    processor: Annotated[
        str | None, typer.Option(metavar="MODULE:ATTR", help="A Python Processor to use instead of HTTP.")
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, max=1000, help="Items processed at once.")] = 10,
    worker: Annotated[str | None, typer.Option(help="This worker's name (default host-pid).")] = None,
    lease_seconds: Annotated[
        float, typer.Option(min=1.0, max=86400.0, help="Each claim's length; a heartbeat renews it every third.")
    ] = 60.0,
    item_timeout: Annotated[
        str | None, typer.Option(metavar="S", help="A processor call taking longer fails, transiently.")
    ] = None,
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds one handler request may take.")] = 30.0,
    shutdown_grace: Annotated[float, typer.Option(min=0.0, help="Seconds in-flight items get on stop.")] = 30.0,
    min_priority: Annotated[
        int | None, typer.Option(metavar="N", help="Claim only from partitions of this priority or higher.")
    ] = None,
    max_priority: Annotated[
        int | None, typer.Option(metavar="N", help="Claim only from partitions of this priority or lower.")
    ] = None,
    log_level: LogLevelOption = "INFO",
    log_format: LogFormatOption = "text",
) -> None:
    """Run a pull worker against `feedproc serve` until SIGINT/SIGTERM (no database access).

    Its token comes from FEEDPROC_WORKER_TOKEN (or FEEDPROC_API_TOKEN). On stop it claims nothing
    more, lets in-flight items finish for --shutdown-grace seconds, and hands the rest back.
    """
    from ..core.redaction import redact_url
    from ..processors import HTTPProcessor, load_processor
    from ..worker import RemoteWorker

    if (handler is None) == (processor is None):
        raise InvalidInput("work needs exactly one of --handler URL or --processor module:attr")
    for name, url in (("--api", api), ("--handler", handler)):
        if url is not None:
            check_http_url(url, name)
    _check_log_options(log_level, log_format)
    for name, bound in (("--min-priority", min_priority), ("--max-priority", max_priority)):
        if bound is not None:
            check_priority(bound, name)
    if processor is not None:
        sys.path.insert(0, os.getcwd())
        target: Any = load_processor(processor)
    else:
        assert handler is not None
        target = HTTPProcessor(handler, timeout=timeout, max_connections=max(concurrency, 10))
    token = os.environ.get("FEEDPROC_WORKER_TOKEN") or os.environ.get("FEEDPROC_API_TOKEN") or None
    logs.configure(log_level, log_format)
    logs.add_url_secrets(api)
    logs.add_url_secrets(handler)
    if token:
        logs.add_secret(token)
    remote = RemoteWorker(
        api,
        queue,
        target,
        token=token,
        worker=worker,
        concurrency=concurrency,
        lease_seconds=lease_seconds,
        timeout=parse_duration(item_timeout, "--item-timeout") if item_timeout else None,
        shutdown_grace=shutdown_grace,
        min_priority=min_priority,
        max_priority=max_priority,
    )
    logging.getLogger("feedproc.worker").info(
        "worker %s claiming from %s, queue %s", remote.worker, redact_url(api), queue
    )

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, remote.stop)
        await remote.run()

    asyncio.run(main())


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
