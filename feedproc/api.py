"""The HTTP API of `feedproc serve` (FastAPI), under /api/v1, plus /healthz and /metrics.

The same operations as the command line, through the same `Feed` methods, with the same rules and
errors: malformed input is 400 (422 when the request does not match the OpenAPI schema), an unknown
partition 404, a refusal (duplicate key, sealed or finished partition, gate too low) 409, a missing
schema or an unreachable database 503; every error is `{"error": "..."}` and changes nothing.

Partition keys may contain `/`, so a key is the rest of the path: `GET /api/v1/partitions/a/b` is
partition `a/b`, and `POST /api/v1/partitions/a/b/seal` seals it (only POST routes end in an action).
Lists are keyset-paginated: pass the last key (or history id) seen as `after`.

Mutating endpoints need `Authorization: Bearer <FEEDPROC_API_TOKEN>`, compared in constant time;
a server started without a token is read-only. The worker API (claim, heartbeat, answer: pull
workers and callback handlers) also takes `FEEDPROC_WORKER_TOKEN`, which allows nothing else.
Request bodies are limited in size.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import threading
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, FastAPI, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._version import __version__
from .core.errors import FeedprocError, InvalidInput, StaleClaim
from .core.models import KEY_PATTERN, MAX_DEPTH, MAX_PAGE, QUEUE_PATTERN, check_key, item_from_row, json_depth
from .core.naming import GATE_NAME_PATTERN
from .feed import Feed
from .gatenames import GateNames, gate_filter, with_name
from .health import serve_health
from .metrics import CONTENT_TYPE, render_down, render_gauges

DEFAULT_MAX_BODY = 10 * 1024 * 1024
GATE_NAME = f"^{GATE_NAME_PATTERN.pattern}$"
INT32 = 2**31 - 1
INT64 = 2**63 - 1
StatusName = Literal["available", "complete", "failed", "cancelled"]


class ApiError(Exception):
    """An error answered as `{"error": message}` with `status`."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers


# ---------------------------------------------------------------- request bodies


#: A gate: its number, or its name in the queue's pipeline (a name never starts with a digit: "1" is
#: neither, as before names). A well-formed name the pipeline lacks is a 400 naming it.
GateIn = Annotated[int, Field(ge=0, le=INT32, strict=True)] | Annotated[str, Field(pattern=GATE_NAME)]
GATE_HELP = "a gate number, or the name of a gate in the pipeline of the partition's queue"


class ItemIn(BaseModel):
    """One item: its gate (default 0; a number, or a name in the queue's pipeline) and its data (any JSON)."""

    model_config = ConfigDict(extra="forbid")
    gate: GateIn = Field(0, description=GATE_HELP, examples=[0, "ocr"])
    data: Any = None


class NewPartition(BaseModel):
    """`feedproc add` as JSON."""

    model_config = ConfigDict(extra="forbid")
    key: str = Field(..., description="1-200 characters of A-Z a-z 0-9 . _ : / -", examples=["upload-42"])
    items: list[ItemIn] = Field(default_factory=list)
    queue: str = "default"
    priority: int = Field(0, ge=-(2**31), le=INT32, strict=True)
    open: bool = Field(False, strict=True, description="leave unsealed: more items may be added")
    manual_checkpoint: bool = Field(False, strict=True)
    not_before: str | None = Field(None, description="ISO 8601; without a zone it is UTC")
    weight: int = Field(1, ge=1, le=INT32, strict=True, description="share of the queue's limit per item in flight")
    item_timeout: float | None = Field(None, gt=0, le=86400 * 7, description="seconds a processor call may take")
    windows: list[str] | None = Field(None, max_length=24, description='windows of the day, e.g. ["22:00-06:00"]')
    timezone: str | None = Field(None, max_length=64, description="the windows' time zone (default UTC)")


class NewItems(BaseModel):
    """`feedproc add-items` as JSON."""

    model_config = ConfigDict(extra="forbid")
    items: list[ItemIn] = Field(..., min_length=1)


class ClaimRequest(BaseModel):
    """A pull worker asks for items."""

    model_config = ConfigDict(extra="forbid")
    worker: str = Field(..., min_length=1, max_length=120, description="the worker's name (history, records)")
    max: int = Field(10, ge=1, le=1000, strict=True, description="items at most")
    lease_seconds: float = Field(60.0, ge=1, le=86400, description="how long each claim holds without a heartbeat")
    wait: float = Field(0.0, ge=0, le=60, description="seconds to wait for work when none is ready (long poll)")


