"""The worker API, for pull workers (`feedproc.worker`) and callback handlers: claim a pull-mode
queue's ready items (long-polling when none is), keep a claim alive with heartbeats, answer it (one
at a time or many in one transaction) or release it unanswered. These take a worker token; one
limited to queues claims from those alone and answers only their items (403 otherwise). A claim's
token that no longer holds its item is a 409 with a `reason`."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterable
from typing import Annotated, Any, TypeGuard

from fastapi import APIRouter, Body, Depends, Path, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from ..auth import Grant
from ..core.errors import FeedprocError, StaleClaim
from ..core.models import MAX_PRIORITY, MIN_PRIORITY, QUEUE_PATTERN
from ..feed import Feed
from .collected import results_url
from .common import INT64, _data, _feed
from .errors import ApiError
from .gate import working

router = APIRouter()

Worker = Annotated[Grant, Depends(working)]
QueuePath = Annotated[str, Path(pattern=QUEUE_PATTERN.pattern)]
ItemPath = Annotated[int, Path(ge=1, le=INT64)]


class ClaimRequest(BaseModel):
    """A pull worker asks for items."""

    model_config = ConfigDict(extra="forbid")
    worker: str = Field(..., min_length=1, max_length=120, description="the worker's name (history, records)")
    max: int = Field(10, ge=1, le=1000, strict=True, description="items at most")
    lease_seconds: float = Field(60.0, ge=1, le=86400, description="how long each claim holds without a heartbeat")
    wait: float = Field(0.0, ge=0, le=60, description="seconds to wait for work when none is ready (long poll)")
    min_priority: int | None = Field(
        None, ge=MIN_PRIORITY, le=MAX_PRIORITY, strict=True, description="only partitions of this priority or higher"
    )
    max_priority: int | None = Field(
        None, ge=MIN_PRIORITY, le=MAX_PRIORITY, strict=True, description="only partitions of this priority or lower"
    )


class Heartbeat(BaseModel):
    """A worker still works on a claimed item."""

    model_config = ConfigDict(extra="forbid")
    token: str = Field(..., min_length=1, max_length=64)
    progress: float | None = Field(None, ge=0, le=1)
    lease_seconds: float | None = Field(None, ge=1, le=86400, description="a new lease length, from now")


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


_OUTSIDE = "item {} is not in a queue this token may work on"


def _is_id(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= INT64


def _outside(feed: Feed, grant: Grant, item_ids: Iterable[Any]) -> set[int]:
    """Those of `item_ids` (those that are ids) whose queue `grant` may not work on: one query, made
    only for a token limited to queues. An unknown item is not among them (its answer is the 404)."""
    if grant.queues is None:
        return set()
    wanted = [item_id for item_id in item_ids if _is_id(item_id)]
    queues = feed.queues_of_items(wanted) if wanted else {}
    return {item_id for item_id, queue in queues.items() if not grant.may_work_on(queue)}


def _check_item(feed: Feed, grant: Grant, item_id: int) -> None:
    if _outside(feed, grant, [item_id]):
        raise ApiError(403, _OUTSIDE.format(item_id))


def _fast_json(body: dict[str, Any]) -> Any:
    """`body` as a JSON response, encoded by `json` alone (its values are JSON types already)."""
    return Response(json.dumps(body, separators=(",", ":")), media_type="application/json")


@router.post("/queues/{queue}/claim", tags=["workers"])
async def claim(queue: QueuePath, body: ClaimRequest, request: Request, grant: Worker) -> dict[str, Any]:
    """Claim up to `max` ready items of a pull-mode queue, each held for `lease_seconds` unless a
    heartbeat extends it; with `wait`, hold the request up to that many seconds until there is
    work. Items come only from their partition's current gate, in priority order, and with
    `min_priority` / `max_priority` only from partitions of a priority in that range. Each item:
    id, partition, queue, gate, attempt, deliveries, data (or data_base64), token, lease_expires_at; a fan-in
    item also `collected` ({"gate", "count", "failed", "results" or "results_url"}, the URL
    authorised by the claim's token) and `accumulated`. 409 when the queue is not in pull mode; 403
    when the token may not claim from it."""
    if not grant.may_work_on(queue):
        raise ApiError(403, f"this token may not claim from queue {queue!r}")
    feed: Feed = _feed(request)
    board: ReadyBoard = request.app.state.ready_board
    loop = asyncio.get_running_loop()
    deadline = loop.time() + body.wait
    while True:
        claimed = await run_in_threadpool(
            feed.claim,
            queue,
            body.worker,
            max_items=body.max,
            lease_seconds=body.lease_seconds,
            min_priority=body.min_priority,
            max_priority=body.max_priority,
        )
        if await request.is_disconnected():  # the worker gave up (stopping): nobody will hear of these
            for entry in claimed:
                await run_in_threadpool(feed.release, entry["id"], entry["token"])
            return {"items": []}
        remaining = deadline - loop.time()
        if claimed or remaining <= 0:
            break
        await board.wait(remaining)
    for entry in claimed:  # a fan-in item whose results are too many to send: where to read them
        pages = entry.get("collected", {}).pop("pages", None)
        if pages is not None:
            url = results_url(str(request.base_url), entry["id"], entry["token"], pages["after"], pages["until"])
            entry["collected"]["results_url"] = url
    # A ready-made JSON body: FastAPI's encoder walks every value in Python (a third of the time of
    # a claim of 100 items).
    return _fast_json({"items": [{**{k: v for k, v in c.items() if k != "data"}, **_data(c["data"])} for c in claimed]})


@router.post("/items/{item_id}/heartbeat", tags=["workers"])
def heartbeat(item_id: ItemPath, body: Heartbeat, request: Request, grant: Worker) -> dict[str, Any]:
    """Extend a claim (by its lease, or a new `lease_seconds`) and keep `progress` (0..1). 409 with
    `reason` ("expired", "cancelled", "superseded") when the token no longer holds the item."""
    _check_item(_feed(request), grant, item_id)
    expires = _feed(request).heartbeat(item_id, body.token, progress=body.progress, lease_seconds=body.lease_seconds)
    return {"id": item_id, "lease_expires_at": expires}


@router.post("/items/{item_id}/answer", tags=["workers"])
def answer(
    item_id: ItemPath,
    request: Request,
    grant: Worker,
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
    """Answer a claimed item, as a handler would answer its request; 400 for a malformed answer,
    413 for one with more children than `--max-children` (default 100,000) and 409 with `reason`
    when the token no longer holds the item (nothing changes then)."""
    token = body.get("token")
    if not isinstance(token, str) or not 1 <= len(token) <= 64:
        raise ApiError(400, "token: the claim's token (a string) is required")
    fields = {k: v for k, v in body.items() if k != "token"}
    _check_item(_feed(request), grant, item_id)
    return _feed(request).answer(item_id, token, fields, max_children=request.app.state.max_children)


class AnswerBatch(BaseModel):
    """Many answers at once, each `{"id", "token", <answer fields>}`."""

    model_config = ConfigDict(extra="forbid")
    answers: list[dict[str, Any]] = Field(..., min_length=1, max_length=1000)


@router.post("/answers", tags=["workers"])
def answer_many(body: AnswerBatch, request: Request, grant: Worker) -> dict[str, Any]:
    """Answer many claimed items in one transaction (a worker's group commit). Each answer is
    judged alone: `results` holds, in order, `{"id", "status": 200, "outcome", ...}` or
    `{"id", "status": 400 | 403 | 404 | 409 | 413, "error"[, "reason"]}`; the refused ones change
    nothing (403: the item is in a queue the token may not work on; 413: more children than
    `--max-children`)."""
    results: list[dict[str, Any] | None] = [None] * len(body.answers)
    batch: list[tuple[int, str, dict[str, Any]]] = []
    where: list[int] = []
    outside = _outside(_feed(request), grant, (entry.get("id") for entry in body.answers))
    for n, entry in enumerate(body.answers):
        item_id, token = entry.get("id"), entry.get("token")
        if not _is_id(item_id):
            results[n] = {"id": item_id, "status": 400, "error": "id: an item id is required"}
        elif not isinstance(token, str) or not 1 <= len(token) <= 64:
            results[n] = {"id": item_id, "status": 400, "error": "token: the claim's token (a string) is required"}
        elif item_id in outside:
            results[n] = {"id": item_id, "status": 403, "error": _OUTSIDE.format(item_id)}
        else:
            batch.append((item_id, token, {k: v for k, v in entry.items() if k not in ("id", "token")}))
            where.append(n)
    written = _feed(request).answer_many(batch, max_children=request.app.state.max_children) if batch else []
    for n, result in zip(where, written, strict=True):
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


@router.post("/items/{item_id}/release", tags=["workers"])
def release(item_id: ItemPath, body: TokenOnly, request: Request, grant: Worker) -> dict[str, Any]:
    """Hand a claimed item back unanswered (a worker stopping): ready again at once, no attempt
    counted. 409 with `reason` when the token no longer holds the item."""
    _check_item(_feed(request), grant, item_id)
    _feed(request).release(item_id, body.token)
    return {"id": item_id, "released": True}
