"""Completion hooks' deliveries: listed and read (`feedproc hooks`, `hooks show`) with a read token,
retried (`hooks retry`) with an operate token. A hook's id is also the `Idempotency-Key` its
receiver saw."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from ..core.hooks import FAILED
from ..core.models import QUEUE_PATTERN
from ..core.views import listed_json
from .common import INT64, _feed
from .errors import ApiError
from .gate import Operating, Reading

router = APIRouter()

HookId = Annotated[int, Path(ge=1, le=INT64, description="a hook's id (its Idempotency-Key)")]


@router.get("/hooks", dependencies=Reading, tags=["hooks"])
def list_hooks(
    request: Request,
    status: Literal["pending", "sent", "failed"] | None = None,
    queue: Annotated[str | None, Query(pattern=QUEUE_PATTERN.pattern)] = None,
    key: Annotated[str | None, Query(min_length=1, max_length=200, description="a partition key")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    before: Annotated[int | None, Query(ge=1, le=INT64, description="the last id of the previous page")] = None,
) -> dict[str, Any]:
    """Completion hooks' deliveries, newest first (`feedproc hooks --json`), without their payloads:
    `{"hooks": [...], "next": ID}`; pass `next` as `before` for the next page (null: no more)."""
    rows = listed_json(_feed(request).hooks(status=status, queue=queue, key=key, limit=limit, before=before))
    return {"hooks": rows, "next": rows[-1]["id"] if len(rows) == limit else None}


@router.get("/hooks/{hook_id}", dependencies=Reading, tags=["hooks"])
def get_hook(hook_id: HookId, request: Request) -> dict[str, Any]:
    """One hook's delivery with its `payload`, the summary its receiver is sent (`feedproc hooks
    show ID --json`); 404 when there is none of that id."""
    return _feed(request).hook(hook_id).to_json()


@router.post("/hooks/{hook_id}/retry", dependencies=Operating, tags=["hooks"])
def retry_hook(hook_id: HookId, request: Request) -> dict[str, Any]:
    """A failed hook pending again, due now with fresh attempts (`feedproc hooks retry ID`):
    `{"retried": 1, "hook": {...}}`. 409 when it is not failed (pending: it is being delivered;
    sent: it was), 404 when there is none of that id."""
    feed = _feed(request)
    count = feed.retry_hooks([hook_id])
    hook = feed.hook(hook_id)
    if not count and hook.status != FAILED:  # not failed (now): say what it is instead
        raise ApiError(409, f"hook {hook_id} is {hook.status}, not failed: only a failed hook is retried")
    return {"retried": count, "hook": hook.to_json()}


class HookSelection(BaseModel):
    """Hooks to retry: by id, or every failed one (of a queue)."""

    model_config = ConfigDict(extra="forbid")
    ids: list[Annotated[int, Field(ge=1, le=INT64, strict=True)]] | None = Field(None, min_length=1, max_length=1000)
    failed: bool = Field(False, strict=True, description="every failed hook (of `queue`)")
    queue: str | None = Field(None, pattern=QUEUE_PATTERN.pattern)


@router.post("/hooks/retry", dependencies=Operating, tags=["hooks"])
def retry_hooks(body: HookSelection, request: Request) -> dict[str, Any]:
    """Failed hooks pending again, due now with fresh attempts (`feedproc hooks retry ID... |
    --failed [--queue Q]`): those of `ids`, or with `"failed": true` every failed one (of `queue`).
    `{"retried": N}`: hooks of `ids` that are not failed are left alone and not counted. 400 for
    neither or both, 404 for an id that does not exist (nothing is retried then)."""
    if (body.ids is None) == (not body.failed):
        raise ApiError(400, 'give ids, or "failed": true, not both' if body.failed else 'give ids, or "failed": true')
    return {"retried": _feed(request).retry_hooks(body.ids or (), failed=body.failed, queue=body.queue)}
