"""Partitions and their items: create a partition (`feedproc add`), add items to an open one
(`feedproc add-items`), and the reads: partitions listed and filtered, the status summary, one
partition, its items, one item with its deliveries, its history. Lists are keyset-paginated."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from ..core.flow import MAX_GROUP
from ..core.models import KEY_PATTERN, MAX_PAGE, MAX_PRIORITY, MIN_PRIORITY, QUEUE_PATTERN, item_from_row
from ..core.views import listed_json
from ..gate_labels import GateNames, gate_filter, with_name
from .common import (
    GATE_HELP,
    GATE_NAME,
    INT32,
    INT64,
    GateIn,
    KeyPath,
    _feed,
    _key,
    _shown,
    _status,
    expensive,
    within_max_items,
)
from .errors import ApiError, got, said
from .gate import Operating, Reading

router = APIRouter()
#: Routes that add items: operate, and no more items than `--max-items` (413).
AddingItems = [*Operating, Depends(within_max_items)]

StatusName = Literal["available", "complete", "failed", "cancelled"]
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE, description=f"page size, at most {MAX_PAGE}")]


#: A concurrency group: a non-empty name (not only spaces, no NUL), as `Feed` checks it, so that a
#: malformed one is a 422 naming the field rather than the store's 400.
Group = Annotated[
    Annotated[str, Field(min_length=1, max_length=MAX_GROUP, pattern=r"^[^\x00]*[^\s\x00][^\x00]*$", strict=True)],
    said(lambda value: f"must be a non-empty name of at most {MAX_GROUP} characters, got {got(value)}"),
]

#: Failed items a gate lets pass: a count, or a percentage ("5%"); checked by `Feed` (400).
Tolerance = Annotated[
    StrictInt | StrictStr,
    said(lambda value: f'must be a count (an integer >= 0) or a percentage like "5%", got {got(value)}'),
]


class ItemIn(BaseModel):
    """One item: its gate (default 0; a number, or a name in the queue's pipeline) and its data (any
    JSON); `collect`, an earlier gate whose items' results it receives when delivered (fan-in)."""

    model_config = ConfigDict(extra="forbid")
    gate: GateIn = Field(0, description=GATE_HELP, examples=[0, "ocr"])
    data: Any = None
    collect: GateIn | None = Field(None, description="an earlier gate whose items' results it receives (fan-in)")


class NewPartition(BaseModel):
    """`feedproc add` as JSON."""

    model_config = ConfigDict(extra="forbid")
    key: str | None = Field(
        None,
        description="1-200 characters of A-Z a-z 0-9 . _ : / -; omitted: a UUIDv7 is generated",
        examples=["upload-42"],
    )
    items: list[ItemIn] = Field(default_factory=list)
    queue: str = "default"
    priority: int | None = Field(
        None,
        ge=MIN_PRIORITY,
        le=MAX_PRIORITY,
        strict=True,
        description="higher is leased and claimed first (64-bit); omitted: the queue's default, else 0",
    )
    open: bool = Field(False, strict=True, description="leave unsealed: more items may be added")
    manual_checkpoint: bool = Field(False, strict=True)
    not_before: str | None = Field(None, description="ISO 8601; without a zone it is UTC")
    weight: int | None = Field(
        None,
        ge=1,
        le=INT32,
        strict=True,
        description="share of the queue's limit per item in flight; omitted: the queue's default, else 1",
    )
    item_timeout: float | None = Field(None, gt=0, le=86400 * 7, description="seconds a processor call may take")
    windows: list[str] | None = Field(None, max_length=24, description='windows of the day, e.g. ["22:00-06:00"]')
    timezone: str | None = Field(None, max_length=64, description="the windows' time zone (default UTC)")
    tolerate: Tolerance | None = Field(
        None, description='failed items each gate lets pass: a count, or a percentage of its items ("5%")'
    )
    deadline: float | str | None = Field(
        None,
        description="seconds from now, or an ISO 8601 time (without a zone it is UTC), after which the partition, "
        'unless finished, fails with "deadline exceeded"',
    )
    partition_limit: int | None = Field(
        None,
        ge=1,
        le=INT32,
        strict=True,
        description="its items in flight at once at most, fleet-wide (its queue's and gates' limits hold too)",
    )
    group: Group | None = Field(
        None,
        description="its concurrency group (a tenant): its queue's and gates' group_limit and the queue's"
        " group_rate count all of a group's partitions together",
        examples=["acme"],
    )