class Heartbeat(BaseModel):
    """A worker still works on a claimed item."""

    model_config = ConfigDict(extra="forbid")
    token: str = Field(..., min_length=1, max_length=64)
    progress: float | None = Field(None, ge=0, le=1)
    lease_seconds: float | None = Field(None, ge=1, le=86400, description="a new lease length, from now")


# ---------------------------------------------------------------- auth and limits

_bearer = HTTPBearer(auto_error=False, description="FEEDPROC_API_TOKEN")


def require_token(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """Mutating endpoints: the bearer token must equal FEEDPROC_API_TOKEN (constant-time)."""
    expected: str | None = request.app.state.token
    if not expected:
        raise ApiError(403, "this server has no FEEDPROC_API_TOKEN: it is read-only")
    given = credentials.credentials if credentials is not None else ""
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise ApiError(401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})


def require_worker_token(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """Worker endpoints: FEEDPROC_API_TOKEN, or FEEDPROC_WORKER_TOKEN (which allows only these)."""
    accepted = [t for t in (request.app.state.token, request.app.state.worker_token) if t]
    if not accepted:
        raise ApiError(403, "this server has no FEEDPROC_API_TOKEN or FEEDPROC_WORKER_TOKEN: it is read-only")
    given = (credentials.credentials if credentials is not None else "").encode()
    if not any(hmac.compare_digest(given, t.encode()) for t in accepted):
        raise ApiError(401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})


class ReadyBoard:
    """Wakes long-polling claims when work may be ready: a LISTEN connection on PostgreSQL (one
    per server, for every queue), else nothing (claims poll). Waiters re-claim when woken."""

    POLL = 1.0  # seconds between claims of a long poll without a notification (SQLite; retries due)

    def __init__(self, feed: Feed) -> None:
        self.feed = feed
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self._stop: Any = None
        self._lock = threading.Lock()

    async def wait(self, seconds: float) -> None:
        """Until a notification or `seconds` (at most POLL), whichever is first."""
        with self._lock:
            if self._loop is None:
                self._loop, self._event = asyncio.get_running_loop(), asyncio.Event()
                self._stop = self.feed.listen_ready(self._notified)
        assert self._event is not None
        self._event.clear()
        try:
            async with asyncio.timeout(min(seconds, self.POLL)):
                await self._event.wait()
        except TimeoutError:
            pass

    def _notified(self) -> None:
        loop, event = self._loop, self._event
        if loop is not None and event is not None:
            loop.call_soon_threadsafe(event.set)

    def close(self) -> None:
        if self._stop is not None:
            self._stop()


class BodyLimit:
    """ASGI middleware: a request body larger than `limit` bytes is answered 413 before any handler."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await self._reject(scope, receive, send)
            return
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._reject(scope, receive, send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = JSONResponse({"error": f"request body larger than {self.limit} bytes"}, status_code=413)
        await response(scope, receive, send)


# ---------------------------------------------------------------- helpers


def _feed(request: Request) -> Feed:
    return request.app.state.feed


def _key(key: str) -> str:
    try:
        return check_key(key)
    except InvalidInput as error:
        raise ApiError(400, str(error)) from None


def _not_before(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value.strip())
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    except (ValueError, OverflowError):
        raise ApiError(400, f"not_before {value!r} is not an ISO 8601 time") from None


def _items(items: list[ItemIn]) -> list[Any]:
    """The items checked, gate names resolved: call it within `Feed.gate_naming` (an unknown name
    is a 400 naming it, before anything is written)."""
    return [item_from_row(item.model_dump(), where=f"item {n}: ") for n, item in enumerate(items, start=1)]


def _status(feed: Feed, key: str) -> dict[str, Any]:
    """A partition's status object, with its gates' names when its queue has a pipeline."""
    return GateNames(feed).status(feed.status(key))


def _data(raw: bytes) -> dict[str, Any]:
    """An item's data as JSON, or as `data_base64` when it is not JSON or nests deeper than MAX_DEPTH
    (stored by older versions or by SQL: the response encoder stops a few hundred levels down)."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return {"data_base64": base64.b64encode(raw).decode()}
    if json_depth(data) > MAX_DEPTH:
        return {"data_base64": base64.b64encode(raw).decode()}
    return {"data": data}


