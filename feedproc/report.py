"""Human-readable `feedproc status` output."""

from __future__ import annotations

import base64
import json
from typing import Any

import typer

from .core.fanin import result_json
from .gate_labels import label

STATUSES = ("available", "complete", "failed", "cancelled")


def _table(headers: list[str], rows: list[list[Any]]) -> None:
    cells = [headers] + [["" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        typer.echo("  ".join(value.ljust(widths[i]) for i, value in enumerate(row)).rstrip())
        if n == 0:
            typer.echo("  ".join("-" * w for w in widths))


def tolerated_text(entry: dict[str, Any]) -> str:
    """A gate's tolerated failures (an entry of a status' `tolerated`) in words: "2 failed,
    tolerated: 5% allowed (at most 2 of 40)", or "3 failed, more than the 5% allowed ..."."""
    said = "more than the {} allowed" if entry["exceeded"] else "tolerated: {} allowed"
    text = f"{entry['failed']} failed, " + said.format(entry["allowed"])
    if "items" in entry:
        text += f" (at most {entry['limit']} of {entry['items']})"
    return text


def accumulated_text(accumulated: dict[str, Any]) -> str:
    """A partition's accumulator in words: "max_score 0.97, pages 12"."""
    return ", ".join(f"{name} {value}" for name, value in sorted(accumulated.items()))


def print_partition(status: dict[str, Any]) -> None:
    flags = [name for name in ("sealed", "manual_checkpoint") if status.get(name)]
    if status.get("tolerate"):
        flags.append(f"tolerate {status['tolerate']}")
    current = label(status["gate"], status.get("gate_name"))
    group = f"  group {status['group']}" if status.get("group") is not None else ""  # its concurrency group
    typer.echo(
        f"partition {status['key']}  queue {status['queue']}{group}  status {status['status']}  "
        f"gate {current}  priority {status['priority']}  {' '.join(flags)}".rstrip()
    )
    if status.get("not_before"):
        typer.echo(f"not before {status['not_before']}")
    lease = status.get("lease")
    if lease:
        wanted = f" (wanted by {lease['wanted_by']})" if lease.get("wanted_by") else ""
        typer.echo(f"leased by {lease['owner']} until {lease['expires_at']}{wanted}")
    schedule = status.get("schedule")
    if schedule:
        parts = []
        if schedule["weight"] != 1:
            parts.append(f"weight {schedule['weight']}")
        if schedule["item_timeout"]:
            parts.append(f"item timeout {schedule['item_timeout']:g}s")
        if schedule["windows"]:
            parts.append(f"windows {schedule['windows']} {schedule['timezone']}")
        queue = schedule.get("queue") or {}
        if queue.get("limit"):
            parts.append(f"queue limit {queue['limit']} ({queue['slots_in_use']} in use)")
        if queue.get("windows"):
            parts.append(f"queue windows {queue['windows']} {queue['timezone']}")
        if schedule.get("windows_never_overlap"):
            parts.append("its windows and the queue's never overlap: nothing will be dispatched")
        elif not schedule["window_open"]:
            parts.append(f"window closed, opens {schedule['next_window_opens_at']}")
        if parts:
            typer.echo(", ".join(parts))
    totals = status["items"]
    typer.echo(f"items: {totals['total']} total, " + ", ".join(f"{totals[s]} {s}" for s in STATUSES))
    if status.get("accumulated"):
        typer.echo(f"accumulated: {accumulated_text(status['accumulated'])}")
    if status["gates"]:
        names = status.get("gate_names") or {}  # gate names (their queue has a pipeline)
        rows = []
        progress = (status.get("progress") or {}).get("gates", {})
        for gate, counts in sorted(status["gates"].items(), key=lambda kv: int(kv[0])):
            total = sum(counts[s] for s in STATUSES)
            done = counts["complete"] + counts["cancelled"] + counts["failed"]
            marker = "<" if int(gate) == status["gate"] else ""
            reported = progress.get(gate) or {}
            mean = reported.get("mean_progress")
            in_flight = f"{reported['in_flight']} at {100 * mean:.0f}%" if mean is not None else ""
            rows.append(
                [label(gate, names.get(gate)), *(counts[s] for s in STATUSES), f"{done}/{total}", in_flight, marker]
            )
        _table(["gate", *STATUSES, "done", "in progress", "current"], rows)
        for gate, entry in sorted((status.get("tolerated") or {}).items(), key=lambda kv: int(kv[0])):
            typer.echo(f"gate {label(gate, names.get(gate))}: {tolerated_text(entry)}")
    if status["failed_items"]:
        typer.echo("failed items:")
        _table(
            ["id", "gate", "attempts", "last error"],
            [
                [f["id"], label(f["gate"], f.get("gate_name")), f["attempts"], (f["last_error"] or "")[:100]]
                for f in status["failed_items"]
            ],
        )
    if status.get("history"):
        typer.echo("history:")
        _table(
            ["at", "event", "item", "watcher", "detail"],
            [[h["at"], h["kind"], h["item"], h["watcher"], h["detail"]] for h in status["history"]],
        )


def print_summary(summary: dict[str, Any]) -> None:
    parts, items = summary["partitions"], summary["items"]
    typer.echo("partitions: " + ", ".join(f"{parts[s]} {s}" for s in STATUSES))
    typer.echo(f"items: {items['total']} total, " + ", ".join(f"{items[s]} {s}" for s in STATUSES))
    if summary.get("recent"):
        typer.echo("\nrecently updated partitions:")
        _table(
            ["key", "queue", "status", "gate", "priority", "leased by", "updated"],
            [
                [
                    r["key"],
                    r["queue"],
                    r["status"],
                    label(r["gate"], r.get("gate_name")),
                    r["priority"],
                    r["owner"],
                    r["updated_at"],
                ]
                for r in summary["recent"]
            ],
        )
    live = [w for w in summary.get("watchers", []) if w["alive"]]
    if live:
        typer.echo("\nwatchers:")
        _table(
            ["id", "queue", "concurrency", "leases", "heartbeat", "schema"],
            [
                [w["id"], w["queue"], w["concurrency"], w["leases"], w["heartbeat_at"], w.get("revision") or "-"]
                for w in live
            ],
        )


def item_json(item: dict[str, Any]) -> dict[str, Any]:
    """An item (`Feed.item` / `Feed.items` row) as JSON: data parsed, or `data_base64` when not JSON;
    its result likewise (`result`, null when it has none, or `result_base64`)."""
    result = {k: v for k, v in item.items() if k not in ("data", "result")}
    if "data" in item:
        try:
            result["data"] = json.loads(item["data"])
        except ValueError:
            result["data_base64"] = base64.b64encode(item["data"]).decode()
    if "result" in item:
        result.update(result_json(item["result"]))
    return result


def _preview(raw: bytes, width: int = 60) -> str:
    text = raw.decode("utf-8", "replace").replace("\n", " ")
    return text if len(text) <= width else text[: width - 3] + "..."


def print_items(rows: list[dict[str, Any]], *, header: bool) -> None:
    """A page of `feedproc items` (the header with the first page only)."""
    cells = [
        [
            r["id"],
            label(r["gate"], r.get("gate_name")),
            r["status"],
            r["attempts"],
            (r["last_error"] or "")[:60],
            _preview(r["data"]),
            "" if r.get("result") is None else _preview(r["result"], 40),
        ]
        for r in rows
    ]
    if header:
        _table(["id", "gate", "status", "attempts", "last error", "data", "result"], cells)
    else:
        for row in cells:
            typer.echo("  ".join("" if v is None else str(v) for v in row))


def print_item(item: dict[str, Any]) -> None:
    """`feedproc item ID`: the item, its data pretty-printed, and its deliveries with their errors."""
    typer.echo(
        f"item {item['id']}  partition {item['partition']}  queue {item['queue']}  "
        f"gate {label(item['gate'], item.get('gate_name'))}  "
        f"status {item['status']}  attempts {item['attempts']}  deliveries {item['deliveries']}"
    )
    if item.get("parent"):
        typer.echo(f"child of item {item['parent']}")
    if item.get("last_error"):
        typer.echo(f"last error: {item['last_error']}")
    shown = item_json(item)
    data = json.dumps(shown["data"], indent=2, ensure_ascii=False) if "data" in shown else shown["data_base64"]
    typer.echo("data:" if "data" in shown else "data (base64):")
    typer.echo(data)
    if item.get("result") is not None:  # what the item produced (fan-in), kept apart from its data
        if "result" in shown:
            typer.echo("result:")
            typer.echo(json.dumps(shown["result"], indent=2, ensure_ascii=False))
        else:
            typer.echo("result (base64):")
            typer.echo(shown["result_base64"])
    if item.get("collect") is not None:
        typer.echo(f"collects the results of gate {item['collect']}")
    if item["history"]:
        typer.echo("deliveries:")
        _table(
            ["n", "attempt", "gate", "outcome", "started", "duration", "watcher"],
            [
                [
                    h["n"],
                    h["attempt"],
                    label(h["gate"], h.get("gate_name")),
                    h["outcome"],
                    h["started_at"] or "",
                    "" if h["duration"] is None else f"{h['duration']:.3f}s",
                    h["watcher"],
                ]
                for h in item["history"]
            ],
        )
        for h in item["history"]:
            if h["error"]:
                typer.echo(f"\ndelivery {h['n']} ({h['outcome']}, attempt {h['attempt']}):")
                typer.echo(h["error"].rstrip())
