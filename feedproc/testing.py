"""Testing a pipeline or a processor in your own test suite: `Harness`.

A `Harness` runs a queue's `Pipeline`, a `Processor` or a plain function on a throwaway SQLite
database with the real store, the real gate rules and the real watcher, in-process (no `feedproc
watch`, no server)::

    with Harness(pipeline) as harness:
        harness.add("scan-1", [{"gate": "list", "data": {"files": ["a.pdf"]}}])
        harness.drain()
        harness.assert_complete("scan-1")
        assert harness.results("scan-1", "classify") == [...]

**How it runs.** `step()` runs a `Watcher` (the one `feedproc watch` runs, on an event loop of its
own in a thread of its own) until nothing of the queue is due *now*: every due item is delivered,
and so is what becomes due as a consequence (the next gate's items once a gate drains, children,
a "not yet" that asked for no delay); then the watcher stops and releases its leases, so between
calls the database is still and may be read or changed through `harness.feed`. Answers are
written by the watcher's fenced group commit; results, collect, tolerate, accumulate, retries,
item timeouts and answers it refuses behave as in production because they are the production code.

**Time.** Nothing sleeps through a backoff: `drain()` steps, and when nothing is due now but
something will be (a retry, a "not yet", a partition's `not_before`), it moves the queue's clock
forward to that moment plus one poll interval (`advance()`: every due time of the queue is brought
forward in the database; history keeps its real times), as a watcher polling that often would
find it. So `max_attempts=8, retry_delay=2` fails an item after 254 s of the fake clock and a few
milliseconds of the real one. Item timeouts (`item_timeout`) are real time: a call is timed as in
production. Windows of the day are judged on the real clock, which the fake one does not move.

**Convergence.** `drain()` gives up with `NotDrained` (an AssertionError: pytest shows it as a
failed assertion, with every unfinished partition described) after `max_steps` steps (a processor
that always answers "not yet") or `timeout` seconds of real time (a call that hangs, a paused
queue).

SQLite only, by design: the database is a copy of a migrated template made once per process
(migrating takes 0.2 s, copying a millisecond).
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import json
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .core.models import Item, Response
from .core.pipelines import PipelineSpec
from .core.views import HistoryEntry, HookView, ItemRow, ItemView, PartitionStatus
from .feed import Feed, ItemLike
from .processors import ProcessorLike
from .processors.pipeline import Pipeline
from .processors.transactional import AnyProcessor
from .watcher import Watcher, WatcherConfig
from .watcher.config import current_names

__all__ = ["Drained", "Harness", "NotDrained", "Step"]

#: Seconds between two looks at whether anything is still due while a step runs (a 0.3 ms read).
#: With it, 3 gates of 100 items drain in one step of 100-240 ms (medians of 10-15; 70-140 ms at best)
#: and one item's step takes 14 ms, on 2 cores at a load of 6-7; 0.5 ms or 10 ms made no difference
#: above that noise.
QUIET_POLL = 0.002
#: Tables under the default prefix whatever $FEEDPROC_TABLE_PREFIX says: the database is the harness's own.
PREFIX = "feedproc_"
#: Watcher settings of a harness unless given: every partition leased at once, and a step that
#: times out gives its calls a second to finish.
DEFAULTS: dict[str, Any] = {"max_partitions": 1000, "shutdown_grace": 1.0}
#: Partitions, and items of each state of a partition, described in a failure message at most.
DESCRIBED = 10

Function = Callable[[Item], Response | Awaitable[Response]]


class NotDrained(AssertionError):
    """A step or a drain did not come to rest in time (or the watcher gave up); the message says
    what is still unfinished."""


@dataclass(frozen=True, slots=True)
class Step:
    """What one `step()` did."""

    #: Deliveries answered and written (every outcome: done, moved, not yet, retried, failed).
    deliveries: int
    #: Partitions that became complete, failed or cancelled, in key order.
    finished: tuple[str, ...]
    #: Seconds until more of the queue is due (database clock); None when nothing waits for time.
    next_due: float | None


@dataclass(frozen=True, slots=True)
class Drained:
    """What a `drain()` did."""

    steps: int
    deliveries: int
    #: Seconds the fake clock moved forward (backoff, "not yet" delays, `not_before` waited out).
    waited: float
    #: Partitions that finished during the drain, in the order they did.
    finished: tuple[str, ...]
    #: Partitions still unfinished though nothing is due: waiting for items, a seal or a checkpoint.
    unfinished: tuple[str, ...]


class Harness:
    """A queue served in-process on a throwaway SQLite database, for tests.

    `processor`: a `Pipeline` (its queue; its spec is applied, as `feedproc pipeline apply --from`
    does, so gate names, tolerate and accumulate work), a stored `PipelineSpec` (a TOML pipeline:
    each gate to its handler or processor), a `Processor` (an instance, or a class made with no
    arguments) or a function of an `Item` answering a `Response` (plain or `async def`).
    `queue`: the queue served (a Pipeline's own by default, else "default"). `directory`: where
    the database file goes (pytest's `tmp_path` keeps it for a look afterwards: `harness.url`);
    by default a temporary directory removed by `close()`. `hooks`: functions of the queue's
    `python` completion hooks (a Pipeline's own are called too), called at the end of the step
    that finished their partition; HTTP hooks are called as well. `settings`: the watcher's
    (`WatcherConfig` fields: `max_attempts`, `retry_delay`, `item_timeout`, `concurrency`, `batch`...).

    A context manager (`with Harness(pipeline) as harness:`), hence a pytest fixture that yields it.
    """

    def __init__(
        self,
        processor: Pipeline | PipelineSpec | AnyProcessor | type | Function,
        *,
        queue: str | None = None,
        directory: str | Path | None = None,
        hooks: Mapping[str, Callable[[dict[str, Any]], Any]] | None = None,
        **settings: Any,
    ) -> None:
        spec = processor.spec if isinstance(processor, Pipeline) else processor
        if isinstance(spec, PipelineSpec):
            if queue is not None and queue != spec.queue:
                raise ValueError(f"the pipeline serves queue {spec.queue!r}, not {queue!r}")
            queue = spec.queue
        self.queue: str = queue or "default"
        #: The watcher's settings for every step.
        self.config = WatcherConfig(**{**DEFAULTS, **current_names(settings), "queue": self.queue})
        self._processor = _processor_of(processor)
        self._hooks = dict(hooks or {})  # functions of `python` hooks, besides a Pipeline's own
        own = processor.hook_functions if isinstance(processor, Pipeline) else {}
        self._hook_names = sorted({*own, *self._hooks})
        self._temporary: tempfile.TemporaryDirectory[str] | None = None
        if directory is None:
            self._temporary = tempfile.TemporaryDirectory(prefix="feedproc-testing-")
            directory = self._temporary.name
        self.path = Path(directory) / f"feedproc-{uuid.uuid4().hex[:8]}.db"
        shutil.copyfile(_template(), self.path)
        #: `sqlite:///...` of the database (for `feedproc --db`, or a `Feed` of your own).
        self.url = f"sqlite:///{self.path}"
        #: The Feed on the database: anything the harness does not wrap (seal, cancel, act_on_items...).
        self.feed = Feed(self.url, table_prefix=PREFIX)
        if isinstance(spec, PipelineSpec):
            self.feed.apply_pipeline(spec, by="feedproc.testing")

    # ------------------------------------------------------------ life

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the database; remove it when the harness made its directory."""
        self.feed.close()
        if self._temporary is not None:
            self._temporary.cleanup()
            self._temporary = None

    def __repr__(self) -> str:
        return f"Harness(queue={self.queue!r}, url={self.url!r})"

    # ------------------------------------------------------------ producing

    def add(self, key: str, items: Iterable[ItemLike] = (), **options: Any) -> int:
        """Create partition `key` in the harness's queue, as `Feed.add_partition` does: items as
        `{"gate": ..., "data": ...}` (a gate by its name in the pipeline, or its number), `(gate,
        bytes)` pairs or `NewItem`s; `options` are add_partition's (`sealed`, `priority`, `tolerate`,
        `not_before`, `item_timeout`...). Returns the number of items added."""
        if "queue" in options:
            raise TypeError("add() takes no queue: the harness serves queue " + repr(self.queue))
        return self.feed.add_partition(key, items, queue=self.queue, **options)

    def add_items(self, key: str, items: Iterable[ItemLike]) -> int:
        """Add items to an open (unsealed) partition, as `Feed.add_items` does."""
        return self.feed.add_items(key, items)

    # ------------------------------------------------------------ running

    def step(self, *, timeout: float = 10.0) -> Step:
        """Run the watcher until nothing is due now (see the module's docstring); the clock does not
        move. NotDrained if items are still due after `timeout` seconds (a call that hangs without
        an item timeout, a paused queue), or when the watcher gave up; a processor's `start()` that
        raises is raised here."""
        store = self.feed.store
        due = store.next_due(self.queue)
        if (due is None or due > 0) and not store.hooks_due(self.queue, python_hooks=self._hook_names):
            return Step(0, (), due)
        unfinished, delivered = set(store.unfinished(self.queue)), store.deliveries_made(self.queue)
        problem = self._run(timeout)
        if problem:
            raise NotDrained(f"{problem}\n{self.describe()}")
        finished = tuple(sorted(unfinished - set(store.unfinished(self.queue))))
        return Step(store.deliveries_made(self.queue) - delivered, finished, store.next_due(self.queue))

    def drain(self, *, max_steps: int = 100, timeout: float = 10.0) -> Drained:
        """Step until nothing waits for time any more, moving the fake clock forward between steps
        to the next due time plus one poll interval (`config.poll_interval`). NotDrained after
        `max_steps` steps or `timeout` seconds of real time, describing what is unfinished."""
        started = time.monotonic()
        steps = deliveries = 0
        waited = 0.0
        finished: list[str] = []
        while True:
            left = timeout - (time.monotonic() - started)
            if steps >= max_steps or left <= 0:
                why = f"{steps} steps" if steps >= max_steps else f"{timeout:g}s"
                raise NotDrained(
                    f"queue {self.queue!r} did not drain within {why} ({deliveries} deliveries, "
                    f"{waited:g}s of the fake clock waited out)\n{self.describe()}"
                )
            step = self.step(timeout=left)
            steps, deliveries = steps + 1, deliveries + step.deliveries
            finished.extend(step.finished)
            if step.next_due is None:
                unfinished = tuple(self.feed.store.unfinished(self.queue))
                return Drained(steps, deliveries, waited, tuple(finished), unfinished)
            if step.next_due > 0:  # (else it came due while the watcher stopped: step again)
                seconds = step.next_due + self.config.poll_interval
                self.advance(seconds)
                waited += seconds

    def advance(self, seconds: float) -> None:
        """Move the queue's clock `seconds` forward: its retries, "not yet" answers and partitions'
        `not_before` come that much sooner (in the database; nothing sleeps)."""
        self.feed.store.bring_forward(self.queue, seconds)

    def _run(self, timeout: float) -> str | None:
        """One watcher's life on a loop of its own, in a thread of its own (the caller may be in an
        event loop already: an async test). Returns why it did not come to rest, if it did not."""
        outcome: list[BaseException | str | None] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            try:
                outcome.append(loop.run_until_complete(self._watch(timeout)))
            except BaseException as error:
                outcome.append(error)
            finally:
                # Not `asyncio.run`: its end waits for the default executor's threads, and a plain-def
                # call past its item timeout would hold the step until it returns.
                loop.close()

        thread = threading.Thread(target=main, name=f"feedproc-testing-{self.queue}", daemon=True)
        thread.start()
        thread.join(timeout + self.config.shutdown_grace + 30.0)
        if thread.is_alive() or not outcome:
            return f"the watcher did not stop within {timeout + self.config.shutdown_grace + 30.0:g}s"
        result = outcome[0]
        if isinstance(result, BaseException):
            raise result
        return result

    async def _watch(self, timeout: float) -> str | None:
        """Run a watcher until nothing is due now, then stop it (its leases released)."""
        loop = asyncio.get_running_loop()
        watcher = Watcher(self.feed.store, self._processor, self.config, hooks=self._hooks)
        looks = ThreadPoolExecutor(1, thread_name_prefix="feedproc-testing-look")
        run = asyncio.create_task(watcher.run(), name="watcher")
        deadline = loop.time() + timeout
        due: float | None = 0.0
        try:
            while not run.done():
                due = await loop.run_in_executor(looks, self.feed.store.next_due, self.queue)
                if due is None or due > 0 or loop.time() >= deadline:
                    break
                await asyncio.wait([run], timeout=QUIET_POLL)
            if not run.done():  # the hooks of the partitions this step finished, called before it ends
                await watcher.deliver_hooks()
        finally:
            watcher.stop()
            try:
                await run
            finally:
                looks.shutdown(wait=False)
        if watcher.fatal is not None:
            return f"the watcher gave up: {watcher.fatal}"
        if due is not None and due <= 0:
            return (
                f"queue {self.queue!r} still had items due after {timeout:g}s: a call that does not return"
                " (an item_timeout bounds it), or a queue paused or outside its windows (judged on the real clock)"
            )
        return None

    # ------------------------------------------------------------ reading

    def status(self, key: str, *, history: int = 0) -> PartitionStatus:
        """Partition `key`'s status, as `Feed.status` gives it (`feedproc status KEY --json`)."""
        return self.feed.status(key, history=history)

    def items(self, key: str, *, gate: int | str | None = None, status: str | None = None) -> list[ItemRow]:
        """Every item of `key` (at `gate`, a name or a number; with `status`), as `Feed.items` gives
        them (id, gate, status, attempts, deliveries, last_error, data and result as bytes), in id order."""
        number = None if gate is None else self.gate(gate)
        found: list[ItemRow] = []
        while page := self.feed.items(key, gate=number, status=status, after_id=found[-1].id if found else 0):
            found.extend(page)
        return found

    def item(self, item_id: int) -> ItemView:
        """One item with its deliveries (`history`: outcome, error with the traceback's end), as `Feed.item`."""
        return self.feed.item(item_id)

    def results(self, key: str, gate: int | str) -> list[Any]:
        """The results (`Response(result=...)`) of `key`'s items at `gate` that produced one, in item
        id order, parsed as JSON (bytes when they are not JSON)."""
        return [_parsed(item.result) for item in self.items(key, gate=gate) if item.result is not None]

    def hooks(self, key: str | None = None) -> list[HookView]:
        """The queue's completion hooks' deliveries (of partition `key`), newest first."""
        return self.feed.hooks(queue=self.queue, key=key)

    def errors(self, key: str, *, gate: int | str | None = None) -> list[str]:
        """The errors of `key`'s failed items (at `gate`), in item id order."""
        return [item.last_error or "" for item in self.items(key, gate=gate, status="failed")]

    def history(self, key: str) -> list[HistoryEntry]:
        """Partition `key`'s whole history (created, gate advances, failures, completion...), oldest
        first, as `Feed.history` gives it."""
        events: list[HistoryEntry] = []
        while page := self.feed.history(key, after=events[-1].id or 0 if events else 0, limit=500):
            events.extend(page)
        return events

    def accumulated(self, key: str) -> dict[str, float]:
        """Partition `key`'s accumulator: what its answers' `accumulate` numbers came to."""
        store = self.feed.store
        return store.accumulated(store.partition_id(key))

    def gate(self, gate: int | str) -> int:
        """A gate's number, from its name in the queue's pipeline (or the number itself)."""
        if isinstance(gate, int):
            return gate
        numbers = {name: number for number, name in self.feed.gate_names(self.queue).items()}
        if gate not in numbers:
            raise ValueError(f"queue {self.queue!r} has no gate named {gate!r} (its gates: {sorted(numbers)})")
        return numbers[gate]

    # ------------------------------------------------------------ asserting

    def assert_status(self, key: str, status: str) -> PartitionStatus:
        """Fail, describing the partition (its items' errors included), unless `key` is `status`;
        returns its status."""
        current = self.status(key)
        if current.status != status:
            raise AssertionError(f"expected partition {key!r} to be {status}\n{self.describe(key)}")
        return current

    def assert_complete(self, key: str) -> PartitionStatus:
        """Fail, saying why (failed items with their errors, what is still waiting), unless `key` is complete."""
        return self.assert_status(key, "complete")

    def assert_failed(self, key: str, error: str | None = None) -> PartitionStatus:
        """Fail unless `key` failed (and, with `error`, some failed item's error contains it)."""
        current = self.assert_status(key, "failed")
        if error is not None and not any(error in text for text in self.errors(key)):
            raise AssertionError(f"no failed item of {key!r} has an error containing {error!r}\n{self.describe(key)}")
        return current

    def describe(self, key: str | None = None) -> str:
        """Partition `key` (or the queue's unfinished partitions, the first few) in a few lines:
        status, gate, item counts, and its failed and available items with their last errors."""
        keys = [key] if key is not None else self.feed.store.unfinished(self.queue)
        names = self.feed.gate_names(self.queue)
        lines = [self._described(k, names) for k in keys[:DESCRIBED]]
        if len(keys) > DESCRIBED:
            lines.append(f"... and {len(keys) - DESCRIBED} more unfinished partitions")
        return "\n".join(lines) or "(no unfinished partition)"

    def _described(self, key: str, names: dict[int, str]) -> str:
        status = self.status(key)
        counts = ", ".join(f"{n} {what}" for what, n in status.items.items() if what != "total" and n)
        gate = _gate_text(status.gate, names)
        lines = [f"partition {key!r}: {status.status} at gate {gate} ({counts or 'no items'})"]
        if status.status == "available" and not status.sealed:
            lines.append("  not sealed: it waits for more items (seal it, or add it with sealed=True)")
        for state in ("failed", "available"):
            shown = self.feed.items(key, status=state, limit=DESCRIBED)
            for item in shown:
                error = f": {item.last_error}" if item.last_error else ""
                lines.append(
                    f"  item {item.id} at gate {_gate_text(item.gate, names)}: {state} after "
                    f"{item.deliveries} deliveries ({item.attempts} failed attempts){error}"
                )
            if status.items.get(state, 0) > len(shown):
                lines.append(f"  ... and {status.items[state] - len(shown)} more {state} items")
        return "\n".join(lines)


def _gate_text(number: int, names: dict[int, str]) -> str:
    return f"{number} ({names[number]})" if number in names else str(number)


def _parsed(result: bytes) -> Any:
    try:
        return json.loads(result)
    except ValueError:
        return result


def _processor_of(processor: Pipeline | PipelineSpec | AnyProcessor | type | Function) -> AnyProcessor | None:
    """What the watcher is given: a Pipeline as itself, a stored spec as nothing (each gate routes
    to its own), a class made, a function wrapped."""
    if isinstance(processor, Pipeline):
        return processor
    if isinstance(processor, PipelineSpec):
        return None
    if inspect.isclass(processor):
        made = processor()
        if not isinstance(made, ProcessorLike):
            raise TypeError(f"{processor.__name__}() has no process(item) method")
        return made
    if isinstance(processor, ProcessorLike):
        return processor
    if callable(processor):
        return _AsyncFunction(processor) if inspect.iscoroutinefunction(processor) else _Function(processor)
    raise TypeError(f"cannot serve {processor!r}: give a Pipeline, a PipelineSpec, a Processor or a function")


class _Function:
    """A plain function of an Item as a processor (run on a worker thread, as a plain-def process is)."""

    def __init__(self, function: Function) -> None:
        self.function = function

    def process(self, item: Item) -> Response | Awaitable[Response]:
        return self.function(item)


class _AsyncFunction:
    """An `async def` function of an Item as a processor."""

    def __init__(self, function: Function) -> None:
        self.function = function

    async def process(self, item: Item) -> Response:
        answer = self.function(item)
        return await answer if inspect.isawaitable(answer) else answer


_made: list[Path] = []
_making = threading.Lock()


def _template() -> Path:
    """A migrated database made once per process (removed at exit), which each harness copies."""
    with _making:
        if not _made or not _made[0].exists():
            folder = Path(tempfile.mkdtemp(prefix="feedproc-testing-template-"))
            atexit.register(shutil.rmtree, folder, True)
            path = folder / "template.db"
            with Feed(f"sqlite:///{path}", table_prefix=PREFIX) as feed:
                feed.migrate()
            _made[:] = [path]
        return _made[0]
