"""An operator's actions on partitions and items: seal, retry, cancel, checkpoint, resubmit, remove or
reprioritise a partition (the commands of the same names), and retry, skip or cancel items, by id or
as every failed or available item of a partition. All need an operate token; a refusal is a 409 that
changes nothing."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, ConfigDict, Field

from ..core.models import MAX_PRIORITY, MIN_PRIORITY
from ..gate_labels import gate_filter
from .common import GATE_HELP, INT64, GateIn, KeyPath, _feed, _key, _status
from .errors import ApiError
from .gate import Operating

router = APIRouter()


@router.post("/partitions/{key:path}/seal", dependencies=Operating, tags=["actions"])
def seal(key: KeyPath, request: Request) -> dict[str, Any]:
    """No more items will be added (`feedproc seal`)."""
    feed = _feed(request)
    feed.seal(_key(key))
    return {"partition": _status(feed, key)}


@router.post("/partitions/{key:path}/retry", dependencies=Operating, tags=["actions"])
def retry(key: KeyPath, request: Request) -> dict[str, Any]:
    """A failed partition and its failed items back to work (`feedproc retry`); 409 unless failed."""
    feed = _feed(request)
    count = feed.retry(_key(key))
    return {"retried": count, "partition": _status(feed, key)}


@router.post("/partitions/{key:path}/cancel", dependencies=Operating, tags=["actions"])
def cancel(key: KeyPath, request: Request) -> dict[str, Any]:
    """Cancel a partition and its available items (`feedproc cancel`); 409 if complete."""
    feed = _feed(request)
    feed.cancel(_key(key))
    return {"partition": _status(feed, key)}


@router.post("/partitions/{key:path}/resubmit", dependencies=Operating, tags=["actions"])
def resubmit(key: KeyPath, request: Request) -> dict[str, Any]:
    """Run a finished partition again from its first gate with the items its producer added
    (`feedproc resubmit`): children its answers added go, attempts, errors, results and
    accumulators are reset, its history stays (a `resubmitted` event, by "api"). 409 while it is
    available."""
    feed = _feed(request)
    count = feed.resubmit(_key(key), by="api")
    return {"resubmitted": count, "partition": _status(feed, key)}


@router.delete("/partitions/{key:path}", dependencies=Operating, tags=["actions"])
def remove(key: KeyPath, request: Request) -> dict[str, Any]:
    """Delete a finished partition now with its items, history, delivery records, claims and
    accumulators (`feedproc remove`); 409 while it is available: cancel it first."""
    return {"key": key, "removed": _feed(request).remove(_key(key))}


@router.post("/partitions/{key:path}/checkpoint", dependencies=Operating, tags=["actions"])
def checkpoint(key: KeyPath, request: Request) -> dict[str, Any]:
    """Advance a manual-checkpoint partition whose gate has drained (`feedproc checkpoint`)."""
    feed = _feed(request)
    gate = feed.checkpoint(_key(key))
    return {"gate": gate, "partition": _status(feed, key)}


class PriorityChange(BaseModel):
    """A partition's new priority."""

    model_config = ConfigDict(extra="forbid")
    priority: int = Field(..., ge=MIN_PRIORITY, le=MAX_PRIORITY, strict=True, description="higher is leased first")


@router.post("/partitions/{key:path}/priority", dependencies=Operating, tags=["actions"])
def set_priority(key: KeyPath, body: PriorityChange, request: Request) -> dict[str, Any]:
    """Change a partition's priority (`feedproc priority KEY N`): its next lease and claim order
    follow it; recorded in its history (by "api") unless unchanged. 404 for an unknown key."""
    feed = _feed(request)
    was = feed.set_priority(_key(key), body.priority, by="api")
    return {"priority": body.priority, "was": was, "partition": _status(feed, key)}


class ItemSelection(BaseModel):
    """Items to act on: by id, or every failed or available item of a partition (at one gate)."""

    model_config = ConfigDict(extra="forbid")
    ids: list[Annotated[int, Field(ge=1, le=INT64, strict=True)]] | None = Field(None, min_length=1, max_length=1000)
    partition: str | None = Field(None, description="a partition key")
    gate: GateIn | None = Field(None, description=GATE_HELP)


ItemAction = Literal["retry", "skip", "cancel"]


@router.post("/items/{action}", dependencies=Operating, tags=["actions"])
def act_on_items(action: ItemAction, body: ItemSelection, request: Request) -> dict[str, Any]:
    """Retry (due now, attempts reset), skip (complete without processing) or cancel items, named by
    `ids` or as every failed or available item of `partition` (at `gate`); recorded in each item's
    deliveries and the history as done by "api". 409 (nothing changes) when a named item is not
    failed or available or its partition is finished."""
    if (body.ids is None) == (body.partition is None):
        raise ApiError(400, "give ids or partition, not both")
    if body.gate is not None and body.partition is None:
        raise ApiError(400, "gate goes with partition")
    feed = _feed(request)
    key = _key(body.partition) if body.partition is not None else None
    gate = gate_filter(feed, key, body.gate) if key is not None else None
    return feed.act_on_items(action, ids=body.ids, key=key, gate=gate, by="api")


def _one_item_action(action: str) -> Any:
    def act(item_id: Annotated[int, Path(ge=1, le=INT64)], request: Request) -> dict[str, Any]:
        return _feed(request).act_on_items(action, ids=[item_id], by="api")

    act.__doc__ = f"{action.capitalize()} one item (see POST /items/{action}); 409 unless failed or available."
    act.__name__ = f"{action}_item"
    return act


for _action in ("retry", "skip", "cancel"):
    router.post(f"/items/{{item_id}}/{_action}", dependencies=Operating, tags=["actions"])(_one_item_action(_action))
