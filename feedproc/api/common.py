"""What the route modules share: the bearer-token dependencies, the request body limit, the types of
gates, keys and ids in paths and bodies, and the helpers that turn a request into `Feed` calls and
`Feed` rows into answers."""

from __future__ import annotations

import base64
import hmac
import json
from typing import Annotated, Any

from fastapi import Depends, Path, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import Field
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..core.errors import InvalidInput
from ..core.models import KEY_PATTERN, MAX_DEPTH, check_key, json_depth
from ..core.naming import GATE_NAME_PATTERN
from ..feed import Feed
from ..gatenames import GateNames
from .errors import ApiError

DEFAULT_MAX_BODY = 10 * 1024 * 1024
GATE_NAME = f"^{GATE_NAME_PATTERN.pattern}$"
INT32 = 2**31 - 1
INT64 = 2**63 - 1

#: A gate: its number, or its name in the queue's pipeline (a name never starts with a digit: "1" is
#: neither, as before names). A well-formed name the pipeline lacks is a 400 naming it.
GateIn = Annotated[int, Field(ge=0, le=INT32, strict=True)] | Annotated[str, Field(pattern=GATE_NAME)]
GATE_HELP = "a gate number, or the name of a gate in the pipeline of the partition's queue"

KeyPath = Annotated[str, Path(pattern=KEY_PATTERN.pattern, description="a partition key; may contain '/'")]


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


Mutating = [Depends(require_token)]


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


AddingItems = [*Mutating, Depends(within_max_items)]


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
