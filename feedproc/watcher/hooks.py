"""The hook sender: delivers the queue's completion hooks from the outbox (`store/hooks.py`).

Once per poll interval, or at once when this watcher's answers finished a partition, it looks for
hooks due (a read on the outbox's index), claims up to `CLAIM_BATCH` of them and calls them
concurrently: an HTTP hook is POSTed its JSON body, signed (`core.hooks.sign`) with the watcher's
secret (`FEEDPROC_HOOK_SECRET`), with the hook's id as `Idempotency-Key`; a Python hook's callable
(registered with this watcher) is called with the same body, parsed. A 2xx answer, or a callable
returning, is delivered; anything else is a failed attempt, retried with backoff up to
`hook_attempts`, then failed for good (kept, and retried by an operator).

A claim lasts the call's timeout and a margin: a watcher killed mid-call leaves it to expire, and
another watcher (or this one, restarted) delivers the hook again. Receivers deduplicate by id.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import httpx

from .._version import __version__
from ..core.errors import DatabaseUnavailable
from ..core.hooks import IDEMPOTENCY_HEADER, PYTHON, SIGNATURE_HEADER, HookCall, backoff, sign
from ..core.redaction import redact_url
from ..processors.pipeline import HookFunction
from ..store import Store
from .config import WatcherConfig

log = logging.getLogger("feedproc.hooks")
P = ParamSpec("P")
T = TypeVar("T")

#: Hooks claimed at once (and called concurrently) at most.
CLAIM_BATCH = 16
#: Seconds between a watcher's looks for due hooks at least (its poll interval when longer).
HOOK_POLL_FLOOR = 1.0
#: A claim lasts twice the call's timeout and this: writing the outcome comes after the call.
CLAIM_MARGIN = 1.0


@dataclass(frozen=True, slots=True)
class HookSettings:
    """What a hook sender delivers and how: the hooks of `queue` (None: every queue's HTTP hooks,
    as `feedproc serve` delivers them), calls of `timeout` seconds, `attempts` of them at most,
    `max_delay` seconds at most between two, and a look for due hooks every `poll_interval`."""

    queue: str | None
    attempts: int = 25
    timeout: float = 10.0
    max_delay: float = 60.0
    poll_interval: float = 1.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.timeout <= 0 or self.max_delay <= 0 or self.poll_interval <= 0:
            raise ValueError("hook attempts must be at least 1, and its timeout and delays positive")

    @classmethod
    def of(cls, config: WatcherConfig) -> HookSettings:
        """A watcher's: its queue's hooks, by its `hook_*` settings."""
        # At most a look a second: the outbox is read by every watcher of the queue, and one
        # polling every 50 ms (the tests' watchers) would read it 20 times a second for nothing;
        # a hook of its own answers' partitions wakes it at once anyway.
        every = max(config.poll_interval, HOOK_POLL_FLOOR)
        return cls(config.queue, config.hook_attempts, config.hook_timeout, config.hook_max_delay, every)


class HookSender:
    """Claims and calls hooks (`HookSettings` says which); `loop` runs until `stopping()` is true.
    Its store calls run on `executor`; `counted(outcome)` counts each call (sent, retried,
    failed); `outage(error)` hears of a database outage, which the loop waits out."""

    def __init__(
        self,
        store: Store,
        settings: HookSettings,
        sender_id: str,
        *,
        executor: ThreadPoolExecutor,
        stopping: Callable[[], bool],
        functions: Mapping[str, HookFunction] = {},
        secret: str | None = None,
        counted: Callable[[str], None] = lambda outcome: None,
        outage: Callable[[BaseException], None] = lambda error: None,
    ) -> None:
        self._store = store
        self._settings = settings
        self._id = sender_id
        self._executor = executor
        self._stopping = stopping
        self.functions = dict(functions)  #: hook name -> the callable of a `python` hook
        self._secret = secret
        self._counted = counted
        self._outage = outage
        self._wake = asyncio.Event()
        self._warned_unsigned = False
        self._cycle = asyncio.Lock()  # held by a claim and its calls: the loop's, or `deliver_due`'s

    def wake(self) -> None:
        """Look for hooks due now, not at the next poll interval (a partition finished here)."""
        self._wake.set()

    async def _call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            timeout=self._settings.timeout, follow_redirects=False, headers={"User-Agent": f"feedproc/{__version__}"}
        )

    async def deliver_due(self) -> int:
        """Call every hook due now, once each (a failed one is due again only after its delay);
        returns how many were called. What `feedproc.testing.Harness` runs after each step."""
        called = 0
        async with self._client() as client, self._cycle:  # after the loop's calls under way
            while claimed := await self._claim():
                await asyncio.gather(*(self._deliver(client, call) for call in claimed))
                called += len(claimed)
        return called

    async def loop(self) -> None:
        """Deliver due hooks until stopped; a database outage is waited out."""
        settings = self._settings
        async with self._client() as client:
            while not self._stopping():
                async with self._cycle:
                    try:
                        claimed = await self._claim()
                    except DatabaseUnavailable as error:
                        self._outage(error)
                        claimed = []
                    if claimed:
                        await asyncio.gather(*(self._deliver(client, call) for call in claimed))
                if len(claimed) == CLAIM_BATCH:
                    continue  # more may be due
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=settings.poll_interval)

    async def _claim(self) -> list[HookCall]:
        store, settings, functions = self._store, self._settings, list(self.functions)
        if not await self._call(store.hooks_due, settings.queue, python_hooks=functions):
            return []  # the common case: one read on the outbox's index, no write transaction
        return await self._call(
            store.claim_hooks,
            self._id,
            settings.queue,
            python_hooks=functions,
            limit=CLAIM_BATCH,
            claim_seconds=2 * settings.timeout + CLAIM_MARGIN,
        )

    async def _deliver(self, client: httpx.AsyncClient, call: HookCall) -> None:
        """Call one hook and write what happened (an error of ours is its failure, never the loop's)."""
        started = time.monotonic()
        status: int | None = None
        try:
            if call.target == PYTHON:
                await self._call_function(call)
            else:
                status = await self._post(client, call)
            error = None if status is None or 200 <= status < 300 else f"answered HTTP {status}"
        except Exception as caught:  # the hook's failure, whatever it was
            error = _described(caught, call.target)
        seconds = time.monotonic() - started
        try:
            if error is None:
                written = await self._call(self._store.hook_sent, call, response_status=status)
                self._counted("sent")
                log.info(
                    "hook %s of partition %s delivered (%s, %.3fs)",
                    call.hook,
                    call.key,
                    _target(call),
                    seconds,
                    extra={"event": "hook_sent", "key": call.key, "hook": call.hook, "watcher": self._id},
                )
            else:
                retry_in = None if call.attempt >= self._settings.attempts else self._delay(call.attempt)
                written = await self._call(
                    self._store.hook_failed, call, error, retry_in=retry_in, response_status=status
                )
                self._counted("retried" if retry_in is not None else "failed")
                later = f"retried in {retry_in:.1f}s" if retry_in is not None else "out of attempts: failed"
                log.warning(
                    "hook %s of partition %s, attempt %d, to %s: %s; %s",
                    call.hook,
                    call.key,
                    call.attempt,
                    _target(call),
                    error,
                    later,
                    extra={"event": "hook_failed", "key": call.key, "hook": call.hook, "watcher": self._id},
                )
            if not written:  # its claim expired and another watcher took it: that one records it
                log.info("hook %s of partition %s: claimed again by another watcher meanwhile", call.hook, call.key)
        except DatabaseUnavailable as caught:  # the claim expires; the hook is called again then
            self._outage(caught)

    def _delay(self, attempt: int) -> float:
        return backoff(attempt, base=min(1.0, self._settings.max_delay), cap=self._settings.max_delay)

    async def _post(self, client: httpx.AsyncClient, call: HookCall) -> int:
        body = call.body()
        headers = {
            "Content-Type": "application/json",
            IDEMPOTENCY_HEADER: str(call.id),
            "Feedproc-Hook": call.hook,
            "Feedproc-Attempt": str(call.attempt),
        }
        if self._secret:
            headers[SIGNATURE_HEADER] = sign(self._secret, int(time.time()), body)
        elif not self._warned_unsigned:
            self._warned_unsigned = True
            log.warning("hooks are sent unsigned: set FEEDPROC_HOOK_SECRET so receivers can verify them")
        response = await client.post(call.target, content=body, headers=headers)
        return response.status_code

    async def _call_function(self, call: HookCall) -> None:
        function = self.functions.get(call.hook)
        if function is None:  # claimed only when this watcher has one: a registration changed
            raise LookupError(f"no Python function for {call.hook} in this watcher")
        body = json.loads(call.body())
        if inspect.iscoroutinefunction(function):
            await asyncio.wait_for(_awaited(function(body)), timeout=self._settings.timeout)
        else:
            await asyncio.wait_for(asyncio.to_thread(function, body), timeout=self._settings.timeout)


async def _awaited(value: Awaitable[Any]) -> Any:
    return await value


def _target(call: HookCall) -> str:
    return "a Python function" if call.target == PYTHON else redact_url(call.target)


def _described(error: BaseException, target: str) -> str:
    """A failed call in one line: what went wrong, without the URL (its query may hold a secret)."""
    if isinstance(error, TimeoutError | httpx.TimeoutException):
        return "timed out"
    lines = str(error).replace(target, redact_url(target)).splitlines()
    text = lines[0][:500] if lines else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class HookThread:
    """A `HookSender` on an event loop in a thread of its own: how `feedproc serve` delivers the
    HTTP hooks of every queue (a pull-mode queue has no watcher to deliver its hooks)."""

    def __init__(self, store: Store, settings: HookSettings, sender_id: str, *, secret: str | None) -> None:
        self._stopped = threading.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="feedproc-hooks")
        self._last_outage = 0.0
        self._timeout = settings.timeout
        self.sender = HookSender(
            store,
            settings,
            sender_id,
            executor=self._executor,
            stopping=self._stopped.is_set,
            secret=secret,
            outage=self._outage,
        )
        self._thread = threading.Thread(target=self._main, name="feedproc-hooks", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop after the calls under way (each at most the hook timeout); their claims expire."""
        self._stopped.set()
        self._thread.join(self._timeout + 5)
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _main(self) -> None:
        try:
            asyncio.run(self.sender.loop())
        except Exception:  # a bug of ours: said, and the API goes on serving
            log.exception("completion hooks stopped")

    def _outage(self, error: BaseException) -> None:
        if time.monotonic() - self._last_outage > 60:  # once a minute while it lasts
            self._last_outage = time.monotonic()
            log.warning("completion hooks wait for the database: %s", error)