def _fast_json(body: dict[str, Any]) -> Any:
    """`body` as a JSON response, encoded by `json` alone (its values are JSON types already)."""
    return Response(json.dumps(body, separators=(",", ":")), media_type="application/json")


def _page(rows: list[dict[str, Any]], limit: int, cursor: str) -> dict[str, Any]:
    """A page and the cursor of the next one (None on the last page)."""
    return {"items": rows, "next": rows[-1][cursor] if len(rows) == limit else None}


# ---------------------------------------------------------------- routes

api = APIRouter(prefix="/api/v1")
Mutating = [Depends(require_token)]
KeyPath = Annotated[str, Path(pattern=KEY_PATTERN.pattern, description="a partition key; may contain '/'")]
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE, description=f"page size, at most {MAX_PAGE}")]


@api.post("/partitions", status_code=201, dependencies=Mutating, tags=["partitions"])
def create_partition(body: NewPartition, request: Request) -> dict[str, Any]:
    """Create a partition with its items in one transaction (`feedproc add`); sealed unless `open`."""
    feed = _feed(request)
    with feed.gate_naming(queue=body.queue):  # {"gate": "ocr"}
        items = _items(body.items)
    count = feed.add_partition(
        body.key,
        items,
        queue=body.queue,
        priority=body.priority,
        sealed=not body.open,
        manual_checkpoint=body.manual_checkpoint,
        not_before=_not_before(body.not_before),
        weight=body.weight,
        item_timeout=body.item_timeout,
        windows=body.windows,
        window_tz=body.timezone,
    )
    return {"added": count, "partition": _status(feed, body.key)}


@api.get("/partitions", tags=["partitions"])
def list_partitions(
    request: Request,
    queue: Annotated[str | None, Query(pattern=QUEUE_PATTERN.pattern)] = None,
    status: StatusName | None = None,
    prefix: Annotated[str | None, Query(pattern=r"^[A-Za-z0-9._:/-]{0,200}$", description="key prefix")] = None,
    after: Annotated[str | None, Query(pattern=KEY_PATTERN.pattern, description="last key of the page before")] = None,
    limit: Limit = 50,
    sort: Literal["key", "activity", "priority", "age"] = "key",
    error: Annotated[
        str | None, Query(min_length=1, max_length=200, description="text of a failed item's error")
    ] = None,
    offset: Annotated[int, Query(ge=0, le=1_000_000, description="with a sort other than key")] = 0,
) -> dict[str, Any]:
    """Partitions with their item counts per gate; filter by queue, status, key prefix and error text.
    In key order (pages by `after`: the `next` of the previous page), or by `activity` (being worked
    on, then last changed), `priority` or `age` (pages by `offset`)."""
    if sort != "key" and after is not None:
        raise ApiError(400, "after goes with sort=key; page other sorts by offset")
    feed = _feed(request)
    rows = feed.partitions(
        queue=queue, status=status, prefix=prefix, after=after, limit=limit, sort=sort, error=error, offset=offset
    )
    names = GateNames(feed)
    rows = [names.status(row) for row in rows]
    if sort != "key":
        return {"items": rows, "next_offset": offset + limit if len(rows) == limit else None}
    return _page(rows, limit, "key")


@api.get("/status", tags=["partitions"])
def summary(request: Request) -> dict[str, Any]:
    """Counts of partitions and items by status (`feedproc status --json`)."""
    feed = _feed(request)
    return GateNames(feed).summary(feed.summary())


@api.get("/partitions/{key:path}", tags=["partitions"])
def partition_status(
    key: KeyPath, request: Request, history: Annotated[int, Query(ge=0, le=1000)] = 0
) -> dict[str, Any]:
    """One partition: the `feedproc status KEY --json` object (with `history` events when asked).
    When its queue has a pipeline: `gate_name` beside `gate`, `gate_names` beside `gates`."""
    feed = _feed(request)
    return GateNames(feed).status(feed.status(_key(key), history=history))


