"""Producer commands: migrate, add, add-items, seal, retry, cancel, checkpoint, cleanup."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ..core.errors import InvalidInput
from .app import (
    DbOption,
    ItemsOption,
    _feed,
    app,
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
    priority: Annotated[int, typer.Option(help="Higher is leased first.")] = 0,
    open_: Annotated[bool, typer.Option("--open", help="Leave unsealed: more items may be added.")] = False,
    manual_checkpoint: Annotated[
        bool, typer.Option(help="Hold each drained gate until `feedproc checkpoint`.")
    ] = False,
    not_before: Annotated[str | None, typer.Option(help="ISO 8601 time before which nothing is dispatched.")] = None,
    weight: Annotated[int, typer.Option(min=1, help="Share of the queue's concurrency limit per item in flight.")] = 1,
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
    db: DbOption = None,
) -> None:
    """Create partition KEY with its items, in one transaction (no KEY: one is generated and printed)."""
    when = parse_time(not_before)
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
    }
    with _feed(db) as feed:
        if key is not None:
            count = feed.add_partition(key, read_items(items), **options)
        else:
            added = feed.add_partition(None, read_items(items), **options)
            key, count = added.key, added.items
    typer.echo(f"added partition {key} with {count} items")


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
