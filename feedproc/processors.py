"""Processors: what a watcher hands each item to.

A Processor turns an `Item` into a `Response`, or raises: `PermanentError` fails the item at once,
`RetryLater` / `InvalidAnswer` / any other exception is a transient failure (retried with backoff).
`HTTPProcessor` is the default, speaking the HTTP handler contract; `load_processor` resolves
`--processor module:attr`.
"""

from __future__ import annotations

import asyncio
import base64
import contextvars
import email.utils
import importlib
import inspect
import itertools
import json
import socket
import time
from collections.abc import Mapping
from typing import Any

import httpx

from . import __version__
from .errors import InvalidInput, PermanentError, RetryLater
from .models import Item, NewItem, Response, check_progress, encode_json

BODY_KEPT = 500  # characters of a failed answer's body kept in last_error
CONNECTIONS_PER_CLIENT = 2
JSON_CONTENT = {"Content-Type": "application/json"}


class InvalidAnswer(Exception):
    """A processor's answer does not follow the contract (a transient failure)."""

    def __str__(self) -> str:
        return f"invalid answer: {self.args[0] if self.args else ''}"


class Processor:
    """Base class for in-process processors. Override `process` (async or plain `def`)."""

    async def start(self) -> None:
        """Called once before the first item (open clients, pools...)."""

    async def close(self) -> None:
        """Called once when the watcher stops."""

    def process(self, item: Item) -> Response | Any:
        raise NotImplementedError


async def call_processor(processor: Any, item: Item, timeout: float | None = None) -> Response:
    """Run `processor.process(item)`: awaited if async, in a worker thread if a plain function.

    `timeout` (seconds) bounds the call from the moment it runs: a plain function still waiting for
    a free worker thread has not started, and that wait is not counted. A call past its timeout is
    abandoned (a thread cannot be stopped: it runs on, unheard) and `RetryLater` is raised."""
    method = processor.process
    if _is_async(method):
        result = await (method(item) if timeout is None else _call_async(method, item, timeout))
    else:
        result = await (asyncio.to_thread(method, item) if timeout is None else _call_in_thread(method, item, timeout))
        if inspect.isawaitable(result):
            result = await result
    if not isinstance(result, Response):
        raise InvalidAnswer(f"process() returned {type(result).__name__}, not a feedproc.Response")
    return result


_ASYNC: dict[Any, bool] = {}  # process functions seen, by whether they are `async def`


def _is_async(method: Any) -> bool:
    """`inspect.iscoroutinefunction(method)`, remembered per function (it costs microseconds per item)."""
    function = getattr(method, "__func__", method)
    try:
        return _ASYNC[function]
    except KeyError:
        result = _ASYNC[function] = inspect.iscoroutinefunction(method)
        return result
    except TypeError:  # an unhashable callable
        return inspect.iscoroutinefunction(method)


def _timed_out(timeout: float) -> RetryLater:
    return RetryLater(f"item timed out after {timeout:g}s")


async def _call_async(method: Any, item: Item, timeout: float) -> Any:
    try:
        async with asyncio.timeout(timeout) as deadline:
            return await method(item)
    except TimeoutError:
        if deadline.expired():
            raise _timed_out(timeout) from None
        raise  # the processor's own TimeoutError


async def _call_in_thread(method: Any, item: Item, timeout: float) -> Any:
    loop = asyncio.get_running_loop()
    started = loop.create_future()

    def run() -> Any:
        loop.call_soon_threadsafe(lambda: started.done() or started.set_result(None))
        return method(item)

    call = loop.run_in_executor(None, contextvars.copy_context().run, run)
    await asyncio.wait((started, call), return_when=asyncio.FIRST_COMPLETED)  # queued for a thread: not timed
    done, _ = await asyncio.wait((call,), timeout=timeout)
    if not done:
        call.add_done_callback(lambda f: f.cancelled() or f.exception())  # its late outcome is dropped quietly
        raise _timed_out(timeout)
    return call.result()


