"""The dashboard of `feedproc serve`: server-side Jinja2 templates (autoescaped: keys, data and
errors are always escaped) and a little plain JavaScript that re-fetches the live part of the page
every two seconds, draws the charts (uPlot, bundled under static/vendor) and sends actions to the
API with the bearer token the operator typed in.

Pages: `/` (summary, throughput and backlog charts, partitions with filters and sorting, watchers,
recent failures), `/running` (items in flight now), `/hooks` (completion hooks failed and pending,
with retry), `/queues` and `/queues/NAME` (settings and hooks, slots,
backlog per gate, charts, pause/resume), `/partitions/KEY` (gates with timings and ETA, failed items,
items a page at a time, history) and `/items/ID` (data, deliveries with tracebacks, actions). Each
page's live part is also served alone under `/ui/...` for the refresh; times show relative, with
the ISO time on hover.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader
from markupsafe import Markup, escape

from .api.common import expensive
from .api.gate import Reading
from .core.errors import InvalidInput, NotFound
from .core.models import KEY_PATTERN, QUEUE_PATTERN, STATUSES, check_key, check_queue
from .core.views import listed_json
from .feed import Feed
from .gate_labels import GateNames, with_name
from .report import tolerated_text

HERE = Path(__file__).resolve().parent
PAGE = 50  # partitions per page
ITEMS_PAGE = 100
DATA_SHOWN = 200_000  # characters of an item's data shown on its page (the download has it all)
REFRESH_MS = 2000
SORTS = {"activity": "recent activity", "key": "key", "priority": "priority", "age": "age"}
INT64 = 2**63 - 1
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


def ago(moment: str | None) -> Markup:
    """An ISO time as `<time>`: relative ("3m ago", "in 20s"), the ISO time on hover."""
    if not moment:
        return Markup("")
    try:
        then = datetime.fromisoformat(moment)
    except ValueError:
        return Markup(escape(moment))
    seconds = (datetime.now(UTC) - then).total_seconds()
    text = f"{duration(abs(seconds))} ago" if seconds >= 0 else f"in {duration(-seconds)}"
    return Markup('<time datetime="{0}" title="{0}">{1}</time>').format(moment, text)


def duration(seconds: Any) -> str:
    """Seconds as a short human duration: 850ms, 42s, 3m 5s, 2h 10m, 3d 4h ("" for no number)."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return ""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


templates.env.filters.update(keypath=key_path, ago=ago, duration=duration, tolerated=tolerated_text)
router = APIRouter(include_in_schema=False, dependencies=Reading)  # pages are reads (Basic works: browsers)


def install(app: FastAPI) -> None:
    """Add the dashboard's pages and static files to `app`."""
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")


