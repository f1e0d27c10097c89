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
import functools
import importlib
import inspect
import json
import math
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import Any, Protocol, cast, runtime_checkable

import aiohttp
from multidict import MultiMapping

from . import tracing
from ._version import __version__
from .core.errors import InvalidAnswer, InvalidInput, PermanentError, RetryLater
from .core.models import Item, NewItem, Response, check_delay, check_progress, gate_problem, shown, strict_json
from .redact import redact_text, redact_url, url_secrets

BODY_KEPT = 500  # bytes of a failed answer's body kept in last_error
MAX_ANSWER_BYTES = 10 * 1024 * 1024  # an answer's body, decoded, at most (`feedproc watch --max-answer-bytes`)
ACCEPT_ENCODING = "gzip, deflate"  # what read_body inflates within the size limit
JSON_CONTENT = {"Content-Type": "application/json"}


@runtime_checkable
class ProcessorLike(Protocol):
    """What a watcher needs of a processor: `process(item)` answering a `Response`, as an `async def`
    or a plain `def` (run in a worker thread). `start()` and `close()` are called when present.
    `Processor` is the base class to subclass; any object of this shape works as well."""

    def process(self, item: Item) -> Response | Awaitable[Response]: ...


class Processor:
    """Base class for in-process processors. Override `process` (async or plain `def`)."""

    async def start(self) -> None:
        """Called once before the first item (open clients, pools...)."""

    async def close(self) -> None:
        """Called once when the watcher stops."""

    def process(self, item: Item) -> Response | Awaitable[Response]:
        raise NotImplementedError

    async def process_batch(self, items: list[Item]) -> list[Response]:
        """Answer a batch (`feedproc watch --batch N`): one Response per item, in the items' order.
        Override to work in bulk (an exception fails every item of the batch, transiently). Not
        overridden, the watcher hands each item of a batch to `process`, concurrently, each failure
        its own item's; called directly, this default does the same, one item after the other."""
        return [await call_processor(self, item) for item in items]


async def call_processor(processor: ProcessorLike, item: Item, timeout: float | None = None) -> Response:
    """Run `processor.process(item)`: awaited if async, in a worker thread if a plain function.

    `timeout` (seconds) bounds the call from the moment it runs: a plain function still waiting for
    a free worker thread has not started, and that wait is not counted. A call past its timeout is
    abandoned (a thread cannot be stopped: it runs on, unheard) and `RetryLater` is raised."""
    method: Any = processor.process  # async or plain: which is decided at run time
    result: Any
    if _is_async(method):
        result = await (method(item) if timeout is None else _call_async(method, item, timeout))
    else:
        result = await (asyncio.to_thread(method, item) if timeout is None else _call_in_thread(method, item, timeout))
        if inspect.isawaitable(result):
            result = await result
    if not isinstance(result, Response):
        raise InvalidAnswer(f"process() returned {type(result).__name__}, not a feedproc.Response")
    return result


async def call_batch(
    processor: ProcessorLike, items: list[Item], timeout: float | None = None
) -> list[Response | Exception]:
    """Deliver a batch: for each item, in order, its Response or the exception that is its failure.

    An HTTPProcessor sends one request (`deliver_batch`); a processor that overrides `process_batch`
    gets the whole list (an exception fails every item; a missing or wrong answer only its item);
    any other gets each item's `process` call, concurrently. `timeout` bounds a `process_batch` call
    as a whole, or each `process` call."""
    deliver = getattr(processor, "deliver_batch", None)
    if deliver is not None:
        try:
            results: list[Response | Exception] = await (
                deliver(items) if timeout is None else _call_async(deliver, items, timeout)
            )
        except Exception as error:
            return [error] * len(items)
        return results
    if _overrides_batch(processor):
        method: Any = getattr(processor, "process_batch")  # noqa: B009  # not part of ProcessorLike
        try:
            if _is_async(method):
                answer = await (method(items) if timeout is None else _call_async(method, items, timeout))
            else:
                call = asyncio.to_thread(method, items) if timeout is None else _call_in_thread(method, items, timeout)
                answer = await call
                if inspect.isawaitable(answer):
                    answer = await answer
        except Exception as error:
            return [error] * len(items)
        return _per_item(answer, len(items))
    calls = (call_processor(processor, item, timeout) for item in items)
    gathered = await asyncio.gather(*calls, return_exceptions=True)
    for result in gathered:
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            raise result  # cancelled: the watcher is stopping
    return cast("list[Response | Exception]", gathered)


