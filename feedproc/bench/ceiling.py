"""The client ceiling of the http workload: the HTTP client feedproc uses (an aiohttp session, set
up as `HTTPProcessor` sets it up), posting the same body to the same handler program at the same
concurrency in a bare loop, with nothing else to do. feedproc's http drain ÷ this rate is how much
of the client's speed feedproc keeps; the rest of the time per item is feedproc's own.

It runs in a process of its own (`python -m feedproc.bench.ceiling URL CONCURRENCY REQUESTS`,
printing JSON), as a watcher does, against a handler started without a call log (the drain's
handler log counts deliveries exactly once; these requests are not deliveries).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from ..core.models import Item
from ..processors import HTTPProcessor, request_body


async def client_loop(url: str, concurrency: int, requests: int, body: bytes) -> dict[str, Any]:
    """POST `body` to `url` `requests` times, `concurrency` at once; the rate, reading every answer."""
    processor = HTTPProcessor(url, max_connections=concurrency)
    await processor.start()
    session = processor.session  # the same settings as a watcher's
    headers = processor.request_headers()
    left = iter(range(requests))
    failures = 0

    async def worker() -> None:
        nonlocal failures
        for _ in left:
            async with session.post(url, data=body, headers=headers, allow_redirects=False) as response:
                await response.read()
                failures += response.status != 200

    try:
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    finally:
        await processor.close()
    return {
        "requests": requests,
        "concurrency": concurrency,
        "seconds": round(seconds, 4),
        "rate": round(requests / seconds, 1),
        "failures": failures,
    }


def sample_body(data: bytes) -> bytes:
    """The request body of an item with `data`, as a watcher sends it."""
    return request_body(Item(1, "http-0", "default", 0, 1, data, lambda fraction: None))


def main() -> None:
    url, concurrency, requests, data = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].encode()
    print(json.dumps(asyncio.run(client_loop(url, concurrency, requests, sample_body(data)))))


if __name__ == "__main__":
    main()
