"""Operator commands: status, items, item (show, retry, skip, cancel), queue set/show, wait."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from ..core.errors import InvalidInput
from ..core.fanin import parse_operations
from ..core.flow import parse_rate, parse_rate_setting
from ..core.hooks import check_target
from ..core.models import MAX_INT32, check_key
from ..core.views import listed_json
from .app import (
    ITEMS_PAGE,
    DbOption,
    _feed,
    app,
    parse_duration,
)


@app.command()
def status(
    key: Annotated[str | None, typer.Argument(help="A partition; omit for a summary of all.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    history: Annotated[int, typer.Option("--history", help="Also show the last N history events.")] = 0,
    db: DbOption = None,
) -> None:
    """Show one partition, or a summary of all."""
    from ..gate_labels import GateNames
    from ..report import print_partition, print_summary

    with _feed(db) as feed:
        names = GateNames(feed)  # gate names beside numbers where the queue has a pipeline
        if key is None:
            summary = names.summary(feed.summary(recent=20).to_json())  # --json carries what the table shows
            if as_json:
                typer.echo(json.dumps(summary))
            else:
                print_summary(summary)
            return
        result = names.status(feed.status(key, history=history).to_json())
    if as_json:
        typer.echo(json.dumps(result))
    else:
        print_partition(result)


@app.command("items")
def list_items(
    key: Annotated[str, typer.Argument(help="The partition.")],
    gate: Annotated[
        str | None, typer.Option(metavar="GATE", help="Only items at this gate (its number, or its name).")
    ] = None,
    status_filter: Annotated[
        str | None, typer.Option("--status", metavar="STATUS", help="available, complete, failed or cancelled.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON Lines: one item per line, data included.")] = False,
    db: DbOption = None,
) -> None:
    """List a partition's items (a finished partition's results are read this way), a page at a time."""
    from ..core.models import STATUSES
    from ..gate_labels import GateNames, gate_filter, with_name
    from ..report import item_json, print_items

    check_key(key)
    if status_filter is not None and status_filter not in STATUSES:
        raise InvalidInput(f"--status {status_filter!r}: use one of {', '.join(STATUSES)}")
    after, first = 0, True
    with _feed(db) as feed:
        number = gate_filter(feed, key, gate, "--gate: ")
        names: dict[int, str] | None = None
        while True:  # keyset pages: memory stays flat however many items the partition has
            rows = listed_json(feed.items(key, gate=number, status=status_filter, after_id=after, limit=ITEMS_PAGE))
            if names is None and rows:
                names = GateNames(feed).of_items(key, rows)
            rows = [with_name(row, names or {}) for row in rows]
            if as_json:
                for row in rows:
                    typer.echo(json.dumps(item_json(row), ensure_ascii=False))
            elif rows or first:
                print_items(rows, header=first)
            first = False
            if len(rows) < ITEMS_PAGE:
                return
            after = rows[-1]["id"]


#: What `feedproc item` takes, said when it is given something else (nothing at all, say).
ITEM_USAGE = (
    "usage: feedproc item ID (show one item), or feedproc item retry|skip|cancel ID... | --partition KEY [--gate G]"
)


@app.command("item")
def item_command(
    words: Annotated[
        list[str] | None,
        typer.Argument(metavar="[retry|skip|cancel] [ID]...", help="An item to show, or an action and its items."),
    ] = None,
    partition: Annotated[
        str | None, typer.Option(metavar="KEY", help="An action on every failed or available item of KEY.")
    ] = None,
    gate: Annotated[
        str | None,
        typer.Option(metavar="GATE", help="With --partition: only at this gate (its number, or its name)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    db: DbOption = None,
) -> None:
    """Show one item (its data and every delivery), or act on items: retry, skip or cancel.

    Retry: due now, attempts reset; skip: complete, unprocessed; by ID, or --partition KEY [--gate G]."""
    from ..gate_labels import GateNames, gate_filter
    from ..report import item_json, print_item

    words = words or []
    action = words[0] if words and words[0] in ("retry", "skip", "cancel") else None
    ids = [_item_id(word) for word in (words[1:] if action else words)]
    if action is None:
        if len(ids) != 1 or partition is not None or gate is not None:
            raise InvalidInput(ITEM_USAGE)
        with _feed(db) as feed:
            item = GateNames(feed).item(feed.item(ids[0]).to_json())
        if as_json:
            typer.echo(json.dumps(item_json(item), ensure_ascii=False))
        else:
            print_item(item)
        return
    if partition is None and not ids:
        raise InvalidInput(f"{action}: name the items (IDs) or --partition KEY")
    if partition is not None and ids:
        raise InvalidInput(f"{action}: name the items (IDs) or --partition KEY, not both")
    if gate is not None and partition is None:
        raise InvalidInput("--gate goes with --partition")
    if partition is not None:
        check_key(partition)
    with _feed(db) as feed:
        number = gate_filter(feed, partition, gate, "--gate: ") if partition is not None else None
        done = feed.act_on_items(action, ids=ids or None, key=partition, gate=number, by="cli")
    if as_json:
        typer.echo(json.dumps(done))
    else:
        where = ", ".join(done["partitions"]) or "no partition"
        typer.echo(f"{done['action']}: {done['items']} item(s) in {where}")


def _item_id(word: str) -> int:
    if not word.isdigit() or not 0 < int(word[:20]) < 2**63:
        raise InvalidInput(f"{word!r} is not an item id (a positive integer)")
    return int(word)


queue_app = typer.Typer(
    no_args_is_help=True,
    help="Queue settings: concurrency limit, time windows, push or pull, completion hooks, pause and resume.",
)
app.add_typer(queue_app, name="queue")


@queue_app.command("set")
def queue_set(
    name: str,
    limit: Annotated[
        int | None, typer.Option(help="Sum of weights in flight across all watchers at most (< 1: no limit).")
    ] = None,
    window: Annotated[
        list[str] | None,
        typer.Option(metavar="HH:MM-HH:MM", help="Dispatch only in this window of the day (repeatable)."),
    ] = None,
    timezone: Annotated[
        str | None, typer.Option(metavar="ZONE", help="Time zone of the windows (default UTC).")
    ] = None,
    no_windows: Annotated[bool, typer.Option("--no-windows", help="Remove the queue's windows.")] = False,
    mode: Annotated[
        str | None,
        typer.Option(metavar="push|pull", help="push: watchers deliver its items; pull: workers claim them."),
    ] = None,
    accumulate: Annotated[
        list[str] | None,
        typer.Option(
            metavar="NAME=OP",
            help="How answers' accumulate numbers merge: NAME=sum|min|max|count"
            " (repeatable; replaces the declaration).",
        ),
    ] = None,
    no_accumulate: Annotated[
        bool, typer.Option("--no-accumulate", help="Remove the queue's accumulate declaration.")
    ] = False,
    on_complete: Annotated[
        str | None,
        typer.Option(metavar="URL|python", help="Call this when a partition completes ('' removes the hook)."),
    ] = None,
    on_fail: Annotated[
        str | None, typer.Option(metavar="URL|python", help="Call this when a partition fails ('' removes it).")
    ] = None,
    on_cancel: Annotated[
        str | None,
        typer.Option(metavar="URL|python", help="Call this when a partition is cancelled ('' removes it)."),
    ] = None,
    priority: Annotated[
        int | None, typer.Option(metavar="N", help="Priority of a partition added without one (64-bit).")
    ] = None,
    weight: Annotated[int | None, typer.Option(metavar="N", help="Weight of a partition added without one.")] = None,
    no_defaults: Annotated[
        bool, typer.Option("--no-defaults", help="Remove the default priority and weight (0 and 1 again).")
    ] = False,
    partition_limit: Annotated[
        int | None,
        typer.Option(metavar="N", help="Items of any one partition in flight at once, fleet-wide (< 1: no limit)."),
    ] = None,
    aging: Annotated[
        str | None,
        typer.Option(
            metavar="DURATION|'N per DURATION'",
            help="A waiting partition's priority counts one higher per DURATION of its age (10s, '1 per 10s').",
        ),
    ] = None,
    no_aging: Annotated[bool, typer.Option("--no-aging", help="Remove the queue's aging.")] = False,
    group_limit: Annotated[
        int | None,
        typer.Option(
            metavar="N",
            max=MAX_INT32,
            help="Items of any one concurrency group in flight at once, fleet-wide (< 1: no limit).",
        ),
    ] = None,
    rate: Annotated[
        str | None,
        typer.Option(
            metavar="RATE",
            help="Items started at most, fleet-wide: 600/min, 10/s, 100/hour, 2/day, a number per second,"
            " or the name of a shared rate (0: no rate).",
        ),
    ] = None,
    group_rate: Annotated[
        str | None,
        typer.Option(metavar="RATE", help="Items of any one concurrency group started at most (0: no rate)."),
    ] = None,
    db: DbOption = None,
) -> None:
    """Store queue NAME's concurrency limit, windows, mode, accumulate declaration, completion hooks,
    the priority and weight its partitions get when added without theirs, its partition limit, aging,
    group limit and/or rates (options not given keep their value).

    A hook is an http(s) URL, POSTed the partition's summary (signed with $FEEDPROC_HOOK_SECRET), or
    `python`: a function its watchers were given."""
    if mode is not None and mode not in ("push", "pull"):
        raise typer.BadParameter(f"must be push or pull, got {mode!r}", param_hint="--mode")
    if aging is not None and no_aging:
        raise InvalidInput("--aging and --no-aging: give one")
    aging_seconds = 0.0 if no_aging else _aging(aging) if aging is not None else None
    rates = {  # a group's rate is its own bucket: it cannot name a shared rate
        "rate": _rate(rate, "--rate", parse_rate_setting),
        "group_rate": _rate(group_rate, "--group-rate", parse_rate),
    }
    if accumulate and no_accumulate:
        raise InvalidInput("--accumulate and --no-accumulate: give one")
    declared = None
    if accumulate:
        try:
            declared = parse_operations(accumulate)  # before touching the database
        except ValueError as error:
            raise InvalidInput(str(error)) from None
    elif no_accumulate:
        declared = {}
    given = {"on_complete": on_complete, "on_fail": on_fail, "on_cancel": on_cancel}
    hooks = {name: target for name, target in given.items() if target is not None} or None
    for hook, target in (hooks or {}).items():  # before touching the database; '' removes the hook
        if target:
            check_target(target, where="--" + hook.replace("_", "-"))
    with _feed(db) as feed:
        settings = feed.set_queue(
            name,
            limit=limit,
            windows=window,
            window_tz=timezone,
            clear_windows=no_windows,
            mode=mode,
            accumulate=declared,
            hooks=hooks,
            priority=priority,
            weight=weight,
            clear_defaults=no_defaults,
            partition_limit=partition_limit,
            aging=aging_seconds,
            group_limit=group_limit,
            **rates,
        )
    limit_text = f"limit {settings.limit}" if settings.limited else "no limit"
    windows_text = f"windows {settings.windows} {settings.window_tz or 'UTC'}" if settings.windows else "no windows"
    said = ", ".join(f"{n}={op}" for n, op in settings.accumulate)
    accumulate_text = f", accumulate {said}" if said else ""
    hooks_text = _hooks_text(dict(settings.hooks))
    defaults = _defaults_text(settings.describe(datetime.now(UTC)))  # what `queue show` prints them from
    typer.echo(f"queue {name}: {settings.mode}, {limit_text}, {windows_text}{accumulate_text}{hooks_text}{defaults}")


def _defaults_text(q: Mapping[str, Any]) -> str:
    """A queue's default priority and weight, its partition limit, aging, group limit and rates, as
    `queue set` and `queue show` print them (those set), from its JSON (rates as "10/s")."""
    parts = [f"default {what} {q[what]}" for what in ("priority", "weight") if q.get(what) is not None]
    if q.get("partition_limit") is not None:
        parts.append(f"partition limit {q['partition_limit']}")
    if q.get("aging") is not None:
        parts.append(f"aging 1 per {q['aging']:g}s")
    for key, what in (("group_limit", "group limit"), ("rate", "rate"), ("group_rate", "group rate")):
        if q.get(key) is not None:
            parts.append(f"{what} {q[key]}")
    return ", " + ", ".join(parts) if parts else ""


def _aging(value: str) -> float:
    """`--aging`: a duration (`10s`: one step of priority per 10 s of waiting) or `N per DURATION`."""
    steps, per, duration = value.strip().partition(" per ")
    if not per:
        return parse_duration(value, "--aging")
    if not steps.strip().isdigit() or int(steps) < 1:
        raise InvalidInput(f"--aging {value!r}: expected a duration like 10s, or 'N per DURATION' like '1 per 10s'")
    return parse_duration(duration, "--aging") / int(steps)


#: `--rate 2.5`: a bare decimal number is a rate per second.
_NUMBER = re.compile(r"^(\d+\.?\d*|\.\d+)$")


def _rate(value: str | None, option: str, parse: Callable[[Any, str], object]) -> str | float | None:
    """`--rate` / `--group-rate` checked (by `parse`) before anything is written, so that a refusal
    names the option (the store's names the setting): a number is a rate per second; 0 clears."""
    if value is None:
        return None
    text = value.strip()
    given: str | float = float(text) if _NUMBER.match(text) else text  # not float(): a rate may be named "inf"
    if given == 0:
        return 0.0  # the store's "no rate"
    parse(given, option)
    return given


def _hooks_text(hooks: dict[str, str]) -> str:
    """A queue's hooks as `queue set` and `queue show` print them, credentials hidden."""
    from ..core.redaction import redact_url

    shown = ", ".join(f"{hook} {redact_url(target)}" for hook, target in hooks.items())
    return f", hooks {shown}" if shown else ""


@queue_app.command("pause")
def queue_pause(name: str, db: DbOption = None) -> None:
    """Pause queue NAME fleet-wide: in-flight items finish, nothing new is dispatched or claimed."""
    with _feed(db) as feed:
        feed.set_queue(name, paused=True, by="cli")
    typer.echo(f"queue {name}: paused")


@queue_app.command("resume")
def queue_resume(name: str, db: DbOption = None) -> None:
    """Resume a paused queue."""
    with _feed(db) as feed:
        feed.set_queue(name, paused=False, by="cli")
    typer.echo(f"queue {name}: resumed")


@queue_app.command("show")
def queue_show(
    name: Annotated[str | None, typer.Argument(help="One queue; omit for all.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    db: DbOption = None,
) -> None:
    """Show queues' limits, slots in use, windows (with when the next one opens), hooks and the
    weight each concurrency group has in flight."""
    with _feed(db) as feed:
        rows = [q.to_json() for q in feed.queues() if name is None or q.name == name]
        if name is not None and not rows:
            rows = [feed.queue(name).to_json()]
    if as_json:
        typer.echo(json.dumps(rows[0] if name is not None else rows))
        return
    for q in rows:
        limit_text = f"limit {q['limit']} ({q['slots_in_use']} in use)" if q["limit"] else "no limit"
        if q["windows"]:
            state = "open" if q["window_open"] else f"closed, opens {q['next_window_opens_at']}"
            windows_text = f"windows {q['windows']} {q['timezone']} ({state})"
        else:
            windows_text = "no windows"
        paused = f", paused since {q['paused_at']} by {q['paused_by']}" if q["paused"] else ""
        declared = ", ".join(f"{n}={op}" for n, op in (q.get("accumulate") or {}).items())
        accumulate = f", accumulate {declared}" if declared else ""
        hooks = _hooks_text(q.get("hooks") or {})
        defaults = _defaults_text(q)
        in_flight = ", ".join(f"{group} {weight}" for group, weight in (q.get("groups") or {}).items())
        groups = f", groups in flight {in_flight}" if in_flight else ""
        windows = ", ".join(f"gate {gate} {width:g}" for gate, width in (q.get("adaptive") or {}).items())
        groups += f", adaptive window {windows}" if windows else ""
        typer.echo(
            f"{q['name']}: {q['mode']}, {limit_text}, {windows_text}{accumulate}{hooks}{defaults}{groups}{paused}"
        )


@app.command()
def wait(
    key: str,
    timeout: Annotated[float | None, typer.Option(min=0.0, help="Give up after S seconds (exit 124).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the final status as JSON.")] = False,
    db: DbOption = None,
) -> None:
    """Block until KEY is complete (exit 0), failed or cancelled (exit 1); 124 on timeout."""
    from ..report import print_partition

    check_key(key)  # malformed: exit 2 before touching the database
    with _feed(db) as feed:
        try:
            result = feed.wait(key, timeout).to_json()
        except TimeoutError as error:
            print(f"feedproc: {error}", file=sys.stderr)
            result = getattr(error, "status", None)
            code = 124
        else:
            code = 0 if result["status"] == "complete" else 1
    if result is not None:
        if as_json:
            typer.echo(json.dumps(result))
        else:
            print_partition(result)
    raise typer.Exit(code)
