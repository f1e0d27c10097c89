"""Processors that complete in their answer's transaction ("complete in your transaction"): a
plain `def process(item, connection)` given a SQLAlchemy `Connection` in the fenced transaction
that writes its answer, so that what it writes there commits if and only if the answer is accepted.

Apart from `calling` because it names SQLAlchemy's types: the pull worker, which imports the
processor seam, needs no database."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeAlias, cast, runtime_checkable

from ..core.errors import InvalidAnswer, InvalidInput
from ..core.models import Item, Response
from .calling import ProcessorLike, _is_async, _timed_out

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection


@runtime_checkable
class TransactionalProcessorLike(Protocol):
    """A processor that completes in the answer's transaction ("complete in your transaction"):
    `transactional = True`, and a plain `def process(item, connection)` given a SQLAlchemy
    `Connection` inside the fenced transaction that writes its answer. Its statements on it commit
    if and only if the answer is accepted. `TransactionalProcessor` is the base class to subclass."""

    transactional: ClassVar[bool]

    def process(self, item: Item, connection: Connection) -> Response: ...


#: What a watcher is given to hand items to: a processor, or a transactional one.
AnyProcessor: TypeAlias = ProcessorLike | TransactionalProcessorLike


class TransactionalProcessor:
    """Base class for processors whose own writes commit with their answer, in one transaction on
    feedproc's database. Override `process(item, connection)`, a plain `def` (it runs in a worker
    thread): its statements on `connection` commit if and only if the answer is accepted (the
    partition's lease and the item's version still valid); a raise rolls them back. Never commit or
    roll back `connection` yourself."""

    transactional: ClassVar[bool] = True

    async def start(self) -> None:
        """Called once before the first item."""

    async def close(self) -> None:
        """Called once when the watcher stops."""

    def process(self, item: Item, connection: Connection) -> Response:
        """Answer one item; write what it produces on `connection` (same rules as `Processor.process`)."""
        raise NotImplementedError


def is_transactional(processor: object, gate: int) -> bool:
    """Whether `processor` completes items at `gate` in their answer's transaction: its
    `transactional` attribute, or a `Pipeline`'s gate declared `transactional=True`."""
    per_gate = getattr(processor, "transactional_gate", None)
    if per_gate is not None:
        return bool(per_gate(gate))
    return getattr(processor, "transactional", False) is True


def transactional_function(processor: object, gate: int) -> Callable[[Item, Connection], Any]:
    """The plain function a transactional delivery at `gate` calls with `(item, connection)`:
    the processor's `process` or a `Pipeline`'s gate function. TypeError for an `async def` (the
    connection is a blocking one, used on a worker thread)."""
    per_gate = getattr(processor, "transactional_function", None)
    function: Any = per_gate(gate) if per_gate is not None else getattr(processor, "process")  # noqa: B009
    if _is_async(function):
        raise TypeError(f"a transactional processor must be a plain def, not async def ({_name(function)})")
    return cast("Callable[[Item, Connection], Any]", function)


def check_transactional(processor: object, batch: int) -> bool:
    """Refuse, at a watcher's start, what cannot complete in the answer's transaction: an
    `async def` transactional processor, or one asked for batches (`--batch`: each item is its own
    transaction). InvalidInput, one line. Returns whether `processor` is transactional anywhere."""
    gates = getattr(processor, "transactional_gates", None)
    numbers = list(gates()) if gates is not None else ([0] if is_transactional(processor, 0) else [])
    for gate in numbers:
        try:
            transactional_function(processor, gate)
        except TypeError as error:
            raise InvalidInput(str(error)) from None
    if numbers and batch > 1:
        raise InvalidInput(
            "a transactional processor completes each item in its own transaction: "
            "it cannot take --batch (use --batch 1)"
        )
    return bool(numbers)


def _name(function: Any) -> str:
    return str(getattr(function, "__qualname__", None) or type(function).__name__)


async def call_in_transaction(
    function: Callable[[Item, Connection], Any],
    item: Item,
    connection: Connection,
    timeout: float | None,
    abandon: Callable[[], None],
) -> Response:
    """Run a transactional processor's `function(item, connection)` on a worker thread (bounded by
    `timeout` as `call_processor` bounds a plain def). Returned: the caller owns `connection`. Raised
    (the processor's exception, a timeout, a cancellation), the call's transaction is given up:
    `abandon()` runs once the call has finished, on the call's own thread when it was still running
    (a timed-out one runs on unheard, its connection in use until then: the watcher's executor may
    be gone by the time it returns), and the caller must not touch `connection` again."""
    loop = asyncio.get_running_loop()
    started = loop.create_future()
    lock = threading.Lock()
    given_up = ran = False  # the caller gave the call up; the call is over (or never will run)

    def run() -> Any:
        nonlocal ran
        try:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile (the watcher stopped)
                loop.call_soon_threadsafe(lambda: None if started.done() else started.set_result(None))
            return function(item, connection)
        finally:
            with lock:
                ran, late = True, given_up
            if late:  # given up while it ran: the thread that used the connection gives it up too
                abandon()

    call = loop.run_in_executor(None, contextvars.copy_context().run, run)

    def never_ran(finished: asyncio.Future[Any]) -> None:
        if not finished.cancelled():
            finished.exception()  # its late outcome is dropped quietly
        with lock:
            over = ran
        if not over:  # cancelled before a thread took it (the watcher stopping)
            abandon()

    def give_up() -> None:
        nonlocal given_up
        with lock:
            given_up, over = True, ran
        if over:  # the processor raised or answered nonsense: its connection is free now
            try:
                loop.run_in_executor(None, abandon)
            except RuntimeError:  # no executor any more (the watcher stopping): here, then
                abandon()
        else:
            call.add_done_callback(never_ran)

    try:
        if timeout is None:
            result = await asyncio.shield(call)
        else:
            await asyncio.wait((started, call), return_when=asyncio.FIRST_COMPLETED)  # queued: not timed
            done, _ = await asyncio.wait((call,), timeout=timeout)
            if not done:
                raise _timed_out(timeout)
            result = call.result()
        if not isinstance(result, Response):
            raise InvalidAnswer(f"process() returned {type(result).__name__}, not a feedproc.Response")
    except BaseException:
        give_up()
        raise
    return result