@api.get("/items", tags=["partitions"])
def list_items(
    request: Request,
    key: Annotated[str, Query(pattern=KEY_PATTERN.pattern)],
    gate: Annotated[str | None, Query(pattern=f"^[0-9]{{1,10}}$|{GATE_NAME}", description=GATE_HELP)] = None,
    status: StatusName | None = None,
    after: Annotated[int, Query(ge=0, le=INT64, description="last item id of the page before")] = 0,
    limit: Limit = 100,
) -> dict[str, Any]:
    """A partition's items in id order (data as JSON, or `data_base64`; `gate_name` beside `gate`
    when the partition's queue has a pipeline). `gate` filters by a gate's number or name."""
    feed = _feed(request)
    rows = feed.items(key, gate=gate_filter(feed, key, gate), status=status, after_id=after, limit=limit)
    names = GateNames(feed).of_items(key, rows)
    return _page(
        [with_name({**{k: v for k, v in r.items() if k != "data"}, **_data(r["data"])}, names) for r in rows],
        limit,
        "id",
    )


@api.get("/items/{item_id}", tags=["partitions"])
def get_item(item_id: Annotated[int, Path(ge=1, le=INT64)], request: Request) -> dict[str, Any]:
    """One item with its data (as JSON, or `data_base64`) and every delivery, oldest first
    (`history`: n, attempt, gate, watcher, started_at, ended_at, duration, outcome, error);
    `gate_name` beside each gate when its queue has a pipeline."""
    feed = _feed(request)
    item = GateNames(feed).item(feed.item(item_id))
    return {**{k: v for k, v in item.items() if k != "data"}, **_data(item["data"])}


@api.get("/history", tags=["partitions"])
def history(
    request: Request,
    key: Annotated[str, Query(pattern=KEY_PATTERN.pattern)],
    after: Annotated[int, Query(ge=0, le=INT64, description="last event id of the page before")] = 0,
    limit: Limit = 100,
) -> dict[str, Any]:
    """A partition's history (leases, steals, gate advances, failures, retries...), oldest first."""
    return _page(_feed(request).history(key, after=after, limit=limit), limit, "id")


@api.post("/partitions/{key:path}/items", dependencies=Mutating, tags=["actions"])
def add_items(key: KeyPath, body: NewItems, request: Request) -> dict[str, Any]:
    """Add items to an open partition (`feedproc add-items`)."""
    feed = _feed(request)
    with feed.gate_naming(key=_key(key)):  # {"gate": "ocr"}
        items = _items(body.items)
    count = feed.add_items(key, items)
    return {"added": count, "partition": _status(feed, key)}


@api.post("/partitions/{key:path}/seal", dependencies=Mutating, tags=["actions"])
def seal(key: KeyPath, request: Request) -> dict[str, Any]:
    """No more items will be added (`feedproc seal`)."""
    feed = _feed(request)
    feed.seal(_key(key))
    return {"partition": _status(feed, key)}


@api.post("/partitions/{key:path}/retry", dependencies=Mutating, tags=["actions"])
def retry(key: KeyPath, request: Request) -> dict[str, Any]:
    """A failed partition and its failed items back to work (`feedproc retry`); 409 unless failed."""
    feed = _feed(request)
    count = feed.retry(_key(key))
    return {"retried": count, "partition": _status(feed, key)}


@api.post("/partitions/{key:path}/cancel", dependencies=Mutating, tags=["actions"])
def cancel(key: KeyPath, request: Request) -> dict[str, Any]:
    """Cancel a partition and its available items (`feedproc cancel`); 409 if complete."""
    feed = _feed(request)
    feed.cancel(_key(key))
    return {"partition": _status(feed, key)}


@api.post("/partitions/{key:path}/checkpoint", dependencies=Mutating, tags=["actions"])
def checkpoint(key: KeyPath, request: Request) -> dict[str, Any]:
    """Advance a manual-checkpoint partition whose gate has drained (`feedproc checkpoint`)."""
    feed = _feed(request)
    gate = feed.checkpoint(_key(key))
    return {"gate": gate, "partition": _status(feed, key)}


class ItemSelection(BaseModel):
    """Items to act on: by id, or every failed or available item of a partition (at one gate)."""

    model_config = ConfigDict(extra="forbid")
    ids: list[Annotated[int, Field(ge=1, le=INT64, strict=True)]] | None = Field(None, min_length=1, max_length=1000)
    partition: str | None = Field(None, description="a partition key")
    gate: GateIn | None = Field(None, description=GATE_HELP)


