"""The gate rules, pure: the state machine in `feedproc.core.gates`, one branch per test, then
hypothesis properties of `settle`. (tests/store/test_gate_rules.py drives the real store with them.)"""

from hypothesis import given
from hypothesis import strategies as st

from feedproc.core.fanin import Tolerance
from feedproc.core.gates import Decision, GateFacts, Move, check_not_below, counts_matter, initial_gate, settle


def facts(
    gate: int = 0,
    *,
    available_here: bool = False,
    failed_here: bool = False,
    next_gate: int | None = None,
    sealed: bool = False,
    manual_checkpoint: bool = False,
) -> GateFacts:
    return GateFacts(gate, available_here, failed_here, next_gate, sealed, manual_checkpoint)


# ---------------------------------------------------------------- settle: one branch per test


def test_settle_stays_while_the_gate_has_available_items() -> None:
    assert settle(facts(2, available_here=True, next_gate=5, sealed=True)) == Decision(Move.STAY, 2)


def test_settle_stays_while_available_items_remain_beside_a_failed_one() -> None:
    assert settle(facts(2, available_here=True, failed_here=True, sealed=True)) == Decision(Move.STAY, 2)


def test_settle_fails_a_drained_gate_with_a_failed_item() -> None:
    assert settle(facts(3, failed_here=True)) == Decision(Move.FAIL, 3)


def test_settle_fail_beats_advance() -> None:
    assert settle(facts(3, failed_here=True, next_gate=4)) == Decision(Move.FAIL, 3)


def test_settle_fail_beats_complete() -> None:
    assert settle(facts(3, failed_here=True, sealed=True)) == Decision(Move.FAIL, 3)


def test_settle_fail_beats_checkpoint() -> None:
    outcome = settle(facts(3, failed_here=True, next_gate=4, manual_checkpoint=True), checkpoint=True)
    assert outcome == Decision(Move.FAIL, 3)


def test_settle_advances_to_the_next_gate_that_holds_work_skipping_empty_gates() -> None:
    assert settle(facts(1, next_gate=7)) == Decision(Move.ADVANCE, 7)


def test_settle_advances_an_unsealed_partition_with_work_above() -> None:
    assert settle(facts(0, next_gate=1, sealed=False)) == Decision(Move.ADVANCE, 1)


def test_settle_manual_checkpoint_waits_at_a_drained_gate() -> None:
    assert settle(facts(1, next_gate=2, sealed=True, manual_checkpoint=True)) == Decision(Move.WAIT, 1)


def test_settle_manual_checkpoint_advances_on_checkpoint() -> None:
    outcome = settle(facts(1, next_gate=4, sealed=True, manual_checkpoint=True), checkpoint=True)
    assert outcome == Decision(Move.ADVANCE, 4)


def test_settle_checkpoint_does_not_move_a_gate_that_still_has_work() -> None:
    outcome = settle(facts(1, available_here=True, next_gate=4, manual_checkpoint=True), checkpoint=True)
    assert outcome == Decision(Move.STAY, 1)


def test_settle_manual_checkpoint_completes_a_sealed_partition_with_nothing_above() -> None:
    assert settle(facts(5, sealed=True, manual_checkpoint=True)) == Decision(Move.COMPLETE, 5)


def test_settle_completes_a_sealed_drained_partition() -> None:
    assert settle(facts(5, sealed=True)) == Decision(Move.COMPLETE, 5)


def test_settle_unsealed_drained_partition_waits() -> None:
    assert settle(facts(5, sealed=False)) == Decision(Move.WAIT, 5)


def test_settle_checkpoint_on_an_unsealed_drained_partition_waits() -> None:
    assert settle(facts(5, manual_checkpoint=True), checkpoint=True) == Decision(Move.WAIT, 5)


# ---------------------------------------------------------------- rules 1 and 4


def test_initial_gate_is_the_lowest_item_gate() -> None:
    assert initial_gate([4, 2, 9, 2]) == 2


def test_initial_gate_without_items_is_zero() -> None:
    assert initial_gate([]) == 0
    assert initial_gate(None) == 0


def test_check_not_below_refuses_a_lower_gate_naming_both_gates() -> None:
    reason = check_not_below(1, 3)
    assert reason is not None
    assert "1" in reason and "3" in reason


def test_check_not_below_allows_the_current_gate() -> None:
    assert check_not_below(3, 3) is None


def test_check_not_below_allows_a_higher_gate() -> None:
    assert check_not_below(9, 3) is None


# ---------------------------------------------------------------- settle: properties


