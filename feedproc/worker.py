"""`RemoteWorker` (`feedproc work`): a pull worker that runs a Processor against the worker API of
`feedproc serve`, with no database access and only a worker token.

It claims items of a pull-mode queue (long-polling when none is ready), runs each through the
processor with heartbeats that keep its claim, and sends the answer. A heartbeat or answer refused
with 409 means the item is no longer this worker's (cancelled, expired, superseded): its call is
cancelled (an `async def` processor gets `CancelledError`; a plain `def` one sees `item.cancelled`)
and nothing is sent. On stop it claims nothing more, lets in-flight items finish for
`shutdown_grace` seconds, then hands the rest back unanswered (no attempt counted).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import socket
import threading
import time
from typing import Any

import httpx

from .core.errors import PermanentError, RetryLater
from .core.fanin import Collected, CollectedResult, PageReader, inline_results
from .core.models import Item, Response
from .core.policy import describe
from .processors import ProcessorLike, call_processor

log = logging.getLogger("feedproc.worker")
ANSWERS_PER_REQUEST = 200  # answers sent in one request (one transaction on the server) at most


class Gone(Exception):
    """The API refused a claim's token (409): the item is no longer this worker's."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class RemoteWorker:
    """Runs `processor` on the items of pull-mode `queue`, claimed from the API at `api_url`.

    `token`: FEEDPROC_WORKER_TOKEN (or the API token). `concurrency`: items in flight at most.
    `lease_seconds`: each claim's length, renewed by a heartbeat every third of it. `timeout`:
    seconds a processor call may take (None: unbounded; heartbeats keep long work claimed).
    `min_priority` / `max_priority`: claim only items of partitions with a priority in that range.
    """

    def __init__(
        self,
        api_url: str,
        queue: str,
        processor: ProcessorLike,
        *,
        token: str | None = None,
        worker: str | None = None,
        concurrency: int = 10,
        lease_seconds: float = 60.0,
        claim_wait: float = 20.0,
        timeout: float | None = None,
        shutdown_grace: float = 30.0,
        min_priority: int | None = None,
        max_priority: int | None = None,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.queue = queue
        self.processor = processor
        self.worker = worker or f"{socket.gethostname()}-{os.getpid()}"
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.claim_wait = claim_wait
        self.timeout = timeout
        self.shutdown_grace = shutdown_grace
        # Sent with every claim when given (the API checks the range).
        self._priorities = {
            name: value
            for name, value in (("min_priority", min_priority), ("max_priority", max_priority))
            if value is not None
        }
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.AsyncClient(base_url=self.api_url, headers=headers, timeout=claim_wait + 30)
        # Collected results' pages, read by processors on their threads (`item.collected`): the URL's
        # token authorises them, no header.
        self._pages = httpx.Client(timeout=60)
        self._stopping = asyncio.Event()
        self._freed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._tokens: dict[int, str] = {}
        self._outbox: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()  # answers to send; None: done
        self.answered = 0

    def stop(self) -> None:
        """Claim nothing more; in-flight items finish (then `run` returns)."""
        self._stopping.set()

    async def run(self) -> None:
        """Claim and process until `stop()`; then finish or hand back what is in flight."""
        start = getattr(self.processor, "start", None)
        if start is not None:
            await start()
        sender = asyncio.create_task(self._send_answers(), name="answers")
        try:
            await self._claim_loop()
            await self._drain()
            await self._outbox.put(None)
            await sender
        finally:
            sender.cancel()
            close = getattr(self.processor, "close", None)
            if close is not None:
                await close()
            await self._client.aclose()
            self._pages.close()

    async def _claim_loop(self) -> None:
        backoff = 0.5
        while not self._stopping.is_set():
            room = self.concurrency - len(self._tasks)
            if room <= 0:  # every slot busy: wait for one to free (or for stop)
                self._freed.clear()
                await _first(self._freed.wait(), self._stopping.wait())
                continue
            try:
                claimed = await self._claim(room)
                backoff = 0.5
            except (httpx.HTTPError, Gone, OSError) as error:
                log.warning("claim failed (%s); trying again in %.1fs", error, backoff)
                claimed = []
                await self._pause(backoff)
                backoff = min(backoff * 2, 30.0)
            for entry in claimed:
                task = asyncio.create_task(self._work(entry))
                self._tasks.add(task)
                task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._freed.set()

    async def _pause(self, seconds: float) -> None:
        try:
            async with asyncio.timeout(seconds):
                await self._stopping.wait()
        except TimeoutError:
            pass

    async def _claim(self, room: int) -> list[dict[str, Any]]:
        body = {
            "worker": self.worker,
            "max": room,
            "lease_seconds": self.lease_seconds,
            "wait": self.claim_wait,
            **self._priorities,
        }
        claim = asyncio.ensure_future(self._post(f"/api/v1/queues/{self.queue}/claim", body))
        await _first(claim, self._stopping.wait())
        if not claim.done():  # stopped during the long poll: hang up (the server hands back what it claims then)
            claim.cancel()
            await asyncio.gather(claim, return_exceptions=True)
            return []
        items: list[dict[str, Any]] = claim.result().get("items", [])
        if self._stopping.is_set():  # stopped as the claim came back: what it brought goes back
            for entry in items:
                await self._release(entry["id"], entry["token"])
            return []
        return items

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = await self._client.post(path, json=body)
        if response.status_code == 409:
            payload = _json(response)
            raise Gone(str(payload.get("reason") or "refused"), str(payload.get("error") or response.text))
        if response.status_code >= 400:
            raise httpx.HTTPStatusError(
                f"{response.status_code} from {path}: {response.text[:300]}",
                request=response.request,
                response=response,
            )
        return _json(response)

    async def _work(self, entry: dict[str, Any]) -> None:
        item_id, token = int(entry["id"]), str(entry["token"])
        self._tokens[item_id] = token
        progress: list[float | None] = [None]
        stop = threading.Event()
        data = (
            base64.b64decode(entry["data_base64"])
            if "data_base64" in entry
            else json.dumps(entry.get("data"), separators=(",", ":"), ensure_ascii=False).encode()
        )

        def report(fraction: float) -> None:
            progress[0] = fraction

        item = Item(item_id, entry["partition"], entry["queue"], entry["gate"], entry["attempt"], data, report, stop)
        item.deliveries = int(entry.get("deliveries", entry["attempt"]))  # (a server of before 0014: not sent)
        if "collected" in entry:  # a fan-in item: what it collects, and the accumulator
            item.collected = self._collected(entry["collected"])
            item.accumulated = entry.get("accumulated") or {}
        call = asyncio.ensure_future(call_processor(self.processor, item, self.timeout))
        beat = asyncio.ensure_future(self._heartbeats(item_id, token, progress, call, stop))
        try:
            try:
                result: Response | BaseException = await call
            except asyncio.CancelledError:
                if not stop.is_set():
                    raise  # the worker itself is being cancelled
                return  # the item is no longer ours (409): nothing to send
            except Exception as error:
                result = error
            finally:
                beat.cancel()
            await self._outbox.put({"id": item_id, "token": token, **answer_body(result)})
        finally:
            self._tokens.pop(item_id, None)

    def _collected(self, shown: dict[str, Any]) -> Collected:
        """A claim's `collected` as the processor's `item.collected`: its results inline, or read a
        page at a time from its `results_url` (authorised by the claim's token in it)."""
        gate = shown.get("gate")
        results = shown.get("results")
        reader = (
            inline_results([_collected_result(row) for row in results])
            if results is not None
            else _pages(self._pages, str(shown["results_url"]))
        )
        return Collected(
            gate if isinstance(gate, int) else -1,
            int(shown.get("count", 0)),
            int(shown.get("failed", 0)),
            reader,
            gate_name=gate if isinstance(gate, str) else None,
        )

    async def _send_answers(self) -> None:
        """Send answers as they come, many per request (`POST /api/v1/answers`, one transaction
        on the server): while one request is out, the next batch gathers."""
        while True:
            batch = [await self._outbox.get()]
            while len(batch) < ANSWERS_PER_REQUEST and not self._outbox.empty():
                batch.append(self._outbox.get_nowait())
            last = batch[-1] is None
            answers = [a for a in batch if a is not None]
            if answers:
                await self._post_answers(answers)
            if last:
                return

    async def _post_answers(self, answers: list[dict[str, Any]]) -> None:
        for attempt in range(3):
            try:
                results = (await self._post("/api/v1/answers", {"answers": answers})).get("results", [])
                break
            except (httpx.HTTPError, OSError) as error:  # their claims expire and the items are retried
                if attempt == 2:
                    log.warning("could not send %d answers: %s", len(answers), error)
                    return
                await asyncio.sleep(0.5 * 2**attempt)
        too_large = []
        for result in results:
            if result.get("status") == 200:
                self.answered += 1
            elif result.get("status") == 409:
                log.info(
                    "answer for item %s refused: %s (%s)", result.get("id"), result.get("error"), result.get("reason")
                )
            else:
                log.warning("answer for item %s refused: %s", result.get("id"), result.get("error"))
                if result.get("status") == 413:
                    too_large.append(result)
        if too_large:
            # Over a limit of the server's (more children than its --max-children): the same answer
            # would be refused every time, so the item fails now, saying why, as a watcher's would.
            tokens = {a["id"]: a["token"] for a in answers}
            failures = [
                {"id": r["id"], "token": tokens[r["id"]], "error": {"message": str(r.get("error")), "no_retry": True}}
                for r in too_large
                if r.get("id") in tokens
            ]
            await self._post_answers(failures)

    async def _heartbeats(
        self, item_id: int, token: str, progress: list[float | None], call: asyncio.Future[Any], stop: threading.Event
    ) -> None:
        interval = max(self.lease_seconds / 3, 0.2)
        while True:
            await asyncio.sleep(interval)
            body: dict[str, Any] = {"token": token}
            if progress[0] is not None:
                body["progress"] = progress[0]
            try:
                await self._post(f"/api/v1/items/{item_id}/heartbeat", body)
            except Gone as gone:
                log.info("item %s is no longer this worker's (%s): stopping its call", item_id, gone.reason)
                stop.set()
                call.cancel()
                return
            except (httpx.HTTPError, OSError) as error:
                log.warning("heartbeat for item %s failed: %s", item_id, error)

    async def _drain(self) -> None:
        """In-flight items get `shutdown_grace` seconds; the rest are cancelled and handed back."""
        if not self._tasks:
            return
        deadline = time.monotonic() + self.shutdown_grace
        while self._tasks and time.monotonic() < deadline:
            await asyncio.wait(set(self._tasks), timeout=max(deadline - time.monotonic(), 0.01))
        left = dict(self._tokens)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for item_id, token in left.items():
            await self._release(item_id, token)

    async def _release(self, item_id: int, token: str) -> None:
        try:
            await self._post(f"/api/v1/items/{item_id}/release", {"token": token})
        except (httpx.HTTPError, Gone, OSError) as error:  # its claim expires instead
            log.warning("could not hand item %s back: %s", item_id, error)


def answer_body(result: Response | BaseException) -> dict[str, Any]:
    """A processor's result as the answer fields of the worker API (the handler contract's)."""
    if isinstance(result, BaseException):
        if isinstance(result, PermanentError):
            return {"error": {"message": describe(result), "no_retry": True}}
        body: dict[str, Any] = {"error": {"message": describe(result)}}
        if isinstance(result, RetryLater) and result.after is not None:
            body["retry_after"] = result.after
        return body
    answer: dict[str, Any] = {"done": True} if result.done else {"gate": result.gate}
    if result.data is not None:
        try:
            answer["data"] = json.loads(result.data)
        except ValueError:
            answer["data_base64"] = base64.b64encode(result.data).decode()
    if result.result is not None:  # what it produced (fan-in), kept apart from its data
        try:
            answer["result"] = json.loads(result.result)
        except ValueError:
            answer["result_base64"] = base64.b64encode(result.result).decode()
    if result.items:
        try:
            answer["items"] = [_child(c.gate, json.loads(c.data), c.collect) for c in result.children]
        except ValueError:
            return {"error": {"message": "a pull worker's child items need JSON data"}}
    if result.accumulate is not None:  # numbers for the partition's accumulator
        answer["accumulate"] = dict(result.accumulate)
    if result.retry_after is not None:
        answer["retry_after"] = result.retry_after
    if result.progress is not None:
        answer["progress"] = result.progress
    return answer


def _collected_result(row: dict[str, Any]) -> CollectedResult:
    """One result as the API shows it (`{"id", "result"}`, `result_base64`, or `{"id", "error"}`)."""
    if "error" in row:
        return CollectedResult(int(row["id"]), error=row["error"], failed=True)
    if "result_base64" in row:
        return CollectedResult(int(row["id"]), base64.b64decode(row["result_base64"]))
    value = row.get("result")
    encoded = None if value is None else json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    return CollectedResult(int(row["id"]), encoded)


def _pages(client: httpx.Client, url: str) -> PageReader:
    """A page reader of the results served at `url` (`GET /api/v1/items/{id}/collected`)."""
    first = httpx.URL(url)

    def read_page(after: int | None, limit: int) -> list[CollectedResult]:
        wanted = first.copy_merge_params({"limit": str(limit)})
        if after is not None:
            wanted = wanted.copy_set_param("after", str(after))
        response = client.get(wanted)
        if response.status_code != 200:
            raise RetryLater(f"reading the collected results: HTTP {response.status_code}: {response.text[:300]}")
        return [_collected_result(row) for row in response.json().get("results", [])]

    return read_page


def _child(gate: int, data: Any, collect: int | None) -> dict[str, Any]:
    return {"gate": gate, "data": data} if collect is None else {"gate": gate, "data": data, "collect": collect}


async def _first(*waits: Any) -> None:
    """Until the first of `waits` (awaitables) is done; the others are cancelled (a future is kept)."""
    futures = [asyncio.ensure_future(w) for w in waits]
    _, pending = await asyncio.wait(futures, return_when=asyncio.FIRST_COMPLETED)
    for future in pending:
        if not isinstance(waits[futures.index(future)], asyncio.Future):
            future.cancel()


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        value = response.json()
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