ItemAction = Literal["retry", "skip", "cancel"]


@api.post("/items/{action}", dependencies=Mutating, tags=["actions"])
def act_on_items(action: ItemAction, body: ItemSelection, request: Request) -> dict[str, Any]:
    """Retry (due now, attempts reset), skip (complete without processing) or cancel items, named by
    `ids` or as every failed or available item of `partition` (at `gate`); recorded in each item's
    deliveries and the history as done by "api". 409 (nothing changes) when a named item is not
    failed or available or its partition is finished."""
    if (body.ids is None) == (body.partition is None):
        raise ApiError(400, "give ids or partition, not both")
    if body.gate is not None and body.partition is None:
        raise ApiError(400, "gate goes with partition")
    feed = _feed(request)
    key = _key(body.partition) if body.partition is not None else None
    gate = gate_filter(feed, key, body.gate) if key is not None else None
    return feed.act_on_items(action, ids=body.ids, key=key, gate=gate, by="api")


def _one_item_action(action: str) -> Any:
    def act(item_id: Annotated[int, Path(ge=1, le=INT64)], request: Request) -> dict[str, Any]:
        return _feed(request).act_on_items(action, ids=[item_id], by="api")

    act.__doc__ = f"{action.capitalize()} one item (see POST /items/{action}); 409 unless failed or available."
    act.__name__ = f"{action}_item"
    return act


for _action in ("retry", "skip", "cancel"):
    api.post(f"/items/{{item_id}}/{_action}", dependencies=Mutating, tags=["actions"])(_one_item_action(_action))


class QueueChange(BaseModel):
    """`feedproc queue set` (and pause / resume) as JSON; fields left out keep their value."""

    model_config = ConfigDict(extra="forbid")
    limit: int | None = Field(None, ge=0, le=INT32, strict=True, description="sum of weights in flight; 0: none")
    windows: list[str] | None = Field(None, max_length=24, description="windows of the day; [] removes them")
    timezone: str | None = Field(None, max_length=64)
    mode: Literal["push", "pull"] | None = None
    paused: bool | None = Field(None, strict=True)


@api.get("/queues", tags=["queues"])
def list_queues(request: Request) -> dict[str, Any]:
    """Every queue with settings or unfinished partitions: mode, limit, slots in use, windows, paused."""
    return {"queues": _feed(request).queues()}


@api.get("/queues/{name}", tags=["queues"])
def get_queue(name: Annotated[str, Path(pattern=QUEUE_PATTERN.pattern)], request: Request) -> dict[str, Any]:
    """One queue's settings and state."""
    return _feed(request).queue(name)


@api.put("/queues/{name}", dependencies=Mutating, tags=["queues"])
def change_queue(
    name: Annotated[str, Path(pattern=QUEUE_PATTERN.pattern)], body: QueueChange, request: Request
) -> dict[str, Any]:
    """Change a queue's limit, windows, time zone, mode or pause (`feedproc queue set|pause|resume`)."""
    feed = _feed(request)
    feed.set_queue(
        name,
        limit=body.limit,
        windows=body.windows or None,
        window_tz=body.timezone,
        clear_windows=body.windows == [],
        mode=body.mode,
        paused=body.paused,
        by="api",
    )
    return feed.queue(name)


@api.post("/queues/{name}/pause", dependencies=Mutating, tags=["queues"])
def pause_queue(name: Annotated[str, Path(pattern=QUEUE_PATTERN.pattern)], request: Request) -> dict[str, Any]:
    """Pause a queue fleet-wide: in-flight items finish, nothing new is dispatched or claimed."""
    feed = _feed(request)
    feed.set_queue(name, paused=True, by="api")
    return feed.queue(name)


@api.post("/queues/{name}/resume", dependencies=Mutating, tags=["queues"])
def resume_queue(name: Annotated[str, Path(pattern=QUEUE_PATTERN.pattern)], request: Request) -> dict[str, Any]:
    """Resume a paused queue."""
    feed = _feed(request)
    feed.set_queue(name, paused=False, by="api")
    return feed.queue(name)


