"""Completion hooks' deliveries: `feedproc hooks` lists them, `hooks show ID` shows one with the
summary it sends, `hooks retry ID... | --failed` makes failed ones pending again."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from ..core.errors import InvalidInput
from ..core.hooks import FAILED, HOOK_STATES
from ..core.views import listed_json
from ..report import _table
from .app import DbOption, _feed, app

#: What `feedproc hooks` takes, said when it is given something else.
HOOKS_USAGE = (
    "usage: feedproc hooks [--failed | --status S] [--queue Q] [--key K], feedproc hooks show ID, "
    "or feedproc hooks retry ID... | --failed [--queue Q]"
)


@app.command("hooks")
def hooks_command(
    words: Annotated[
        list[str] | None,
        typer.Argument(metavar="[show ID | retry [ID]...]", help="A hook to show, or hooks to retry."),
    ] = None,
    failed: Annotated[
        bool, typer.Option("--failed", help="Only failed hooks (with retry: every failed hook, of --queue).")
    ] = False,
    status: Annotated[
        str | None,
        typer.Option("--status", metavar="STATUS", help="Only hooks in this state: pending, sent or failed."),
    ] = None,
    queue: Annotated[str | None, typer.Option(metavar="QUEUE", help="Only this queue's hooks.")] = None,
    key: Annotated[str | None, typer.Option(metavar="KEY", help="Only the hooks of this partition.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="At most N hooks, newest first.")] = 100,
    before: Annotated[
        int | None, typer.Option(metavar="ID", min=1, help="Only hooks older than this id (the next page).")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print JSON (a list: JSON Lines, one hook per line).")
    ] = False,
    db: DbOption = None,
) -> None:
    """List completion hooks' deliveries (newest first), show one with its payload, or retry failed ones.

    A line per hook: id, queue, partition, hook, status, attempts, last error, target (no credentials).

    Retry: failed hooks pending again, due now with fresh attempts; by ID, or --failed [--queue Q]."""
    words = words or []
    if words and words[0] == "show":
        if len(words) != 2 or failed or status or queue or key or before is not None:
            raise InvalidInput("usage: feedproc hooks show ID [--json]")
        with _feed(db) as feed:
            shown = feed.hook(_hook_id(words[1])).to_json()
        if as_json:
            typer.echo(json.dumps(shown, ensure_ascii=False))
        else:
            _print_hook(shown)
        return
    if words and words[0] == "retry":
        _retry(words[1:], failed=failed, queue=queue, other=bool(status or key or before is not None), db=db)
        return
    if words:
        raise InvalidInput(HOOKS_USAGE)
    if failed and status is not None and status != FAILED:
        raise InvalidInput(f"--failed and --status {status}: give one")
    if status is not None and status not in HOOK_STATES:
        raise InvalidInput(f"--status {status!r}: use one of {', '.join(HOOK_STATES)}")
    with _feed(db) as feed:
        rows = listed_json(
            feed.hooks(status=FAILED if failed else status, queue=queue, key=key, limit=limit, before=before)
        )
    if as_json:
        for row in rows:
            typer.echo(json.dumps(row, ensure_ascii=False))
        return
    if not rows:
        typer.echo("no hooks")
        return
    _table(
        ["id", "queue", "key", "hook", "status", "attempts", "last error / response", "target"],
        [[r["id"], r["queue"], r["key"], r["hook"], _state(r), r["attempts"], _outcome(r), r["target"]] for r in rows],
    )


def _retry(ids_given: list[str], *, failed: bool, queue: str | None, other: bool, db: str | None) -> None:
    if other:
        raise InvalidInput("retry takes hook IDs, or --failed [--queue Q]")
    if bool(ids_given) == failed:
        raise InvalidInput("retry: name the hooks (IDs) or --failed" + (", not both" if failed else ""))
    ids = [_hook_id(word) for word in ids_given]
    with _feed(db) as feed:
        count = feed.retry_hooks(ids, failed=failed, queue=queue)
    left = f" ({len(set(ids)) - count} not failed: left as they are)" if ids and count < len(set(ids)) else ""
    typer.echo(f"{count} hook(s) pending again{left}")


def _hook_id(word: str) -> int:
    if not word.isdigit() or not 0 < int(word[:20]) < 2**63:
        raise InvalidInput(f"{word!r} is not a hook id (a positive integer)")
    return int(word)


def _state(row: dict[str, Any]) -> str:
    """Its status, with "(calling)" while a watcher holds it."""
    return f"{row['status']} (calling)" if row["claimed"] else row["status"]


def _outcome(row: dict[str, Any]) -> str:
    """The last attempt in a few words: its error, else the HTTP status it was answered."""
    if row["last_error"]:
        return " ".join(row["last_error"].split())[:60]
    return f"HTTP {row['response_status']}" if row["response_status"] is not None else ""


def _print_hook(hook: dict[str, Any]) -> None:
    """`feedproc hooks show ID`: the delivery, its last outcome and the payload pretty-printed."""
    typer.echo(
        f"hook {hook['id']}  {hook['hook']}  queue {hook['queue']}  partition {hook['key']}  "
        f"status {_state(hook)}  attempts {hook['attempts']}"
    )
    typer.echo(f"target: {hook['target']}")
    typer.echo(f"written: {hook['created_at']}" + (f"  sent: {hook['sent_at']}" if hook["sent_at"] else ""))
    if hook["next_attempt_at"]:
        typer.echo(f"next attempt: {hook['next_attempt_at']}")
    if hook["response_status"] is not None:
        typer.echo(f"answered: HTTP {hook['response_status']}")
    if hook["last_error"]:
        typer.echo(f"last error: {hook['last_error']}")
    typer.echo("payload:")
    typer.echo(json.dumps(hook["payload"], indent=2, ensure_ascii=False))
