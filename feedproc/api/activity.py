"""The work across the fleet, as the dashboard shows it: the watchers and the leases they hold,
recently failed partitions (and retrying them in bulk), items in flight now, and throughput over
the last hour or day."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from ..core.models import QUEUE_PATTERN
from ..core.views import listed_json
from ..gate_labels import GateNames
from .common import _feed, _key
from .gate import Operating, Reading

router = APIRouter()


@router.get("/watchers", dependencies=Reading, tags=["watchers"])
def list_watchers(request: Request) -> dict[str, Any]:
    """Registered watchers (heartbeat, liveness, lease counts) and the leases held now."""
    feed = _feed(request)
    return {"watchers": listed_json(feed.watchers()), "leases": GateNames(feed).rows(listed_json(feed.leases()))}


@router.get("/failures", dependencies=Reading, tags=["partitions"])
def failures(request: Request, limit: Annotated[int, Query(ge=1, le=100)] = 20) -> dict[str, Any]:
    """The most recently failed partitions, each with one of its errors."""
    feed = _feed(request)
    return {"items": GateNames(feed).rows(listed_json(feed.recent_failures(limit=limit)))}


class FailedSelection(BaseModel):
    """Failed partitions to retry in bulk: by queue, key prefix and error text (all optional)."""

    model_config = ConfigDict(extra="forbid")
    queue: str | None = Field(None, pattern=QUEUE_PATTERN.pattern)
    prefix: str | None = Field(None, max_length=200)
    error: str | None = Field(None, min_length=1, max_length=200)
    limit: int = Field(100, ge=1, le=500, strict=True)


@router.post("/failures/retry", dependencies=Operating, tags=["actions"])
def retry_failures(body: FailedSelection, request: Request) -> dict[str, Any]:
    """Retry failed partitions in bulk, up to `limit` in key order, each as `POST
    /partitions/{key}/retry` would: `{"retried": [{"key", "retried"}...]}` with the count of items
    put back to work per partition."""
    prefix = _key(body.prefix) if body.prefix else None
    return {"retried": _feed(request).retry_failed(queue=body.queue, prefix=prefix, error=body.error, limit=body.limit)}


@router.get("/running", dependencies=Reading, tags=["partitions"])
def running(
    request: Request,
    queue: Annotated[str | None, Query(pattern=QUEUE_PATTERN.pattern)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> dict[str, Any]:
    """Items in flight now, longest running first: watcher deliveries and worker or callback claims,
    with gate, attempt, who has it, elapsed seconds (once a heartbeat reported it) and progress."""
    feed = _feed(request)
    return {"items": GateNames(feed).rows(listed_json(feed.running(queue=queue, limit=limit)))}


@router.get("/throughput", dependencies=Reading, tags=["partitions"])
def throughput(
    request: Request,
    span: Literal["hour", "day"] = "hour",
    queue: Annotated[str | None, Query(pattern=QUEUE_PATTERN.pattern)] = None,
) -> dict[str, Any]:
    """Items added, processed, completed and failed per minute (last hour) or per 15 minutes (last
    day), with the backlog at the end of each step: the dashboard's charts."""
    seconds, step = SPANS[span]
    return _feed(request).throughput(seconds=seconds, step=step, queue=queue).to_json()


#: Chart spans: (seconds, step).
SPANS = {"hour": (3600, 60), "day": (86400, 900)}
