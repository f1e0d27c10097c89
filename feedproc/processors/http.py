"""The HTTP processor: each item (or batch) is a `POST` to a handler service, over one aiohttp
session; answers are read within a size limit as they stream, then by `answers`."""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import secrets
import zlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar, cast

import aiohttp
from multidict import MultiMapping

from .. import logs, tracing
from .._version import __version__
from ..core.errors import Accepted, InvalidAnswer, RetryLater
from ..core.models import MAX_CHILDREN, Item, Response
from ..core.redaction import credentials_conflict, redact_text, redact_url, url_secrets
from .answers import read_answer, read_batch_answer
from .calling import Processor

MAX_ANSWER_BYTES = 10 * 1024 * 1024  # an answer's body, decoded, at most (`feedproc watch --max-answer-bytes`)
ACCEPT_ENCODING = "gzip, deflate"  # what read_body inflates within the size limit
JSON_CONTENT = {"Content-Type": "application/json"}
ACCEPTED_LEASE = 3600.0  # seconds a 202's answer may take when the handler does not say
MAX_ACCEPTED_LEASE = 7 * 24 * 3600
LARGE_ANSWER = 64 * 1024  # bytes from which an answer is read on a thread (HTTPProcessor._read)
REQUEST_FORMATS = ("json", "raw")
_T = TypeVar("_T")  # HTTPProcessor(request=...): the contract's JSON body, or Go Feed's raw data


@dataclass(frozen=True, slots=True)
class HTTPOptions:
    """Settings of the HTTP processors a watcher makes: its `--handler`'s and its pipeline's gates'
    (the `feedproc watch` options of the same names; `headers` are `--header`'s, and a gate's own
    timeout and headers win over these). See `HTTPProcessor` for what each does."""

    timeout: float = 30.0
    headers: Mapping[str, str] = field(default_factory=dict)
    max_connections: int = 100
    max_answer_bytes: int = MAX_ANSWER_BYTES
    callback_url: str | None = None
    max_children: int = MAX_CHILDREN

    def __post_init__(self) -> None:
        object.__setattr__(self, "headers", MappingProxyType(dict(self.headers)))  # frozen all the way down

    def processor(
        self,
        url: str,
        *,
        timeout: float | None = None,
        headers: Mapping[str, str] | None = None,
        request: str = "json",
    ) -> HTTPProcessor:
        """An HTTPProcessor of `url` with these settings (`timeout` and `headers` replacing theirs)."""
        return HTTPProcessor(
            url,
            timeout=self.timeout if timeout is None else timeout,
            headers=self.headers if headers is None else headers,
            max_connections=self.max_connections,
            max_answer_bytes=self.max_answer_bytes,
            callback_url=self.callback_url,
            request=request,
            max_children=self.max_children,
        )