@st.composite
def gate_facts(draw: st.DrawFn) -> GateFacts:
    gate = draw(st.integers(0, 1000))
    next_gate = draw(st.none() | st.integers(gate + 1, gate + 1000))
    available_here, failed_here, sealed, manual = (draw(st.booleans()) for _ in range(4))
    return GateFacts(gate, available_here, failed_here, next_gate, sealed, manual)


@given(gate_facts(), st.booleans())
def test_property_outcome_gate_is_never_below_the_current_gate(f: GateFacts, checkpoint: bool) -> None:
    assert settle(f, checkpoint=checkpoint).gate >= f.gate


@given(gate_facts(), st.booleans())
def test_property_only_advance_changes_the_gate_and_only_to_next_gate(f: GateFacts, checkpoint: bool) -> None:
    outcome = settle(f, checkpoint=checkpoint)
    if outcome.move is Move.ADVANCE:
        assert f.next_gate is not None
        assert outcome.gate == f.next_gate
    else:
        assert outcome.gate == f.gate


@given(gate_facts(), st.booleans())
def test_property_stay_exactly_when_the_gate_has_available_items(f: GateFacts, checkpoint: bool) -> None:
    assert (settle(f, checkpoint=checkpoint).move is Move.STAY) == f.available_here


@given(gate_facts(), st.booleans())
def test_property_complete_only_when_sealed_and_nothing_available_anywhere(f: GateFacts, checkpoint: bool) -> None:
    complete = settle(f, checkpoint=checkpoint).move is Move.COMPLETE
    assert complete == (f.sealed and not f.available_here and not f.failed_here and f.next_gate is None)


@given(gate_facts(), st.booleans())
def test_property_fail_only_with_a_failed_item_and_nothing_available_here(f: GateFacts, checkpoint: bool) -> None:
    failed = settle(f, checkpoint=checkpoint).move is Move.FAIL
    assert failed == (f.failed_here and not f.available_here)


@given(gate_facts())
def test_property_checkpoint_only_releases_a_manual_wait(f: GateFacts) -> None:
    plain, forced = settle(f), settle(f, checkpoint=True)
    if plain != forced:
        assert f.manual_checkpoint and f.next_gate is not None
        assert plain == Decision(Move.WAIT, f.gate)
        assert forced == Decision(Move.ADVANCE, f.next_gate)


@given(gate_facts())
def test_property_a_manual_checkpoint_partition_never_advances_by_itself(f: GateFacts) -> None:
    if f.manual_checkpoint:
        assert settle(f).move is not Move.ADVANCE


@given(gate_facts(), st.booleans())
def test_property_settling_after_an_advance_stays(f: GateFacts, checkpoint: bool) -> None:
    outcome = settle(f, checkpoint=checkpoint)
    if outcome.move is Move.ADVANCE:
        # the next gate holds available work by definition of next_gate
        after = GateFacts(outcome.gate, True, False, None, f.sealed, f.manual_checkpoint)
        assert settle(after) == Decision(Move.STAY, outcome.gate)


# ---------------------------------------------------------------- tolerated failures


def tolerating(
    tolerate: str | int,
    failed: int,
    total: int,
    gate: int = 2,
    *,
    available_here: bool = False,
    next_gate: int | None = None,
    sealed: bool = True,
    manual: bool = False,
) -> GateFacts:
    """Facts of a gate with `failed` of `total` items failed and a tolerance (`"5%"`, a count)."""
    return GateFacts(
        gate, available_here, failed > 0, next_gate, sealed, manual, Tolerance.parse(tolerate), failed, total
    )


def test_a_tolerated_failure_lets_a_drained_gate_advance() -> None:
    assert settle(tolerating("5%", 2, 40, next_gate=3)) == Decision(Move.ADVANCE, 3)


def test_a_tolerated_failure_lets_a_drained_sealed_partition_complete() -> None:
    assert settle(tolerating("5%", 2, 40)) == Decision(Move.COMPLETE, 2)


def test_a_tolerated_failure_lets_an_open_partition_wait_for_more() -> None:
    assert settle(tolerating("5%", 2, 40, sealed=False)) == Decision(Move.WAIT, 2)


def test_a_tolerated_failure_still_waits_for_a_manual_checkpoint() -> None:
    facts = tolerating("5%", 2, 40, next_gate=3, manual=True)
    assert settle(facts) == Decision(Move.WAIT, 2)
    assert settle(facts, checkpoint=True) == Decision(Move.ADVANCE, 3)


def test_within_the_tolerance_the_gate_stays_while_items_are_available() -> None:
    assert settle(tolerating("5%", 2, 40, available_here=True, next_gate=3)) == Decision(Move.STAY, 2)


