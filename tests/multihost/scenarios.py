"""The multi-host scenarios (balance and churn, scale, network faults), each returning what it
measured and the invariants it checked. `tests/multihost/test_multihost.py` runs them small in CI;
`cmds/multihost.py` runs them at full size and prints the tables of docs/performance.md."""

from __future__ import annotations

import math
import time
from typing import Any

from sqlalchemy import text

from .harness import Cluster, cluster, wait_for

# ---------------------------------------------------------------- helpers


def seed(c: Cluster, partitions: int, items: int, *, gates: int = 1, key: str = "p") -> int:
    """Add `partitions` partitions of `items` items at each of `gates` gates; how many items."""
    with c.feed() as feed:
        for n in range(partitions):
            feed.add_partition(f"{key}{n}", [(g, b"{}") for g in range(gates) for _ in range(items)])
    return partitions * items * gates


def balanced(held: dict[int, int], total: int) -> bool:
    """Every live host within ±1 of the fair share (total / hosts), and every partition leased."""
    if not held or sum(held.values()) != total:
        return False
    fair = total / len(held)
    return all(math.floor(fair) - 1 <= n <= math.ceil(fair) + 1 for n in held.values())


def surplus(held: dict[int, int], total: int) -> int:
    """Hand-overs needed at least to balance `held`: what the hosts above the share hold beyond it."""
    share = math.ceil(total / max(len(held), 1))
    return sum(max(0, n - share) for n in held.values())


def completed(c: Cluster) -> int:
    """Items completed so far."""
    return int(c.scalar("SELECT count(*) FROM feedproc_items WHERE status = 'complete'"))


def all_complete(c: Cluster) -> bool:
    """Every partition complete."""
    return int(c.scalar("SELECT count(*) FROM feedproc_partitions WHERE status <> 'complete'")) == 0


def with_work(c: Cluster) -> int:
    """Partitions with work now (what the watchers share)."""
    return int(c.scalar("SELECT count(*) FROM feedproc_partitions WHERE status = 'available' AND ready_at IS NOT NULL"))


def settle(c: Cluster, total: int | None, deadline: float) -> dict[str, Any]:
    """Wait (up to `deadline` seconds) for the leases to be balanced over `total` partitions (None:
    those with work at each look, for a run whose partitions finish meanwhile); what it took."""
    before = c.handovers()
    first_full: dict[int, int] | None = None
    at_first_full = before  # hand-overs so far when every partition was first seen leased

    def check() -> dict[int, int] | None:
        nonlocal first_full, at_first_full
        shared = total if total is not None else with_work(c)
        count = c.handovers()
        held = c.leases_by_host()
        if first_full is None and sum(held.values()) == shared:
            first_full, at_first_full = held, count
        return held if balanced(held, shared) else None

    held, seconds = wait_for(check, deadline, every=0.5)
    final = held or c.leases_by_host()
    return {
        "balanced": bool(held),
        "seconds": round(seconds, 1),
        "held": dict(sorted(final.items())),
        "handovers": c.handovers() - before,
        # Measured against the surplus of the same moment: hand-overs made before it had already
        # reduced that surplus.
        "handovers_after_all_leased": c.handovers() - at_first_full if first_full else None,
        "surplus_when_all_leased": surplus(first_full, sum(first_full.values())) if first_full else None,
    }


def drain_rate(c: Cluster, seconds: float, warmup: float) -> dict[str, float]:
    """Items completed per second over `seconds` after `warmup`, with the database's CPU and
    transactions per item over the same window."""
    time.sleep(warmup)
    xacts = "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = 'feedproc'"
    done0, cpu0, tx0, t0, busy0 = completed(c), c.pg.cpu_seconds(), c.scalar(xacts), time.monotonic(), _cpu()
    time.sleep(seconds)
    done1, cpu1, tx1, t1, busy1 = completed(c), c.pg.cpu_seconds(), c.scalar(xacts), time.monotonic(), _cpu()
    items = max(done1 - done0, 1)
    return {
        "machine_busy": round((busy1[0] - busy0[0]) / max(busy1[1] - busy0[1], 1), 2),
        "items_per_s": round(items / (t1 - t0), 1),
        "db_cpu_ms_per_item": round(1000 * (cpu1 - cpu0) / items, 3),
        "db_cpu_cores": round((cpu1 - cpu0) / (t1 - t0), 2),
        "db_transactions_per_item": round((tx1 - tx0) / items, 3),
    }


