"""Collected results, a page at a time (fan-in): `GET /api/v1/items/{id}/collected?token=T`, the
`results_url` a fan-in item's handler (or pull worker) is given when its collection is too large to
travel inside its request or claim.

It is authorised by the delivery's own token, not by an API token: the route is open to the gate
(`api/gate.py`) and checks the token itself (`Feed.collected_page`, compared in constant time). The
token holds while its delivery does: once the answer is written, or the claim ends, it is refused
(409 with a `reason`), as a late answer is.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response

from ..core.fanin import PAGE
from ..feed import Feed
from .common import INT64, _feed
from .gate import Open

router = APIRouter()


def results_url(base: str, item_id: int, token: str, after: int, until: int) -> str:
    """The URL of the first page of item `item_id`'s collected results on the server at `base`."""
    return f"{base.rstrip('/')}/api/v1/items/{item_id}/collected?token={token}&after={after}&until={until}"


@router.get("/items/{item_id}/collected", dependencies=Open, tags=["workers"])
def collected(
    item_id: Annotated[int, Path(ge=1, le=INT64)],
    request: Request,
    token: Annotated[str, Query(min_length=1, max_length=64, description="the delivery's token")],
    after: Annotated[int | None, Query(ge=0, le=INT64, description="the last item id of the page before")] = None,
    until: Annotated[int | None, Query(ge=0, le=INT64, description="the highest item id of the collection")] = None,
    limit: Annotated[int, Query(ge=1, le=PAGE, description=f"results per page, at most {PAGE}")] = PAGE,
) -> Any:
    """A page of the results the item collects, in item id order: `{"results": [{"id", "result"}
    (or `result_base64`), or {"id", "error"} for a failed item, ...], "next": the next page's URL,
    or null after the last}`. Pages hold at most `limit` results and about 1 MiB past their first.
    Follow `next` to read every result exactly once. 404 for a token no delivery of the item has;
    409 with `reason` once that delivery ended (its answer written, expired, cancelled)."""
    feed: Feed = _feed(request)
    rows, next_after, last = feed.collected_page(item_id, token, after=after, until=until, limit=limit)
    following = None
    if next_after is not None:
        following = str(request.url.include_query_params(after=next_after, until=last))
    body = {"results": [row.to_json() for row in rows], "next": following}
    return Response(json.dumps(body, separators=(",", ":")), media_type="application/json")
