"""The API's documentation pages (Swagger UI at /api/v1/docs, Redoc at /api/v1/redoc) under a
content security policy, as the dashboard's pages are: scripts only from this server, plus the
inline script each page carries, allowed by its hash (so injected markup could not run), and no
framing by other sites (`frame-ancestors 'none'`).

The pages come from FastAPI (through fastapi-offline, which serves their assets from the package);
their inline scripts are hashed as they are sent, so the policy follows whatever FastAPI renders
(a root path included)."""

from __future__ import annotations

import base64
import hashlib
import re

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_INLINE_SCRIPT = re.compile(rb"<script(?![^>]*\bsrc=)[^>]*>(.*?)</script>", re.DOTALL | re.IGNORECASE)
# Inline styles stay allowed: Swagger UI and Redoc style their elements from script; a style cannot run code.
POLICY = (
    "default-src 'self'; script-src 'self'{hashes}; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)


def policy_for(page: bytes) -> str:
    """The content security policy of `page`: its inline scripts allowed by their SHA-256, nothing else inline."""
    hashes = "".join(
        f" 'sha256-{base64.b64encode(hashlib.sha256(script).digest()).decode()}'"
        for script in _INLINE_SCRIPT.findall(page)
    )
    return POLICY.format(hashes=hashes)


class DocsPolicy:
    """ASGI middleware: the documentation pages at `paths` get `policy_for` their own body (they
    are a few kilobytes, read whole), `X-Frame-Options: DENY` and `nosniff`."""

    def __init__(self, app: ASGIApp, paths: tuple[str, ...]) -> None:
        self.app = app
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        body = bytearray()

        async def hold(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            body.extend(message.get("body", b""))
            if message.get("more_body", False) or start is None:
                return
            headers = MutableHeaders(scope=start)
            headers["Content-Security-Policy"] = policy_for(bytes(body))
            headers["X-Frame-Options"] = "DENY"
            headers["X-Content-Type-Options"] = "nosniff"
            await send(start)
            await send({"type": "http.response.body", "body": bytes(body)})

        await self.app(scope, receive, hold)