def _cpu() -> tuple[int, int]:
    """The machine's (busy, total) CPU ticks so far, all cores (/proc/stat)."""
    with open("/proc/stat") as stat:
        ticks = [int(v) for v in stat.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle, iowait
    return sum(ticks) - idle, sum(ticks)


def once_each(c: Cluster) -> dict[str, int]:
    """Invariants over every item, from the database and the processors' own record of each call:
    how many items and in which state; `called_after_complete`: calls that started after their
    item had completed (a completion delivered again; must be 0); `early_gate`: calls at a gate
    that started before every item of the gate below in its partition had finished (the barrier;
    must be 0)."""

    calls = c.calls()
    with c.engine.connect() as conn:
        rows = conn.execute(text("SELECT id, partition_id, gate, status, updated_at FROM feedproc_items")).all()
    finished = {r.id: r.updated_at.timestamp() for r in rows if r.status == "complete"}
    where = {r.id: (r.partition_id, r.gate) for r in rows}
    drained: dict[tuple[int, int], float] = {}  # (partition, gate) -> when its last item finished
    for r in rows:
        key = (r.partition_id, r.gate)
        drained[key] = max(drained.get(key, 0.0), r.updated_at.timestamp())
    after = sum(1 for item, _, t in calls if item in finished and t > finished[item])
    early = sum(
        1
        for item, gate, t in calls
        if gate > 0 and (below := drained.get((where[item][0], gate - 1))) is not None and t < below
    )
    row = c.scalar(
        "SELECT json_build_object("
        "'items', count(*), 'complete', count(*) FILTER (WHERE status = 'complete'),"
        "'available', count(*) FILTER (WHERE status = 'available'),"
        "'failed', count(*) FILTER (WHERE status = 'failed'),"
        "'lost', coalesce(sum(lost), 0)) FROM feedproc_items"
    )
    counts = {k: int(v) for k, v in row.items()}
    return {**counts, "calls": len(calls), "called_after_complete": after, "early_gate": early}


# ---------------------------------------------------------------- balance and churn


def balance(hosts: int = 8, partitions: int = 1000, lease: float = 10.0) -> dict[str, Any]:
    """`partitions` busy partitions over `hosts` hosts: balanced within two lease periods of the
    start, of a host joining and of a host leaving cleanly (SIGTERM); hand-overs counted; no
    delivery lost to a hand-over."""
    with cluster(hosts + 1, lease_seconds=lease, processor="tests.multihost.processors:Linger") as c:
        seed(c, partitions, 1)
        for n in range(1, hosts + 1):
            c.start_host(n)
        result: dict[str, Any] = {"hosts": hosts, "partitions": partitions, "lease_seconds": lease}
        result["start"] = settle(c, partitions, 2 * lease)
        c.start_host(hosts + 1)
        result["join"] = settle(c, partitions, 2 * lease)
        result["join"]["minimum"] = partitions // (hosts + 1)  # the newcomer's share, all from others
        c.stop_host(1)
        result["leave"] = settle(c, partitions, 2 * lease)
        result["leave"]["minimum"] = 0  # the leaver's partitions are free: no hand-over is needed
        result["lost_deliveries"] = c.lost_deliveries()
        result["takeovers"] = c.takeovers()
        return result


# ---------------------------------------------------------------- scale


def scale(
    host_counts: tuple[int, ...] = (1, 2, 4, 8), concurrency: int = 50, seconds: float = 15.0
) -> list[dict[str, Any]]:
    """An I/O-bound processor (20 ms a call) on 1, 2, 4, 8 hosts: throughput against the ideal
    hosts x concurrency / 20 ms, with the database's CPU and transactions per item."""
    rows = []
    for hosts in host_counts:
        ideal = hosts * concurrency / 0.020
        with cluster(hosts, concurrency=concurrency) as c:
            # Enough work for the window at the ideal rate, in as many partitions as the hosts lease.
            per_partition = 500
            count = max(4 * hosts, math.ceil(ideal * (seconds + 10) / per_partition))
            seed(c, count, per_partition)
            for n in range(1, hosts + 1):
                c.start_host(n)
            measured = drain_rate(c, seconds, warmup=5.0)
            rows.append(
                {
                    "hosts": hosts,
                    "ideal_items_per_s": ideal,
                    **measured,
                    "of_ideal": round(measured["items_per_s"] / ideal, 3),
                }
            )
    return rows


# ---------------------------------------------------------------- network faults


def latency(hosts: int = 4, delay_ms: float = 20.0, jitter_ms: float = 10.0, seconds: float = 15.0) -> dict[str, Any]:
    """Every host 40 ± 20 ms (round trip) from the database: throughput, and how long a gate takes to
    open after its last item completed."""
    with cluster(hosts) as c:
        c.proxy.set_latency(delay_ms, jitter_ms)
        seed(c, 8 * hosts, 300, gates=2)
        for n in range(1, hosts + 1):
            c.start_host(n)
        rate = drain_rate(c, seconds, warmup=5.0)
        wait_for(lambda: all_complete(c), 300)
        advance = c.scalar(
            "SELECT json_build_object('p50', percentile_cont(0.5) WITHIN GROUP (ORDER BY ms),"
            " 'p99', percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), 'n', count(*)) FROM ("
            " SELECT 1000 * EXTRACT(EPOCH FROM min(i1.started_at) - max(i0.updated_at)) AS ms"
            " FROM feedproc_items AS i0 JOIN feedproc_items AS i1 ON i1.partition_id = i0.partition_id"
            " WHERE i0.gate = 0 AND i1.gate = 1 GROUP BY i0.partition_id) AS g"
        )
        return {
            "hosts": hosts,
            "latency": f"{2 * delay_ms:g} ± {2 * jitter_ms:g} ms",
            **rate,
            "gate_advance_ms": {k: round(float(v), 1) for k, v in advance.items()},
            "items": once_each(c),
        }


def cut_off(hosts: int = 4, lease: float = 10.0) -> dict[str, Any]:
    """One host's link down for two lease periods mid-run, then back: its partitions taken over
    after expiry, its late answers refused by the fence, its fair share back after it rejoins, and
    no item delivered more than once more than the items it had in flight when cut."""
    with cluster(hosts, lease_seconds=lease, processor="tests.multihost.processors:Slow") as c:
        # Work for the whole scenario (two lease periods cut off, the rejoin, a margin) at the rate
        # the hosts reach with the Slow processor (half a second a call, 50 at a time each).
        partitions = 10 * hosts
        rate = hosts * 50 / 0.5
        items = seed(c, partitions, math.ceil(rate * (7 * lease + 10) / partitions))
        for n in range(1, hosts + 1):
            c.start_host(n)
        settle(c, None, 2 * lease)
        owners = c.watcher_of()
        victim = next(w for w, n in owners.items() if n == 1)
        in_flight = c.in_flight_of(victim)
        mine = c.partitions_of(victim)
        held = len(mine)
        c.network.cut(1)
        cut_at = time.monotonic()
        # Every partition of the cut host taken over by the others after its leases expired.
        _, took = wait_for(lambda: c.still_held_by(victim, mine) == 0, 3 * lease)
        time.sleep(max(0.0, 2 * lease - (time.monotonic() - cut_at)))
        c.network.heal(1)
        rejoined = settle(c, None, 3 * lease)
        wait_for(lambda: all_complete(c), 600)
        final = once_each(c)
        fenced = {by: int(c.metric(1, "feedproc_answers_fenced_total", by=by)) for by in ("database", "watcher")}
        deliveries = int(c.scalar("SELECT coalesce(sum(deliveries), 0) FROM feedproc_items"))
        return {
            "hosts": hosts,
            "lease_seconds": lease,
            "cut_host_leases": held,
            "cut_host_in_flight": in_flight,
            "taken_over": held - c.still_held_by(victim, mine),
            "taken_over_after_s": round(took, 1),
            "fenced_answers": fenced,
            "rejoined": rejoined,
            "items": final,
            "extra_deliveries": deliveries - items,
        }


def database_outage(kind: str, hosts: int = 4, seconds: float = 30.0) -> dict[str, Any]:
    """The database unreachable for everyone (`blackhole`) or every connection reset again and
    again (`resets`) for `seconds`, mid-run: nothing lost, nothing completed twice, everyone resumes."""
    with cluster(hosts, lease_seconds=10.0) as c:
        items = seed(c, 8 * hosts, 400)
        for n in range(1, hosts + 1):
            c.start_host(n)
        wait_for(lambda: completed(c) > items // 10, 120)
        before = completed(c)
        if kind == "blackhole":
            c.proxy.blackhole(True)
            time.sleep(seconds)
            c.proxy.blackhole(False)
        else:
            c.proxy.reset_storm(seconds, every_s=1.0)
            time.sleep(seconds)
        resumed, took = wait_for(lambda: completed(c) > before + 100, 120)
        done, _ = wait_for(lambda: all_complete(c), 600)
        alive = [n for n, h in c.members.items() if h.alive()]
        deliveries = int(c.scalar("SELECT coalesce(sum(deliveries), 0) FROM feedproc_items"))
        # A host that exited says why in its log's last lines (its workdir goes with the cluster).
        dead = {
            n: h.log.read_text(errors="replace").splitlines()[-15:] if h.log is not None and h.log.exists() else []
            for n, h in c.members.items()
            if not h.alive()
        }
        return {
            "fault": kind,
            "seconds": seconds,
            "hosts": hosts,
            "resumed_after_s": round(took, 1) if resumed else None,
            "all_complete": bool(done),
            "hosts_alive": len(alive),
            "items": once_each(c),
            "extra_deliveries": deliveries - items,
            "resets": getattr(c.proxy, "resets", None),
            **({"dead_hosts": dead} if dead else {}),
        }


# ---------------------------------------------------------------- capacity


def capacity(
    workloads: tuple[str, ...] = ("flat", "fan", "http"), watchers: int = 2, items: int = 2000
) -> list[dict[str, Any]]:
    """What one item costs the database: `feedproc bench` against a PostgreSQL of the harness's own,
    its CPU (all its processes) read around each run. The figures cover the whole life of an item:
    added by a producer, leased, fetched, delivered, answered; and each run's throughput."""
    import json
    import subprocess
    import sys

    from .harness import ROOT, Postgres

    rows = []
    pg = Postgres()
    try:
        pg.start()
        for workload in workloads:
            out = pg.dir / f"bench-{workload}.json"  # removed with the server's directory
            cpu0 = pg.cpu_seconds()
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "feedproc",
                    "bench",
                    "--db",
                    pg.url("postgres", host="127.0.0.1"),
                    "--workload",
                    workload,
                    "--watchers",
                    str(watchers),
                    "--partitions",
                    "20",
                    "--items",
                    str(items),
                    "--latency-seconds",
                    "0",
                    "--json",
                    str(out),
                ],
                check=True,
                capture_output=True,
                cwd=ROOT,
                timeout=900,
            )
            cpu = pg.cpu_seconds() - cpu0
            run = json.loads(out.read_text())["runs"][0]
            drained = run["items"] if isinstance(run.get("items"), int) else 20 * items
            rows.append(
                {
                    "workload": workload,
                    "items": drained,
                    "drain_items_per_s": run["drain"]["rate"],
                    "db_cpu_ms_per_item": round(1000 * cpu / drained, 3),
                    "server_transactions_per_item": run["drain"]["server"]["transactions_per_item"],
                    "statements_per_item": run["drain"]["statements_per_item"],
                }
            )
    finally:
        pg.stop()
    return rows