def _overrides_batch(processor: Any) -> bool:
    method = getattr(type(processor), "process_batch", None)
    return method is not None and method is not Processor.process_batch


def _per_item(answer: Any, count: int) -> list[Response | Exception]:
    """`process_batch`'s answer as one result per item: a missing or wrong answer fails its item."""
    if not isinstance(answer, list):
        return [InvalidAnswer(f"process_batch() returned {type(answer).__name__}, not a list")] * count
    results: list[Response | Exception] = []
    for n in range(count):
        if n >= len(answer):
            results.append(InvalidAnswer(f"process_batch() returned {len(answer)} answers for {count} items"))
        elif isinstance(answer[n], Response):
            results.append(answer[n])
        else:
            results.append(InvalidAnswer(f"process_batch() answered with {type(answer[n]).__name__}, not a Response"))
    return results


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


async def _call_async(method: Any, item: Item | list[Item], timeout: float) -> Any:
    try:
        async with asyncio.timeout(timeout) as deadline:
            return await method(item)
    except TimeoutError:
        if deadline.expired():
            raise _timed_out(timeout) from None
        raise  # the processor's own TimeoutError


async def _call_in_thread(method: Any, item: Item | list[Item], timeout: float) -> Any:
    loop = asyncio.get_running_loop()
    started = loop.create_future()

    def run() -> Any:
        loop.call_soon_threadsafe(lambda: None if started.done() else started.set_result(None))
        return method(item)

    call = loop.run_in_executor(None, contextvars.copy_context().run, run)
    await asyncio.wait((started, call), return_when=asyncio.FIRST_COMPLETED)  # queued for a thread: not timed
    done, _ = await asyncio.wait((call,), timeout=timeout)
    if not done:
        call.add_done_callback(lambda f: f.cancelled() or f.exception())  # its late outcome is dropped quietly
        raise _timed_out(timeout)
    return call.result()


def load_processor(path: str) -> ProcessorLike:
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
    if isinstance(target, ProcessorLike) and not inspect.isclass(target):
        return target
    if callable(target):
        try:
            instance = target()
        except TypeError as error:
            raise InvalidInput(f"bad --processor {path!r}: cannot create it without arguments ({error})") from error
        if isinstance(instance, ProcessorLike):
            return instance
    raise InvalidInput(f"bad --processor {path!r}: not a Processor class, factory or instance")


# ---------------------------------------------------------------- HTTP