def gate_bars(
    counts: dict[str, dict[str, int]],
    current: int,
    names: dict[int, str] | None = None,
    tolerated: dict[str, dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """One progress bar per gate: complete or cancelled out of all its items; failed ones apart, so a
    gate whose items all failed reads 0% done with its failures, never 100%. `names`: the gates'
    names in the queue's pipeline (shown beside the numbers); `tolerated`: the status' failures its
    gates tolerate (such a gate's failures read "2 failed, tolerated: 5% allowed", not as failed)."""
    names, tolerated = names or {}, tolerated or {}
    bars = []
    for gate, c in sorted(counts.items(), key=lambda kv: int(kv[0])):
        total = sum(c.values())
        done = c["complete"] + c["cancelled"]
        bars.append(
            {
                "gate": int(gate),
                "name": names.get(int(gate)),
                "total": total,
                "done": done,
                "failed": c["failed"],
                "available": c["available"],
                "percent": 100 * done // total if total else 100,
                "current": int(gate) == current,
                "tolerated": tolerated.get(gate),
            }
        )
    return bars


def overall(items: dict[str, int], status: str) -> int:
    """A partition's progress in percent, as its gate bars count: items done (complete, or cancelled:
    they need no work) out of all, failed ones apart. A complete partition is 100%; a failed or
    cancelled one shows how far it got, its complete items (counting its failed and cancelled ones
    as finished made a failed partition with nothing complete read 66%)."""
    total = items["total"]
    if status == "complete" or not total:
        return 100
    done = items["complete"] + (items["cancelled"] if status == "available" else 0)
    return 100 * done // total


def _render(request: Request, name: str, context: dict[str, Any], status: int = 200) -> HTMLResponse:
    response = templates.TemplateResponse(
        request, name, {"refresh_ms": REFRESH_MS, "path": request.url.path, **context}, status_code=status
    )
    response.headers.update(SECURITY_HEADERS)
    return response


def _missing(request: Request, message: str) -> HTMLResponse:
    return _render(request, "missing.html", {"message": message}, status=404)


# ---------------------------------------------------------------- filters from the address bar


def _clean(value: str | None, pattern: Any) -> str | None:
    """A filter from the address bar: anything a key or queue could not contain is dropped."""
    return value if value and pattern.fullmatch(value) else None


def _filters(request: Request) -> dict[str, Any]:
    q = request.query_params
    status = q.get("status") if q.get("status") in STATUSES else None
    sort = q.get("sort") if q.get("sort") in SORTS else "activity"
    error = " ".join((q.get("error") or "").replace("\x00", " ").split())[:200] or None
    try:
        offset = max(0, min(int(q.get("offset") or 0), 1_000_000))
    except ValueError:
        offset = 0
    return {
        "status": status,
        "queue": _clean(q.get("queue"), QUEUE_PATTERN),
        "prefix": _clean(q.get("prefix"), KEY_PATTERN),
        "error": error,
        "sort": sort,
        "after": _clean(q.get("after"), KEY_PATTERN) if sort == "key" else None,
        "offset": offset if sort != "key" else 0,
    }


def _link(base: str, **params: Any) -> str:
    kept = {k: v for k, v in params.items() if v not in (None, "", 0)}
    return base + ("?" + urlencode(kept) if kept else "")


# ---------------------------------------------------------------- page contexts


def _overview(feed: Feed, f: dict[str, Any]) -> dict[str, Any]:
    partitions = listed_json(
        feed.partitions(
            status=f["status"],
            queue=f["queue"],
            prefix=f["prefix"],
            error=f["error"],
            sort=f["sort"],
            after=f["after"],
            offset=f["offset"],
            limit=PAGE,
        )
    )
    names = GateNames(feed)
    for p in partitions:
        p["bars"] = gate_bars(p["gates"], p["gate"], names.of(p["queue"]), p.get("tolerated"))
        p["percent"] = overall(p["items"], p["status"])
    leases: dict[str, list[dict[str, Any]]] = {}
    for lease in listed_json(feed.leases(limit=500)):
        leases.setdefault(lease["owner"], []).append(lease)
    base = {k: f[k] for k in ("status", "queue", "prefix", "error")}
    sorted_by = {} if f["sort"] == "activity" else {"sort": f["sort"]}
    full = len(partitions) == PAGE
    if f["sort"] == "key":
        next_page = _link("/", **base, **sorted_by, after=partitions[-1]["key"]) if full else None
    else:
        next_page = _link("/", **base, **sorted_by, offset=f["offset"] + PAGE) if full else None
    return {
        "counts": feed.partition_counts(),  # not item totals: those would count every item, every refresh
        "partitions": partitions,
        "f": f,
        "next_page": next_page,
        "first_page": _link("/", **base, **sorted_by) if (f["after"] or f["offset"]) else None,
        "status_link": lambda s: _link("/", **{**base, "status": s}, **sorted_by),
        "sort_link": lambda s: _link("/", **base, sort=None if s == "activity" else s),
        "sorts": SORTS,
        "queues": [q.name for q in feed.queues()],
        "watchers": listed_json(feed.watchers()),
        "leases": leases,
        "failures": names.rows(listed_json(feed.recent_failures(limit=10))),
        "statuses": STATUSES,
        "bulk": {k: v for k, v in base.items() if k in ("queue", "prefix", "error") and v},
    }


def _partition(feed: Feed, key: str, after: int) -> dict[str, Any]:
    status = feed.status(key, history=50).to_json()
    named = GateNames(feed)
    names = named.of(status["queue"])  # the gates' names, when its queue has a pipeline
    timings = feed.timings(key).to_json()
    return {
        "p": named.status(status),
        "gate_rows": gate_bars(status["gates"], status["gate"], names, status.get("tolerated")),
        "percent": overall(status["items"], status["status"]),
        "timings": timings["gates"],
        "current": with_name(timings["current"], names) if timings["current"] else None,
        "items": [
            with_name({**item, "data": item["data"][:300].decode("utf-8", errors="replace")}, names)
            for item in listed_json(feed.items(key, after_id=after, limit=ITEMS_PAGE))
        ],
        "items_after": after,
        "items_page": ITEMS_PAGE,
    }


def _pretty(raw: bytes) -> str:
    """Stored bytes pretty-printed as JSON, or as text when they are not JSON."""
    try:
        return json.dumps(json.loads(raw), indent=2, ensure_ascii=False)
    except ValueError:
        return raw.decode("utf-8", errors="replace")


def _item(feed: Feed, item_id: int) -> dict[str, Any]:
    item = GateNames(feed).item(feed.item(item_id).to_json())
    raw: bytes = item["data"]
    pretty = _pretty(raw)
    result: bytes | None = item["result"]  # what it produced (fan-in), kept apart from its data
    shown_result = _pretty(result) if result is not None else None
    return {
        "i": item,
        "data": pretty[:DATA_SHOWN],
        "data_cut": len(pretty) > DATA_SHOWN,
        "size": len(raw),
        "result": shown_result[:DATA_SHOWN] if shown_result is not None else None,
        "result_cut": shown_result is not None and len(shown_result) > DATA_SHOWN,
        "result_size": len(result) if result is not None else 0,
        "history": list(reversed(item["history"])),
    }


def _queue(feed: Feed, name: str) -> dict[str, Any]:
    queue = feed.queue(check_queue(name)).to_json()
    names = GateNames(feed).of(name)
    return {
        "q": queue,
        "backlog": feed.backlog_by_gate(name),
        "gate_names": names,
        "running": [with_name(r, names) for r in listed_json(feed.running(queue=name, limit=50))],
        "partitions": [
            with_name(p, names)
            for p in listed_json(feed.partitions(queue=name, status="available", sort="activity", limit=20))
        ],
        "hour": feed.throughput(queue=name, seconds=3600, step=300).to_json(),
    }


# ---------------------------------------------------------------- routes


def _page(request: Request, template: str, context: dict[str, Any], live: str) -> HTMLResponse:
    return _render(request, template, {**context, "live_src": live})


@router.get("/", response_class=HTMLResponse)
def overview_page(request: Request) -> HTMLResponse:
    context = _overview(request.app.state.feed, _filters(request))
    return _page(request, "overview.html", context, "/ui/overview?" + request.url.query)


@router.get("/ui/overview", response_class=HTMLResponse)
def overview_live(request: Request) -> HTMLResponse:
    return _render(request, "_overview.html", _overview(request.app.state.feed, _filters(request)))


@router.get("/running", response_class=HTMLResponse)
def running_page(request: Request) -> HTMLResponse:
    return _page(request, "running.html", _running(request.app.state.feed), "/ui/running")


@router.get("/ui/running", response_class=HTMLResponse)
def running_live(request: Request) -> HTMLResponse:
    return _render(request, "_running.html", _running(request.app.state.feed))


def _running(feed: Feed) -> dict[str, Any]:
    return {"running": GateNames(feed).rows(listed_json(feed.running()))}


#: Hooks of each state the hooks page lists (the newest).
HOOKS_SHOWN = 100


@router.get("/hooks", response_class=HTMLResponse)
def hooks_page(request: Request) -> HTMLResponse:
    return _page(request, "hooks.html", _hooks(request.app.state.feed), "/ui/hooks")


@router.get("/ui/hooks", response_class=HTMLResponse)
def hooks_live(request: Request) -> HTMLResponse:
    return _render(request, "_hooks.html", _hooks(request.app.state.feed))


def _hooks(feed: Feed) -> dict[str, Any]:
    """Failed hooks (to retry) and pending ones (being delivered), newest first."""
    return {
        "failed": listed_json(feed.hooks(status="failed", limit=HOOKS_SHOWN)),
        "pending": listed_json(feed.hooks(status="pending", limit=HOOKS_SHOWN)),
        "shown": HOOKS_SHOWN,
    }


@router.get("/queues", response_class=HTMLResponse)
async def queues_page(request: Request) -> HTMLResponse:
    return _page(request, "queues.html", await _queues(request), "/ui/queues")


@router.get("/ui/queues", response_class=HTMLResponse)
async def queues_live(request: Request) -> HTMLResponse:
    return _render(request, "_queues.html", await _queues(request))


async def _queues(request: Request) -> dict[str, Any]:
    """Queues with their gauges, which count over all items: a few at once (api.common.expensive)."""
    feed: Feed = request.app.state.feed
    return await expensive(request, lambda: {"queues": listed_json(feed.queues()), "gauges": feed.gauges()})


@router.get("/queues/{name}", response_class=HTMLResponse)
def queue_page(request: Request, name: str) -> HTMLResponse:
    try:
        context = _queue(request.app.state.feed, name)
    except InvalidInput as error:
        return _missing(request, str(error))
    return _page(request, "queue.html", context, f"/ui/queues/{quote(name, safe='')}")


@router.get("/ui/queues/{name}", response_class=HTMLResponse)
def queue_live(request: Request, name: str) -> HTMLResponse:
    try:
        return _render(request, "_queue.html", _queue(request.app.state.feed, name))
    except InvalidInput as error:
        return _missing(request, str(error))


@router.get("/items/{item_id}", response_class=HTMLResponse)
def item_page(request: Request, item_id: int = PathParam(ge=1, le=INT64)) -> HTMLResponse:
    try:
        context = _item(request.app.state.feed, item_id)
    except (InvalidInput, NotFound) as error:
        return _missing(request, str(error))
    return _page(request, "item.html", context, f"/ui/items/{item_id}")


@router.get("/ui/items/{item_id}", response_class=HTMLResponse)
def item_live(request: Request, item_id: int = PathParam(ge=1, le=INT64)) -> HTMLResponse:
    try:
        return _render(request, "_item.html", _item(request.app.state.feed, item_id))
    except (InvalidInput, NotFound) as error:
        return _missing(request, str(error))


@router.get("/items/{item_id}/data")
def item_data(request: Request, item_id: int = PathParam(ge=1, le=INT64)) -> Response:
    """An item's data exactly as stored, as a download."""
    try:
        data = request.app.state.feed.item(item_id).data
    except (InvalidInput, NotFound) as error:
        return Response(str(error), status_code=404, media_type="text/plain")
    headers = {"Content-Disposition": f'attachment; filename="item-{item_id}.json"', **SECURITY_HEADERS}
    return Response(data, media_type="application/octet-stream", headers=headers)


@router.get("/partitions/{key:path}", response_class=HTMLResponse)
def partition_page(request: Request, key: str, after: int = Query(0, ge=0, le=INT64)) -> HTMLResponse:
    try:
        context = _partition(request.app.state.feed, check_key(key), after)
    except (InvalidInput, NotFound) as error:
        return _missing(request, str(error))
    return _page(request, "partition.html", context, f"/ui/partitions/{key_path(key)}?after={after}")


@router.get("/ui/partitions/{key:path}", response_class=HTMLResponse)
def partition_live(request: Request, key: str, after: int = Query(0, ge=0, le=INT64)) -> HTMLResponse:
    try:
        context = _partition(request.app.state.feed, check_key(key), after)
    except (InvalidInput, NotFound) as error:
        return _missing(request, str(error))
    return _render(request, "_partition.html", context)
