"""The HTTP API of `feedproc serve` (FastAPI), under /api/v1, plus /healthz and /metrics.

What clients are promised (errors, keys that contain `/`, pagination, tokens, the body limit) is
`DESCRIPTION` below, which is also the description of the OpenAPI document (/api/v1/docs).

One module per part, each route module with its own router:

- this one: `create_app`, which assembles the application, and `run`, which serves it;
- `errors`: `ApiError` and the handlers that answer every error as `{"error": "..."}`;
- `gate`: the Host check and each route's token scope, checked before the body is read;
- `common`: what the routes share: body limit, path and gate types, helpers;
- `partitions`: create partitions, add items, and read partitions, items and history;
- `actions`: seal, retry, cancel, checkpoint a partition; retry, skip, cancel items;
- `queues`: queue settings, pause and resume; stored pipelines;
- `activity`: watchers and their leases, recent failures (and their bulk retry), running, throughput;
- `hooks`: completion hooks' deliveries, listed, read and retried;
- `workers`: the worker API (claim, heartbeat, answer, release) for pull workers and callbacks.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from .._version import __version__
from ..auth import Access, Tokens
from ..core.errors import FeedprocError
from ..core.models import MAX_CHILDREN, MAX_ITEMS
from ..feed import Feed
from ..health import DatabaseProbe
from ..metrics import CONTENT_TYPE, render_down, render_gauges
from . import actions, activity, collected, hooks, partitions, queues, workers
from .common import DEFAULT_MAX_BODY, BodyLimit, expensive, expensive_reads
from .docs import DocsPolicy
from .errors import install_error_handlers
from .gate import Gate, Open, Reading, route_scopes
from .workers import ReadyBoard

__all__ = ["DEFAULT_MAX_BODY", "create_app", "run"]

DESCRIPTION = """\
The same operations as the command line, through the same `Feed` methods, with the same rules and
errors: malformed input is 400 (422 when the request does not match the OpenAPI schema), an unknown
partition 404, a refusal (duplicate key, sealed or finished partition, gate too low) 409, a missing
schema or an unreachable database 503; every error is `{"error": "..."}` and changes nothing.

Partition keys may contain `/`, so a key is the rest of the path: `GET /api/v1/partitions/a/b` is
partition `a/b`, and `POST /api/v1/partitions/a/b/seal` seals it (only POST routes end in an action).
Lists are keyset-paginated: pass the last key (or history id) seen as `after`.

Each call needs `Authorization: Bearer <token>` of its scope, checked (in constant time) before the
body is read: `read` for reads (where reads are open, none), `operate` for actions and adding work,
`admin` for queue settings, `worker` for the worker API (claim, heartbeat, answer: pull workers and
callback handlers; a worker token may be limited to queues). admin includes operate, which includes
read; a worker token reads nothing. Reads also take `Authorization: Basic` with the token as the
password (browsers). A server with no token for a scope refuses its calls (403). A Host header
other than localhost, an IP address or a name allowed with `--allowed-host` is a 400.
Request bodies are limited in size, a request's items in number (`--max-items`, 413) and an
answer's children too (`--max-children`, 413).
"""

#: The documentation pages: Swagger UI and Redoc (`docs.DocsPolicy` sets their security policy).
DOCS_PAGES = ("/api/v1/docs", "/api/v1/redoc")

#: The route modules in the order their routes are matched and listed in the OpenAPI document.
ROUTE_MODULES = (partitions, actions, queues, activity, hooks, workers, collected)


def create_app(
    feed: Feed,
    *,
    token: str | None = None,
    worker_token: str | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    access: Access | None = None,
    max_items: int = MAX_ITEMS,
    max_children: int = MAX_CHILDREN,
) -> FastAPI:
    """The whole `feedproc serve` application: API, dashboard, /healthz and /metrics. Who may do
    what is `access`; without it, `token` (admin and worker) and `worker_token` (worker), reads open.
    A request may add `max_items` items at most, a worker's or callback's answer `max_children` children."""
    from fastapi_offline import FastAPIOffline

    from .. import dashboard

    app = FastAPIOffline(  # the docs' Swagger UI and Redoc assets come from the package, not a CDN
        title="feedproc",
        version=__version__,
        description=DESCRIPTION,
        openapi_url="/api/v1/openapi.json",
        docs_url=DOCS_PAGES[0],
        redoc_url=DOCS_PAGES[1],
        static_url="/api/v1/docs-assets",
    )
    app.state.feed = feed
    app.state.max_items = max_items
    app.state.max_children = max_children
    app.state.ready_board = ReadyBoard(feed)
    app.state.expensive = expensive_reads()  # status summaries and gauges: a few at once
    for module in ROUTE_MODULES:
        app.include_router(module.router, prefix="/api/v1")
    dashboard.install(app)

    probe = DatabaseProbe(feed.twin(pool_size=1))  # answers while the API's pool and threads are busy

    @app.get("/healthz", dependencies=Open, tags=["operations"])
    async def healthz() -> JSONResponse:
        """200 when the database answers; 503 with the reason otherwise."""
        status, body = await probe()
        return JSONResponse(body, status_code=status)

    @app.get("/metrics", dependencies=Reading, tags=["operations"], response_class=PlainTextResponse)
    async def metrics(request: Request) -> Response:
        """Prometheus text: partitions by status, backlog, failed items, leases, live watchers and
        completion hooks by status, per queue."""
        try:
            text = render_gauges(await expensive(request, feed.gauges))
        except FeedprocError as error:
            text = render_down(str(error))
        return Response(text, media_type=CONTENT_TYPE)

    install_error_handlers(app)
    app.add_middleware(DocsPolicy, paths=DOCS_PAGES)
    app.add_middleware(BodyLimit, limit=max_body)
    # Added last, so outermost: no token, no Host, no body read.
    access = access or Access(Tokens.legacy(token or None, worker_token or None))
    app.add_middleware(Gate, access=access, routes=route_scopes(app))
    return app


#: `feedproc serve`'s connections (--max-connections): each an open socket, whatever it is doing.
MAX_CONNECTIONS = 256
#: Seconds a client has to send a request's line and headers, and may stay idle between requests.
HEADER_TIMEOUT, IDLE_TIMEOUT = 10.0, 60.0


def run(app: FastAPI, sock: Any, *, log_level: str = "info", max_connections: int = MAX_CONNECTIONS) -> None:
    """Serve `app` on a bound socket until SIGINT/SIGTERM; then shut down gracefully (exit 0, like `watch`).
    Bounded as serving.py says: `max_connections` (fewer when the process lacks file descriptors)."""
    import signal

    import uvicorn

    from ..serving import Limits, fit_descriptors, uvicorn_settings

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:  # uvicorn's, minus re-raising the signal at exit
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            self.should_exit = True

    # log_config=None: uvicorn's loggers propagate to the root handler of `logs.configure()` (text or
    # JSON, redacted, rate-limited) instead of getting handlers of their own.
    limits = Limits(fit_descriptors(max_connections), HEADER_TIMEOUT, IDLE_TIMEOUT)
    config = uvicorn.Config(
        app, log_level=log_level, access_log=False, lifespan="off", log_config=None, **uvicorn_settings(limits)
    )
    _Server(config).run(sockets=[sock])