class HTTPProcessor(Processor):
    """Sends each item to an HTTP handler service (`POST url`) and reads its answer.

    Requests go over one aiohttp session's keep-alive pool of up to `max_connections` (TCP_NODELAY,
    redirects not followed, no cookies kept). `timeout` bounds the whole request, from connecting to
    the answer's last byte; an answer larger than `max_answer_bytes` once decoded (gzip or deflate,
    inflated while it streams) is cut off as a transient failure. `headers` are added to every
    request (e.g. an Authorization header for the handler). Credentials in `url` are sent as basic
    auth and never shown: errors name `shown_url`.

    Why aiohttp: 10,000 POSTs of an item's body at 50 in flight to the benchmark's handler ran at
    about 13,000/s on an aiohttp session against 2,040/s with httpx, even sharded into 2-connection
    clients as this processor did (httpx's pool slows down sharply under concurrency).
    """

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 30.0,
        headers: Mapping[str, str] | None = None,
        max_connections: int = 100,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        if max_answer_bytes < 1:
            raise ValueError("max_answer_bytes must be at least 1")
        self.url = url
        self.shown_url = redact_url(url)
        self._secrets = url_secrets(url)
        self.timeout = timeout
        self.max_answer_bytes = max_answer_bytes
        # Only the encodings read_body inflates within the size limit are offered.
        self.headers = {"User-Agent": f"feedproc/{__version__}", "Accept-Encoding": ACCEPT_ENCODING, **(headers or {})}
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"HTTPProcessor({self.shown_url!r})"

    async def start(self) -> None:
        if self._session is not None:
            return
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=self.max_connections),
            headers=self.headers,
            auto_decompress=False,  # read_body inflates, within the size limit
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=None),  # process() bounds the whole request itself
        )

    @property
    def session(self) -> aiohttp.ClientSession:
        """The client session requests go over (after `start()`)."""
        if self._session is None:
            raise RuntimeError("HTTPProcessor.start() was not called")
        return self._session

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def process(self, item: Item) -> Response:
        status, headers, content = await self._send(request_body(item), self.max_answer_bytes)
        return read_answer(status, content, headers.get("Retry-After"), url=self.shown_url)

    async def deliver_batch(self, items: list[Item]) -> list[Response | Exception]:
        """One `POST` of `{"items": [...]}` for a batch; each item's Response or failure, in order
        (`read_batch_answer`). The size limit is `max_answer_bytes` per item of the batch."""
        body = b'{"items":[' + b",".join(request_body(item) for item in items) + b"]}"
        try:
            status, headers, content = await self._send(body, self.max_answer_bytes * len(items))
        except Exception as error:  # the request failed as a whole: every item's failure
            return [error] * len(items)
        return read_batch_answer(status, content, headers.get("Retry-After"), [i.id for i in items], self.shown_url)

    async def _send(self, body: bytes, limit: int) -> tuple[int, MultiMapping[str], bytes]:
        """POST `body` within the whole-request timeout; transport failures become RetryLater."""
        await self.start()
        assert self._session is not None
        try:
            async with asyncio.timeout(self.timeout) as deadline:
                return await self._exchange(self._session, body, limit)
        except TimeoutError as error:
            if deadline.expired():
                raise RetryLater(
                    f"handler timed out after {self.timeout:g}s (whole request, {self.shown_url})"
                ) from error
            raise RetryLater(f"handler timed out ({type(error).__name__}, {self.shown_url})") from error
        except (aiohttp.ClientError, OSError, ValueError) as error:
            text = redact_text(str(error), self._secrets)
            detail = f"{type(error).__name__}: {text}" if text else type(error).__name__
            raise RetryLater(f"handler unreachable: {detail} ({self.shown_url})") from error

    def request_headers(self) -> Mapping[str, str]:
        """The headers of one request besides the constant ones (`headers`, `User-Agent`...): its
        content type and, with tracing, its `traceparent`. Override to add per-request headers."""
        if not tracing.enabled():
            return JSON_CONTENT
        headers = dict(JSON_CONTENT)
        tracing.inject(headers)  # the delivery's span is current here: the handler's spans join its trace
        return headers

    async def _exchange(
        self, session: aiohttp.ClientSession, body: bytes, limit: int
    ) -> tuple[int, MultiMapping[str], bytes]:
        """POST `body`; the answer's status, headers and body, read within the size limit."""
        headers = self.request_headers()
        async with session.post(self.url, data=body, headers=headers, allow_redirects=False) as response:
            ok = 200 <= response.status < 300
            try:
                content = await read_body(response.headers, response.content.iter_any(), limit)
            except AnswerTooLarge as error:
                if ok:
                    raise RetryLater(f"{error} from {self.shown_url}") from None
                content = error.start  # a failure's status decides; the start of its body is kept
                response.close()  # the rest is not read: the connection cannot be reused
            except UndecodableAnswer as error:
                if ok:
                    raise InvalidAnswer(str(error)) from None
                content = b""
            return response.status, response.headers, content


class AnswerTooLarge(Exception):
    """An answer's body is over the size limit (`start`: what was read of it, at most the limit)."""

    def __init__(self, limit: int, start: bytes = b"", declared: int | None = None) -> None:
        said = f" (Content-Length: {declared})" if declared is not None else ""
        super().__init__(f"answer larger than {limit} bytes{said}")
        self.start = start


class UndecodableAnswer(Exception):
    """An answer's body in an encoding we did not offer, or corrupt."""


