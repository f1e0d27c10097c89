"""What the route modules share: the request body limit, the types of
gates, keys and ids in paths and bodies, and the helpers that turn a request into `Feed` calls and
`Feed` rows into answers."""

from __future__ import annotations

import base64
import json
from typing import Annotated, Any

from fastapi import Path, Request
from fastapi.responses import JSONResponse
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


# ---------------------------------------------------------------- limits


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
