"""Pipeline commands: pipeline apply (a TOML file, or a Python Pipeline's settings), show, remove."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from ..core.errors import InvalidInput, NotFound
from ..core.models import check_queue
from ..core.pipelines import PipelineSpec, parse_toml
from .app import DbOption, _feed, app

pipeline_app = typer.Typer(
    no_args_is_help=True,
    help="Pipelines: a queue's gates named, each routed to its own handler with its own settings, and schedules.",
)
app.add_typer(pipeline_app, name="pipeline")


@pipeline_app.command("apply")
def pipeline_apply(
    file: Annotated[str | None, typer.Argument(metavar="FILE.toml", help="The pipeline file.")] = None,
    from_: Annotated[
        str | None,
        typer.Option("--from", metavar="MODULE:ATTR", help="Store a Python Pipeline's gates and settings instead."),
    ] = None,
    db: DbOption = None,
) -> None:
    """Store a queue's pipeline; running watchers follow it within a poll interval."""
    spec = _read_spec(file, from_)
    with _feed(db) as feed:
        stored = feed.apply_pipeline(spec, by="cli")
    gates = ", ".join(f"{gate.number}={gate.name}" for gate in stored.gates)
    schedules = f", {len(stored.schedules)} schedule(s)" if stored.schedules else ""
    typer.echo(f"queue {stored.queue}: pipeline version {stored.version} (gates {gates}{schedules})")


def _read_spec(file: str | None, source: str | None) -> PipelineSpec:
    if (file is None) == (source is None):
        raise InvalidInput("pipeline apply needs a FILE.toml or --from module:attr, one of them")
    if file is not None:
        path = Path(file)
        if not path.is_file():
            raise InvalidInput(f"{file}: no such file")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as error:
            raise InvalidInput(f"{file}: not UTF-8 (byte {error.start + 1})") from None
        return parse_toml(text, source=file)
    from ..processors import load_processor
    from ..processors.pipeline import Pipeline

    assert source is not None
    sys.path.insert(0, os.getcwd())
    target: Any = load_processor(source)
    if not isinstance(target, Pipeline):
        raise InvalidInput(f"--from {source!r} is a {type(target).__name__}, not a feedproc Pipeline")
    return target.spec


@pipeline_app.command("show")
def pipeline_show(
    queue: Annotated[str | None, typer.Argument(help="One queue's pipeline; omit for every one.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    db: DbOption = None,
) -> None:
    """Show pipelines: version, gates with their handler and settings, schedules."""
    if queue is not None:
        check_queue(queue)
    with _feed(db) as feed:
        if queue is not None:
            spec = feed.pipeline(queue)
            specs = [spec if spec is not None else _none(queue)]
        else:
            specs = feed.pipelines()
    rows = [spec.shown() for spec in specs]
    if as_json:
        typer.echo(json.dumps(rows[0] if queue is not None else rows))
        return
    for row in rows:
        typer.echo(f"queue {row['queue']}: pipeline version {row['version']}")
        for gate in row["gate"]:
            target = gate.get("handler") or gate.get("processor") or "the watcher's own processor"
            settings = {k: v for k, v in gate.items() if k not in ("name", "number", "handler", "processor")}
            extra = "  " + " ".join(f"{k}={_shown(v)}" for k, v in settings.items()) if settings else ""
            typer.echo(f"  gate {gate['number']} ({gate['name']}) -> {target}{extra}")
        for schedule in row.get("schedule", []):
            typer.echo(f"  schedule {schedule['name']}: {schedule['cron']} {schedule['timezone']} -> {schedule['key']}")


def _none(queue: str) -> NoReturn:
    raise NotFound(f"queue {queue!r} has no pipeline")


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value))
    if isinstance(value, dict):
        return ",".join(value)  # header names only
    return str(value)


@pipeline_app.command("remove")
def pipeline_remove(queue: str, db: DbOption = None) -> None:
    """Remove a queue's pipeline and its schedules: its watchers go back to their own processor."""
    check_queue(queue)
    with _feed(db) as feed:
        if not feed.remove_pipeline(queue):
            _none(queue)
    typer.echo(f"queue {queue}: pipeline removed")
