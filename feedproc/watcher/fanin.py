"""Fan-in at delivery: an item at a gate that collects (its pipeline gate's `collect`, or its own)
receives what the collected gate's items of its partition produced (`Item.collected`) and the
partition's accumulator (`Item.accumulated`).

Only such items pay for it: the router answers "collects nothing" from a dict lookup, and the reads
run on a thread, never on the event loop. A Python processor iterates the results straight from the
store, a page at a time. An HTTP handler gets them inside its request when they fit (at most the
gate's `collect_inline`, 1,000 by default, and 1 MiB), else a `results_url` on `feedproc serve`
(the watcher's `--callback-url`), valid for that delivery only: the watcher records a claim of the
delivery (`store.collecting`), whose token the URL carries and which its answer ends. A raw request
has no room for results: any go by the URL.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from ..core.errors import FeedprocError, RetryLater
from ..core.fanin import COLLECT_INLINE_BYTES, Collected, CollectedResult, PageReader
from ..core.models import Item
from ..core.pipelines import Collects
from ..core.records import ReadyItem
from ..processors import HTTPProcessor
from ..processors.pipeline import Route
from ..store import Store
from ..store.collecting import Collection, Gathered

#: Seconds a results URL outlives its request's timeout: the answer is written a little after the
#: request ends (the group commit), and the answer is what ends the URL's delivery.
URL_GRACE = 5.0


async def fan_in(
    store: Store, watcher_id: str, route: Route, what: Collects, batch: Sequence[ReadyItem], items: Sequence[Item]
) -> None:
    """Give `items` (of one partition, at one gate; `batch` their ReadyItems) what they collect
    and the accumulator. Raises RetryLater, a transient failure of their delivery, when that
    cannot be done: a collection too large for the request and no `--callback-url` to give a
    results URL on, or the database failing."""
    processor = route.processor
    http = processor if isinstance(processor, HTTPProcessor) else None
    inline = 0 if http is None or http.request == "raw" else COLLECT_INLINE_BYTES
    urls = None if http is None else http.callback_url
    seconds = (http.timeout if http is not None else 0.0) + URL_GRACE
    try:
        gathered, tokens = await asyncio.to_thread(
            _gather, store, batch, what, inline, http is not None, urls, watcher_id, seconds
        )
    except FeedprocError as error:  # the database away, say: a transient failure of the delivery
        raise RetryLater(f"could not read what item {batch[0].id} collects: {error}") from error
    collection = gathered.collection
    for ready, item in zip(batch, items, strict=True):
        token = tokens.get(ready.id)
        url = None
        if token is not None and urls is not None:
            after, until = collection.first - 1, collection.last
            url = f"{urls}/api/v1/items/{ready.id}/collected?token={token}&after={after}&until={until}"
        item.collected = Collected(
            what.gate,
            collection.count,
            collection.failed,
            _reader(store, collection),
            gate_name=what.name,
            inline=gathered.results if http is not None else None,
            results_url=url,
            token=token,
        )
        item.accumulated = gathered.accumulated


def _gather(
    store: Store,
    batch: Sequence[ReadyItem],
    what: Collects,
    inline: int,
    http: bool,
    urls: str | None,
    watcher: str,
    seconds: float,
) -> tuple[Gathered, dict[int, str]]:
    """(On a thread.) The collection and the accumulator; for an HTTP handler whose results do not
    travel inline, a claim per delivery for the results URL's token."""
    first = batch[0]
    gathered = store.gather(first.partition_id, what, inline_bytes=inline)
    tokens: dict[int, str] = {}
    if http and gathered.results is None:
        collection = gathered.collection
        if urls is None:
            raise RetryLater(
                f"item {first.id} collects {collection.total} results of gate {what.name or what.gate}, more than a"
                f" request carries ({what.inline} and 1 MiB at most; a raw request none): give the watcher"
                " --callback-url (feedproc serve's URL) to send them by a results URL"
            )
        tokens = {ready.id: store.open_collection(ready.id, ready.version, watcher, seconds) for ready in batch}
    return gathered, tokens


def _reader(store: Store, collection: Collection) -> PageReader:
    """Pages of `collection` read from the store (a Python processor's `item.collected`)."""

    def read_page(after: int | None, limit: int) -> list[CollectedResult]:
        start = collection.first - 1 if after is None else after
        return store.collected_page(collection.partition_id, collection.gate, start, collection.last, limit)

    return read_page
