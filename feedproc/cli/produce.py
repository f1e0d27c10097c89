"""Producer commands: migrate, add, add-items, seal, retry, cancel, checkpoint, priority, cleanup."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ..core.errors import InvalidInput
from ..core.flow import MAX_GROUP, check_group
from ..core.models import MAX_INT32, MAX_PRIORITY, MIN_PRIORITY, check_key, check_priority, shown
from .app import (
    DbOption,
    ItemsOption,
    _feed,
    app,
    parse_deadline,
    parse_duration,
    parse_time,
    read_items,
)


@app.command()
def migrate(db: DbOption = None) -> None:
    """Create or upgrade the schema (idempotent)."""
    with _feed(db, create=True) as feed:
        before, after = feed.migrate()
    if before == after:
        typer.echo(f"schema is up to date (revision {after})")
    else:
        typer.echo(f"schema migrated from {before or 'nothing'} to revision {after}")


@app.command()
def add(
    key: Annotated[str | None, typer.Argument(help="The partition's key; omitted: a UUIDv7 is generated.")] = None,
    items: ItemsOption = None,
    queue: Annotated[str, typer.Option(help="Queue of the partition.")] = "default",
    priority: Annotated[
        int | None,
        typer.Option(help="Higher is leased first: a signed 64-bit integer (default: the queue's, else 0)."),
    ] = None,
    open_: Annotated[bool, typer.Option("--open", help="Leave unsealed: more items may be added.")] = False,
    manual_checkpoint: Annotated[
        bool, typer.Option(help="Hold each drained gate until `feedproc checkpoint`.")
    ] = False,
    not_before: Annotated[str | None, typer.Option(help="ISO 8601 time before which nothing is dispatched.")] = None,
    weight: Annotated[
        int | None,
        typer.Option(
            min=1, help="Share of the queue's concurrency limit per item in flight (default: the queue's, else 1)."
        ),
    ] = None,
    item_timeout: Annotated[
        str | None, typer.Option(metavar="S", help="A processor call taking longer is a transient failure.")
    ] = None,
    window: Annotated[
        list[str] | None, typer.Option(metavar="HH:MM-HH:MM", help="Dispatch only in this window (repeatable).")
    ] = None,
    timezone: Annotated[str | None, typer.Option(metavar="ZONE", help="Time zone of --window (default UTC).")] = None,
    tolerate: Annotated[
        str | None,
        typer.Option(metavar="N|P%", help="Failed items each gate lets pass: a count, or a percentage of its items."),
    ] = None,
    deadline: Annotated[
        str | None,
        typer.Option(
            metavar="DURATION|TIME",
            help="Fail the partition unless finished by then: a duration from now (90s, 10m, 2h) or an ISO 8601 time.",
        ),
    ] = None,
    partition_limit: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=MAX_INT32,
            help="Its items in flight at once at most, fleet-wide (besides its queue's and gates').",
        ),
    ] = None,
    group: Annotated[
        str | None,
        typer.Option(
            metavar="NAME",
            help="Its concurrency group (a tenant): its queue's and gates' group limit and the queue's"
            " group rate count all of a group's partitions together.",
        ),
    ] = None,
    db: DbOption = None,
) -> None:
    """Create partition KEY with its items, in one transaction (no KEY: one is generated and printed)."""
    _check_group(group)
    when = parse_time(not_before)
    until = parse_deadline(deadline) if deadline is not None else None
    timeout = parse_duration(item_timeout, "--item-timeout") if item_timeout is not None else None
    if items is None and not open_:  # a sealed partition without items completes at once: surely a slip
        raise InvalidInput("add needs --items FILE|- (or --open, to add its items later)")
    options: dict[str, Any] = {
        "queue": queue,
        "priority": priority,
        "sealed": not open_,
        "manual_checkpoint": manual_checkpoint,
        "not_before": when,
        "weight": weight,
        "item_timeout": timeout,
        "windows": window or None,
        "window_tz": timezone,
        "tolerate": tolerate,
        "deadline": until,
        "partition_limit": partition_limit,
        "group": group,
    }
    with _feed(db) as feed:
        if key is not None:
            count = feed.add_partition(key, read_items(items), **options)
        else:
            added = feed.add_partition(None, read_items(items), **options)
            key, count = added.key, added.items
    typer.echo(f"added partition {key} with {count} items")


def _check_group(group: str | None) -> None:
    """`--group` checked before anything is read or written, so that a refusal names the option
    (the store's names the setting, `group`)."""
    try:
        check_group(group)
    except InvalidInput:
        raise InvalidInput(
            f"--group {shown(group)}: expected a non-empty name of at most {MAX_GROUP} characters"
        ) from None


@app.command("add-items")
def add_items(key: str, items: ItemsOption = None, db: DbOption = None) -> None:
    """Add items to an open partition."""
    if items is None:
        raise InvalidInput("add-items needs --items FILE (or - for standard input)")
    with _feed(db) as feed:
        count = feed.add_items(key, read_items(items))
    typer.echo(f"added {count} items to {key}")


@app.command()
def seal(key: str, db: DbOption = None) -> None:
    """Mark that no more items will be added to KEY."""
    with _feed(db) as feed:
        feed.seal(key)
    typer.echo(f"sealed {key}")


@app.command()
def retry(key: str, db: DbOption = None) -> None:
    """Put a failed partition and its failed items back to work."""
    with _feed(db) as feed:
        count = feed.retry(key)
    typer.echo(f"retrying {key}: {count} failed items are available again")


@app.command()
def cancel(key: str, db: DbOption = None) -> None:
    """Cancel KEY and its available items."""
    with _feed(db) as feed:
        feed.cancel(key)
    typer.echo(f"cancelled {key}")


@app.command()
def resubmit(key: str, db: DbOption = None) -> None:
    """Run a finished partition again from its first gate with the items its producer added."""
    with _feed(db) as feed:
        count = feed.resubmit(key, by="cli")
    typer.echo(f"resubmitted {key}: {count} items are available again")


@app.command()
def remove(key: str, db: DbOption = None) -> None:
    """Delete a finished partition now, with its items and history (cancel an active one first)."""
    with _feed(db) as feed:
        removed = feed.remove(key)
    typer.echo(f"removed {key}: {removed['items']} items, {removed['events']} events")


@app.command()
def checkpoint(key: str, db: DbOption = None) -> None:
    """Advance a manual-checkpoint partition whose gate has drained."""
    with _feed(db) as feed:
        gate = feed.checkpoint(key)
    typer.echo(f"{key} moved to gate {gate}")


@app.command(context_settings={"ignore_unknown_options": True})  # a negative N is not an option
def priority(
    key: str,
    n: Annotated[str, typer.Argument(metavar="N", help=f"The new priority, {MIN_PRIORITY} to {MAX_PRIORITY}.")],
    db: DbOption = None,
) -> None:
    """Change KEY's priority (higher is leased and claimed first) from its next lease on."""
    check_key(key)  # malformed: exit 2 before touching the database
    new = check_priority(parse_priority(n))
    with _feed(db) as feed:
        was = feed.set_priority(key, new, by="cli")
    typer.echo(f"{key}: priority {new} (was {was})")


def parse_priority(word: str) -> int | str:
    """`word` as an integer if it is one (digits, maybe signed); else as it is, for `check_priority`
    to refuse naming it. A word of more than 21 characters is never read as a number."""
    digits = word[1:] if word[:1] in "+-" else word
    return int(word) if digits.isdigit() and digits.isascii() and len(word) <= 21 else word


@app.command()
def cleanup(
    older_than: Annotated[str, typer.Option(help="Age of the last change, e.g. 7d, 12h, 30m.")],
    include_failed: Annotated[bool, typer.Option(help="Delete failed partitions too.")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count what would be deleted; delete nothing.")] = False,
    db: DbOption = None,
) -> None:
    """Delete finished partitions with their items and history, in bounded batches."""
    seconds = parse_duration(older_than, "--older-than", unit_required=True)
    with _feed(db) as feed:
        deleted = feed.cleanup(seconds, include_failed=include_failed, dry_run=dry_run)
    verb = "would delete" if dry_run else "deleted"
    typer.echo(f"{verb} {deleted['partitions']} partitions, {deleted['items']} items, {deleted['events']} events")