async def read_body(headers: MultiMapping[str], chunks: AsyncIterator[bytes], limit: int) -> bytes:
    """The body arriving as `chunks` (raw, as sent), decoded (identity, gzip or deflate) as it arrives.

    Raises AnswerTooLarge as soon as the decoded body passes `limit`: decompression never produces
    more than the room left, so a gzip bomb costs at most `limit` bytes of memory however far it
    would inflate. A compressed body may take twice the limit on the wire (a stream that inflates
    to nothing is stopped there); a Content-Length past that is refused before reading."""
    decoder = _Decoder.of(headers)
    wire_limit = limit if decoder is _IDENTITY else 2 * limit + 1024
    declared = _content_length(headers)
    if declared is not None and declared > wire_limit:
        raise AnswerTooLarge(limit, declared=declared)
    parts: list[bytes] = []
    size = wire = 0
    async for chunk in chunks:
        wire += len(chunk)
        piece = decoder.decode(chunk, limit - size)
        size += len(piece)
        parts.append(piece)
        if size > limit or wire > wire_limit:
            raise AnswerTooLarge(limit, b"".join(parts)[:limit])
    piece = decoder.flush(limit - size)
    if piece:
        parts.append(piece)
        if size + len(piece) > limit:
            raise AnswerTooLarge(limit, b"".join(parts)[:limit])
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _content_length(headers: MultiMapping[str]) -> int | None:
    value = headers.get("Content-Length")
    if value is None or not value.strip().isdigit():
        return None
    return int(value.strip()[:30])  # 10**30 bytes is past any limit; no 4,300-digit parse


class _Decoder:
    """Undoes a Content-Encoding chunk by chunk, never producing more than it is allowed to.

    Clients' own decoders inflate a whole chunk at once (a 64 KiB chunk of a gzip bomb is 64 MiB);
    zlib's `max_length` stops here at the room left (plus one byte, to tell that it is over)."""

    __slots__ = ("_raw_deflate", "_zlib")

    def __init__(self, zlib_object: Any = None, raw_deflate: bool = False) -> None:
        self._zlib = zlib_object
        self._raw_deflate = raw_deflate  # a "deflate" body may be raw deflate rather than zlib

    @classmethod
    def of(cls, headers: MultiMapping[str]) -> _Decoder:
        fields = headers.getall("Content-Encoding", [])
        encodings = [e.strip().lower() for field in fields for e in field.split(",")]
        encodings = [e for e in encodings if e not in ("", "identity")]
        if not encodings:
            return _IDENTITY
        if len(encodings) == 1 and encodings[0] in ("gzip", "x-gzip"):
            return cls(zlib.decompressobj(16 + zlib.MAX_WBITS))
        if len(encodings) == 1 and encodings[0] == "deflate":
            return cls(zlib.decompressobj(), raw_deflate=True)
        raise UndecodableAnswer(f"Content-Encoding {', '.join(encodings)!r} was not offered (only {ACCEPT_ENCODING})")

    def decode(self, chunk: bytes, room: int) -> bytes:
        if self._zlib is None:
            return chunk
        try:
            try:
                return cast(bytes, self._zlib.decompress(chunk, max(room, 0) + 1))
            except zlib.error:
                if not self._raw_deflate:
                    raise
                self._raw_deflate, self._zlib = False, zlib.decompressobj(-zlib.MAX_WBITS)
                return cast(bytes, self._zlib.decompress(chunk, max(room, 0) + 1))
            finally:
                self._raw_deflate = False  # only the first chunk tells zlib from raw deflate
        except zlib.error as error:
            raise UndecodableAnswer(f"the answer's compressed body is corrupt ({error})") from None

    def flush(self, room: int) -> bytes:
        if self._zlib is None:
            return b""
        try:
            return cast(bytes, self._zlib.flush(max(room, 0) + 1))
        except zlib.error as error:
            raise UndecodableAnswer(f"the answer's compressed body is corrupt ({error})") from None


_IDENTITY = _Decoder()


