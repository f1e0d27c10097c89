"""The router: what the watcher follows of its queue — the pipeline, version by version (each gate's
processor and settings), and the queue's settings (limit, pause, windows, operations)."""

from __future__ import annotations

import logging
import math
import time
from datetime import UTC, datetime

from ..core.policy import RetryPolicy
from ..core.records import Lease, QueueSettings, ReadyItem
from ..processors import HTTPOptions
from ..processors.pipeline import GateRouter, Pipeline, Route, close_processors
from ..processors.transactional import AnyProcessor
from .calls import DatabaseCalls
from .config import WatcherConfig
from .flight import ReadyBuffer

log = logging.getLogger("feedproc.watcher")


class Router:
    """The pipeline version followed (`current`, a GateRouter) and the queue's settings (`settings`),
    read again every poll interval; each gate's route, batch size and windows."""

    def __init__(
        self,
        calls: DatabaseCalls,
        config: WatcherConfig,
        watcher_id: str,
        processor: AnyProcessor | None,
        http_options: HTTPOptions,
        buffer: ReadyBuffer,
    ) -> None:
        self._calls = calls
        self._config = config
        self._id = watcher_id
        #: The watcher's own processor (`--handler`/`--processor`); None: the queue's pipeline routes every gate.
        self.processor = processor
        self.policy = config.retry_policy
        # Pipelines: a Python `Pipeline` given as the processor is the pipeline (its code is its
        # version); otherwise the queue's stored pipeline is followed (`follow_pipeline`), each
        # version through a router of its own. `http_options` make its gates' HTTP processors.
        self.code_pipeline = processor if isinstance(processor, Pipeline) else None
        self.http_options = http_options
        self._buffer = buffer
        spec = self.code_pipeline.spec if self.code_pipeline is not None else None
        self.current = GateRouter(spec, processor, self.policy, route=False)
        self._started_processors: set[int] = set()  # ids of the processors started (each once)
        self._retired: list[AnyProcessor] = []  # earlier versions' processors, closed on stop
        self.settings = QueueSettings(config.queue)  # limit and windows, re-read every poll interval
        self._settings_read_at = -math.inf

    async def start(self) -> None:
        """Start the watcher's own processor (its failure fails the start)."""
        await self.current.start(self._started_processors, strict=True)

    async def close(self) -> None:
        """Close the processors of every version followed."""
        await close_processors([*self.current.processors, *self._retired])

    async def read_settings(self) -> None:
        """Read the queue's settings now (at start-up)."""
        self.settings = await self._calls.call(self._calls.poll, self._calls.store.queue_settings, self._config.queue)

    async def refresh(self) -> None:
        """Once a poll interval: read the queue's settings and follow its pipeline. A limit set or
        lowered, or the queue paused, drops the buffered items."""
        cfg = self._config
        settings = self.settings
        if time.monotonic() - self._settings_read_at >= cfg.poll_interval:  # not on every early maintenance
            settings = await self._calls.call(self._calls.poll, self._calls.store.queue_settings, cfg.queue)
            self._settings_read_at = time.monotonic()
            await self.follow_pipeline()
        lowered = settings.limited and (not self.settings.limited or settings.limit < self.settings.limit)
        flow_set = _flow_of(settings) != _flow_of(self.settings) and any(_flow_of(settings))
        if lowered or flow_set or (settings.paused and not self.settings.paused):
            # A limit set or lowered, or the queue paused, while items wait in the buffer: give them
            # back (fetched again through the slot claim, or once resumed) instead of dispatching them.
            self._buffer.drop_all()
            if settings.paused:
                log.info(
                    "queue %s is paused: in-flight items finish, nothing new starts",
                    cfg.queue,
                    extra={"event": "queue_paused", "watcher": self._id},
                )
        self.settings = settings

    async def follow_pipeline(self) -> None:
        """Follow the queue's stored pipeline: when its version moved, route by the new version from
        now on (deliveries under way finish with the router they started with). One primary-key
        read per poll interval; nothing when the watcher serves a Python `Pipeline` of its own."""
        if self.code_pipeline is not None:
            return
        calls, store, queue = self._calls, self._calls.store, self._config.queue
        version = await calls.call(calls.poll, store.pipeline_version, queue)
        if version == self.current.version:
            return
        spec = await calls.call(calls.poll, store.pipeline, queue) if version else None
        old = self.current
        router = GateRouter(
            spec,
            self.processor,
            self.policy,
            route=self.processor is None,
            http_options=self.http_options,
            reuse=old.made,
        )
        await router.start(self._started_processors)
        kept = {id(processor) for processor in router.processors}
        self._retired.extend(p for p in old.processors if id(p) not in kept and p is not self.processor)
        if spec is not None and (spec.limits or spec.flow.any) and not self.settings.limited:
            await calls.call(calls.poll, store.set_queue, queue, by=self._id)  # the row slot claims lock
        gained = set((spec.limits if spec else {}).items()) - set((old.spec.limits if old.spec else {}).items())
        if gained or (spec is not None and spec.flow != old.flow and spec.flow.any):
            self._buffer.drop_all()  # a gate limit or flow control set or changed: fetched again through the claim
        self.current = router
        if spec is None and self.processor is None:
            log.warning(
                "queue %s has no pipeline any more: nothing is delivered until one is applied",
                queue,
                extra={"event": "pipeline_removed", "watcher": self._id},
            )
            return
        log.info(
            "queue %s: pipeline version %d (%s)",
            queue,
            router.version,
            ", ".join(f"{g.number}={g.name}" for g in spec.gates) if spec else "removed",
            extra={"event": "pipeline_followed", "version": router.version, "watcher": self._id},
        )

    @property
    def serves_nothing(self) -> bool:
        """Serving a pipeline that was removed: nothing is delivered (nor failed) until one is applied."""
        return self.processor is None and self.current.spec is None

    def policy_of(self, ready: ReadyItem) -> RetryPolicy:
        """The attempts and backoff of `ready`'s gate under the pipeline version now followed."""
        return self.current.route(ready.gate).policy

    def batch_of(self, gate: int) -> int:
        """Items of one partition delivered in one call at `gate`: the gate's `batch`, else `--batch`."""
        route = self.current.route(gate)
        if self.current.transactional(route, gate):
            return 1  # each item its own transaction (a stored pipeline's `batch` is not followed)
        spec = route.gate
        return spec.batch if spec is not None and spec.batch is not None else self._config.batch

    @property
    def largest_batch(self) -> int:
        """The most items one call may carry at any gate: `--batch`, or a pipeline gate's `batch`."""
        spec = self.current.spec
        return max([self._config.batch, *(g.batch for g in (spec.gates if spec else ()) if g.batch)])

    def partition_limit(self, lease: Lease | None, gate: int) -> int | None:
        """Items of the partition of `lease` at `gate` in flight at once at most: the smallest of
        its own, its queue's and its pipeline gate's `partition_limit` (None: none applies)."""
        spec = self.current.route(gate).gate
        limits = [
            limit
            for limit in (
                self.settings.partition_limit,
                lease.partition_limit if lease is not None else None,
                spec.partition_limit if spec is not None else None,
            )
            if limit is not None
        ]
        return min(limits) if limits else None

    @staticmethod
    def gate_label(route: Route, gate: int) -> str:
        """The `gate` label of a delivery's metrics: its name in the pipeline, else its number."""
        return route.gate.name if route.gate is not None else str(gate)

    def closed_gates(self) -> list[int]:
        """Gates of the pipeline outside their time windows now: their partitions are not fetched from."""
        spec = self.current.spec
        return [] if spec is None else spec.closed_gates(datetime.now(UTC))


def _flow_of(settings: QueueSettings) -> tuple[object, ...]:
    """A queue's own flow controls: set or changed, the buffered items are fetched again through them."""
    return (settings.group_limit, settings.rate, settings.group_rate)
