"""The benchmark's report: a line per run on standard error as it goes, and the Markdown tables."""

from __future__ import annotations

from typing import Any

from .options import COLLECT_WORKLOADS, PULL_CLAIM, PULL_WORKLOADS


def summary(result: dict[str, Any]) -> str:
    drain = result.get("drain") or {}
    name = result["system"] if result["system"] == "feedproc" else f"{result['system']} {result.get('settings')}"
    text = f"{name} {result['db']} {result['workload']} x{result['watchers']}: {result.get('items', 0)} items"
    if result["workload"] in COLLECT_WORKLOADS:
        fan_in = result.get("fan_in") or {}
        text = f"{name} {result['db']} {result['workload']} N={result['size']:,}"
        if fan_in:
            text += (
                f": barrier → fan-in call {fan_in['barrier_to_call_ms']:,.0f} ms, iterated in "
                f"{fan_in['iterate_seconds']:.2f}s, peak RSS {_peak(result.get('peak_rss_mb'))} MB"
            )
    if drain.get("rate"):
        text += f", drain {drain['rate']:,.0f}/s"
    if result.get("problems"):
        text += "  PROBLEM: " + "; ".join(result["problems"])
    return text


def _num(value: Any, digits: int = 0) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}"


def _pair(stats: dict[str, Any] | None) -> str:
    if not stats or stats.get("p50") is None:
        return "—"
    return f"{stats['p50']:.1f} / {stats['p99']:.1f}"


def _peak(values: list[float] | None) -> str:
    return f"{max(values):.0f}" if values else "—"


