"""`Feed`, for pull workers (the worker API): claim ready items, heartbeat, answer or release them,
read what a fan-in item collects; and the reading of a worker's answer object."""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..core.errors import (
    FeedprocError,
    InvalidAnswer,
    InvalidInput,
    PermanentError,
    RetryLater,
    TooLarge,
    TooManyChildren,
)
from ..core.fanin import COLLECT_INLINE_BYTES, PAGE, CollectedResult, result_size
from ..core.models import MAX_CHILDREN, MAX_PRIORITY, MIN_PRIORITY, Response, check_priority
from ..store import MAX_CLAIM, ClaimAnswer
from .base import FeedBase, retried


class Workers(FeedBase):
    """The pull workers' side: claims and their answers."""

    @retried
    def claim(
        self,
        queue: str,
        worker: str,
        *,
        max_items: int = 10,
        lease_seconds: float = 60.0,
        min_priority: int | None = None,
        max_priority: int | None = None,
    ) -> list[dict[str, Any]]:
        """Claim up to `max_items` ready items of pull-mode `queue` for `worker`, each held for
        `lease_seconds` unless heartbeats extend it. Each is a dict: id, partition, queue, gate,
        attempt, deliveries, data (bytes), token, lease_expires_at. Only items at their partition's
        current gate, in priority order, and with `min_priority` / `max_priority` only of partitions
        whose priority is in that range (both included); [] when none is ready. Refused unless the
        queue is in pull mode."""
        check_claim(worker, max_items, lease_seconds)
        low = MIN_PRIORITY if min_priority is None else check_priority(min_priority, "min_priority")
        high = MAX_PRIORITY if max_priority is None else check_priority(max_priority, "max_priority")
        claimed = self.store.claim(queue, worker, max_items, lease_seconds, self.policy, (low, high))
        if any("collects" in entry for entry in claimed):
            self._fan_in(claimed)
        return claimed

    def _fan_in(self, claimed: list[dict[str, Any]]) -> None:
        """Give each claimed fan-in item what it collects: `collected` ({"gate", "count", "failed"}
        with its `results` inline, or `pages`: {"after", "until"}, the bounds of its results' pages,
        which the API makes a `results_url`) and `accumulated`. Inline results of one claim come to
        COLLECT_INLINE_BYTES at most in all: past that, the items' results travel by pages."""
        budget = COLLECT_INLINE_BYTES
        for entry in claimed:
            if "collects" not in entry:
                continue
            partition_id, what = entry.pop("collects")
            gathered = self.store.gather(partition_id, what, inline_bytes=budget)
            collection = gathered.collection
            collected: dict[str, Any] = {
                "gate": what.name or what.gate,
                "count": collection.count,
                "failed": collection.failed,
            }
            if gathered.results is not None:
                collected["results"] = [row.to_json() for row in gathered.results]
                budget -= sum(map(result_size, gathered.results))
            else:
                collected["pages"] = {"after": collection.first - 1, "until": collection.last}
            entry["collected"] = collected
            entry["accumulated"] = gathered.accumulated

    def collected_page(
        self, item_id: int, token: str, *, after: int | None = None, until: int | None = None, limit: int = PAGE
    ) -> tuple[list[CollectedResult], int | None, int]:
        """A page of the results item `item_id` collects, for the holder of its delivery's `token`
        (a watcher's collecting delivery, a pull worker's claim, a 202's): the results with ids
        above `after` up to `until` (the bounds the delivery was given; the whole collection
        without them), at most `limit`; with the `after` of the next page (None: that was the
        last) and `until`. NotFound for a token no delivery of the item has; StaleClaim once the
        delivery ended (the answer was written, it expired, it was cancelled)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= PAGE:
            raise InvalidInput(f"limit must be an integer from 1 to {PAGE}, got {limit!r}")
        # The bounds come with the URLs a delivery is given: counting (an index range as large as
        # the collection) only for a request without them.
        collection = self.store.collected_by(item_id, token, counted=after is None or until is None)
        start = collection.first - 1 if after is None else after
        last = collection.last if until is None else until
        rows = self.store.collected_page(collection.partition_id, collection.gate, start, last, limit)
        more = bool(rows) and rows[-1].id < last
        return rows, (rows[-1].id if more else None), last

    @retried
    def heartbeat(
        self, item_id: int, token: str, *, progress: float | None = None, lease_seconds: float | None = None
    ) -> str:
        """Extend a claim (by its lease, or `lease_seconds`) and keep `progress` (0..1); returns the
        new expiry (ISO 8601). StaleClaim when the token no longer holds the item, with its `reason`."""
        if progress is not None and (isinstance(progress, bool) or not 0 <= progress <= 1):
            raise InvalidInput(f"progress must be a number from 0 to 1, got {progress!r}")
        if lease_seconds is not None:
            check_claim("-", 1, lease_seconds)
        return self.store.heartbeat_claim(item_id, token, progress=progress, lease_seconds=lease_seconds)

    def answer(
        self, item_id: int, token: str, answer: Mapping[str, Any] | Response, *, max_children: int = MAX_CHILDREN
    ) -> dict[str, Any]:
        """Answer a claimed item: a Response, or an answer object of the handler contract (done /
        gate / data or data_base64 / items / retry_after / progress / Go Feed's complete and
        response, or `error`: {"message", "no_retry"} or a message). A failure is retried with
        backoff or, with no_retry or out of attempts, fails the item. Returns what became of it.
        InvalidInput for a malformed answer, TooLarge for one with more than `max_children`
        children and StaleClaim for a token that no longer holds the item: nothing changes then."""
        (result,) = self.answer_many([(item_id, token, answer)], max_children=max_children)
        if isinstance(result, Exception):
            raise result
        return result

    @retried
    def answer_many(
        self, answers: Sequence[tuple[int, str, Mapping[str, Any] | Response]], *, max_children: int = MAX_CHILDREN
    ) -> list[dict[str, Any] | FeedprocError]:
        """`answer` for many claimed items in one transaction: each one's result, or the error that
        refused it alone (InvalidInput, TooLarge, StaleClaim, NotFound); the others are written."""
        results: list[dict[str, Any] | FeedprocError | None] = [None] * len(answers)
        valid: list[tuple[int, ClaimAnswer]] = []
        for n, (item_id, token, answer) in enumerate(answers):
            try:
                if isinstance(answer, Response):
                    if len(answer.children) > max_children:
                        raise TooManyChildren(len(answer.children), max_children)
                    valid.append((n, (item_id, token, answer, None)))
                    continue
                with self.gate_naming(item=item_id):  # {"gate": "rank"}: the item's queue's pipeline
                    valid.append((n, (item_id, token, read_worker_answer(answer, max_children), None)))
            except TooManyChildren as refused:  # refused, as any request over a limit: the sender hears why
                results[n] = TooLarge(str(refused))
            except (PermanentError, RetryLater) as reported:
                valid.append((n, (item_id, token, None, reported)))
            except InvalidInput as invalid:
                results[n] = invalid
        written = self.store.answer_claims([a for _, a in valid], self.policy) if valid else []
        for (n, _), result in zip(valid, written, strict=True):
            if isinstance(result, InvalidAnswer):
                results[n] = InvalidInput(str(result))
            elif isinstance(result, FeedprocError) or not isinstance(result, Exception):
                results[n] = result
            else:
                raise result
        return [r for r in results if r is not None]

    @retried
    def release(self, item_id: int, token: str) -> None:
        """Hand a claimed item back unanswered (ready again at once, no attempt counted)."""
        self.store.release_claim(item_id, token)

    @retried
    def expire_claims(self, queue: str | None = None) -> int:
        """Settle claims that ran out without an answer (each counts an attempt); how many."""
        return self.store.expire_claims(queue, self.policy)

    def listen_ready(self, on_ready: Callable[[], Any]) -> Callable[[], None] | None:
        """Call `on_ready()` (on a thread of its own) whenever a queue may have new work, until the
        returned stop function is called; None where the database cannot notify (SQLite, MariaDB/MySQL,
        PostgreSQL behind a transaction pooler with no direct listen URL)."""
        if self.store.listen_dsn is None:
            return None
        from ..store.notify import Listener

        listener = Listener(self.store.listen_dsn, self.store.table_prefix, None, on_ready)
        listener.start()
        return listener.stop


def check_claim(worker: str, max_items: int, lease_seconds: float) -> None:
    """InvalidInput unless a claim's arguments are usable."""
    if not isinstance(worker, str) or not 1 <= len(worker) <= 120:
        raise InvalidInput("worker must be a name of 1 to 120 characters")
    if isinstance(max_items, bool) or not isinstance(max_items, int) or not 1 <= max_items <= MAX_CLAIM:
        raise InvalidInput(f"max must be an integer from 1 to {MAX_CLAIM}, got {max_items!r}")
    if isinstance(lease_seconds, bool) or not isinstance(lease_seconds, int | float) or not 1 <= lease_seconds <= 86400:
        raise InvalidInput(f"lease_seconds must be from 1 to 86400, got {lease_seconds!r}")


