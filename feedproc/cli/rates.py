"""Shared rate commands: rate set, rate list, rate remove. A shared rate ("ocr-api" at 600/min) is
one token bucket that every queue and pipeline gate whose `rate` names it draws from, fleet-wide."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from ..core.flow import check_rate_name, parse_rate
from .app import DbOption, _feed, app

rate_app = typer.Typer(
    no_args_is_help=True, help="Shared rates: one rate limit for every queue and gate that names it."
)
app.add_typer(rate_app, name="rate")


@rate_app.command("set")
def rate_set(
    name: Annotated[str, typer.Argument(help="The rate's name (a queue's or gate's `rate` names it).")],
    rate: Annotated[str, typer.Argument(help="600/min, 10/s, 100/hour, 2/day, or a number per second.")],
    db: DbOption = None,
) -> None:
    """Declare shared rate NAME at RATE, or change its rate."""
    check_rate_name(name)  # malformed: exit 2 before touching the database
    parse_rate(_number_or_text(rate))
    with _feed(db) as feed:
        shown = feed.set_rate(name, _number_or_text(rate))
    typer.echo(f"rate {shown.name}: {shown.rate}")


@rate_app.command("list")
def rate_list(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False, db: DbOption = None
) -> None:
    """List the shared rates: name, rate, and the tokens their bucket holds now."""
    with _feed(db) as feed:
        rows = [row.to_json() for row in feed.rates()]
    if as_json:
        typer.echo(json.dumps(rows))
        return
    if not rows:
        typer.echo("no shared rates")
    for row in rows:
        typer.echo(f"{row['name']}: {row['rate']}, {row['tokens']:g} tokens now")


@rate_app.command("remove")
def rate_remove(name: str, db: DbOption = None) -> None:
    """Remove shared rate NAME (refused while a queue's rate names it)."""
    check_rate_name(name)
    with _feed(db) as feed:
        feed.remove_rate(name)
    typer.echo(f"rate {name}: removed")


def _number_or_text(value: str) -> str | float:
    """A bare number is a rate per second; anything else is read as written."""
    try:
        return float(value)
    except ValueError:
        return value
