"""Aging with a real watcher (issue 34), every database: with its queue's `aging`, a partition that
has waited long enough is served before a newer one of a higher priority; without it, the higher
priority goes first."""

from __future__ import annotations

import threading

import pytest

from feedproc import Feed, Item, Processor, Response

from ..store.test_aging import age
from ..support import wait_status, watching


class Order(Processor):
    def __init__(self) -> None:
        self.seen: list[str] = []
        self._lock = threading.Lock()

    async def process(self, item: Item) -> Response:
        with self._lock:
            self.seen.append(item.partition)
        return Response(done=True)


@pytest.mark.parametrize(("aging", "first"), [(10.0, "old-low"), (None, "new-high")])
def test_a_partition_that_waited_long_enough_goes_first_with_aging(
    db_url: str, feed: Feed, aging: float | None, first: str
) -> None:
    if aging is not None:
        feed.set_queue("default", aging=aging)
    feed.add_partition("old-low", [(0, b"{}")] * 10, priority=0)
    feed.add_partition("new-high", [(0, b"{}")] * 10, priority=5)
    age(feed, "old-low", 1000)  # 100 steps of 10 s
    order = Order()
    with watching(db_url, order, concurrency=1):
        for key in ("old-low", "new-high"):
            wait_status(feed, key, "complete")
    assert order.seen[:10] == [first] * 10