class NewItems(BaseModel):
    """`feedproc add-items` as JSON."""

    model_config = ConfigDict(extra="forbid")
    items: list[ItemIn] = Field(..., min_length=1)


def _not_before(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value.strip())
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    except (ValueError, OverflowError):
        raise ApiError(400, f"not_before {value!r} is not an ISO 8601 time") from None


def _deadline(value: float | str | None) -> datetime | float | None:
    """A number of seconds as it is; a string as an ISO 8601 time (400 when it is not one)."""
    if value is None or isinstance(value, float | int):
        return value
    try:
        parsed = datetime.fromisoformat(value.strip())
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    except (ValueError, OverflowError):
        raise ApiError(400, f"deadline {value!r} is neither a number of seconds nor an ISO 8601 time") from None


def _items(items: list[ItemIn]) -> list[Any]:
    """The items checked, gate names resolved: call it within `Feed.gate_naming` (an unknown name
    is a 400 naming it, before anything is written)."""
    return [item_from_row(item.model_dump(), where=f"item {n}: ") for n, item in enumerate(items, start=1)]


def _page(rows: list[dict[str, Any]], limit: int, cursor: str) -> dict[str, Any]:
    """A page and the cursor of the next one (None on the last page)."""
    return {"items": rows, "next": rows[-1][cursor] if len(rows) == limit else None}


@router.post("/partitions", status_code=201, dependencies=AddingItems, tags=["partitions"])
def create_partition(body: NewPartition, request: Request) -> dict[str, Any]:
    """Create a partition with its items in one transaction (`feedproc add`); sealed unless `open`.
    Without a `key`, one is generated (a UUIDv7); the answer's `key` is the partition's. More items
    than `--max-items` (default 100,000): 413, nothing written."""
    feed = _feed(request)
    with feed.gate_naming(queue=body.queue):  # {"gate": "ocr"}
        items = _items(body.items)
    options: dict[str, Any] = {
        "queue": body.queue,
        "priority": body.priority,
        "sealed": not body.open,
        "manual_checkpoint": body.manual_checkpoint,
        "not_before": _not_before(body.not_before),
        "weight": body.weight,
        "item_timeout": body.item_timeout,
        "windows": body.windows,
        "window_tz": body.timezone,
        "tolerate": body.tolerate,
        "deadline": _deadline(body.deadline),
        "partition_limit": body.partition_limit,
        "group": body.group,
    }
    if body.key is not None:
        key, count = body.key, feed.add_partition(body.key, items, **options)
    else:
        added = feed.add_partition(None, items, **options)
        key, count = added.key, added.items
    return {"key": key, "added": count, "partition": _status(feed, key)}


@router.get("/partitions", dependencies=Reading, tags=["partitions"])
def list_partitions(
    request: Request,
    queue: Annotated[str | None, Query(pattern=QUEUE_PATTERN.pattern)] = None,
    status: StatusName | None = None,
    prefix: Annotated[str | None, Query(pattern=r"^[A-Za-z0-9._:/-]{0,200}$", description="key prefix")] = None,
    after: Annotated[str | None, Query(pattern=KEY_PATTERN.pattern, description="last key of the page before")] = None,
    limit: Limit = 50,
    sort: Literal["key", "activity", "priority", "age"] = "key",
    error: Annotated[
        str | None, Query(min_length=1, max_length=200, description="text of a failed item's error")
    ] = None,
    offset: Annotated[int, Query(ge=0, le=1_000_000, description="with a sort other than key")] = 0,
) -> dict[str, Any]:
    """Partitions with their item counts per gate; filter by queue, status, key prefix and error text.
    In key order (pages by `after`: the `next` of the previous page), or by `activity` (being worked
    on, then last changed), `priority` or `age` (pages by `offset`)."""
    if sort != "key" and after is not None:
        raise ApiError(400, "after goes with sort=key; page other sorts by offset")
    feed = _feed(request)
    rows = feed.partitions(
        queue=queue, status=status, prefix=prefix, after=after, limit=limit, sort=sort, error=error, offset=offset
    )
    names = GateNames(feed)
    shown = [names.status(row.to_json()) for row in rows]
    if sort != "key":
        return {"items": shown, "next_offset": offset + limit if len(shown) == limit else None}
    return _page(shown, limit, "key")