@api.get("/pipelines", tags=["queues"])
def list_pipelines(request: Request) -> dict[str, Any]:
    """Every stored pipeline (`feedproc pipeline show --json`): its version, queue, gates (names,
    numbers, handlers, settings) and schedules; credentials (header values, a handler URL's user and
    password) shown as `***`, since reads need no token."""
    return {"pipelines": [spec.shown() for spec in _feed(request).pipelines()]}


@api.get("/pipelines/{queue}", tags=["queues"])
def get_pipeline(queue: Annotated[str, Path(pattern=QUEUE_PATTERN.pattern)], request: Request) -> dict[str, Any]:
    """A queue's stored pipeline (`feedproc pipeline show QUEUE --json`); 404 when it has none."""
    spec = _feed(request).pipeline(queue)
    if spec is None:
        raise ApiError(404, f"queue {queue!r} has no pipeline")
    return spec.shown()


@api.get("/watchers", tags=["watchers"])
def list_watchers(request: Request) -> dict[str, Any]:
    """Registered watchers (heartbeat, liveness, lease counts) and the leases held now."""
    feed = _feed(request)
    return {"watchers": feed.watchers(), "leases": GateNames(feed).rows(feed.leases())}


@api.get("/failures", tags=["partitions"])
def failures(request: Request, limit: Annotated[int, Query(ge=1, le=100)] = 20) -> dict[str, Any]:
    """The most recently failed partitions, each with one of its errors."""
    feed = _feed(request)
    return {"items": GateNames(feed).rows(feed.recent_failures(limit=limit))}


class FailedSelection(BaseModel):
    """Failed partitions to retry in bulk: by queue, key prefix and error text (all optional)."""

    model_config = ConfigDict(extra="forbid")
    queue: str | None = Field(None, pattern=QUEUE_PATTERN.pattern)
    prefix: str | None = Field(None, max_length=200)
    error: str | None = Field(None, min_length=1, max_length=200)
    limit: int = Field(100, ge=1, le=500, strict=True)


@api.post("/failures/retry", dependencies=Mutating, tags=["actions"])
def retry_failures(body: FailedSelection, request: Request) -> dict[str, Any]:
    """Retry failed partitions in bulk, up to `limit` in key order, each as `POST
    /partitions/{key}/retry` would: `{"retried": [{"key", "retried"}...]}` with the count of items
    put back to work per partition."""
    prefix = _key(body.prefix) if body.prefix else None
    return {"retried": _feed(request).retry_failed(queue=body.queue, prefix=prefix, error=body.error, limit=body.limit)}


