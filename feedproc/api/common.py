"""What the route modules share: the request body limit, the types of
gates, keys and ids in paths and bodies, and the helpers that turn a request into `Feed` calls and
`Feed` rows into answers."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import Path, Request
from fastapi.responses import JSONResponse
from pydantic import Field
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..core.errors import InvalidInput
from ..core.gate_names import GATE_NAME_PATTERN
from ..core.models import KEY_PATTERN, MAX_DEPTH, check_key, json_depth
from ..feed import Feed
from ..gate_labels import GateNames
from ..serving import Budget
from .errors import ApiError, got, said

DEFAULT_MAX_BODY = 10 * 1024 * 1024
#: Request-body bytes being read and handled at once, per server (at least the largest body allowed).
#: A body parsed into models takes ~14 times its size (8 MB of 78,000 items: +117 MB of RSS). Ten
#: concurrent 8 MB bodies took serve from 85 MB to 1.48 GB; with 12 MiB (one such body at a time,
#: small ones beside it) to 211 MB, with 16 MiB (two at a time) to 324 MB, no faster on SQLite.
BODY_BUDGET = 12 * 1024 * 1024
BODY_WAIT = 10.0  # seconds a request waits for its bytes of the budget before a 503
CHUNKED_STEP = 1024 * 1024  # a chunked body reserves its bytes this many at a time
#: Reads that count over whole tables (status summary, gauges) running at once, and the seconds one
#: waits for its turn before a 503. At 1.9M items a summary takes 1.7 s on SQLite; 20 at once made
#: /healthz fail and the dashboard take 29 s. Two leave the database pool (10) and threads to the rest.
EXPENSIVE_AT_ONCE, EXPENSIVE_WAIT = 2, 5.0
GATE_NAME = f"^{GATE_NAME_PATTERN.pattern}$"
INT32 = 2**31 - 1
INT64 = 2**63 - 1


def gate_must_be(value: Any) -> str:
    """What a gate in a request must be, as the command line says it (`gate must be an integer >= 0`)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > INT32:
        return f"must be at most {INT32}, got {got(value)}"
    return f"must be an integer >= 0 or a gate name, got {got(value)}"


#: A gate: its number, or its name in the queue's pipeline (a name never starts with a digit: "1" is
#: neither, as before names). A well-formed name the pipeline lacks is a 400 naming it.
GateIn = Annotated[
    Annotated[int, Field(ge=0, le=INT32, strict=True)] | Annotated[str, Field(pattern=GATE_NAME)],
    said(gate_must_be),
]
GATE_HELP = "a gate number, or the name of a gate in the pipeline of the partition's queue"

KeyPath = Annotated[str, Path(pattern=KEY_PATTERN.pattern, description="a partition key; may contain '/'")]


# ---------------------------------------------------------------- limits


async def within_max_items(request: Request) -> None:
    """A request adding items: 413 when its `items` list is longer than `--max-items`. Counted in
    the parsed body (Starlette keeps what the route parsed) before any item is validated: 1,000,000
    items would otherwise become as many models, then as many NewItems, before any check."""
    limit: int = request.app.state.max_items
    try:
        body = await request.json()
    except Exception:  # not JSON: the route's own validation says what is wrong
        return
    items = body.get("items") if isinstance(body, dict) else None
    if isinstance(items, list) and len(items) > limit:
        raise ApiError(
            413,
            f"{len(items)} items in one request; the limit is {limit} (feedproc serve --max-items): "
            "send them in several requests",
        )


