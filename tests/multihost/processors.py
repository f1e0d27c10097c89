"""The processors the multi-host harness's watchers run (`--processor tests.multihost.processors:X`)."""

from __future__ import annotations

import asyncio

from feedproc import Item, Processor, Response


class Sleep20(Processor):
    """I/O-bound work: 20 ms of waiting per item, then done (or on to the gate the data names)."""

    async def process(self, item: Item) -> Response:
        await asyncio.sleep(0.02)
        return Response(done=True)


class Linger(Processor):
    """Keeps every partition busy for ever: 50 ms of work, then "not yet, ask again in a second".
    The balance scenario needs partitions that stay leased while hosts come and go."""

    async def process(self, item: Item) -> Response:
        await asyncio.sleep(0.05)
        return Response(gate=item.gate, retry_after=1.0)


class Slow(Processor):
    """Half a second per item: long enough that a host cut off has answers in flight."""

    async def process(self, item: Item) -> Response:
        await asyncio.sleep(0.5)
        return Response(done=True)