def load_processor(path: str) -> Any:
    """Resolve `module:attr` to a processor: a class (instantiated), a factory (called) or an instance."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise InvalidInput(f"bad --processor {path!r}: expected module:attribute")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise InvalidInput(f"bad --processor {path!r}: cannot import {module_name!r} ({error})") from error
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise InvalidInput(f"bad --processor {path!r}: {module_name!r} has no attribute {attr!r}") from None
    if hasattr(target, "process") and not inspect.isclass(target):
        return target
    if callable(target):
        try:
            instance = target()
        except TypeError as error:
            raise InvalidInput(f"bad --processor {path!r}: cannot create it without arguments ({error})") from error
        if hasattr(instance, "process"):
            return instance
    raise InvalidInput(f"bad --processor {path!r}: not a Processor class, factory or instance")


# ---------------------------------------------------------------- HTTP


class HTTPProcessor(Processor):
    """Sends each item to an HTTP handler service (`POST url`) and reads its answer.

    One pooled, keep-alive `httpx.AsyncClient` per watcher. `timeout` bounds each request;
    `headers` are added to every request (e.g. an Authorization header for the handler).
    """

    def __init__(
        self, url: str, *, timeout: float = 30.0, headers: Mapping[str, str] | None = None, max_connections: int = 100
    ) -> None:
        self.url = url
        self.timeout = timeout
        self.headers = {"User-Agent": f"feedproc/{__version__}", **(headers or {})}
        self.max_connections = max_connections
        self._clients: list[httpx.AsyncClient] = []
        self._turn = itertools.count()

    async def start(self) -> None:
        if self._clients:
            return
        # httpx's connection pool slows down sharply with many concurrent requests on one client
        # (encode/httpx#3215: ~400 req/s at 20 in flight here, against ~1,200 with small clients),
        # so requests are spread round-robin over clients of at most CONNECTIONS_PER_CLIENT each.
        shards = max(1, -(-self.max_connections // CONNECTIONS_PER_CLIENT))
        per_client = -(-self.max_connections // shards)
        for _ in range(shards):
            transport = httpx.AsyncHTTPTransport(
                retries=1,  # one reconnect when a kept-alive socket turns out closed
                limits=httpx.Limits(max_connections=per_client, max_keepalive_connections=per_client),
                socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],  # no Nagle wait per request
            )
            self._clients.append(httpx.AsyncClient(timeout=self.timeout, headers=self.headers, transport=transport))

    async def close(self) -> None:
        clients, self._clients = self._clients, []
        for client in clients:
            await client.aclose()

    async def process(self, item: Item) -> Response:
        await self.start()
        client = self._clients[next(self._turn) % len(self._clients)]
        try:
            answer = await client.post(self.url, content=request_body(item), headers=JSON_CONTENT)
        except httpx.TimeoutException as error:
            raise RetryLater(f"handler timed out after {self.timeout:g}s ({type(error).__name__})") from error
        except httpx.HTTPError as error:
            raise RetryLater(f"handler unreachable: {type(error).__name__}: {error}") from error
        return read_answer(answer.status_code, answer.content, answer.headers.get("Retry-After"))


def request_body(item: Item) -> bytes:
    """The JSON body of the contract; data that is not JSON travels as `data_base64`."""
    body: dict[str, Any] = {
        "id": item.id,
        "partition": item.partition,
        "queue": item.queue,
        "gate": item.gate,
        "attempt": item.attempt,
    }
    try:
        body["data"] = json.loads(item.data)
    except (ValueError, UnicodeDecodeError):
        body["data_base64"] = base64.b64encode(item.data).decode()
    return json.dumps(body, separators=(",", ":")).encode()


def read_answer(status: int, content: bytes, retry_after_header: str | None) -> Response:
    """Turn an HTTP answer into a Response, or raise the failure the contract says it is."""
    retry_after = parse_retry_after(retry_after_header)
    parsed: Any = None
    try:
        parsed = json.loads(content) if content else None
    except (ValueError, UnicodeDecodeError):
        parsed = None
    go_error = parsed.get("error") if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict) else None
    if not 200 <= status < 300:
        text = content[:BODY_KEPT].decode("utf-8", "replace")
        message = f"HTTP {status}: {text}" if text else f"HTTP {status}"
        permanent = (400 <= status < 500 and status not in (408, 429)) or bool(go_error and go_error.get("no_retry"))
        if permanent:
            raise PermanentError(message)
        raise RetryLater(message, after=retry_after)
    if not isinstance(parsed, dict):
        shown = content[:100].decode("utf-8", "replace")
        raise InvalidAnswer(f"expected a JSON object, got {shown!r}")
    if go_error is not None:
        message = str(go_error.get("message") or "handler reported an error")
        if go_error.get("no_retry"):
            raise PermanentError(message)
        raise RetryLater(message, after=retry_after)
    return response_from_json(parsed, retry_after)


def response_from_json(answer: dict[str, Any], retry_after: float | None = None) -> Response:
    """Read an answer object (ours, or Go Feed's `complete` / `response` spelling)."""
    done = answer.get("done", answer.get("complete", False))
    data_value = answer["data"] if "data" in answer else answer.get("response", _MISSING)
    data = None if data_value is _MISSING else encode_json(data_value)
    field_retry = answer.get("retry_after")
    if field_retry is not None:
        if isinstance(field_retry, bool) or not isinstance(field_retry, int | float) or field_retry < 0:
            raise InvalidAnswer(f"retry_after must be a number of seconds >= 0, got {field_retry!r}")
        retry_after = max(float(field_retry), retry_after or 0.0)
    progress = answer.get("progress")
    if progress is not None:
        try:
            progress = check_progress(progress)
        except ValueError as error:
            raise InvalidAnswer(str(error)) from None
    children_value = answer.get("items") or []
    if not isinstance(children_value, list):
        raise InvalidAnswer('items must be a list of {"gate": G, "data": ...}')
    children = []
    for n, child in enumerate(children_value, start=1):
        if not isinstance(child, dict):
            raise InvalidAnswer(f"child {n} is not an object")
        gate = child.get("gate", 0)
        if isinstance(gate, bool) or not isinstance(gate, int):
            raise InvalidAnswer(f"child {n} has gate {gate!r}, not an integer")
        children.append(NewItem(gate, encode_json(child.get("data"))))
    if done is True:
        return Response(done=True, data=data, items=children, retry_after=retry_after, progress=progress)
    gate = answer.get("gate")
    if gate is None:
        raise InvalidAnswer('the answer has neither "done": true nor a "gate"')
    if isinstance(gate, bool) or not isinstance(gate, int):
        raise InvalidAnswer(f"gate must be an integer, got {gate!r}")
    return Response(gate=gate, data=data, items=children, retry_after=retry_after, progress=progress)


_MISSING = object()


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