def to_markdown(report: dict[str, Any]) -> str:
    meta = report["meta"]
    settings = meta["settings"]
    load = meta["host"].get("load_average_at_start")
    collect = [run for run in report["runs"] if run["workload"] in COLLECT_WORKLOADS]
    shape = (
        f"{settings['partitions']} partitions x {settings['items_per_partition']} items; latencies at half the "
        f"drain rate for {settings['latency_seconds']:g}s."
        if len(collect) < len(report["runs"])
        else "the collect workloads' own shape (below)."
    )
    lines = [
        f"### feedproc bench, {meta['started_at']}",
        "",
        f"`{meta['command']}`: {meta['host']['cpus']} CPUs, load average {load[0] if load else '?'} at start, "
        f"Python {meta['host']['python']}, {', '.join(meta['databases'])}; "
        f"watchers `feedproc watch {settings['watch']}`, {shape}",
        "",
        "| db | workload | watchers | items | enqueue items/s | drain items/s | ½ load items/s: offered of target "
        "| dispatch p50 / p99 ms (½ load) | gate advance p50 / p99 ms (drain) | gate advance p50 / p99 ms (½ load) "
        "| peak RSS MB | statements / item | transactions / item | server transactions / item | once |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    if len(collect) == len(report["runs"]):
        lines = lines[:-3]  # collect only: its own table below
    for run in report["runs"]:
        if run["workload"] in COLLECT_WORKLOADS:
            continue
        drain = run.get("drain") or {}
        paced = run.get("paced") or {}
        lines.append(
            "| "
            + " | ".join(
                [
                    run["db"],
                    run["workload"] + (f" (+{run['finished_rows']:,} finished)" if run.get("finished_rows") else ""),
                    str(run["watchers"]),
                    _num(run.get("items")),
                    _num((run.get("enqueue") or {}).get("rate")),
                    _num(drain.get("rate")),
                    f"{_num(paced.get('offered_rate'))} of {_num(paced.get('target_rate'))}" if paced else "—",
                    _pair(paced.get("dispatch_latency_ms")),
                    _pair(drain.get("gate_advance_ms")),
                    _pair(paced.get("gate_advance_ms")),
                    _peak(drain.get("peak_rss_mb")),
                    _num(drain.get("statements_per_item"), 2),
                    _num(drain.get("transactions_per_item"), 3),
                    _num((drain.get("server") or {}).get("transactions_per_item"), 3),
                    _once(run),
                ]
            )
            + " |"
        )
    if report["peers"]:
        lines += [
            "",
            "Flat no-op drain on the same PostgreSQL, same number of processes ("
            "drain = first dispatch to last completion, from each system's own tables):",
            "",
            "| system | settings | processes | jobs | enqueue jobs/s | drain jobs/s | feedproc ÷ system "
            "| peak RSS MB | server transactions / job | once |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        ours = {
            r["watchers"]: r
            for r in report["runs"]
            if r["db"] == "postgresql" and r["workload"] == "flat" and (r.get("drain") or {}).get("rate")
        }
        for watchers in sorted({p["watchers"] for p in report["peers"]}):
            rows = [ours[watchers]] if watchers in ours else []
            rows += [p for p in report["peers"] if p["watchers"] == watchers]
            mine = ours.get(watchers, {}).get("drain", {}).get("rate")
            for row in rows:
                drain = row.get("drain") or {}
                ratio = mine / drain["rate"] if mine and drain.get("rate") else None
                lines.append(
                    "| "
                    + " | ".join(
                        [
                            row["system"],
                            _settings_text(row),
                            str(row["watchers"]),
                            _num(row.get("items")),
                            _num((row.get("enqueue") or {}).get("rate")),
                            _num(drain.get("rate")),
                            "—" if ratio is None else f"{ratio:.2f}x",
                            _peak(drain.get("peak_rss_mb")),
                            _num((drain.get("server") or {}).get("transactions_per_item"), 3),
                            _once(row),
                        ]
                    )
                    + " |"
                )
    lines += _accumulate_lines(report["runs"])
    ceilings = [r for r in report["runs"] if r.get("ceiling") and (r.get("drain") or {}).get("rate")]
    if ceilings:
        lines += [
            "",
            "HTTP client ceiling: the same client (aiohttp) in a bare loop, one process, same handler, body and "
            "concurrency per process; feedproc ÷ ceiling is how much of the client's speed feedproc keeps:",
            "",
            "| db | workload | watchers | feedproc drain items/s | client ceiling requests/s | feedproc ÷ ceiling |",
            "| --- | --- | ---: | ---: | ---: | ---: |",
        ]
        for run in ceilings:
            rate, ceiling = run["drain"]["rate"], run["ceiling"]["rate"]
            lines.append(
                f"| {run['db']} | {run['workload']} | {run['watchers']} | {_num(rate)} | {_num(ceiling)} "
                f"| {rate / ceiling:.0%} |"
            )
    if any(r["workload"] in PULL_WORKLOADS for r in report["runs"]):
        lines += [
            "",
            f"pull: the same items in a pull-mode queue, drained by `watchers` x `feedproc work --concurrency "
            f"{PULL_CLAIM}` processes (the no-op processor; claims of up to {PULL_CLAIM} items, answers sent many "
            "per request) through one `feedproc serve`; its drain starts at the first claim.",
        ]
    if collect:
        lines += ["", *collect_table(collect)]
    if len(collect) < len(report["runs"]) or report["peers"]:
        lines += ["", *LEGEND]
    problems = [
        f"- {r['system']} {r['db']} {r['workload']} x{r['watchers']}: {p}"
        for r in report["runs"] + report["peers"]
        for p in r.get("problems", [])
    ]
    if problems:
        lines += ["", "Problems:", *problems]
    return "\n".join(lines) + "\n"


LEGEND = [
    "How each figure is measured (clocks: the database's and the processes' are the same host's):",
    "- enqueue: items ÷ time of the `Feed.add_partition` calls (peers: their batched enqueue), in the bench process;",
    "- drain: items ÷ (first `leased` event → last item `updated_at`), read from the database after the run "
    "(peers: first `picked`/`started` → last `successful`/`succeeded` in their own tables);",
    "- dispatch: processor call time (logged by the no-op processor or the HTTP handler) minus the item's readiness: "
    "the moment the producer sent the COMMIT that added it, or its gate's `gate_advanced` event (the JSON also has "
    "the figure from the insert, `created_at`), while a producer adds partitions at half the drain rate "
    "(flat, http: one partition every 20 ms; fan: the backlog's partitions), or as close to it as one producer gets "
    "(the rate it offered is in the table);",
    "- gate advance: per partition, first call at gate g+1 minus last `updated_at` at gate g (the commit that "
    "advanced it); in the drain, and at half load;",
    "- peak RSS: the highest of the watcher processes (psutil samples and /proc VmHWM);",
    "- statements and transactions per item: counted in the watchers by SQLAlchemy engine events "
    "(an executemany counts each row; the pool's pre-ping is not counted); server transactions: "
    "pg_stat_database xact_commit + xact_rollback of the throwaway database over the drain, less the bench's own "
    "(PostgreSQL only: MariaDB/MySQL count server-wide);",
    "- once: every item complete, and called exactly once according to the call logs.",
]


def _accumulate_lines(runs: list[dict[str, Any]]) -> list[str]:
    """flat-accumulate's drain beside flat's, per database and watcher count (each the mean of its
    runs: repeat the pair to interleave them): the price of merging accumulators in the group commit."""
    rates: dict[tuple[str, int, str], list[float]] = {}
    for run in runs:
        rate = (run.get("drain") or {}).get("rate")
        if rate and run["workload"] in ("flat", "flat-accumulate"):
            rates.setdefault((run["db"], run["watchers"], run["workload"]), []).append(rate)
    pairs = sorted({(db, w) for db, w, _ in rates if (db, w, "flat") in rates and (db, w, "flat-accumulate") in rates})
    if not pairs:
        return []
    lines = [
        "",
        "Accumulate: every answer carries {pages, max_score}, merged in the group commit (drain items/s):",
        "",
        "| db | watchers | flat | flat-accumulate | flat-accumulate ÷ flat |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for db, watchers in pairs:
        flat = sum(rates[(db, watchers, "flat")]) / len(rates[(db, watchers, "flat")])
        acc = sum(rates[(db, watchers, "flat-accumulate")]) / len(rates[(db, watchers, "flat-accumulate")])
        lines.append(f"| {db} | {watchers} | {_num(flat)} | {_num(acc)} | {acc / flat:.0%} |")
    return lines


def collect_table(runs: list[dict[str, Any]]) -> list[str]:
    """The collect workloads' table and how it is measured."""
    lines = [
        "collect: one partition of N items at gate 0 fanning in to one item at gate 1 that collects them, one "
        "watcher; collect: a Python processor iterating all of `item.collected`; collect-http: an HTTP handler "
        "reading them inline (up to 1,000) or page by page from its `results_url` on `feedproc serve`:",
        "",
        "| db | workload | N | setup s | barrier → fan-in call ms | read all s | results/s read | barrier → answered s "
        "| watcher RSS at the call MB | watcher peak RSS MB | serve peak RSS MB | read once |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for run in runs:
        fan_in = run.get("fan_in") or {}
        lines.append(
            "| "
            + " | ".join(
                [
                    run["db"],
                    run["workload"],
                    _num(run["size"]),
                    _num((run.get("setup") or {}).get("seconds"), 1),
                    _num(fan_in.get("barrier_to_call_ms"), 1),
                    _num(fan_in.get("iterate_seconds"), 2),
                    "inline" if run.get("pages") == 0 else _num(fan_in.get("results_per_second")),
                    _num(fan_in.get("barrier_to_answer_seconds"), 2),
                    _num(fan_in.get("rss_at_call_mb")),
                    _peak(run.get("peak_rss_mb")),
                    _num((run.get("server_peak_rss_mb") or {}).get("serve")),
                    _once(run),
                ]
            )
            + " |"
        )
    return [*lines, "", *COLLECT_LEGEND]


COLLECT_LEGEND = [
    "How the collect figures are measured:",
    '- setup: N - 1 complete items with results `{"n": k}` written at gate 0 in one INSERT ... SELECT, then '
    "VACUUM/ANALYZE; the one item left there is answered by the watcher, and that answer drains gate 0;",
    "- barrier: the partition's `gate_advanced` event to gate 1, written in that answer's transaction (database "
    "clock; PostgreSQL's `now()` is the transaction's start, so the figures after it are upper bounds by a few ms);",
    "- fan-in call: the moment the processor's `process()` was entered for the collecting item, or the handler "
    "received its request (the watcher's counting of the collection included); read all: the processor's loop over "
    "`item.collected` (a page of 1,000 at a time), or the handler's over its inline results or its pages (`next` "
    "followed on one keep-alive connection), parsing each result; answered: the fan-in item's `updated_at`;",
    "- RSS at the call: the watcher's VmRSS when `process()` was entered; peak RSS: the highest of the watcher, "
    "and of `feedproc serve` (psutil samples and /proc VmHWM);",
    "- read once: both items called once, and the processor counted N results, none twice, summing N(N + 1)/2.",
]


def _settings_text(row: dict[str, Any]) -> str:
    if row["system"] == "feedproc":
        return "flat, no-op processor"
    if row["system"] == "pgqueuer":
        s = row["settings"]
        return f"asyncpg, {s['consumers']} consumers x batch {s['batch_size']} per process"
    return f"psycopg, concurrency {row['settings']['concurrency']} per process"


def _once(run: dict[str, Any]) -> str:
    if run.get("exactly_once"):
        return "yes"
    return "NO" if "exactly_once" in run else "—"
