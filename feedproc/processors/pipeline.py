"""Pipelines at run time: `Pipeline`, a queue's gates written as Python functions, and `GateRouter`,
which hands each item to its gate's processor.

```python
pipeline = Pipeline("uploads")

@pipeline.gate("list", 0)
def list_folder(item: Item) -> Response:
    return Response(done=True, items=[{"gate": "ocr", "data": {"file": f}} for f in ...])

@pipeline.gate("ocr", 1, limit=8, timeout=120)
async def ocr(item: Item) -> Response: ...
```

`feedproc watch --processor mymodule:pipeline` serves it; `feedproc pipeline apply --from
mymodule:pipeline` stores its gates and settings so that names, limits and `status` work for every
watcher and producer of the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ..core.errors import PermanentError, RetryLater
from ..core.flow import FlowRules
from ..core.gate_names import naming
from ..core.hooks import PYTHON, check_hooks
from ..core.models import Item, Response
from ..core.pipelines import Collects, GateSpec, PipelineSpec, collects, from_mapping
from ..core.policy import RetryPolicy
from .calling import ProcessorLike, call_batch, call_processor, load_processor
from .http import HTTPOptions
from .transactional import AnyProcessor, call_in_transaction, is_transactional, transactional_function

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

log = logging.getLogger("feedproc.watcher")

GateFunction = Callable[[Item], Response | Awaitable[Response]]
#: A completion hook's function: called with the partition's summary (plain or `async def`).
HookFunction = Callable[[dict[str, Any]], Any]
#: A gate declared `transactional=True`: a plain function given the answer's transaction too.
TransactionalGateFunction = Callable[[Item, "Connection"], Response]
F = TypeVar("F", GateFunction, TransactionalGateFunction)


class Pipeline:
    """A queue's gates as Python functions (plain or `async def`, each answering a `Response`),
    with each gate's settings (`limit`, `timeout`, `item_timeout`, `max_attempts`, `retry_delay`,
    `max_retry_delay`, `windows`, `timezone`, `batch`). A processor itself: it hands each item to
    its gate's function, with the gates' names in scope (`Response(gate="rank")`). Its completion
    hooks (`hooks=`, or `on_complete` / `on_fail` / `on_cancel`) are URLs, or functions its
    watchers call with the partition's summary. `priority` and `weight`: what a partition added to
    the queue without its own gets once the pipeline is applied (the queue's defaults).

    `transactional=True` (not stored with the pipeline: it is the code's) makes a gate complete in
    its answer's transaction: its function, a plain `def f(item, connection)`, is given the
    SQLAlchemy `Connection` of the fenced transaction that writes its answer."""

    def __init__(
        self,
        queue: str = "default",
        *,
        schedules: list[Mapping[str, Any]] | None = None,
        hooks: Mapping[str, str | HookFunction] | None = None,
        priority: int | None = None,
        weight: int | None = None,
    ) -> None:
        self.queue = queue
        self._defaults = {
            name: value for name, value in (("priority", priority), ("weight", weight)) if value is not None
        }
        self._gates: dict[int, tuple[dict[str, Any], GateFunction]] = {}
        self._transactional: dict[int, TransactionalGateFunction] = {}  # gate -> its function
        self._schedules = list(schedules or [])
        self._hooks: dict[str, str] = {}
        #: hook name -> the function a `python` hook calls (`Watcher` serving this pipeline calls it)
        self.hook_functions: dict[str, HookFunction] = {}
        self._spec: PipelineSpec | None = None
        for name, target in (hooks or {}).items():
            self._hook(name, target)

    def on_complete(self, target: str | HookFunction) -> Any:
        """The hook called when a partition of the queue completes: a URL, or (also as a decorator)
        a function called with the partition's summary (a dict, as an HTTP hook's JSON body)."""
        return self._hook("on_complete", target)

    def on_fail(self, target: str | HookFunction) -> Any:
        """The hook called when a partition of the queue fails (`on_complete` says what it may be)."""
        return self._hook("on_fail", target)

    def on_cancel(self, target: str | HookFunction) -> Any:
        """The hook called when a partition of the queue is cancelled (as `on_complete`)."""
        return self._hook("on_cancel", target)

    def _hook(self, name: str, target: str | HookFunction) -> Any:
        check_hooks({name: PYTHON if callable(target) else target}, where=f"Pipeline({self.queue!r}) hooks")
        if callable(target):
            self.hook_functions[name] = target
            self._hooks[name] = PYTHON
        else:
            self._hooks[name] = target
            self.hook_functions.pop(name, None)
        self._check()
        return target

    def gate(self, name: str, number: int, *, transactional: bool = False, **settings: Any) -> Callable[[F], F]:
        """Decorator: the function serves gate `number`, named `name`, with these settings;
        `transactional`: it is `def f(item, connection)`, completing in the answer's transaction."""

        def register(function: F) -> F:
            if number in self._gates:
                raise ValueError(f"gate {number} of pipeline {self.queue!r} has a function already")
            if transactional:
                if inspect.iscoroutinefunction(function):
                    raise ValueError(f"gate {number} ({name}): a transactional gate is a plain def, not async def")
                if settings.get("batch", 1) != 1:
                    raise ValueError(f"gate {number} ({name}): a transactional gate cannot take a batch")
                self._transactional[number] = function  # type: ignore[assignment]
            self._gates[number] = ({"name": name, "number": number, **settings}, function)  # type: ignore[assignment]
            self._check()
            return function

        return register

    def schedule(self, name: str, cron: str, key: str, **options: Any) -> None:
        """Start a partition keyed `key` (a template with `{date...}`) at every tick of `cron`
        (`timezone`, `items`, `priority` as in a pipeline file's `[[schedule]]`)."""
        self._schedules.append({"name": name, "cron": cron, "key": key, **options})
        self._check()

    def _check(self) -> None:
        """Check the settings now, where the decorator is (not when a watcher starts); schedules
        wait for a first gate."""
        self._spec = None
        if self._gates:
            self.spec  # noqa: B018

    @property
    def spec(self) -> PipelineSpec:
        """The pipeline's gates, settings and schedules as a PipelineSpec (what `apply --from` stores)."""
        if self._spec is None:
            document = {
                "queue": self.queue,
                **self._defaults,
                "gate": [settings for settings, _ in self._gates.values()],
                "schedule": self._schedules,
                "hooks": self._hooks,
            }
            self._spec = from_mapping(document, source=f"Pipeline({self.queue!r})")
        return self._spec

    def function(self, gate: int) -> GateFunction | None:
        entry = self._gates.get(gate)
        return entry[1] if entry is not None else None

    def transactional_gate(self, gate: int) -> bool:
        """Whether gate `gate` was declared `transactional=True`."""
        return gate in self._transactional

    def transactional_gates(self) -> list[int]:
        return sorted(self._transactional)

    def transactional_function(self, gate: int) -> TransactionalGateFunction:
        """Gate `gate`'s function, given `(item, connection)`, the pipeline's gate names in scope."""
        function = self._transactional[gate]

        def call(item: Item, connection: Connection) -> Response:
            with naming(self.spec.names, f"queue {self.queue!r}"):
                return function(item, connection)

        return call

    async def process(self, item: Item) -> Response:
        function = self.function(item.gate)
        if function is None:
            raise PermanentError(f"pipeline {self.queue!r} has no function for gate {item.gate}")
        with naming(self.spec.names, f"queue {self.queue!r}"):
            return await call_processor(_FunctionProcessor(function), item)


@dataclass(slots=True)
class _FunctionProcessor:
    function: GateFunction

    def process(self, item: Item) -> Response | Awaitable[Response]:
        return self.function(item)


@dataclass(frozen=True, slots=True)
class Route:
    """Where one gate's items go under one version of the pipeline, and with what settings."""

    processor: AnyProcessor | None  # None: nowhere (the delivery fails, with `why`)
    gate: GateSpec | None
    policy: RetryPolicy
    why: str = ""
    transient: bool = False  # the failure is retried (a processor that could not be loaded: a fix may come)


class GateRouter:
    """Hands each item to its gate's processor under one version of a pipeline (`spec`), with the
    pipeline's gate names in scope. A gate with a handler gets its own HTTPProcessor (its timeout and
    headers), one with a processor path its own loaded processor; other gates, and every gate when
    `route` is False, go to `fallback` (the watcher's `--handler`/`--processor`).

    A watcher keeps one router per version: a delivery holds the router it started with, so a change
    applied meanwhile reaches only the deliveries that start after it."""

    def __init__(
        self,
        spec: PipelineSpec | None,
        fallback: AnyProcessor | None,
        policy: RetryPolicy,
        *,
        route: bool = True,
        http_options: HTTPOptions | None = None,
        reuse: Mapping[tuple[Any, ...], ProcessorLike] | None = None,
    ) -> None:
        self.spec = spec
        self.fallback = fallback
        self.version = spec.version if spec is not None else 0
        self._names = spec.names if spec is not None else {}
        self._whose = f"queue {spec.queue!r}" if spec is not None else ""
        self._routes: dict[int, Route] = {}
        self._limits = spec.limits if spec is not None else {}
        self._flow = spec.flow if spec is not None else FlowRules()
        #: (kind, target, settings) -> processor: what this router made, for the next version to reuse.
        self.made: dict[tuple[Any, ...], ProcessorLike] = {}
        options = http_options if http_options is not None else HTTPOptions()
        for gate in spec.gates if spec is not None else ():
            processor: AnyProcessor | None = None
            if route and gate.handler is not None:
                timeout = gate.timeout if gate.timeout is not None else options.timeout
                headers = {**options.headers, **dict(gate.headers)}
                made_key: tuple[Any, ...] = ("http", gate.handler, timeout, tuple(sorted(headers.items())))
                # Gates sent to the same service with the same settings share one client (and its
                # connections), within a version and from the version before.
                processor = (
                    self.made.get(made_key)
                    or (reuse or {}).get(made_key)
                    or options.processor(gate.handler, timeout=timeout, headers=headers)
                )
                self.made[made_key] = processor
            elif route and gate.processor is not None:
                made_key = ("python", gate.processor)
                try:
                    processor = self.made.get(made_key) or (reuse or {}).get(made_key) or load_processor(gate.processor)
                except Exception as error:  # the user's module: contained to this gate's items
                    log.error("gate %d (%s): %s", gate.number, gate.name, error)
                    self._routes[gate.number] = Route(None, gate, gate.policy(policy), str(error), transient=True)
                    continue
                self.made[made_key] = processor
            else:
                processor = fallback
            why = f"gate {gate.number} ({gate.name}) of the pipeline of {self._whose} has no handler or processor"
            self._routes[gate.number] = Route(processor, gate, gate.policy(policy), why)
        #: Gate number -> what its items collect (fan-in), for the gates of this version that say.
        self._collecting = {
            gate.number: what
            for gate in (spec.gates if spec is not None else ())
            if (what := collects(spec, gate.number, None)) is not None
        }
        self._default = Route(
            fallback,
            None,
            policy,
            f"{self._whose or 'this queue'}'s pipeline (version {self.version}) has no gate of that number, "
            "and the watcher has no --handler or --processor for it",
        )

    @property
    def limits(self) -> dict[int, int]:
        """Gate number -> fleet-wide concurrency limit, for the gates of this version that have one."""
        return self._limits

    @property
    def flow(self) -> FlowRules:
        """The group limits and rates of the gates of this version that have them."""
        return self._flow

    @property
    def attempts(self) -> dict[int, int]:
        """Gate number -> max attempts, for the gates whose own `max_attempts` differs from the
        watcher's: deliveries lost with a watcher are charged against their gate's attempts too."""
        return {
            number: route.policy.max_attempts
            for number, route in self._routes.items()
            if route.policy.max_attempts != self._default.policy.max_attempts
        }

    def route(self, gate: int) -> Route:
        """The route of `gate`'s items."""
        return self._routes.get(gate, self._default)

    def collects(self, gate: int, collect: int | None) -> Collects | None:
        """What an item at `gate` collects (its pipeline gate's `collect`, else the item's own
        `collect`), or None: nearly every item, at the cost of a dict lookup."""
        if collect is None and not self._collecting:
            return None
        return self._collecting.get(gate) or collects(self.spec, gate, collect)

    @property
    def processors(self) -> list[AnyProcessor]:
        """Every distinct processor this router hands items to (the fallback included)."""
        seen: dict[int, AnyProcessor] = {}
        for route in [*self._routes.values(), self._default]:
            if route.processor is not None:
                seen.setdefault(id(route.processor), route.processor)
        return list(seen.values())

    def naming(self) -> contextlib.AbstractContextManager[None]:
        """The block in which answers are made: the pipeline's gate names in scope."""
        return naming(self._names, self._whose) if self._names else contextlib.nullcontext()

    async def process(self, route: Route, item: Item, timeout: float | None) -> Response:
        """One item through its route."""
        if route.processor is None:
            raise _nowhere(route, item.gate)
        with self.naming():
            return await call_processor(cast("ProcessorLike", route.processor), item, timeout)

    def transactional(self, route: Route, gate: int) -> bool:
        """Whether `route`'s processor completes items at `gate` in their answer's transaction."""
        return route.processor is not None and is_transactional(route.processor, gate)

    async def process_in_transaction(
        self, route: Route, item: Item, connection: Connection, timeout: float | None, abandon: Callable[[], None]
    ) -> Response:
        """One item through a transactional route, given `connection` (`call_in_transaction`)."""
        assert route.processor is not None
        try:
            function = transactional_function(route.processor, item.gate)
        except TypeError as error:  # an async def: refused at start for the watcher's own processor
            await asyncio.to_thread(abandon)
            raise PermanentError(str(error)) from None
        with self.naming():
            return await call_in_transaction(function, item, connection, timeout, abandon)

    async def process_batch(self, route: Route, items: list[Item], timeout: float | None) -> list[Response | Exception]:
        """A batch of one gate through its route."""
        if route.processor is None:
            return [_nowhere(route, items[0].gate)] * len(items)
        with self.naming():
            return await call_batch(cast("ProcessorLike", route.processor), items, timeout)

    async def start(self, already: set[int], *, strict: bool = False) -> None:
        """Start the processors not started yet (`already`: ids of those that were). A start that
        raises is raised when `strict` (the watcher's own processor, at start-up: the watcher exits),
        else logged (a new version's: its gate's items fail as its calls do; the watcher goes on)."""
        for processor in self.processors:
            if id(processor) in already:
                continue
            already.add(id(processor))
            start = getattr(processor, "start", None)
            if start is not None:
                try:
                    await start()
                except Exception as error:
                    if strict:
                        raise
                    log.error("starting a processor failed: %s: %s", type(error).__name__, error)


def _nowhere(route: Route, gate: int) -> Exception:
    """The failure of a delivery whose gate has no processor."""
    text = f"no processor for gate {gate}: {route.why}"
    return RetryLater(text) if route.transient else PermanentError(text)


async def close_processors(processors: list[AnyProcessor]) -> None:
    """Close each processor once (a failing close is logged, not raised)."""
    for processor in processors:
        close = getattr(processor, "close", None)
        if close is None:
            continue
        try:
            await close()
        except Exception as error:
            log.warning("closing a processor failed: %s", error)


__all__ = ["GateRouter", "Pipeline", "Route", "close_processors"]