class BodyLimit:
    """ASGI middleware: a request body larger than `limit` bytes is answered 413 before any handler,
    and bodies are read and handled only within a byte budget shared by the server's requests
    (`budget` bytes, at least `limit`): a request reserves its Content-Length (a chunked one, as
    its body arrives) before its body is read and releases it once answered. One that cannot have
    its bytes within BODY_WAIT seconds is answered 503 with Retry-After, its body unread. Memory
    stays bounded: parsing a JSON body of 100,000 items into models takes about 14 times its size."""

    def __init__(self, app: ASGIApp, limit: int, budget: int = BODY_BUDGET) -> None:
        self.app = app
        self.limit = limit
        self.budget = Budget(max(budget, limit))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await self._reject(scope, receive, send)
            return
        held = 0
        try:
            if declared is not None:
                if not await self.budget.acquire(int(declared), BODY_WAIT):
                    await _busy(scope, receive, send)
                    return
                held = int(declared)
            chunks: list[bytes] = []
            size, more = 0, True
            while more:
                message = await receive()
                if message["type"] != "http.request":
                    return  # the client went away: nothing to answer
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.limit:
                    await self._reject(scope, receive, send)
                    return
                if size > held:  # chunked, or more than declared (h11 refuses that): reserve as it comes
                    step = max(size - held, CHUNKED_STEP)
                    if not await self.budget.acquire(step, BODY_WAIT):
                        await _busy(scope, receive, send)
                        return
                    held += step
                chunks.append(chunk)
                more = message.get("more_body", False)
            body = b"".join(chunks)
            del chunks
            sent = False

            async def replay() -> Message:
                nonlocal sent
                if not sent:
                    sent = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            await self.app(scope, replay, send)
        finally:
            self.budget.release(held)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = JSONResponse({"error": f"request body larger than {self.limit} bytes"}, status_code=413)
        await response(scope, receive, send)


async def _busy(scope: Scope, receive: Receive, send: Send) -> None:
    error = "server busy: too many large requests; retry"
    await JSONResponse({"error": error}, status_code=503, headers={"Retry-After": "2"})(scope, receive, send)


# ---------------------------------------------------------------- helpers

T = TypeVar("T")


def expensive_reads() -> Budget:
    """The turns of one application's expensive reads (`app.state.expensive`)."""
    return Budget(EXPENSIVE_AT_ONCE)


async def expensive(request: Request, read: Callable[[], T]) -> T:
    """Run `read` (blocking: on a worker thread) when one of EXPENSIVE_AT_ONCE turns is free, else
    answer 503 with Retry-After once EXPENSIVE_WAIT seconds have passed."""
    turns: Budget = request.app.state.expensive
    if not await turns.acquire(1, EXPENSIVE_WAIT):
        raise ApiError(503, "busy: too many status and metrics reads at once; retry", {"Retry-After": "2"})
    try:
        return await run_in_threadpool(read)
    finally:
        turns.release(1)


def _feed(request: Request) -> Feed:
    return request.app.state.feed


def _key(key: str) -> str:
    try:
        return check_key(key)
    except InvalidInput as error:
        raise ApiError(400, str(error)) from None


def _status(feed: Feed, key: str) -> dict[str, Any]:
    """A partition's status object, with its gates' names when its queue has a pipeline."""
    return GateNames(feed).status(feed.status(key).to_json())


def _data(raw: bytes, field: str = "data") -> dict[str, Any]:
    """An item's data as JSON, or as `data_base64` when it is not JSON or nests deeper than MAX_DEPTH
    (stored by older versions or by SQL: the response encoder stops a few hundred levels down).
    `field="result"`: its result the same way (`result`, or `result_base64`)."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return {f"{field}_base64": base64.b64encode(raw).decode()}
    if json_depth(data) > MAX_DEPTH:
        return {f"{field}_base64": base64.b64encode(raw).decode()}
    return {field: data}


def _shown(row: dict[str, Any]) -> dict[str, Any]:
    """An item row (`Feed.items` / `Feed.item`) as the API shows it: its data and its result as JSON
    (`result` null when it has none), or base64 where they are not."""
    shown = {k: v for k, v in row.items() if k not in ("data", "result")}
    shown.update(_data(row["data"]))
    if "result" in row:
        shown.update({"result": None} if row["result"] is None else _data(row["result"], "result"))
    return shown