def request_body(item: Item) -> bytes:
    """The JSON body of the contract; data that is not JSON travels as `data_base64`.

    Data that is JSON in UTF-8 (the common case) is spliced in as it is stored rather than parsed
    and encoded again (1.8 against 5.6 us per item, timeit)."""
    try:
        json.loads(item.data.decode())  # JSON at all? (the text is sent as it is)
    except (ValueError, UnicodeDecodeError):
        body: dict[str, Any] = {
            "id": item.id,
            "partition": item.partition,
            "queue": item.queue,
            "gate": item.gate,
            "attempt": item.attempt,
        }
        try:
            body["data"] = json.loads(item.data)  # JSON in UTF-16 or UTF-32
        except (ValueError, UnicodeDecodeError):
            body["data_base64"] = base64.b64encode(item.data).decode()
        return json.dumps(body, separators=(",", ":")).encode()
    return b'{"id":%d,"partition":%s,"queue":%s,"gate":%d,"attempt":%d,"data":%s}' % (
        item.id,
        _json_string(item.partition),
        _json_string(item.queue),
        item.gate,
        item.attempt,
        item.data,
    )


@functools.lru_cache(maxsize=4096)
def _json_string(text: str) -> bytes:
    """`text` as a JSON string (partition keys and queue names repeat from item to item)."""
    return json.dumps(text).encode()


class _NonStandardJSON(Exception):
    """NaN, Infinity or a number past any float in a JSON text."""


def _no_constant(name: str) -> Any:
    raise _NonStandardJSON(f"non-standard JSON: {name} is not allowed")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NonStandardJSON(f"non-standard JSON: the number {text[:40]} is out of range")
    return value


# One decoder for every answer: json.loads with hooks builds a new one per call (1.4 against 3.0 us
# for `{"done": true}`, timeit).
_STRICT_JSON = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float)


def parse_json(content: bytes) -> Any:
    """Standard JSON only: NaN, Infinity, -Infinity and numbers past a float (1e400) raise
    _NonStandardJSON (Python's parser accepts them; no database or handler should see them);
    anything else that is not JSON raises ValueError."""
    try:
        return _STRICT_JSON.decode(content.decode(json.detect_encoding(content), "surrogatepass"))
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def read_answer(status: int, content: bytes, retry_after_header: str | None, url: str | None = None) -> Response:
    """Turn an HTTP answer into a Response, or raise the failure the contract says it is.

    `url` (shown without credentials) is named in the message of a non-2xx answer."""
    retry_after = parse_retry_after(retry_after_header)
    ok = 200 <= status < 300
    parsed: Any = None
    problem: str | None = None
    try:
        parsed = parse_json(content) if content else None
    except _NonStandardJSON as error:
        problem = str(error)
    except (ValueError, UnicodeDecodeError):
        parsed = None
    go_error = parsed.get("error") if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict) else None
    if not ok:
        text = content[:BODY_KEPT].decode("utf-8", "replace")
        where = f"HTTP {status} from {url}" if url else f"HTTP {status}"
        message = f"{where}: {text}" if text else where
        permanent = (400 <= status < 500 and status not in (408, 429)) or bool(go_error and go_error.get("no_retry"))
        if permanent:
            raise PermanentError(message)
        raise RetryLater(message, after=retry_after)
    if problem is not None:
        raise InvalidAnswer(problem)
    if not isinstance(parsed, dict):
        shown = content[:100].decode("utf-8", "replace")
        raise InvalidAnswer(f"expected a JSON object, got {shown!r}")
    return answer_from_object(parsed, retry_after)


def answer_from_object(answer: dict[str, Any], retry_after: float | None = None) -> Response:
    """One item's `2xx` answer object as a Response, or the failure it reports (`"error": {...}`)."""
    go_error = answer.get("error")
    if isinstance(go_error, dict):
        message = str(go_error.get("message") or "handler reported an error")
        if go_error.get("no_retry"):
            raise PermanentError(message)
        raise RetryLater(message, after=retry_after)
    return response_from_json(answer, retry_after)