def test_crossing_a_percentage_fails_at_once_even_with_items_available() -> None:
    assert settle(tolerating("5%", 3, 40, available_here=True, next_gate=3)) == Decision(Move.FAIL, 2)


def test_a_count_tolerance_lets_that_many_fail_and_no_more() -> None:
    assert settle(tolerating(3, 3, 10, next_gate=4)) == Decision(Move.ADVANCE, 4)
    assert settle(tolerating(3, 4, 1000, available_here=True)) == Decision(Move.FAIL, 2)


def test_a_tolerance_of_zero_fails_at_the_first_failure_without_waiting_for_the_gate_to_drain() -> None:
    assert settle(tolerating(0, 1, 40, available_here=True)) == Decision(Move.FAIL, 2)
    assert settle(tolerating("0%", 1, 40, available_here=True)) == Decision(Move.FAIL, 2)


def test_a_percentage_of_few_items_rounds_down() -> None:
    assert settle(tolerating("5%", 1, 19)) == Decision(Move.FAIL, 2)  # 5% of 19 is 0.95: none may fail
    assert settle(tolerating("5%", 1, 20)) == Decision(Move.COMPLETE, 2)


def test_without_a_tolerance_a_failure_holds_the_gate_until_it_drains_then_fails_it() -> None:
    held = GateFacts(2, True, True, 3, True, False, None, 39, 40)  # counts are not looked at
    assert settle(held) == Decision(Move.STAY, 2)
    assert settle(GateFacts(2, False, True, 3, True, False, None, 1, 40)) == Decision(Move.FAIL, 2)


def test_counts_matter_only_with_a_tolerance_and_a_failure_when_the_gate_drained_or_an_item_just_failed() -> None:
    five = Tolerance.parse("5%")
    assert not counts_matter(None, False, True, failed_now=True)
    assert not counts_matter(five, False, False, failed_now=True)
    assert not counts_matter(five, True, True, failed_now=False)  # stays either way
    assert counts_matter(five, True, True, failed_now=True)
    assert counts_matter(five, False, True, failed_now=False)


# ---------------------------------------------------------------- tolerated failures: properties

tolerances = st.one_of(
    st.integers(0, 60).map(Tolerance),
    st.floats(0, 100, allow_nan=False).map(lambda p: Tolerance(percent=p)),
)


@st.composite
def tolerated_facts(draw: st.DrawFn) -> GateFacts:
    gate = draw(st.integers(0, 1000))
    next_gate = draw(st.none() | st.integers(gate + 1, gate + 1000))
    total = draw(st.integers(1, 500))
    failed = draw(st.integers(1, total))
    available_here = draw(st.booleans()) and failed < total
    sealed, manual = draw(st.booleans()), draw(st.booleans())
    return GateFacts(gate, available_here, True, next_gate, sealed, manual, draw(tolerances), failed, total)


@given(tolerated_facts(), st.booleans())
def test_property_with_a_tolerance_the_partition_fails_exactly_when_it_is_exceeded(
    f: GateFacts, checkpoint: bool
) -> None:
    assert f.tolerance is not None
    failed = settle(f, checkpoint=checkpoint).move is Move.FAIL
    assert failed == f.tolerance.exceeded(f.failed, f.total)


@given(tolerated_facts(), st.booleans())
def test_property_tolerated_failures_decide_as_if_none_had_failed(f: GateFacts, checkpoint: bool) -> None:
    assert f.tolerance is not None
    if not f.tolerance.exceeded(f.failed, f.total):
        none_failed = GateFacts(f.gate, f.available_here, False, f.next_gate, f.sealed, f.manual_checkpoint)
        assert settle(f, checkpoint=checkpoint) == settle(none_failed, checkpoint=checkpoint)


@given(tolerated_facts(), st.booleans())
def test_property_crossing_fails_at_the_current_gate(f: GateFacts, checkpoint: bool) -> None:
    assert f.tolerance is not None
    if f.tolerance.exceeded(f.failed, f.total):
        assert settle(f, checkpoint=checkpoint) == Decision(Move.FAIL, f.gate)


@given(gate_facts(), st.booleans())
def test_property_no_tolerance_is_the_rule_as_it_always_was(f: GateFacts, checkpoint: bool) -> None:
    """Without a tolerance, the counts change nothing: rule 3 holds exactly as above."""
    counted = GateFacts(f.gate, f.available_here, f.failed_here, f.next_gate, f.sealed, f.manual_checkpoint, None, 7, 9)
    assert settle(counted, checkpoint=checkpoint) == settle(f, checkpoint=checkpoint)
