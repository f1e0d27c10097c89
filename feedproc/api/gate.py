"""The gate in front of every request to `feedproc serve`: it checks the Host header, finds the
route the request is for and the scope that route declares, and checks the token, all before
anything reads the request body. A refusal is `{"error": ...}` with 400 (Host), 401 (no or an
unknown token) or 403 (a token without the scope, or a server with no token for it).

A route declares its scope with one of the dependencies below (`dependencies=Operating`, or a
`Grant` parameter such as `grant: Annotated[Grant, Depends(working)]` when the route needs it):
the gate reads it off the matched route, and OpenAPI documents it. A route that declares none is
a read if it only reads (GET: FastAPI's OpenAPI document and its viewers), and `create_app`
refuses to start otherwise; the static files (the dashboard's and the docs' assets) are open.

The token comes from `Authorization: Bearer TOKEN`; reads also take `Authorization: Basic` with
the token as the password, so that a browser can open the dashboard (it prompts once). Nothing
that changes anything takes Basic: a browser attaches those credentials to requests other sites
make it send.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.openapi.models import HTTPBase as HTTPBaseModel
from fastapi.openapi.models import HTTPBearer as HTTPBearerModel
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.security.base import SecurityBase
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ..auth import ADMIN, ANONYMOUS, ENV, OPERATE, READ, WORKER, Access, Grant, host_allowed

OPEN = "open"
GRANT = "feedproc.grant"  # the ASGI scope key under which the gate leaves what the request may do
#: The static mounts, served to anyone (the package's own files: nothing of the database).
OPEN_MOUNTS = {"static", "static-offline-docs"}
#: What a scope allows, for refusals: "this token may not ...".
DOES = {READ: "read", OPERATE: "act on partitions and items", ADMIN: "change queues", WORKER: "use the worker API"}
#: The variables whose tokens have each scope, for "this server has no ... token".
GIVEN_BY = {
    READ: "FEEDPROC_READ_TOKENS, FEEDPROC_OPERATE_TOKENS, FEEDPROC_ADMIN_TOKENS or FEEDPROC_API_TOKEN",
    OPERATE: "FEEDPROC_OPERATE_TOKENS, FEEDPROC_ADMIN_TOKENS or FEEDPROC_API_TOKEN",
    ADMIN: "FEEDPROC_ADMIN_TOKENS or FEEDPROC_API_TOKEN",
    WORKER: f"{ENV[WORKER]}, FEEDPROC_WORKER_TOKEN or FEEDPROC_API_TOKEN",
}
BASIC_CHALLENGE = 'Basic realm="feedproc", charset="UTF-8"'


class _Documented(SecurityBase):
    """A security scheme for the OpenAPI document only: the gate has checked the request already."""

    def __init__(self, model: Any, scheme_name: str) -> None:
        self.model = model
        self.scheme_name = scheme_name

    async def __call__(self) -> None:
        return None


_bearer = _Documented(HTTPBearerModel(description="a token of the scope the call needs"), "HTTPBearer")
_basic = _Documented(
    HTTPBaseModel(scheme="basic", description="reads only: any user name, a read token as the password"),
    "HTTPBasic",
)


def _grant(request: Request) -> Grant:
    grant: Grant | None = request.scope.get(GRANT)
    if grant is None:  # the gate did not run: never serve a route unchecked
        raise RuntimeError("a route was reached without passing the gate")
    return grant


def reading(request: Request, _b: Annotated[None, Depends(_bearer)], _c: Annotated[None, Depends(_basic)]) -> Grant:
    """Reads: a token of any scope but worker (none needed where reads are open)."""
    return _grant(request)


def operating(request: Request, _b: Annotated[None, Depends(_bearer)]) -> Grant:
    """Actions on partitions and items, adding work, pausing queues: operate or admin."""
    return _grant(request)


def administering(request: Request, _b: Annotated[None, Depends(_bearer)]) -> Grant:
    """Queue settings (and, as they come, pipelines): admin."""
    return _grant(request)


def working(request: Request, _b: Annotated[None, Depends(_bearer)]) -> Grant:
    """The worker API: a worker token (the route checks the queue when the token has queues)."""
    return _grant(request)


def opened(request: Request) -> Grant:
    """Open to anyone who names the server right (probes)."""
    return _grant(request)


SCOPE_OF: dict[Any, str] = {reading: READ, operating: OPERATE, administering: ADMIN, working: WORKER, opened: OPEN}
Reading = [Depends(reading)]
Operating = [Depends(operating)]
Administering = [Depends(administering)]
Open = [Depends(opened)]


try:
    from fastapi.routing import iter_route_contexts
except ImportError:  # FastAPI before route contexts copied included routes into the app's own list

    def iter_route_contexts(routes: Any) -> Any:  # type: ignore[misc]
        return iter(routes)


Entry = tuple[re.Pattern[str], frozenset[str] | None, str]


def route_scopes(app: FastAPI) -> list[Entry]:
    """Each route of `app` in the order they are matched, as (path pattern, methods or None for
    any, the scope it needs). ValueError for a route that may change something and declares no
    scope, or declares two."""
    table: list[Entry] = []
    for route in iter_route_contexts(app.router.routes):
        original = getattr(route, "original_route", route)
        declared = set()
        if isinstance(original, APIRoute):
            declared = {SCOPE_OF[d.call] for d in route.dependant.dependencies if d.call in SCOPE_OF}
        given = getattr(route, "methods", None)
        methods = frozenset(given) if given else None
        if len(declared) > 1:
            raise ValueError(f"route {route.path} declares more than one scope: {sorted(declared)}")
        if declared:
            needed = declared.pop()
        elif isinstance(original, Mount) and original.name in OPEN_MOUNTS:
            needed = OPEN
        elif isinstance(original, Route) and methods is not None and methods <= {"GET", "HEAD"}:
            needed = READ  # FastAPI's own pages: the OpenAPI document, Swagger UI, ReDoc
        else:  # anything that may change something must say who may
            raise ValueError(f"route {getattr(route, 'path', route)!r} declares no scope")
        table.append((route.path_regex, methods, needed))
    return table


class Gate:
    """ASGI middleware, the outermost: Host, route, scope and token, before the body is read."""

    def __init__(self, app: ASGIApp, access: Access, routes: list[Entry]) -> None:
        self.app = app
        self.access = access
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.check(scope)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def check(self, scope: Scope) -> JSONResponse | None:
        """The answer that refuses this request, or None (and `scope[GRANT]` set) to let it in."""
        headers = dict(scope["headers"])
        host = headers.get(b"host")
        if host is not None and not host_allowed(host.decode("latin-1"), self.access.allowed_hosts):
            shown = host.decode("latin-1")[:100]
            return _refuse(400, f"host {shown!r} is not allowed; see --allowed-host")
        needed = self._scope_of(scope)
        if needed is None:  # no such route (404), or not with this method (405): the app says so
            return None
        if needed == OPEN or (needed == READ and self.access.open_reads):
            scope[GRANT] = ANONYMOUS
            return None
        challenge = [BASIC_CHALLENGE, "Bearer"] if needed == READ else ["Bearer"]
        tokens = self.access.tokens
        if not tokens.can(needed):
            read_only = ": it is read-only" if needed != READ else ""
            return _refuse(403, f"this server has no {needed} token ({GIVEN_BY[needed]}){read_only}")
        token, basic = _credentials(headers.get(b"authorization"))
        if basic and needed != READ:
            return _refuse(401, "this call needs a bearer token (Basic is for reads only)", challenge)
        grant = tokens.grant(token) if token else None
        if grant is None:
            return _refuse(401, "missing or wrong bearer token", challenge)
        if not grant.allows(needed):
            return _refuse(403, f"this token may not {DOES[needed]}: that needs the {needed} scope")
        scope[GRANT] = grant
        return None

    def _scope_of(self, scope: Scope) -> str | None:
        path, method, root = scope["path"], scope["method"], scope.get("root_path", "")
        if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("", "/"):  # as Starlette routes
            path = path[len(root) :]
        for pattern, methods, needed in self.routes:
            if (methods is None or method in methods) and pattern.match(path):
                return needed
        return None


def _credentials(header: bytes | None) -> tuple[str | None, bool]:
    """The token of an Authorization header, and whether it came as Basic (the password)."""
    if not header:
        return None, False
    kind, _, value = header.decode("latin-1").partition(" ")
    if kind.lower() == "bearer":
        return value.strip() or None, False
    if kind.lower() == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None, True
        return decoded.partition(":")[2] or None, True
    return None, False


def _refuse(status: int, message: str, challenges: list[str] | None = None) -> JSONResponse:
    response = JSONResponse({"error": message}, status_code=status)
    for challenge in challenges or ():
        response.headers.append("WWW-Authenticate", challenge)
    return response
