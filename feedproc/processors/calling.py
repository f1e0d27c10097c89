"""The processor seam: what a watcher hands items to (`ProcessorLike`, the `Processor` base class),
how it calls one for an item or a batch (async, or a plain `def` on a thread; with a timeout), and
`load_processor` for `--processor module:attr`."""

from __future__ import annotations

import asyncio
import contextvars
import importlib
import inspect
from collections.abc import Awaitable
from typing import Any, Protocol, cast, runtime_checkable

from ..core.errors import InvalidAnswer, InvalidInput, RetryLater
from ..core.models import Item, Response


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
        """Answer one item with a `Response` (async, or a plain `def`, which runs in a thread).
        Raise `PermanentError` to fail it at once; any other exception is a transient failure,
        retried with backoff (`RetryLater(after=S)`: not before S seconds)."""
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
    return RetryLater(f"item timed out after {timeout:g}s", pushback="timeout")


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
    except BaseException as error:  # the user's module raised (or exited) while importing: say where
        if isinstance(error, KeyboardInterrupt):
            raise
        raise InvalidInput(f"bad --processor {path!r}: importing {module_name!r} raised {_where(error)}") from None
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
        except Exception as error:
            raise InvalidInput(f"bad --processor {path!r}: creating it raised {_where(error)}") from None
        if isinstance(instance, ProcessorLike):
            return instance
    raise InvalidInput(f"bad --processor {path!r}: not a Processor class, factory or instance")


def _where(error: BaseException) -> str:
    """`Type: message (file line N)`, the innermost frame of the error's traceback: one line."""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    message = " ".join(str(error).split())[:200]
    text = f"{type(error).__name__}: {message}" if message else type(error).__name__
    return f"{text} ({frames[-1].filename} line {frames[-1].lineno})" if frames else text