class HTTPProcessor(Processor):
    """Sends each item to an HTTP handler service (`POST url`) and reads its answer.

    Requests go over one aiohttp session's keep-alive pool of up to `max_connections` (TCP_NODELAY,
    redirects not followed, no cookies kept). `timeout` bounds the whole request, from connecting to
    the answer's last byte; an answer larger than `max_answer_bytes` once decoded (gzip or deflate,
    inflated while it streams) is cut off as a transient failure, and one with more than
    `max_children` child items is refused before any child is read: a permanent failure (the same
    answer would be refused every time). `headers` are added to every
    request (e.g. an Authorization header for the handler). Credentials in `url` are sent as basic
    auth and never shown: errors name `shown_url`.

    `request="json"` (the default) sends the contract's JSON body (`request_body`). `request="raw"`
    sends the item's data bytes as they are stored, as Go Feed's HTTP processor does, with the
    item's metadata in `Feedproc-*` headers (`raw_headers`); with a `callback_url`, the token and
    answer URL travel as `Feedproc-Token` and `Feedproc-Answer-Url`. Answers are read the same way
    in both; a batch (`deliver_batch`) has no raw form.

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
        callback_url: str | None = None,
        request: str = "json",
        max_children: int = MAX_CHILDREN,
    ) -> None:
        if max_answer_bytes < 1:
            raise ValueError("max_answer_bytes must be at least 1")
        if max_children < 0:
            raise ValueError("max_children must be at least 0")
        if request not in REQUEST_FORMATS:
            raise ValueError(f"request must be one of {', '.join(map(repr, REQUEST_FORMATS))}, got {request!r}")
        if conflict := credentials_conflict(url, headers or {}):
            raise ValueError(conflict)
        self.url = url
        # Where a handler that answers 202 sends its answer later (`feedproc serve`'s base URL):
        # with it, each request carries a `token` and an `answer_url`.
        self.callback_url = callback_url.rstrip("/") if callback_url else None
        self.request = request
        # Both are fixed from here on: process() tells the common case (a JSON body, no callback)
        # from the others with this one flag, as cheaply as it tested callback_url alone before.
        self._plain = request == "json" and self.callback_url is None
        self.shown_url = redact_url(url)
        self._secrets = url_secrets(url)
        # Whichever way this processor was made (--handler, a pipeline's gate, Python), its
        # credentials never reach a log line.
        for secret in [*self._secrets, *(headers or {}).values()]:
            logs.add_secret(secret)
        self.timeout = timeout
        self.max_answer_bytes = max_answer_bytes
        self.max_children = max_children
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
        fan_in = item.collected is not None or item.accumulated is not None  # an item that collects (rare)
        if self._plain and not fan_in:
            status, headers, content = await self._send(
                request_body(item), self.max_answer_bytes, self.request_headers()
            )
            return await self._read(read_answer, status, content, headers.get("Retry-After"))
        token = answer_url = None
        if self.callback_url is not None:
            # A collecting delivery's token (its results URL's) is its callback token too: after a
            # 202 the handler goes on reading its results with it until it answers.
            token = getattr(item.collected, "token", None) or secrets.token_urlsafe(24)
            answer_url = f"{self.callback_url}/api/v1/items/{item.id}/answer"
        if self.request == "raw":  # the body is the handler's own data: everything else goes in headers
            body = item.data
            sent: Mapping[str, str] = {**self.request_headers(), **raw_headers(item, token, answer_url)}
            if fan_in:
                sent = {**sent, **fan_in_headers(item)}
        else:
            body, sent = (await fan_in_body(item)) if fan_in else request_body(item), self.request_headers()
            if token is not None and answer_url is not None:
                body = body[:-1] + b',"token":"%s","answer_url":%s}' % (token.encode(), _json_string(answer_url))
        status, headers, content = await self._send(body, self.max_answer_bytes, sent)
        if status == 202 and token is not None:
            raise Accepted(token, read_acceptance(content))
        return await self._read(read_answer, status, content, headers.get("Retry-After"))

    async def deliver_batch(self, items: list[Item]) -> list[Response | Exception]:
        """One `POST` of `{"items": [...]}` for a batch; each item's Response or failure, in order
        (`read_batch_answer`). The size limit is `max_answer_bytes` per item of the batch.

        Raw requests (`request="raw"`) have no batch form: ValueError."""
        if self.request == "raw":
            raise ValueError("HTTPProcessor(request='raw') cannot deliver batches: raw requests carry one item each")
        if any(item.collected is not None or item.accumulated is not None for item in items):
            bodies = [await fan_in_body(item) for item in items]  # fan-in items: each with what it collects
        else:
            bodies = [request_body(item) for item in items]
        body = b'{"items":[' + b",".join(bodies) + b"]}"
        try:
            status, headers, content = await self._send(
                body, self.max_answer_bytes * len(items), self.request_headers()
            )
        except Exception as error:  # the request failed as a whole: every item's failure
            return [error] * len(items)
        ids = [i.id for i in items]
        return await self._read(read_batch_answer, status, content, headers.get("Retry-After"), ids)

    async def _read(self, reader: Callable[..., _T], status: int, content: bytes, *args: Any) -> _T:
        """`reader(status, content, *args, url, max_children)` (read_answer, read_batch_answer): a
        large answer on a thread. Reading 100,000 children took 1 s: on the event loop, the watcher's
        heartbeat (and every other delivery) would wait that long, and a short lease could run out."""
        if len(content) < LARGE_ANSWER:
            return reader(status, content, *args, self.shown_url, self.max_children)
        return await asyncio.to_thread(reader, status, content, *args, self.shown_url, self.max_children)

    async def _send(self, body: bytes, limit: int, headers: Mapping[str, str]) -> tuple[int, MultiMapping[str], bytes]:
        """POST `body` with `headers` (besides the session's constant ones) within the whole-request
        timeout; transport failures become RetryLater."""
        await self.start()
        assert self._session is not None
        try:
            async with asyncio.timeout(self.timeout) as deadline:
                return await self._exchange(self._session, body, limit, headers)
        except TimeoutError as error:
            if deadline.expired():
                raise RetryLater(
                    f"handler timed out after {self.timeout:g}s (whole request, {self.shown_url})", pushback="timeout"
                ) from error
            raise RetryLater(f"handler timed out ({type(error).__name__}, {self.shown_url})") from error
        except (aiohttp.ClientError, OSError, ValueError) as error:
            text = redact_text(str(error), self._secrets)
            detail = f"{type(error).__name__}: {text}" if text else type(error).__name__
            raise RetryLater(f"handler unreachable: {detail} ({self.shown_url})") from error

    def request_headers(self) -> Mapping[str, str]:
        """The headers of one request besides the constant ones (`headers`, `User-Agent`...): its
        content type and, with tracing, its `traceparent`. Override to add per-request headers.

        Called once per request, while the delivery is under way (its span current); a raw request
        adds the item's `Feedproc-*` headers to what it returns (a new dict: this one is not changed)."""
        if not tracing.enabled():
            return JSON_CONTENT
        headers = dict(JSON_CONTENT)
        tracing.inject(headers)  # the delivery's span is current here: the handler's spans join its trace
        return headers

    async def _exchange(
        self, session: aiohttp.ClientSession, body: bytes, limit: int, headers: Mapping[str, str]
    ) -> tuple[int, MultiMapping[str], bytes]:
        """POST `body`; the answer's status, headers and body, read within the size limit."""
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


def read_acceptance(content: bytes) -> float:
    """The lease a `202 {"accepted": true, "lease_seconds": S}` answer asks for (default an hour,
    at most a week); InvalidAnswer for anything else."""
    try:
        parsed = json.loads(content) if content else None
    except (ValueError, UnicodeDecodeError):
        parsed = None
    if not isinstance(parsed, dict) or parsed.get("accepted") is not True:
        raise InvalidAnswer('a 202 answer must be {"accepted": true[, "lease_seconds": S]}')
    seconds = parsed.get("lease_seconds", ACCEPTED_LEASE)
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 1 <= seconds <= MAX_ACCEPTED_LEASE:
        raise InvalidAnswer(f"lease_seconds must be from 1 to {MAX_ACCEPTED_LEASE}, got {seconds!r}")
    return float(seconds)


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
            "deliveries": item.deliveries,
        }
        try:
            body["data"] = json.loads(item.data)  # JSON in UTF-16 or UTF-32
        except (ValueError, UnicodeDecodeError):
            body["data_base64"] = base64.b64encode(item.data).decode()
        return json.dumps(body, separators=(",", ":")).encode()
    return b'{"id":%d,"partition":%s,"queue":%s,"gate":%d,"attempt":%d,"deliveries":%d,"data":%s}' % (
        item.id,
        _json_string(item.partition),
        _json_string(item.queue),
        item.gate,
        item.attempt,
        item.deliveries,
        item.data,
    )