@router.get("/status", dependencies=Reading, tags=["partitions"])
async def summary(request: Request) -> dict[str, Any]:
    """Counts of partitions and items by status (`feedproc status --json`); a few at once (503 busy beyond)."""
    feed = _feed(request)
    return await expensive(request, lambda: GateNames(feed).summary(feed.summary().to_json()))


@router.get("/partitions/{key:path}", dependencies=Reading, tags=["partitions"])
def partition_status(
    key: KeyPath, request: Request, history: Annotated[int, Query(ge=0, le=1000)] = 0
) -> dict[str, Any]:
    """One partition: the `feedproc status KEY --json` object (with `history` events when asked).
    When its queue has a pipeline: `gate_name` beside `gate`, `gate_names` beside `gates`."""
    feed = _feed(request)
    return GateNames(feed).status(feed.status(_key(key), history=history).to_json())


@router.get("/items", dependencies=Reading, tags=["partitions"])
def list_items(
    request: Request,
    key: Annotated[str, Query(pattern=KEY_PATTERN.pattern)],
    gate: Annotated[str | None, Query(pattern=f"^[0-9]{{1,10}}$|{GATE_NAME}", description=GATE_HELP)] = None,
    status: StatusName | None = None,
    after: Annotated[int, Query(ge=0, le=INT64, description="last item id of the page before")] = 0,
    limit: Limit = 100,
) -> dict[str, Any]:
    """A partition's items in id order (data as JSON, or `data_base64`; the result each produced
    likewise, `result` null when none; `gate_name` beside `gate` when the partition's queue has a
    pipeline). `gate` filters by a gate's number or name."""
    feed = _feed(request)
    rows = listed_json(feed.items(key, gate=gate_filter(feed, key, gate), status=status, after_id=after, limit=limit))
    names = GateNames(feed).of_items(key, rows)
    return _page([with_name(_shown(r), names) for r in rows], limit, "id")


@router.get("/items/{item_id}", dependencies=Reading, tags=["partitions"])
def get_item(item_id: Annotated[int, Path(ge=1, le=INT64)], request: Request) -> dict[str, Any]:
    """One item with its data and its result (as JSON, or `data_base64` / `result_base64`), the gate
    it collects (`collect`, when given as it was added) and every delivery, oldest first
    (`history`: n, attempt, gate, watcher, started_at, ended_at, duration, outcome, error);
    `gate_name` beside each gate when its queue has a pipeline."""
    feed = _feed(request)
    item = GateNames(feed).item(feed.item(item_id).to_json())
    return _shown(item)


@router.get("/history", dependencies=Reading, tags=["partitions"])
def history(
    request: Request,
    key: Annotated[str, Query(pattern=KEY_PATTERN.pattern)],
    after: Annotated[int, Query(ge=0, le=INT64, description="last event id of the page before")] = 0,
    limit: Limit = 100,
) -> dict[str, Any]:
    """A partition's history (leases, steals, gate advances, failures, retries...), oldest first."""
    return _page(listed_json(_feed(request).history(key, after=after, limit=limit)), limit, "id")


@router.post("/partitions/{key:path}/items", dependencies=AddingItems, tags=["actions"])
def add_items(key: KeyPath, body: NewItems, request: Request) -> dict[str, Any]:
    """Add items to an open partition (`feedproc add-items`); more than `--max-items`: 413."""
    feed = _feed(request)
    with feed.gate_naming(key=_key(key)):  # {"gate": "ocr"}
        items = _items(body.items)
    count = feed.add_items(key, items)
    return {"added": count, "partition": _status(feed, key)}
