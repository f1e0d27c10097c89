"""`feedproc serve`: the HTTP API, the dashboard, /healthz and /metrics in one process (the
`server` extra), with who may do what (feedproc/auth.py) and the server's limits."""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from .. import logs
from ..core.errors import Refused
from ..core.models import MAX_CHILDREN, MAX_ITEMS
from .app import (
    DbOption,
    HookAttemptsOption,
    HookMaxDelayOption,
    HookTimeoutOption,
    ListenDbOption,
    LogFormatOption,
    LogLevelOption,
    app,
    database_url,
    global_options,
    listen_database_url,
)
from .run import _check_log_options

if TYPE_CHECKING:
    from ..feed import Feed
    from ..watcher.hooks import HookSettings, HookThread


@app.command()
def serve(
    ctx: typer.Context,
    host: Annotated[
        str, typer.Option(help="Address to listen on; other than loopback only with a read token (or --public-read).")
    ] = "127.0.0.1",
    public_read: Annotated[
        bool, typer.Option("--public-read", help="Serve reads without a token, on any address (logged as a WARNING).")
    ] = False,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            metavar="NAME",
            help="A Host name to answer besides localhost and IP addresses (repeatable; *.NAME: subdomains; *: any).",
        ),
    ] = None,
    tokens_file: Annotated[
        str | None,
        typer.Option(metavar="FILE", help="More tokens: lines of 'SCOPE [QUEUES:]TOKEN' (read|operate|admin|worker)."),
    ] = None,
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free port).")] = 8000,
    max_body_bytes: Annotated[int, typer.Option(min=1, help="Largest request body accepted.")] = 10 * 1024 * 1024,
    max_connections: Annotated[
        int,
        typer.Option(
            min=1,
            help="Connections at once: a newcomer closes the oldest idle one, else gets 503 (/healthz always answers).",
        ),
    ] = 256,
    max_items: Annotated[
        int, typer.Option(min=1, metavar="N", help="Most items one request may add (more: 413, nothing written).")
    ] = MAX_ITEMS,
    max_children: Annotated[
        int,
        typer.Option(min=0, metavar="N", help="Most child items one worker or callback answer may add (more: 413)."),
    ] = MAX_CHILDREN,
    max_attempts: Annotated[
        int, typer.Option(min=1, help="Pull workers: deliveries per gate before an item fails.")
    ] = 5,
    max_not_yet: Annotated[
        int, typer.Option(min=1, help='Pull workers: "not yet" answers of an item per gate before it fails.')
    ] = 1000,
    retry_delay: Annotated[
        float, typer.Option(min=0.0, help="Pull workers: first backoff delay; doubles each retry.")
    ] = 1.0,
    max_retry_delay: Annotated[float, typer.Option(min=0.0, help="Pull workers: longest backoff delay.")] = 600.0,
    hooks: Annotated[
        bool,
        typer.Option(
            "--hooks/--no-hooks",
            envvar="FEEDPROC_SERVE_HOOKS",
            help="Deliver every queue's HTTP completion hooks too (pull queues have no watcher to).",
        ),
    ] = True,
    hook_attempts: HookAttemptsOption = 25,
    hook_timeout: HookTimeoutOption = 10.0,
    hook_max_delay: HookMaxDelayOption = 60.0,
    log_level: LogLevelOption = "INFO",
    log_format: LogFormatOption = "text",
    db: DbOption = None,
    listen_db: ListenDbOption = None,
) -> None:
    """Serve the HTTP API (/api/v1), the dashboard (/), /healthz and /metrics.

    Calls need `Authorization: Bearer TOKEN` of their scope: FEEDPROC_READ_TOKENS, _OPERATE_TOKENS,
    _ADMIN_TOKENS, _WORKER_TOKENS (comma-separated; a worker's may be `QUEUE+QUEUE:TOKEN`), or
    FEEDPROC_API_TOKEN (admin and worker) and FEEDPROC_WORKER_TOKEN (worker). Reads are open on
    loopback until FEEDPROC_READ_TOKENS is set; elsewhere they need a token unless --public-read.
    """
    import socket

    from ..auth import load_tokens, serve_access

    try:
        from ..api import create_app, run
    except ImportError as error:
        raise Refused(f"feedproc serve needs the server extra: pip install 'feedproc[server]' ({error})") from None
    from ..feed import Feed

    _check_log_options(log_level, log_format)
    tokens = load_tokens(os.environ, tokens_file)
    access = serve_access(host, tokens, public_read=public_read, allowed_hosts=allowed_host or ())
    logs.configure(log_level, log_format)
    for secret in tokens.secrets():
        logs.add_secret(secret)
    if public_read:
        logging.getLogger("feedproc.serve").warning("--public-read: anyone who reaches %s may read every queue", host)
    logs.add_url_secrets(database_url(db))
    from ..core.policy import RetryPolicy

    policy = RetryPolicy(
        max_attempts=max_attempts, retry_delay=retry_delay, max_retry_delay=max_retry_delay, max_not_yet=max_not_yet
    )
    feed = Feed(
        database_url(db),
        policy=policy,
        table_prefix=global_options(ctx).table_prefix,
        listen_url=listen_database_url(listen_db),
    )
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
        app_ = create_app(feed, max_body=max_body_bytes, access=access, max_items=max_items, max_children=max_children)
        from ..watcher.hooks import HookSettings

        settings = HookSettings(None, attempts=hook_attempts, timeout=hook_timeout, max_delay=hook_max_delay)
        sender = _hook_thread(feed, settings) if hooks else None
        try:
            run(app_, sock, log_level=log_level.lower(), max_connections=max_connections)
        finally:
            if sender is not None:
                sender.stop()
    finally:
        feed.close()


def _hook_thread(feed: Feed, settings: HookSettings) -> HookThread:
    """The completion hooks' sender of this serve process, started: any queue's HTTP hooks."""
    import socket

    from ..watcher.hooks import HookThread

    secret = os.environ.get("FEEDPROC_HOOK_SECRET") or None
    if secret:
        logs.add_secret(secret)
    sender = HookThread(feed.store, settings, f"serve:{socket.gethostname()[:60]}:{os.getpid()}", secret=secret)
    sender.start()
    return sender
