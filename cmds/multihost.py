#!/usr/bin/env python3
"""Run the multi-host scenarios at full size and print the tables of docs/performance.md (as root, from the
repository root, with the test extra installed):

    sudo .venv/bin/python cmds/multihost.py [--only balance,scale,latency,cutoff,blackhole,resets,capacity]
                                            [--json results.json]

Each scenario starts its own PostgreSQL (the system's server binaries, on port 25432), a bridge and
one network namespace per watcher host, and removes all of it when it ends, also on failure. It
talks only to the addresses it assigns itself (10.231.7.0/24 on its own bridge). About 15 minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.multihost import scenarios
from tests.multihost.harness import available

ALL = ("balance", "scale", "latency", "cutoff", "blackhole", "resets", "capacity")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(ALL), help="comma-separated scenarios (default: all)")
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    args = parser.parse_args()
    if (why := available()) is not None:
        print(f"multihost: {why}", file=sys.stderr)
        return 2
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = set(chosen) - set(ALL)
    if unknown:
        print(f"multihost: unknown scenario(s) {', '.join(sorted(unknown))}: use {', '.join(ALL)}", file=sys.stderr)
        return 2
    results: dict[str, Any] = {}
    for name in chosen:
        started = time.monotonic()
        print(f"== {name}", file=sys.stderr, flush=True)
        results[name] = run(name)
        print(f"   {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    print(report(results))
    return 0


def run(name: str) -> Any:
    if name == "balance":
        return scenarios.balance(hosts=8, partitions=1000, lease=10.0)
    if name == "scale":
        return scenarios.scale(host_counts=(1, 2, 4, 8), concurrency=50, seconds=15.0)
    if name == "latency":
        return scenarios.latency(hosts=4, delay_ms=20.0, jitter_ms=10.0, seconds=15.0)
    if name == "cutoff":
        return scenarios.cut_off(hosts=4, lease=10.0)
    if name == "capacity":
        return scenarios.capacity(("flat", "fan", "http"), watchers=2, items=2000)
    return scenarios.database_outage(name, hosts=4, seconds=30.0)


def report(results: dict[str, Any]) -> str:
    """The results as Markdown tables (what docs/performance.md's "Many hosts" section shows)."""
    out: list[str] = []
    if "balance" in results:
        b = results["balance"]
        out += [
            f"Balance: {b['partitions']} busy partitions, {b['hosts']} hosts, lease {b['lease_seconds']:g} s",
            "",
            "| phase | balanced (±1 of the share) after | leases per host | hand-overs | minimum needed |",
            "| --- | ---: | --- | ---: | ---: |",
        ]
        for phase in ("start", "join", "leave"):
            p = b[phase]
            minimum = p.get("minimum", p.get("surplus_when_all_leased"))
            held = " ".join(str(v) for v in p["held"].values())
            after = f"{p['seconds']} s" if p["balanced"] else f"not within {p['seconds']} s"
            handovers = p["handovers"]
            if phase == "start" and p.get("handovers_after_all_leased") is not None:
                handovers = f"{handovers} ({p['handovers_after_all_leased']} once all were leased)"
            out.append(f"| {phase} | {after} | {held} | {handovers} | {minimum} |")
        out += ["", f"Deliveries lost to rebalancing: {b['lost_deliveries']}; leases taken over: {b['takeovers']}.", ""]
    if "scale" in results:
        out += [
            "| hosts | ideal items/s | items/s | of ideal | machine busy | database CPU (cores)"
            " | database CPU ms / item | transactions / item |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in results["scale"]:
            out.append(
                f"| {r['hosts']} | {r['ideal_items_per_s']:,.0f} | {r['items_per_s']:,.0f} | {r['of_ideal']:.0%}"
                f" | {r['machine_busy']:.0%}"
                f" | {r['db_cpu_cores']} | {r['db_cpu_ms_per_item']} | {r['db_transactions_per_item']} |"
            )
        out.append("")
    if "latency" in results:
        r = results["latency"]
        g = r["gate_advance_ms"]
        out += [
            f"Latency {r['latency']} on every host ({r['hosts']} hosts): {r['items_per_s']:,.0f} items/s; gate"
            f" advance p50 {g['p50']} ms, p99 {g['p99']} ms ({g['n']} advances); items {r['items']}.",
            "",
        ]
    if "cutoff" in results:
        r = results["cutoff"]
        out += [
            f"One of {r['hosts']} hosts cut off for two lease periods ({2 * r['lease_seconds']:g} s): its"
            f" {r['cut_host_leases']} leases taken over after {r['taken_over_after_s']} s; its late answers:"
            f" {r['fenced_answers']['database']} refused by the fence in the database,"
            f" {r['fenced_answers']['watcher']} given up by the host itself;"
            f" rebalanced {r['rejoined']['seconds']} s after it came back"
            f" ({' '.join(str(v) for v in r['rejoined']['held'].values())}); {r['extra_deliveries']} deliveries"
            f" beyond one per item, with {r['cut_host_in_flight']} items in flight on the cut host;"
            f" items {r['items']}.",
            "",
        ]
    if "capacity" in results:
        out += [
            "| workload | items | drain items/s | database CPU ms / item | server transactions / item"
            " | statements / item (watchers) |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r in results["capacity"]:
            out.append(
                f"| {r['workload']} | {r['items']:,} | {r['drain_items_per_s']:,.0f} | {r['db_cpu_ms_per_item']}"
                f" | {r['server_transactions_per_item']} | {r['statements_per_item']} |"
            )
        out.append("")
    for fault in ("blackhole", "resets"):
        if fault in results:
            r = results[fault]
            out += [
                f"Database {fault} for {r['seconds']:g} s ({r['hosts']} hosts): resumed {r['resumed_after_s']} s after;"
                f" all complete: {r['all_complete']}; hosts alive: {r['hosts_alive']}; {r['extra_deliveries']}"
                f" deliveries beyond one per item; items {r['items']}.",
                "",
            ]
    return "\n".join(out)


if __name__ == "__main__":
    raise SystemExit(main())