def read_batch_answer(
    status: int, content: bytes, retry_after_header: str | None, ids: list[int], url: str | None = None
) -> list[Response | Exception]:
    """A batch's HTTP answer as each item's Response or failure, in the order of `ids`.

    `{"answers": [...]}` answers the items in order, or by each answer's `"id"` when every answer
    carries one. A non-`2xx` status, a body that is not standard JSON or has no `answers` list is
    every item's failure (as `read_answer` judges it); a missing answer, or one that is not an
    object or is invalid, is its own item's failure only."""
    count = len(ids)
    try:
        parsed = parse_json(content) if content else None
    except _NonStandardJSON as error:
        parsed = InvalidAnswer(str(error))
    except (ValueError, UnicodeDecodeError):
        parsed = None
    answers = parsed.get("answers") if isinstance(parsed, dict) else None
    if not 200 <= status < 300 or not isinstance(answers, list):
        try:
            if isinstance(parsed, InvalidAnswer) and 200 <= status < 300:
                raise parsed
            read_answer(status, content, retry_after_header, url)
            raise InvalidAnswer(f'expected {{"answers": [...]}}, got {shown(content[:100].decode("utf-8", "replace"))}')
        except Exception as error:
            return [error] * count
    retry_after = parse_retry_after(retry_after_header)
    if answers and all(isinstance(a, dict) and "id" in a for a in answers):
        by_id = {a["id"]: a for a in answers}
        chosen = [by_id.get(item_id, _MISSING) for item_id in ids]
    else:
        chosen = [answers[n] if n < len(answers) else _MISSING for n in range(count)]
    results: list[Response | Exception] = []
    for n, answer in enumerate(chosen):
        if answer is _MISSING:
            missing = f"no answer for item {ids[n]} in the batch answer ({len(answers)} answers for {count} items)"
            results.append(InvalidAnswer(missing))
        elif not isinstance(answer, dict):
            results.append(InvalidAnswer(f"answer {n + 1} of the batch is not a JSON object"))
        else:
            try:
                results.append(answer_from_object(answer, retry_after))
            except Exception as error:
                results.append(error)
    return results


def response_from_json(answer: dict[str, Any], retry_after: float | None = None) -> Response:
    """Read an answer object (ours, or Go Feed's `complete` / `response` spelling).

    Every value is checked here, so that a hostile answer is an InvalidAnswer (a transient failure
    of its item) and never reaches the database: gates from 0 to MAX_GATE, a finite `retry_after`
    >= 0 (how long it may be is the policy's cap), standard JSON data."""
    done = answer.get("done", answer.get("complete", False))
    data_value = answer["data"] if "data" in answer else answer.get("response", _MISSING)
    data = None if data_value is _MISSING else _answer_data(data_value, "data")
    field_retry = answer.get("retry_after")
    if field_retry is not None:
        try:
            field_retry = check_delay(field_retry)
        except ValueError as error:
            raise InvalidAnswer(str(error)) from None
        retry_after = max(field_retry, retry_after or 0.0)
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
            raise InvalidAnswer(f"child {n} has gate {shown(gate)}, not an integer")
        if problem := gate_problem(gate):
            raise InvalidAnswer(f"child {n}: {problem}")
        children.append(NewItem(gate, _answer_data(child.get("data"), f"child {n} data")))
    if done is True:
        return Response(done=True, data=data, items=children, retry_after=retry_after, progress=progress)
    gate = answer.get("gate")
    if gate is None:
        raise InvalidAnswer('the answer has neither "done": true nor a "gate"')
    if isinstance(gate, bool) or not isinstance(gate, int):
        raise InvalidAnswer(f"gate must be an integer, got {shown(gate)}")
    if problem := gate_problem(gate):
        raise InvalidAnswer(problem)
    return Response(gate=gate, data=data, items=children, retry_after=retry_after, progress=progress)


def _answer_data(value: Any, what: str) -> bytes:
    """A JSON value of an answer as the bytes stored (a str too is stored as JSON text)."""
    try:
        return strict_json(value, what)
    except (TypeError, ValueError) as error:  # e.g. a lone surrogate "\\ud800" in a string
        raise InvalidAnswer(str(error)) from None


_MISSING = object()


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or an HTTP date), or None.

    A value that is not a finite number or a date (`inf`, `nan`, `1e400`, garbage) is taken as no
    header at all: the header is advice, and unreadable advice should not turn an otherwise valid
    answer into a failure; the backoff applies. A finite but huge value is returned as it is: the
    retry policy caps every delay at `max_retry_delay`."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
        seconds = when.timestamp() - time.time()
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
    return max(0.0, seconds) if math.isfinite(seconds) else None
