"""The dashboard of `feedproc serve`: server-side Jinja2 templates (autoescaped: keys, data and
errors are always escaped) and a little plain JavaScript that re-fetches the live part of the page
every two seconds and sends retry/cancel to the API with the bearer token the operator typed in.

Pages: `/` (summary, partitions by status with per-gate progress bars, watchers with their leases
and heartbeats, recent failures) and `/partitions/KEY` (gates, failed items, items, history). Each
page's live part is also served alone under `/ui/...` for the refresh.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader
from starlette.datastructures import URL

from .core.errors import InvalidInput, NotFound
from .core.models import KEY_PATTERN, STATUSES, check_key
from .feed import Feed

HERE = Path(__file__).resolve().parent
PAGE = 50  # partitions per page
ITEMS_PAGE = 100
REFRESH_MS = 2000
# No inline script or style anywhere: the policy forbids them, so injected markup could not run.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}

templates = Jinja2Templates(env=Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=True))


def key_path(key: str) -> str:
    """A partition key as one URL path segment (`/` escaped too), so that a browser never resolves a
    key such as `x/../victim` into another partition's address."""
    return quote(key, safe="")


templates.env.filters["keypath"] = key_path
router = APIRouter(include_in_schema=False)


def install(app: FastAPI) -> None:
    """Add the dashboard's pages and static files to `app`."""
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")


def gate_bars(counts: dict[str, dict[str, int]], current: int) -> list[dict[str, Any]]:
    """One progress bar per gate: finished (complete, failed, cancelled) out of all its items."""
    bars = []
    for gate, c in sorted(counts.items(), key=lambda kv: int(kv[0])):
        total = sum(c.values())
        done = c["complete"] + c["failed"] + c["cancelled"]
        bars.append(
            {
                "gate": int(gate),
                "total": total,
                "done": done,
                "failed": c["failed"],
                "percent": 100 * done // total if total else 100,
                "current": int(gate) == current,
            }
        )
    return bars


def overall(items: dict[str, int]) -> int:
    """Percent of a partition's items that are finished."""
    total = items["total"]
    return 100 * (total - items["available"]) // total if total else 100


def _render(request: Request, name: str, context: dict[str, Any], status: int = 200) -> HTMLResponse:
    response = templates.TemplateResponse(request, name, {"refresh_ms": REFRESH_MS, **context}, status_code=status)
    response.headers.update(SECURITY_HEADERS)
    return response


def _overview(feed: Feed, status: str | None, prefix: str | None, after: str | None) -> dict[str, Any]:
    if status not in STATUSES:
        status = None
    # Filters come from the address bar: anything a key could not contain is dropped, never sent on.
    prefix = prefix if prefix and KEY_PATTERN.fullmatch(prefix) else None
    after = after if after and KEY_PATTERN.fullmatch(after) else None
    partitions = feed.partitions(status=status, prefix=prefix or None, after=after or None, limit=PAGE)
    for p in partitions:
        p["bars"] = gate_bars(p["gates"], p["gate"])
        p["percent"] = overall(p["items"])
    leases: dict[str, list[dict[str, Any]]] = {}
    for lease in feed.leases(limit=500):
        leases.setdefault(lease["owner"], []).append(lease)
    return {
        "counts": feed.partition_counts(),  # not item totals: those would count every item, every refresh
        "partitions": partitions,
        "next": partitions[-1]["key"] if len(partitions) == PAGE else None,
        "status": status,
        "prefix": prefix or "",
        "after": after or "",
        "watchers": feed.watchers(),
        "leases": leases,
        "failures": feed.recent_failures(limit=10),
        "statuses": STATUSES,
    }


def _partition(feed: Feed, key: str, after: int) -> dict[str, Any]:
    status = feed.status(key, history=50)
    return {
        "p": status,
        "gate_rows": gate_bars(status["gates"], status["gate"]),
        "percent": overall(status["items"]),
        "items": [
            {**item, "data": item["data"].decode("utf-8", errors="replace")}
            for item in feed.items(key, after_id=after, limit=ITEMS_PAGE)
        ],
        "items_after": after,
        "items_page": ITEMS_PAGE,
    }


def _query(request: Request) -> str:
    return URL(scope=request.scope).query


@router.get("/", response_class=HTMLResponse)
def overview_page(
    request: Request, status: str | None = None, prefix: str | None = None, after: str | None = None
) -> HTMLResponse:
    context = _overview(request.app.state.feed, status, prefix, after)
    return _render(request, "overview.html", {**context, "live_src": "/ui/overview?" + _query(request)})


@router.get("/ui/overview", response_class=HTMLResponse)
def overview_live(
    request: Request, status: str | None = None, prefix: str | None = None, after: str | None = None
) -> HTMLResponse:
    return _render(request, "_overview.html", _overview(request.app.state.feed, status, prefix, after))


@router.get("/partitions/{key:path}", response_class=HTMLResponse)
def partition_page(request: Request, key: str, after: int = Query(0, ge=0, le=2**63 - 1)) -> HTMLResponse:
    try:
        context = _partition(request.app.state.feed, check_key(key), after)
    except (InvalidInput, NotFound) as error:
        return _render(request, "missing.html", {"message": str(error)}, status=404)
    live = f"/ui/partitions/{key_path(key)}?after={after}"
    return _render(request, "partition.html", {**context, "live_src": live})


@router.get("/ui/partitions/{key:path}", response_class=HTMLResponse)
def partition_live(request: Request, key: str, after: int = Query(0, ge=0, le=2**63 - 1)) -> HTMLResponse:
    try:
        context = _partition(request.app.state.feed, check_key(key), after)
    except (InvalidInput, NotFound) as error:
        return _render(request, "missing.html", {"message": str(error)}, status=404)
    return _render(request, "_partition.html", context)
