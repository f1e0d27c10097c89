"""How a delivery's result becomes an item's next state: answer validation and retry backoff.

Pure functions, shared by every Processor: a `Response` or an exception goes in, an `Outcome` for
`Store.apply` comes out.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .errors import PermanentError, RetryLater
from .gates import check_not_below
from .models import Response
from .processors import InvalidAnswer
from .store import Kind, Outcome, ReadyItem


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Attempts and backoff: the n-th retry waits `retry_delay * 2**(n-1)` plus up to 25% jitter,
    never more than `max_retry_delay`; a longer `Retry-After` / `retry_after` wins."""

    max_attempts: int = 5
    retry_delay: float = 1.0
    max_retry_delay: float = 600.0
    not_yet_delay: float = 1.0  # a "not yet" answer without retry_after waits this long (the poll interval)

    def backoff(self, retry: int, rng: random.Random | None = None) -> float:
        """Delay before the `retry`-th retry (1-based), jitter included, never above the cap."""
        exponent = min(max(retry - 1, 0), 64)  # 2**64 seconds is past any cap; no float overflow
        base = min(self.retry_delay * 2.0**exponent, self.max_retry_delay)
        return min(base * (1 + (rng or random).uniform(0, 0.25)), max(self.max_retry_delay, base))


def validate(item: ReadyItem, response: Response) -> None:
    """Raise InvalidAnswer when a Response breaks the contract for this item."""
    if response.gate is not None and response.gate < item.gate:
        raise InvalidAnswer(f"gate {response.gate} is lower than the item's gate {item.gate}")
    if response.gate == item.gate and response.items:
        raise InvalidAnswer('a "not yet" answer (gate equal to the item\'s) cannot add items')
    for n, child in enumerate(response.items, start=1):  # type: ignore[arg-type]
        if reason := check_not_below(child.gate, item.gate):
            raise InvalidAnswer(f"child {n}: {reason}")


def outcome_of(
    item: ReadyItem, policy: RetryPolicy, *, response: Response | None = None, error: BaseException | None = None
) -> Outcome:
    """The Outcome for one delivery of `item` that answered `response` or raised `error`."""
    if error is None and response is not None and response.done and not response.items:  # the common answer
        return Outcome(
            item.id,
            item.version,
            item.partition_id,
            item.epoch,
            item.gate,
            Kind.DONE,
            data=response.data,
            attempts=item.attempts,
        )
    base = {
        "item_id": item.id,
        "version": item.version,
        "partition_id": item.partition_id,
        "epoch": item.epoch,
        "gate": item.gate,
    }
    if error is None and response is not None:
        try:
            validate(item, response)
        except InvalidAnswer as invalid:
            error = invalid
    if error is None and response is not None:
        children = tuple(response.items)  # type: ignore[arg-type]
        if response.done:
            return Outcome(**base, kind=Kind.DONE, data=response.data, children=children, attempts=item.attempts)
        if response.gate == item.gate:
            delay = response.retry_after if response.retry_after is not None else policy.not_yet_delay
            return Outcome(
                **base,
                kind=Kind.LATER,
                data=response.data,
                delay=delay,
                attempts=item.attempts,
                progress=response.progress,
            )
        return Outcome(**base, kind=Kind.MOVE, new_gate=response.gate, data=response.data, children=children)
    attempts = item.attempts + 1
    message = describe(error)
    if isinstance(error, PermanentError) or attempts >= policy.max_attempts:
        return Outcome(**base, kind=Kind.FAIL, attempts=attempts, error=message)
    delay = policy.backoff(attempts)
    if isinstance(error, RetryLater) and error.after is not None:
        delay = max(delay, error.after)
    return Outcome(**base, kind=Kind.RETRY, attempts=attempts, delay=delay, error=message)


def describe(error: BaseException | None) -> str:
    if error is None:
        return "no answer"
    if isinstance(error, PermanentError | RetryLater | InvalidAnswer):
        return str(error) or type(error).__name__
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
