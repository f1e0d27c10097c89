"""A resubmitted partition is worked off again by a watcher (every database): its producer's items
are delivered again from its first gate, its fan-out children are made anew (not kept beside the old
ones), and it completes."""

from __future__ import annotations

from feedproc import Feed, Item, Processor, Response

from ..support import wait_status, watching


class FansOut(Processor):
    """Each gate-0 item adds one child at gate 1; children complete. Counts the gate-0 deliveries."""

    def __init__(self) -> None:
        self.parents = 0

    async def process(self, item: Item) -> Response:
        if item.gate == 0:
            self.parents += 1
            return Response(done=True, items=[(1, {"from": item.id})])
        return Response(done=True)


def test_a_resubmitted_partition_runs_again_and_completes(db_url: str, feed: Feed) -> None:
    feed.add_partition("p", [(0, b"1"), (0, b"2")])
    processor = FansOut()
    with watching(db_url, processor, concurrency=2):
        wait_status(feed, "p", "complete")
        assert feed.resubmit("p") == 2

        done = wait_status(feed, "p", "complete")

    assert processor.parents == 4
    assert done.items["total"] == 4  # two producer items and their two new children
    assert [e.kind for e in feed.history("p", limit=1000)].count("resubmitted") == 1