@api.get("/running", tags=["partitions"])
def running(
    request: Request,
    queue: Annotated[str | None, Query(pattern=QUEUE_PATTERN.pattern)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> dict[str, Any]:
    """Items in flight now, longest running first: watcher deliveries and worker or callback claims,
    with gate, attempt, who has it, elapsed seconds (once a heartbeat reported it) and progress."""
    feed = _feed(request)
    return {"items": GateNames(feed).rows(feed.running(queue=queue, limit=limit))}


@api.get("/throughput", tags=["partitions"])
def throughput(
    request: Request,
    span: Literal["hour", "day"] = "hour",
    queue: Annotated[str | None, Query(pattern=QUEUE_PATTERN.pattern)] = None,
) -> dict[str, Any]:
    """Items added, processed, completed and failed per minute (last hour) or per 15 minutes (last
    day), with the backlog at the end of each step: the dashboard's charts."""
    seconds, step = SPANS[span]
    return _feed(request).throughput(seconds=seconds, step=step, queue=queue)


#: Chart spans: (seconds, step).
SPANS = {"hour": (3600, 60), "day": (86400, 900)}


# ---------------------------------------------------------------- the worker API

Working = [Depends(require_worker_token)]
QueuePath = Annotated[str, Path(pattern=QUEUE_PATTERN.pattern)]
ItemPath = Annotated[int, Path(ge=1, le=INT64)]


@api.post("/queues/{queue}/claim", dependencies=Working, tags=["workers"])
async def claim(queue: QueuePath, body: ClaimRequest, request: Request) -> dict[str, Any]:
    """Claim up to `max` ready items of a pull-mode queue, each held for `lease_seconds` unless a
    heartbeat extends it; with `wait`, hold the request up to that many seconds until there is
    work. Items come only from their partition's current gate, in priority order. Each item:
    id, partition, queue, gate, attempt, data (or data_base64), token, lease_expires_at. 409 when
    the queue is not in pull mode."""
    feed: Feed = _feed(request)
    board: ReadyBoard = request.app.state.ready_board
    loop = asyncio.get_running_loop()
    deadline = loop.time() + body.wait
    while True:
        claimed = await run_in_threadpool(
            feed.claim, queue, body.worker, max_items=body.max, lease_seconds=body.lease_seconds
        )
        if await request.is_disconnected():  # the worker gave up (stopping): nobody will hear of these
            for entry in claimed:
                await run_in_threadpool(feed.release, entry["id"], entry["token"])
            return {"items": []}
        remaining = deadline - loop.time()
        if claimed or remaining <= 0:
            break
        await board.wait(remaining)
    # A ready-made JSON body: FastAPI's encoder walks every value in Python (a third of the time of
    # a claim of 100 items).
    return _fast_json({"items": [{**{k: v for k, v in c.items() if k != "data"}, **_data(c["data"])} for c in claimed]})


@api.post("/items/{item_id}/heartbeat", dependencies=Working, tags=["workers"])
def heartbeat(item_id: ItemPath, body: Heartbeat, request: Request) -> dict[str, Any]:
    """Extend a claim (by its lease, or a new `lease_seconds`) and keep `progress` (0..1). 409 with
    `reason` ("expired", "cancelled", "superseded") when the token no longer holds the item."""
    expires = _feed(request).heartbeat(item_id, body.token, progress=body.progress, lease_seconds=body.lease_seconds)
    return {"id": item_id, "lease_expires_at": expires}


@api.post("/items/{item_id}/answer", dependencies=Working, tags=["workers"])
def answer(
    item_id: ItemPath,
    request: Request,
    body: Annotated[
        dict[str, Any],
        Body(
            description=(
                "`token` and the handler contract's answer: done / gate / data / items / retry_after / "
                'progress (Go Feed: complete / response), or `error`: {"message", "no_retry"} or a message'
            ),
            examples=[{"token": "…", "done": True, "data": {"label": "invoice"}}],
        ),
    ],
) -> dict[str, Any]:
    """Answer a claimed item, as a handler would answer its request; 400 for a malformed answer
    and 409 with `reason` when the token no longer holds the item (nothing changes then)."""
    token = body.get("token")
    if not isinstance(token, str) or not 1 <= len(token) <= 64:
        raise ApiError(400, "token: the claim's token (a string) is required")
    fields = {k: v for k, v in body.items() if k != "token"}
    return _feed(request).answer(item_id, token, fields)


class AnswerBatch(BaseModel):
    """Many answers at once, each `{"id", "token", <answer fields>}`."""

    model_config = ConfigDict(extra="forbid")
    answers: list[dict[str, Any]] = Field(..., min_length=1, max_length=1000)


@api.post("/answers", dependencies=Working, tags=["workers"])
def answer_many(body: AnswerBatch, request: Request) -> dict[str, Any]:
    """Answer many claimed items in one transaction (a worker's group commit). Each answer is
    judged alone: `results` holds, in order, `{"id", "status": 200, "outcome", ...}` or
    `{"id", "status": 400 | 404 | 409, "error"[, "reason"]}`; the refused ones change nothing."""
    results: list[dict[str, Any] | None] = [None] * len(body.answers)
    batch: list[tuple[int, str, dict[str, Any]]] = []
    where: list[int] = []
    for n, entry in enumerate(body.answers):
        item_id, token = entry.get("id"), entry.get("token")
        if isinstance(item_id, bool) or not isinstance(item_id, int) or not 1 <= item_id <= INT64:
            results[n] = {"id": item_id, "status": 400, "error": "id: an item id is required"}
        elif not isinstance(token, str) or not 1 <= len(token) <= 64:
            results[n] = {"id": item_id, "status": 400, "error": "token: the claim's token (a string) is required"}
        else:
            batch.append((item_id, token, {k: v for k, v in entry.items() if k not in ("id", "token")}))
            where.append(n)
    for n, result in zip(where, _feed(request).answer_many(batch) if batch else [], strict=True):
        item_id = body.answers[n]["id"]
        if isinstance(result, FeedprocError):
            results[n] = {"id": item_id, "status": result.http_status, "error": str(result)}
            if isinstance(result, StaleClaim):
                results[n]["reason"] = result.reason  # type: ignore[index]
        else:
            results[n] = {"status": 200, **result}
    return _fast_json({"results": results})


class TokenOnly(BaseModel):
    """A claim's token."""

    model_config = ConfigDict(extra="forbid")
    token: str = Field(..., min_length=1, max_length=64)


@api.post("/items/{item_id}/release", dependencies=Working, tags=["workers"])
def release(item_id: ItemPath, body: TokenOnly, request: Request) -> dict[str, Any]:
    """Hand a claimed item back unanswered (a worker stopping): ready again at once, no attempt
    counted. 409 with `reason` when the token no longer holds the item."""
    _feed(request).release(item_id, body.token)
    return {"id": item_id, "released": True}


# ---------------------------------------------------------------- the application


def create_app(
    feed: Feed, *, token: str | None = None, worker_token: str | None = None, max_body: int = DEFAULT_MAX_BODY
) -> FastAPI:
    """The whole `feedproc serve` application: API, dashboard, /healthz and /metrics."""
    from fastapi_offline import FastAPIOffline

    from . import dashboard

    app = FastAPIOffline(  # the docs' Swagger UI and Redoc assets come from the package, not a CDN
        title="feedproc",
        version=__version__,
        description=(__doc__ or "").split("\n\n", 1)[1],
        openapi_url="/api/v1/openapi.json",
        docs_url="/api/v1/docs",
        redoc_url="/api/v1/redoc",
        static_url="/api/v1/docs-assets",
    )
    app.state.feed = feed
    app.state.token = token or None
    app.state.worker_token = worker_token or None
    app.state.ready_board = ReadyBoard(feed)
    app.include_router(api)
    dashboard.install(app)

    @app.get("/healthz", tags=["operations"])
    def healthz() -> JSONResponse:
        """200 when the database answers; 503 with the reason otherwise."""
        status, body = serve_health(feed)
        return JSONResponse(body, status_code=status)

    @app.get("/metrics", tags=["operations"], response_class=PlainTextResponse)
    def metrics() -> Response:
        """Prometheus text: partitions by status, backlog, failed items, leases, live watchers per queue."""
        try:
            text = render_gauges(feed.gauges())
        except FeedprocError as error:
            text = render_down(str(error))
        return Response(text, media_type=CONTENT_TYPE)

    app.add_exception_handler(ApiError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(FeedprocError, _feedproc_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_middleware(BodyLimit, limit=max_body)
    return app


def run(app: FastAPI, sock: Any, *, log_level: str = "info") -> None:
    """Serve `app` on a bound socket until SIGINT/SIGTERM; then shut down gracefully (exit 0, like `watch`)."""
    import signal

    import uvicorn

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:  # uvicorn's, minus re-raising the signal at exit
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            self.should_exit = True

    # log_config=None: uvicorn's loggers propagate to the root handler of `logs.configure()` (text or
    # JSON, redacted, rate-limited) instead of getting handlers of their own.
    config = uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="off", log_config=None)
    _Server(config).run(sockets=[sock])


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def _api_error(request: Request, error: ApiError) -> JSONResponse:
    return _error(error.status, str(error), error.headers)


async def _feedproc_error(request: Request, error: FeedprocError) -> JSONResponse:
    if isinstance(error, StaleClaim):
        return JSONResponse({"error": str(error), "reason": error.reason}, status_code=error.http_status)
    return _error(error.http_status, str(error))


async def _validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
    """422 names what is wrong with a well-formed request; a body that is not JSON at all is a 400."""
    if any(problem.get("type") == "json_invalid" for problem in error.errors()):
        return _error(400, "the request body is not valid JSON")
    problems = []
    for problem in error.errors()[:5]:
        where = ".".join(str(part) for part in problem.get("loc", ()) if part != "body")
        problems.append(f"{where}: {problem.get('msg', 'invalid')}" if where else problem.get("msg", "invalid"))
    return _error(422, "; ".join(problems) or "invalid request")


async def _http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
    return _error(error.status_code, str(error.detail), getattr(error, "headers", None))
