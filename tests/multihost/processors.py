"""The processors the multi-host harness's watchers run (`--processor tests.multihost.processors:X`).

With FPMH_CALL_LOG set, each call is written there as it starts (`item gate unix-time`, a line
each, unbuffered): the harness checks from them that no item was called after it completed and no
gate's item before the previous gate drained.
"""

from __future__ import annotations

import asyncio
import os
import time

from feedproc import Item, Processor, Response

_LOG = open(os.environ["FPMH_CALL_LOG"], "a", buffering=1) if os.environ.get("FPMH_CALL_LOG") else None  # noqa: SIM115


def _called(item: Item) -> None:
    if _LOG is not None:
        _LOG.write(f"{item.id} {item.gate} {time.time():.6f}\n")


class Sleep20(Processor):
    """I/O-bound work: 20 ms of waiting per item, then done."""

    async def process(self, item: Item) -> Response:
        _called(item)
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
        _called(item)
        await asyncio.sleep(0.5)
        return Response(done=True)
