"""The gate rules (the fan-in barrier), written once.

Everything that can change whether a partition's current gate still holds work (an answer applied,
items added, a seal, a checkpoint, a retry) ends by asking `settle` what the partition becomes.
The store gathers the facts with one query under the partition's lock and writes the outcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Move(StrEnum):
    STAY = "stay"  # the current gate still has available items
    WAIT = "wait"  # drained, nothing to do yet: unsealed, or a manual checkpoint holds the gate
    ADVANCE = "advance"  # move to the next gate that holds work
    FAIL = "fail"  # drained with a failed item at the gate
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


@dataclass(frozen=True, slots=True)
class Decision:
    move: Move
    gate: int


def settle(facts: GateFacts, *, checkpoint: bool = False) -> Decision:
    """Apply gate rule 3 to a partition; `checkpoint=True` is an operator's `feedproc checkpoint`."""
    if facts.available_here:
        return Decision(Move.STAY, facts.gate)
    if facts.failed_here:
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
