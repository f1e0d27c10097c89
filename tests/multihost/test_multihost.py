"""Watchers on separate network hosts against one PostgreSQL (docs/performance.md, "Many hosts"): the short
version of `cmds/multihost.py`, run alone in CI (`pytest -m multihost -n 0`) because it measures
throughput and runs its own PostgreSQL and namespaces.

Each host is a Linux network namespace on a link of its own; the database is reached through a
fault proxy. Sizes are small here (3-4 hosts, a lease of 4 s); the figures of docs/performance.md come from the
full run.
"""

from __future__ import annotations

import os

import pytest

from . import scenarios
from .harness import available

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(600)]

if (why := available()) is not None:
    if os.environ.get("FEEDPROC_REQUIRE_MULTIHOST", "") not in ("", "0"):
        pytest.fail(why, pytrace=False)
    pytest.skip(why, allow_module_level=True)

LEASE = 4.0
# Hand-overs beyond the minimum a phase needs: a host that asked for partitions at the same moment
# as another may be handed a few more than the share and give them on (stated in docs/how-it-works.md).
SLACK = 0.1


def test_leases_balance_at_the_start_on_a_join_and_on_a_leave_without_redelivery() -> None:
    # A longer lease than the other tests: balancing is bounded in lease periods, and steals go at
    # most 16 partitions a second per watcher, so a 4 s lease left little room on a busy machine
    # (6.6 s of 8 seen once in CI).
    lease = 6.0
    result = scenarios.balance(hosts=4, partitions=200, lease=lease)
    for phase in ("start", "join", "leave"):
        assert result[phase]["balanced"], (phase, result[phase])
        assert result[phase]["seconds"] <= 2 * lease, (phase, result[phase])
    start, join, leave = result["start"], result["join"], result["leave"]
    assert start["handovers_after_all_leased"] <= start["surplus_when_all_leased"] * (1 + SLACK) + 2, start
    assert join["handovers"] <= join["minimum"] * (1 + SLACK) + 2, join
    assert leave["handovers"] == 0, leave  # the leaver's partitions are spread by leasing, not handed on
    assert result["lost_deliveries"] == 0 and result["takeovers"] == 0, result


def test_throughput_grows_with_hosts_near_the_ideal_until_the_machine_saturates() -> None:
    one, two = scenarios.scale(host_counts=(1, 2), seconds=6.0)
    # 85% of the ideal for one host: a slower CI machine read 88.2% twice in one run (beside the
    # conformance suite, then alone), where this one reads 90-93%.
    assert one["of_ideal"] >= 0.85, one
    # Two hosts on this 2-core machine already share it with the database: 75% is asked here, the
    # full run's table says where it stops and why. (Four runs of 8b4efad and of its successor on
    # 2026-11-25 read 79-86% for two hosts, 1.69-1.83 times one host's rate.)
    assert two["of_ideal"] >= 0.75, two
    assert two["items_per_s"] > 1.5 * one["items_per_s"], (one, two)


def test_a_host_cut_off_is_taken_over_fenced_and_rejoins_with_its_share() -> None:
    result = scenarios.cut_off(hosts=3, lease=LEASE)
    assert result["taken_over"] >= result["cut_host_leases"] > 0, result
    assert result["rejoined"]["balanced"], result
    assert result["items"]["complete"] == result["items"]["items"], result  # nothing lost
    assert result["items"]["failed"] == 0, result
    assert result["items"]["called_after_complete"] == 0, result  # nothing completed twice
    assert result["fenced_answers"]["database"] + result["fenced_answers"]["watcher"] > 0, result
    # Redelivered at most what the cut host had in flight (each of those at most once more).
    assert 0 <= result["extra_deliveries"] <= result["cut_host_in_flight"], result


@pytest.mark.parametrize("fault", ["blackhole", "resets"])
def test_a_database_outage_for_everyone_loses_nothing_and_every_host_resumes(fault: str) -> None:
    result = scenarios.database_outage(fault, hosts=3, seconds=8.0)
    assert result["resumed_after_s"] is not None, result
    assert result["all_complete"], result
    assert result["hosts_alive"] == 3, result.get("dead_hosts")  # (once, a host exited during resets)
    assert result["items"]["complete"] == result["items"]["items"] and result["items"]["failed"] == 0, result
    assert result["items"]["called_after_complete"] == 0, result


def test_with_latency_to_the_database_gates_still_open_only_once_drained() -> None:
    result = scenarios.latency(hosts=2, delay_ms=20.0, jitter_ms=10.0, seconds=5.0)
    items = result["items"]
    assert items["complete"] == items["items"] and items["failed"] == 0, result
    assert items["early_gate"] == 0 and items["called_after_complete"] == 0, result
    assert result["gate_advance_ms"]["n"] > 0, result