def read_worker_answer(answer: Mapping[str, Any], max_children: int = MAX_CHILDREN) -> Response:
    """A worker's answer object as a Response; raises the failure it reports (RetryLater, or
    PermanentError for `no_retry`), InvalidInput when it is malformed and TooManyChildren when it
    has more than `max_children` children (counted before any is read)."""
    from ..processors.answers import answer_from_object

    fields = dict(answer)
    raw = _base64_field(fields, "data")
    raw_result = _base64_field(fields, "result")  # a result that is not JSON (a Python processor's bytes)
    error = fields.get("error")
    if isinstance(error, str):  # a plain message: a transient failure
        fields["error"] = {"message": error}
    retry_after = fields.get("retry_after")
    after = retry_after if isinstance(retry_after, int | float) and not isinstance(retry_after, bool) else None
    try:
        response = answer_from_object(fields, after if isinstance(fields.get("error"), dict) else None, max_children)
    except InvalidAnswer as invalid:
        raise InvalidInput(str(invalid)) from None
    if raw is not None:
        response.data = raw  # data that is not JSON, as a handler's request carries it
    if raw_result is not None:
        response.result = raw_result
    return response


def _base64_field(fields: dict[str, Any], name: str) -> bytes | None:
    """`fields[name + "_base64"]` taken out and decoded (None when absent); InvalidInput when it is
    not base64, or comes with `name` itself."""
    raw = fields.pop(f"{name}_base64", None)
    if raw is None:
        return None
    if name in fields or not isinstance(raw, str):
        raise InvalidInput(f"{name}_base64 must be a base64 string, and not given with {name}")
    try:
        return base64.b64decode(raw, validate=True)
    except ValueError:
        raise InvalidInput(f"{name}_base64 is not valid base64") from None
