"""Schedule commands: schedule list (the partitions pipelines start on a schedule, and when)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from ..core.models import check_queue
from .app import DbOption, _feed, app

schedule_app = typer.Typer(
    no_args_is_help=True, help="Schedules: the partitions a queue's pipeline starts at its cron ticks."
)
app.add_typer(schedule_app, name="schedule")


@schedule_app.command("list")
def schedule_list(
    queue: Annotated[str | None, typer.Argument(help="One queue's schedules; omit for every pipeline's.")] = None,
    count: Annotated[int, typer.Option("--count", min=1, max=100, help="Show the next N ticks.")] = 3,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    db: DbOption = None,
) -> None:
    """List schedules: queue, name, cron and time zone, the next ticks (UTC) and the key of the next."""
    if queue is not None:
        check_queue(queue)  # malformed: exit 2 before touching the database
    with _feed(db) as feed:
        rows = [row.to_json() for row in feed.schedules(queue, count=count)]
    if as_json:
        typer.echo(json.dumps(rows))
        return
    if not rows:
        typer.echo(f"queue {queue}: no schedules" if queue is not None else "no schedules")
        return
    for row in rows:
        ticks = ", ".join(row["next_ticks"])
        typer.echo(
            f"{row['queue']} {row['name']}: cron '{row['cron']}' {row['timezone']}, "
            f"next {ticks} (key {row['next_key']})"
        )
