"""Processors for the command line's end-to-end tests: `feedproc watch --processor cli_processors:NAME`
(and `feedproc work --processor ...`).

Watcher subprocesses import this module through PYTHONPATH (tests/ is on it, see support.feedproc_env).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import time

from sqlalchemy import text
from sqlalchemy.engine import Connection

from feedproc import Item, Processor, Response, TransactionalProcessor
from feedproc.bench.watch import tally

LOG_VARIABLE = "FEEDPROC_TEST_DELIVERY_LOG"
DELAY_VARIABLE = "FEEDPROC_TEST_DELAY"
HOLD_VARIABLE = "FEEDPROC_TEST_HOLD"
INSIDE_VARIABLE = "FEEDPROC_TEST_INSIDE"


def log_delivery(item: Item) -> None:
    """Append `pid partition item-id gate attempt` to the file named by $FEEDPROC_TEST_DELIVERY_LOG.

    One short O_APPEND write per line, so lines from several watcher processes never interleave.
    """
    line = f"{os.getpid()} {item.partition} {item.id} {item.gate} {item.attempt}\n".encode()
    fd = os.open(os.environ[LOG_VARIABLE], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


class LoggedSlow(Processor):
    """Logs each delivery with this process's pid, takes a moment ($FEEDPROC_TEST_DELAY s), then completes.

    While the file named by $FEEDPROC_TEST_HOLD exists, each delivery waits for it to go first: the
    test decides when work may proceed (e.g. once a second watcher is up), whatever the machine's load.
    """

    def __init__(self) -> None:
        self.delay = float(os.environ.get(DELAY_VARIABLE, "0.15"))
        self.hold = os.environ.get(HOLD_VARIABLE)

    async def process(self, item: Item) -> Response:
        log_delivery(item)
        while self.hold and os.path.exists(self.hold):
            await asyncio.sleep(0.02)
        await asyncio.sleep(self.delay)
        return Response(done=True)


class Accumulates(LoggedSlow):
    """LoggedSlow whose answers each accumulate {"n": 1}; an item that collects answers with the
    accumulator it received (`item.accumulated`) as its result."""

    async def process(self, item: Item) -> Response:
        if item.accumulated is not None:
            return Response(done=True, result={"accumulated": dict(item.accumulated)})
        await super().process(item)
        return Response(done=True, accumulate={"n": 1})


class ReportsFrozenObjects(Processor):
    """Writes how many objects the process keeps out of the garbage collector (gc.freeze) to
    $FEEDPROC_TEST_DELIVERY_LOG, then completes."""

    async def process(self, item: Item) -> Response:
        with open(os.environ[LOG_VARIABLE], "a") as log:
            log.write(f"{gc.get_freeze_count()}\n")
        return Response(done=True)


class DiesOnPoison(Processor):
    """Logs each delivery; an item whose data is `{"poison": true}` kills the whole process at once
    (`os._exit(1)`: no cleanup, no answer, like a segfault or the OOM killer); others complete."""

    async def process(self, item: Item) -> Response:
        log_delivery(item)
        if item.json().get("poison"):
            os._exit(1)
        await asyncio.sleep(0.01)
        return Response(done=True)


class FansOutThenLogs(Processor):
    """Pull-worker fan-out: gate 0 fans out three children to gate 1; every gate-1 delivery is logged
    (`log_delivery`), takes $FEEDPROC_TEST_DELAY s, then completes."""

    def __init__(self) -> None:
        self.delay = float(os.environ.get(DELAY_VARIABLE, "0.05"))

    async def process(self, item: Item) -> Response:
        if item.gate == 0:
            return Response(gate=1, items=[(1, {"child": n}) for n in range(3)])
        log_delivery(item)
        await asyncio.sleep(self.delay)
        return Response(done=True, data={"by": os.getpid()})


class FailsOnceWithNul(Processor):
    """An item whose data is `{"nul": true}` fails its first delivery with an error holding a NUL
    (PostgreSQL refuses NUL in text); every delivery takes 0.2 s, so answers arrive together."""

    async def process(self, item: Item) -> Response:
        await asyncio.sleep(0.2)
        if item.json().get("nul") and item.attempt == 1:
            raise ValueError("bad\x00byte")
        return Response(done=True)


class SleepsUntilCancelled(Processor):
    """Starts, writes `started <id>` to the delivery log, sleeps for an hour; on cancellation writes
    `cancelled <id>` (the test reads that the cancel reached the work)."""

    async def process(self, item: Item) -> Response:
        _append(f"started {item.id}")
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            _append(f"cancelled {item.id}")
            raise
        return Response(done=True)


def _append(line: str) -> None:
    fd = os.open(os.environ[LOG_VARIABLE], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


class Joins(Processor):
    """Fan-in: gate 0 answers its file's label as its result; the item that collects answers every
    result it iterated (`item.collected`: inline, or a page at a time) and the accumulator."""

    def process(self, item: Item) -> Response:
        if item.gate == 0:
            return Response(done=True, result={"label": item.json()["file"].upper()})
        rows = [[r.id, json.loads(r.result) if r.result else None, r.error] for r in item.collected]
        return Response(done=True, result={"rows": rows, "accumulated": dict(item.accumulated or {})})


class CountsCollected(Processor):
    """Fan-in at scale: iterates `item.collected` once, counting its results, the ones seen twice
    (a byte per id since the first) and the sum of their `n`; answers those with the process's
    peak RSS (MB) as its result."""

    def process(self, item: Item) -> Response:
        count, twice, total = tally(item.collected)  # the collect benchmark's own count
        # VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so a watcher started by a big
        # pytest worker would report the worker's size (233 MB in CI on every database).
        with open("/proc/self/status") as status:
            peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024
        return Response(done=True, result={"count": count, "twice": twice, "sum": total, "peak_rss_mb": peak})


#: The ledger a transactional processor writes: no unique key, so that a row written twice shows.
LEDGER_TABLE = "CREATE TABLE ledger (item_id BIGINT NOT NULL, pid INTEGER NOT NULL)"


class Ledger(TransactionalProcessor):
    """Completes each item in its answer's transaction after inserting one ledger row for it (this
    process's pid beside the item's id). Its delivery is logged before; after the insert, with the
    transaction still open, `pid item-id` is appended to the file named by $FEEDPROC_TEST_INSIDE
    (when set); then, if the item's data says `"hold": true`, it waits while the $FEEDPROC_TEST_HOLD
    file exists; then it waits $FEEDPROC_TEST_DELAY s."""

    def __init__(self) -> None:
        self.delay = float(os.environ.get(DELAY_VARIABLE, "0.05"))
        self.hold = os.environ.get(HOLD_VARIABLE)
        self.inside = os.environ.get(INSIDE_VARIABLE)

    def process(self, item: Item, connection: Connection) -> Response:
        log_delivery(item)
        connection.execute(
            text("INSERT INTO ledger (item_id, pid) VALUES (:id, :pid)"), {"id": item.id, "pid": os.getpid()}
        )
        if self.inside:
            fd = os.open(self.inside, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, f"{os.getpid()} {item.id}\n".encode())
            finally:
                os.close(fd)
        held = bool(json.loads(item.data or b"{}").get("hold"))
        while held and self.hold and os.path.exists(self.hold):
            time.sleep(0.02)
        time.sleep(self.delay)
        return Response(done=True)
