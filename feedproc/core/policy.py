"""How a delivery's result becomes an item's next state: answer validation and retry backoff.

Pure functions, shared by every Processor: a `Response` or an exception goes in, an `Outcome` for
`Store.apply` comes out.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import cast

from .errors import InvalidAnswer, PermanentError, RetryLater
from .gates import check_not_below
from .models import NewItem, Response, gate_problem
from .records import Kind, Outcome, ReadyItem

#: The longest delay a policy ever returns, whatever its settings (a year): every delay becomes a
#: timestamp in the database, and none may overflow it.
MAX_DELAY = 365 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Attempts and backoff: the n-th retry waits `retry_delay * 2**(n-1)` plus up to 25% jitter; a
    longer `Retry-After` / `retry_after` wins. Every delay it returns is finite, >= 0 and at most
    `max_retry_delay` — a requested one included."""

    max_attempts: int = 5
    retry_delay: float = 1.0
    max_retry_delay: float = 600.0
    not_yet_delay: float = 1.0  # a "not yet" answer without retry_after waits this long (the poll interval)
    #: "Not yet" answers of one item at one gate before it fails: they are not attempts, and a handler
    #: that never says anything else would otherwise be asked forever.
    max_not_yet: int = 1000

    def backoff(self, retry: int, rng: random.Random | None = None) -> float:
        """Delay before the `retry`-th retry (1-based), jitter included, never above the cap."""
        exponent = min(max(retry - 1, 0), 64)  # 2**64 seconds is past any cap; no float overflow
        base = min(self.retry_delay * 2.0**exponent, self.max_retry_delay)
        return self.cap(min(base * (1 + (rng or random).uniform(0, 0.25)), max(self.max_retry_delay, base)))

    def delay_for(self, retry: int, requested: float | None = None, rng: random.Random | None = None) -> float:
        """Delay before the `retry`-th retry (1-based) after a transient failure that asked for
        `requested` seconds (a `Retry-After`, `RetryLater(after=...)`; None: nothing asked): the
        backoff, or the requested delay when it is longer, capped at `max_retry_delay`. A requested
        delay that is not a finite number >= 0 is ignored. Pure, apart from the jitter's `rng`."""
        delay = self.backoff(retry, rng)
        if _usable(requested) and requested > delay:  # type: ignore[operator]
            delay = requested  # type: ignore[assignment]
        return self.cap(delay)

    def not_yet(self, requested: float | None = None) -> float:
        """Delay before asking again after a "not yet" answer that asked for `requested` seconds
        (`retry_after`; None: the poll interval), capped at `max_retry_delay`. A requested delay that
        is not a finite number >= 0 is taken as not given. Pure."""
        return self.cap(requested if _usable(requested) else self.not_yet_delay)  # type: ignore[arg-type]

    def cap(self, delay: float) -> float:
        """`delay` made schedulable: at least 0, at most `max_retry_delay` (and MAX_DELAY, whatever
        the settings); NaN becomes the cap."""
        ceiling = (
            self.max_retry_delay if _usable(self.max_retry_delay) and self.max_retry_delay < MAX_DELAY else MAX_DELAY
        )
        if not delay <= ceiling:  # NaN, inf, too long
            return float(ceiling)
        return float(delay) if delay > 0 else 0.0


def _usable(seconds: float | None) -> bool:
    """A number of seconds a delay may be made of: finite and >= 0 (not None, NaN, inf, a bool)."""
    return (
        seconds is not None
        and not isinstance(seconds, bool)
        and isinstance(seconds, int | float)
        and seconds >= 0
        and math.isfinite(seconds)
    )


def validate(item: ReadyItem, response: Response) -> None:
    """Raise InvalidAnswer when a Response breaks the contract for this item.

    A second line of defence: `Response` checks its values when it is made, but it may be changed
    afterwards, so gates (0..MAX_GATE), data and children are checked again before any write."""
    if response.gate is not None:
        if problem := gate_problem(response.gate):  # (a name, too: Response makes names numbers)
            raise InvalidAnswer(problem)
        if cast(int, response.gate) < item.gate:
            raise InvalidAnswer(f"gate {response.gate} is lower than the item's gate {item.gate}")
    if response.data is not None and type(response.data) is not bytes:
        raise InvalidAnswer(f"data must be bytes once the Response is made, got {type(response.data).__name__}")
    if response.gate == item.gate and response.items:
        raise InvalidAnswer('a "not yet" answer (gate equal to the item\'s) cannot add items')
    for n, child in enumerate(response.children, start=1):
        if not isinstance(child, NewItem) or type(child.data) is not bytes:
            raise InvalidAnswer(f"child {n} is not a NewItem with bytes data (changed after the Response was made?)")
        if problem := gate_problem(child.gate):
            raise InvalidAnswer(f"child {n}: {problem}")
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
            result=response.result,
            accumulate=response.accumulate,
        )
    base = (item.id, item.version, item.partition_id, item.epoch, item.gate)
    if error is None and response is not None:
        try:
            validate(item, response)
        except InvalidAnswer as invalid:
            error = invalid
    if error is None and response is not None:
        children = response.children
        produced = {"data": response.data, "result": response.result, "accumulate": response.accumulate}
        if response.done:
            return Outcome(*base, kind=Kind.DONE, children=children, attempts=item.attempts, **produced)
        if response.gate == item.gate:
            not_yet = item.not_yet + 1
            if not_yet >= policy.max_not_yet:
                why = f"not yet answered {not_yet} times (max_not_yet {policy.max_not_yet})"
                return Outcome(*base, kind=Kind.FAIL, attempts=item.attempts, error=why, not_yet=not_yet)
            delay = policy.not_yet(response.retry_after)
            return Outcome(
                *base,
                kind=Kind.LATER,
                delay=delay,
                attempts=item.attempts,
                progress=response.progress,
                not_yet=not_yet,
                **produced,
            )
        return Outcome(*base, kind=Kind.MOVE, new_gate=cast(int, response.gate), children=children, **produced)
    message = describe(error)
    pushback = error.pushback if isinstance(error, RetryLater) else None
    attempts = item.attempts + 1
    if isinstance(error, PermanentError) or attempts >= policy.max_attempts:
        return Outcome(*base, kind=Kind.FAIL, attempts=attempts, error=message, pushback=pushback)
    delay = policy.delay_for(attempts, error.after if isinstance(error, RetryLater) else None)
    return Outcome(*base, kind=Kind.RETRY, attempts=attempts, delay=delay, error=message, pushback=pushback)


def describe(error: BaseException | None) -> str:
    if error is None:
        return "no answer"
    if isinstance(error, PermanentError | RetryLater | InvalidAnswer):
        return str(error) or type(error).__name__
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
