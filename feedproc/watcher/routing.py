"""Routing: the queue's pipeline followed version by version (each gate's processor and settings),
and the schedules that start partitions."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from ..core.errors import DatabaseUnavailable
from ..processors.pipeline import GateRouter, Route
from .state import WatcherState

log = logging.getLogger("feedproc.watcher")


class Routing(WatcherState):
    """Following the pipeline; each gate's route, batch size and windows."""

    async def _follow_pipeline(self) -> None:
        """Follow the queue's stored pipeline: when its version moved, route by the new version from
        now on (deliveries under way finish with the router they started with). One primary-key
        read per poll interval; nothing when the watcher serves a Python `Pipeline` of its own."""
        if self.code_pipeline is not None:
            return
        queue = self.config.queue
        version = await self._db_call(self._db, self.store.pipeline_version, queue)
        if version == self.router.version:
            return
        spec = await self._db_call(self._db, self.store.pipeline, queue) if version else None
        old = self.router
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
        if spec is not None and spec.limits and not self.queue_settings.limited:
            await self._db_call(self._db, self.store.set_queue, queue, by=self.id)  # the row slot claims lock
        if set((spec.limits if spec else {}).items()) - set((old.spec.limits if old.spec else {}).items()):
            self._drop_buffered(lambda item: True)  # a gate limit set or changed: fetched again through the claim
        self.router = router
        if spec is None and self.processor is None:
            log.warning(
                "queue %s has no pipeline any more: nothing is delivered until one is applied",
                queue,
                extra={"event": "pipeline_removed", "watcher": self.id},
            )
            return
        log.info(
            "queue %s: pipeline version %d (%s)",
            queue,
            router.version,
            ", ".join(f"{g.number}={g.name}" for g in spec.gates) if spec else "removed",
            extra={"event": "pipeline_followed", "version": router.version, "watcher": self.id},
        )

    async def _schedule_loop(self) -> None:
        """Start the partitions of the pipeline's schedules as their ticks come due (every watcher of
        the queue looks; the store makes each tick's partition once)."""
        while True:
            spec = self.router.spec
            if spec is not None and spec.schedules and not self.stopping:
                try:
                    # (a Python Pipeline's schedules run once applied: the stored rows keep their ticks)
                    created = await asyncio.to_thread(self.store.fire_schedules, self.config.queue)
                    for key in created:
                        log.info(
                            "schedule started partition %s",
                            key,
                            extra={"event": "scheduled", "key": key, "watcher": self.id},
                        )
                except DatabaseUnavailable as error:  # an outage: said once, by the loops' health
                    self._health.failed("schedules", error)
                except Exception as error:  # looked at again next time
                    log.warning("could not start scheduled partitions: %s", error)
            await asyncio.sleep(min(self.config.poll_interval, 5.0))

    def _batch_of(self, gate: int) -> int:
        """Items of one partition delivered in one call at `gate`: the gate's `batch`, else `--batch`."""
        spec = self.router.route(gate).gate
        return spec.batch if spec is not None and spec.batch is not None else self.config.batch

    def _gate_label(self, route: Route, gate: int) -> str:
        """The `gate` label of a delivery's metrics: its name in the pipeline, else its number."""
        return route.gate.name if route.gate is not None else str(gate)

    def _closed_gates(self) -> list[int]:
        """Gates of the pipeline outside their time windows now: their partitions are not fetched from."""
        spec = self.router.spec
        return [] if spec is None else spec.closed_gates(datetime.now(UTC))
