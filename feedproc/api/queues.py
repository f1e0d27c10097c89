"""Queues and their pipelines: each queue's settings and state (its completion hooks too), changed
with `feedproc queue set`'s fields or paused and resumed fleet-wide; the stored pipelines, read-only
here (credentials shown as `***`: no read reveals them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Request
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr
from pydantic_core import PydanticCustomError

from ..core.errors import InvalidInput
from ..core.flow import parse_rate, parse_rate_setting
from ..core.models import MAX_PRIORITY, MIN_PRIORITY, QUEUE_PATTERN
from ..core.views import listed_json
from .common import INT32, _feed
from .errors import SAID, ApiError, got, said
from .gate import Administering, Operating, Reading

router = APIRouter()


def _rate_must_be(value: Any) -> str:
    return f"must be a rate like 600/min, 10/s or 100/hour, or a number per second, got {got(value)}"


def _queue_rate_must_be(value: Any) -> str:
    words = "must be a rate like 600/min, 10/s or 100/hour, a number per second or a shared rate's name"
    return f"{words}, got {got(value)}"


def _checked(parse: Callable[[Any], object], must_be: Callable[[Any], str]) -> AfterValidator:
    """A rate checked by `parse` as `Feed.set_queue` checks it, so that a malformed one is a 422
    naming its field (the store's refusal would be a 400) before anything is written; 0 (no rate)
    as it is."""

    def check(value: str | float) -> str | float:
        if value in (0, "0"):
            return value
        try:
            parse(value)
        except InvalidInput:
            raise PydanticCustomError(SAID, "{message}", {"message": must_be(value)}) from None
        return value

    return AfterValidator(check)


_RateIn = Annotated[StrictStr, Field(max_length=100)] | StrictInt | StrictFloat
#: A queue's rate: "600/min", "10/s", "100/hour", "2/day", a number per second (1/day to 1e6/s),
#: or the name of a shared rate (`Feed.set_rate`; 409 unless declared); 0: none.
QueueRate = Annotated[_RateIn, said(_queue_rate_must_be), _checked(parse_rate_setting, _queue_rate_must_be)]
#: Each concurrency group's rate: a rate as above, never a shared one (every group has its own bucket).
GroupRate = Annotated[_RateIn, said(_rate_must_be), _checked(parse_rate, _rate_must_be)]


class QueueChange(BaseModel):
    """`feedproc queue set` (and pause / resume) as JSON; fields left out keep their value."""

    model_config = ConfigDict(extra="forbid")
    limit: int | None = Field(None, ge=0, le=INT32, strict=True, description="sum of weights in flight; 0: none")
    windows: list[str] | None = Field(None, max_length=24, description="windows of the day; [] removes them")
    timezone: str | None = Field(None, max_length=64)
    mode: Literal["push", "pull"] | None = None
    paused: bool | None = Field(None, strict=True)
    accumulate: dict[str, Any] | None = Field(
        None,
        description='how answers\' accumulate numbers merge: {"pages": "sum", "max_score": "max"}'
        " (sum, min, max or count); {} removes the declaration",
    )
    hooks: dict[str, str | None] | None = Field(
        None,
        max_length=3,
        description='completion hooks: {"on_complete": URL or "python", "on_fail": ..., "on_cancel": ...};'
        ' "" or null removes one, those not named keep theirs',
    )
    priority: int | None = Field(
        None, ge=MIN_PRIORITY, le=MAX_PRIORITY, strict=True, description="priority of a partition added without one"
    )
    weight: int | None = Field(None, ge=1, le=INT32, strict=True, description="weight of a partition added without one")
    clear_defaults: bool = Field(
        False, strict=True, description="remove the default priority and weight first (0 and 1 again)"
    )
    partition_limit: int | None = Field(
        None, ge=0, le=INT32, strict=True, description="items of any one partition in flight at once; 0: none"
    )
    aging: float | None = Field(
        None,
        ge=0,
        le=366 * 86400,
        allow_inf_nan=False,
        description="seconds after which a waiting partition's priority counts one higher; 0: none",
    )
    group_limit: int | None = Field(
        None, ge=0, le=INT32, strict=True, description="items of any one concurrency group in flight at once; 0: none"
    )
    rate: QueueRate | None = Field(
        None,
        description='items started at most, fleet-wide: "600/min", "10/s", "100/hour", a number per second or the'
        " name of a shared rate; 0: none",
    )
    group_rate: GroupRate | None = Field(
        None, description="items of any one concurrency group started at most (each its own); 0: none"
    )


@router.get("/queues", dependencies=Reading, tags=["queues"])
def list_queues(request: Request) -> dict[str, Any]:
    """Every queue with settings or unfinished partitions: mode, limit, slots in use, windows, paused."""
    return {"queues": listed_json(_feed(request).queues())}


@router.get("/queues/{name}", dependencies=Reading, tags=["queues"])
def get_queue(name: Annotated[str, Path(pattern=QUEUE_PATTERN.pattern)], request: Request) -> dict[str, Any]:
    """One queue's settings and state."""
    return _feed(request).queue(name).to_json()


@router.put("/queues/{name}", dependencies=Administering, tags=["queues"])
def change_queue(
    name: Annotated[str, Path(pattern=QUEUE_PATTERN.pattern)], body: QueueChange, request: Request
) -> dict[str, Any]:
    """Change a queue's limit, windows, time zone, mode, pause, accumulate declaration, completion
    hooks, default priority and weight, partition limit, aging, group limit or rates (`feedproc
    queue set|pause|resume`); an admin token (pause and resume alone: operate). 400 naming a bad
    declaration or hook, 422 a malformed value: nothing is changed then."""
    feed = _feed(request)
    feed.set_queue(
        name,
        limit=body.limit,
        windows=body.windows or None,
        window_tz=body.timezone,
        clear_windows=body.windows == [],
        mode=body.mode,
        paused=body.paused,
        accumulate=body.accumulate,
        hooks=body.hooks,
        priority=body.priority,
        weight=body.weight,
        clear_defaults=body.clear_defaults,
        partition_limit=body.partition_limit,
        aging=body.aging,
        group_limit=body.group_limit,
        rate=body.rate,
        group_rate=body.group_rate,
        by="api",
    )
    return feed.queue(name).to_json()


@router.post("/queues/{name}/pause", dependencies=Operating, tags=["queues"])
def pause_queue(name: Annotated[str, Path(pattern=QUEUE_PATTERN.pattern)], request: Request) -> dict[str, Any]:
    """Pause a queue fleet-wide: in-flight items finish, nothing new is dispatched or claimed."""
    feed = _feed(request)
    feed.set_queue(name, paused=True, by="api")
    return feed.queue(name).to_json()


@router.post("/queues/{name}/resume", dependencies=Operating, tags=["queues"])
def resume_queue(name: Annotated[str, Path(pattern=QUEUE_PATTERN.pattern)], request: Request) -> dict[str, Any]:
    """Resume a paused queue."""
    feed = _feed(request)
    feed.set_queue(name, paused=False, by="api")
    return feed.queue(name).to_json()


RATE_NAME = r"^[A-Za-z][A-Za-z0-9_.-]{0,99}$"


class RateChange(BaseModel):
    """`feedproc rate set NAME RATE` as JSON."""

    model_config = ConfigDict(extra="forbid")

    rate: GroupRate = Field(description='"600/min", "10/s", "100/hour", "2/day", or a number per second')


@router.get("/rates", dependencies=Reading, tags=["queues"])
def list_rates(request: Request) -> dict[str, Any]:
    """Every shared rate (`feedproc rate list --json`): name, rate, per second and the tokens its
    bucket holds now."""
    return {"rates": [rate.to_json() for rate in _feed(request).rates()]}


@router.put("/rates/{name}", dependencies=Administering, tags=["queues"])
def set_rate(name: Annotated[str, Path(pattern=RATE_NAME)], body: RateChange, request: Request) -> dict[str, Any]:
    """Declare shared rate NAME, or change its rate (`feedproc rate set`); an admin token. Every queue
    and pipeline gate whose `rate` names it draws from its one bucket, fleet-wide."""
    if body.rate in (0, "0"):
        raise ApiError(422, "rate: a shared rate must be above 0 (remove it instead)")
    return _feed(request).set_rate(name, body.rate).to_json()


@router.delete("/rates/{name}", dependencies=Administering, tags=["queues"])
def remove_rate(name: Annotated[str, Path(pattern=RATE_NAME)], request: Request) -> dict[str, Any]:
    """Remove shared rate NAME (`feedproc rate remove`): 409 while a queue's rate names it, 404 without it."""
    _feed(request).remove_rate(name)
    return {"removed": name}


@router.get("/pipelines", dependencies=Reading, tags=["queues"])
def list_pipelines(request: Request) -> dict[str, Any]:
    """Every stored pipeline (`feedproc pipeline show --json`): its version, queue, gates (names,
    numbers, handlers, settings) and schedules; credentials (header values, a handler URL's user and
    password) shown as `***`: no read reveals them."""
    return {"pipelines": [spec.shown() for spec in _feed(request).pipelines()]}


@router.get("/pipelines/{queue}", dependencies=Reading, tags=["queues"])
def get_pipeline(queue: Annotated[str, Path(pattern=QUEUE_PATTERN.pattern)], request: Request) -> dict[str, Any]:
    """A queue's stored pipeline (`feedproc pipeline show QUEUE --json`); 404 when it has none."""
    spec = _feed(request).pipeline(queue)
    if spec is None:
        raise ApiError(404, f"queue {queue!r} has no pipeline")
    return spec.shown()
