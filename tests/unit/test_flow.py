"""Flow control's arithmetic (issue 34), no database: rates as people write them, token buckets'
refill and burst, one fetch's room per group and bucket, and the AIMD of adaptive concurrency."""

from __future__ import annotations

import pytest

from feedproc.core.errors import InvalidInput
from feedproc.core.flow import (
    BACKOFF,
    FlowRules,
    GateReport,
    Room,
    adapted,
    burst,
    format_rate,
    gate_bucket,
    group_bucket,
    parse_rate,
    parse_rate_setting,
    queue_bucket,
    refill,
    shared_bucket,
)


@pytest.mark.parametrize(
    ("written", "per_second"),
    [("600/min", 10.0), ("10/s", 10.0), ("5 per second", 5.0), ("90/hour", 0.025), ("2/day", 2 / 86400), (3, 3.0)],
)
def test_a_rate_is_read_as_people_write_it(written: object, per_second: float) -> None:
    assert parse_rate(written) == pytest.approx(per_second)


@pytest.mark.parametrize("bad", ["fast", "10/fortnight", "-1/s", "0/s", "1/week", "", True, None, float("inf")])
def test_a_malformed_rate_is_refused_naming_it(bad: object) -> None:
    with pytest.raises(InvalidInput, match="rate"):
        parse_rate(bad)


def test_a_name_is_a_shared_rate_and_anything_else_a_rate() -> None:
    assert parse_rate_setting("ocr-api") == "ocr-api"
    assert parse_rate_setting("600/min") == 10.0
    with pytest.raises(InvalidInput):
        parse_rate_setting("6 per fortnight")


@pytest.mark.parametrize(
    ("per_second", "shown"), [(10.0, "10/s"), (0.5, "30/min"), (1 / 3600, "1/hour"), (0.3, "18/min")]
)
def test_a_rate_is_shown_in_the_largest_whole_unit(per_second: float, shown: str) -> None:
    assert format_rate(per_second) == shown


def test_a_bucket_holds_a_seconds_worth_at_least_one_and_refills_up_to_it() -> None:
    assert burst(20.0) == 20.0 and burst(0.1) == 1.0
    assert refill(0.0, 0.5, 20.0) == 10.0
    assert refill(15.0, 10.0, 20.0) == 20.0  # capped
    assert refill(3.0, -1.0, 20.0) == 3.0  # a clock that stepped back adds nothing


def room(
    rules: FlowRules, used: dict[tuple[str, int], int] | None = None, tokens: dict[str, int] | None = None
) -> Room:
    return Room("q", rules, dict(used or {}), dict(tokens or {}))


def test_a_group_takes_up_to_its_limit_and_other_groups_go_on() -> None:
    taking = room(FlowRules(group_limit=2), used={("acme", 0): 1})
    assert [taking.take(0, "acme", 1) for _ in range(3)] == [True, False, False]
    assert taking.take(0, "globex", 1) and taking.take(0, None, 1)
    assert taking.group_full("acme") and not taking.group_full("globex")


def test_a_heavy_item_counts_as_the_group_limit_and_runs_alone() -> None:
    taking = room(FlowRules(group_limit=3))
    assert taking.take(0, "acme", 10)
    assert not taking.take(0, "acme", 1)


def test_a_gates_group_limit_counts_that_gate_only() -> None:
    taking = room(FlowRules(gate_group_limits={1: 1}), used={("acme", 0): 5})
    assert taking.take(1, "acme", 1) and not taking.take(1, "acme", 1)
    assert taking.take(0, "acme", 1)


def test_each_item_takes_a_token_of_every_bucket_that_applies() -> None:
    rules = FlowRules(rate=5.0, gate_rates={1: 1.0}, group_rate=1.0)
    names = {queue_bucket("q"): 3, gate_bucket("q", 1): 1, group_bucket("q", "acme"): 2}
    taking = room(rules, tokens=names)
    assert taking.take(1, "acme", 1)
    assert not taking.take(1, "globex", 1)  # the gate's bucket is dry
    assert taking.gate_dry(1) and not taking.queue_dry
    assert taking.take(0, "acme", 1) and not taking.take(0, "acme", 1)  # acme's own bucket is dry now
    assert taking.spent == {queue_bucket("q"): 2, gate_bucket("q", 1): 1, group_bucket("q", "acme"): 2}


def test_a_queue_and_its_gate_naming_one_shared_rate_take_one_token() -> None:
    rules = FlowRules(rate="api", gate_rates={0: "api"})
    taking = room(rules, tokens={shared_bucket("api"): 1})
    assert taking.take(0, None, 1)
    assert taking.spent == {shared_bucket("api"): 1}


def test_the_wait_for_a_token_is_that_of_the_first_dry_bucket_to_refill() -> None:
    taking = Room(
        "q", FlowRules(rate=4.0), {}, {queue_bucket("q"): 0}, {queue_bucket("q"): 4.0}, {queue_bucket("q"): 0.5}
    )
    assert taking.next_token_in() == pytest.approx(0.125)
    assert room(FlowRules()).next_token_in() is None


def test_a_first_push_back_opens_a_window_below_what_the_fleet_runs() -> None:
    assert adapted(None, GateReport(pushbacks=3, in_flight=16), fleet=48, ceiling=48, since_cut=None) == 48 * BACKOFF
    assert adapted(None, GateReport(pushbacks=1), fleet=500, ceiling=48, since_cut=None) == 48 * BACKOFF  # at most all


def test_a_push_back_under_the_current_window_cuts_it_once() -> None:
    report = GateReport(pushbacks=5, under=20.0)
    assert adapted(20.0, report, fleet=0, ceiling=48, since_cut=1.0) == 20.0 * BACKOFF
    assert adapted(20.0, report, fleet=0, ceiling=48, since_cut=0.01) == 20.0  # cut just now


def test_a_push_back_seen_under_an_older_window_does_not_cut_again() -> None:
    assert adapted(15.0, GateReport(pushbacks=9, under=20.0), fleet=0, ceiling=48, since_cut=1.0) == 15.0
    assert adapted(15.0, GateReport(pushbacks=9, under=None), fleet=0, ceiling=48, since_cut=1.0) == 15.0


def test_a_window_is_never_below_one() -> None:
    assert adapted(1.0, GateReport(pushbacks=1, under=1.0), fleet=0, ceiling=48, since_cut=9.0) == 1.0


def test_successes_grow_a_window_by_one_per_windows_worth_and_past_the_ceiling_it_goes() -> None:
    assert adapted(10.0, GateReport(successes=10), fleet=0, ceiling=48, since_cut=None) == 11.0
    assert adapted(47.5, GateReport(successes=48), fleet=0, ceiling=48, since_cut=None) is None
    assert adapted(None, GateReport(successes=100), fleet=0, ceiling=48, since_cut=None) is None
