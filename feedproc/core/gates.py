"""The gate rules (the fan-in barrier), written once.

Everything that can change whether a partition's current gate still holds work (an answer applied,
items added, a seal, a checkpoint, a retry) ends by asking `settle` what the partition becomes.
The store gathers the facts with one query under the partition's lock and writes the outcome.

A gate may tolerate failures (`fanin.Tolerance`: "5%" of its items, or a count): failed items
within it do not hold the gate, and more than it fail the partition at once, even while other
items there are still available. Only then does `settle` need the gate's counts (`failed`,
`total`); `counts_matter` says when, so that the common case reads nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from .fanin import Tolerance


class Move(StrEnum):
    STAY = "stay"  # the current gate still has available items
    WAIT = "wait"  # drained, nothing to do yet: unsealed, or a manual checkpoint holds the gate
    ADVANCE = "advance"  # move to the next gate that holds work
    FAIL = "fail"  # drained with a failed item at the gate, or more failed there than it tolerates
    COMPLETE = "complete"  # drained, sealed, nothing left anywhere


@dataclass(frozen=True, slots=True)
class GateFacts:
    """What the gate rules look at, for one partition at its current gate."""

    gate: int
    available_here: bool  # any available item at the current gate
    failed_here: bool  # any failed item at the current gate
    next_gate: int | None  # lowest gate above the current one with an available item
    sealed: bool
    manual_checkpoint: bool
    # The failures the gate tolerates (None: any failure holds the gate, rule 3 as it always was),
    # and, when `counts_matter`, its failed items and every item that reached it (whatever became
    # of them: those that moved on to a later gate count too; fewer will do where they still
    # leave the failures within the tolerance, as they can only raise what it allows).
    tolerance: Tolerance | None = None
    failed: int = 0
    total: int = 0


@dataclass(frozen=True, slots=True)
class Decision:
    move: Move
    gate: int


def counts_matter(tolerance: Tolerance | None, available_here: bool, failed_here: bool, *, failed_now: bool) -> bool:
    """Whether `settle` needs the gate's counts: it tolerates failures and has one, and either it
    drained or an item just failed there (`failed_now`). Otherwise the answer is the same without
    them: with items still available the partition stays, and the count of failed items has not
    grown since it was last within the tolerance (the items that reached a gate never decrease)."""
    return tolerance is not None and failed_here and (failed_now or not available_here)


def settle(facts: GateFacts, *, checkpoint: bool = False) -> Decision:
    """Apply gate rule 3 to a partition; `checkpoint=True` is an operator's `feedproc checkpoint`.

    With a tolerance, more failed items than it allows fail the partition at once (FAIL, the
    caller cancels what is left at the gate); as many as it allows do not hold the gate."""
    held = facts.failed_here  # a failed item holds a drained gate...
    if facts.failed_here and facts.tolerance is not None:
        if facts.tolerance.exceeded(facts.failed, facts.total):
            return Decision(Move.FAIL, facts.gate)
        held = False  # ...unless the gate tolerates it
    if facts.available_here:
        return Decision(Move.STAY, facts.gate)
    if held:
        return Decision(Move.FAIL, facts.gate)
    if facts.next_gate is not None:
        if facts.manual_checkpoint and not checkpoint:
            return Decision(Move.WAIT, facts.gate)
        return Decision(Move.ADVANCE, facts.next_gate)
    if facts.sealed:
        return Decision(Move.COMPLETE, facts.gate)
    return Decision(Move.WAIT, facts.gate)


def initial_gate(item_gates: list[int] | None) -> int:
    """Rule 1: a new partition starts at the lowest gate among its items (0 when it has none)."""
    return min(item_gates) if item_gates else 0


def check_not_below(gate: int, partition_gate: int) -> str | None:
    """Rule 4: the reason an item may not be placed at `gate`, or None when it may."""
    if gate < partition_gate:
        return f"gate {gate} is below the partition's current gate {partition_gate}"
    return None