async def fan_in_body(item: Item) -> bytes:
    """`request_body` of a fan-in item: with `"collected"` (`core.fanin.Collected.to_json`: its
    results inline, or their `results_url`) and `"accumulated"`; encoded on a thread when its
    results travel inline (up to 1 MiB of them)."""
    collected = item.collected.to_json() if item.collected is not None else None
    added = {"collected": collected, "accumulated": dict(item.accumulated or {})}

    def encode() -> bytes:
        return request_body(item)[:-1] + b"," + json.dumps(added, separators=(",", ":")).encode()[1:]

    inline = getattr(item.collected, "inline", None)
    return await asyncio.to_thread(encode) if inline else encode()


def fan_in_headers(item: Item) -> dict[str, str]:
    """A raw request's headers for what a fan-in item receives: the collected gate, its counts, the
    URL of its results (`Feedproc-Results-Url`; none when there are none) and the accumulator as
    compact JSON (ASCII)."""
    headers = {"Feedproc-Accumulated": json.dumps(dict(item.accumulated or {}), separators=(",", ":"))}
    collected = item.collected
    if collected is not None:
        headers["Feedproc-Collected-Gate"] = str(collected.gate_name or collected.gate)
        headers["Feedproc-Collected-Count"] = str(collected.count)
        headers["Feedproc-Collected-Failed"] = str(collected.failed)
        if collected.results_url is not None:
            headers["Feedproc-Results-Url"] = collected.results_url
    return headers


def raw_headers(item: Item, token: str | None = None, answer_url: str | None = None) -> dict[str, str]:
    """A raw request's headers for `item`: the fields the JSON body would carry besides its data,
    and a callback's `token` and `answer_url` when given. (Keys and queue names as feedproc checks
    them are plain ASCII without spaces: valid header values as they are.)"""
    headers = {
        "Feedproc-Item-Id": str(item.id),
        "Feedproc-Partition": item.partition,
        "Feedproc-Queue": item.queue,
        "Feedproc-Gate": str(item.gate),
        "Feedproc-Attempt": str(item.attempt),
        "Feedproc-Deliveries": str(item.deliveries),
    }
    if token is not None and answer_url is not None:
        headers["Feedproc-Token"] = token
        headers["Feedproc-Answer-Url"] = answer_url
    return headers


@functools.lru_cache(maxsize=4096)
def _json_string(text: str) -> bytes:
    """`text` as a JSON string (partition keys and queue names repeat from item to item)."""
    return json.dumps(text).encode()
