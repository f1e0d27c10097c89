"""The `feedproc` command line (also `python -m feedproc`).

Errors are one line on stderr; exit 2 for malformed input, 1 for a refused or failed operation.
"""

from __future__ import annotations

import functools
from typing import Any

import typer
from typer.exceptions import Abort, TyperException

from ..core.errors import FeedprocError

# isort: off
# Importing them registers their commands, in the order `feedproc --help` lists them.
from . import produce, operate, rates, hooks, pipelines, schedules, run, serve, tools  # noqa: F401

# isort: on
from .app import _fail, app, database_url, parse_duration, parse_headers, parse_time, read_items

__all__ = ["app", "database_url", "main", "parse_duration", "parse_headers", "parse_time", "read_items"]


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `feedproc` console script."""
    try:
        code = _command().main(args=argv, prog_name="feedproc", standalone_mode=False)
    except FeedprocError as error:
        _fail(str(error), error.exit_code)
    except TyperException as error:  # usage errors: unknown option, bad value, missing argument
        if type(error).__name__ == "NoArgsIsHelpError":
            raise SystemExit(2) from None
        _fail(error.format_message(), error.exit_code or 2)
    except Abort:
        _fail("aborted", 1)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    raise SystemExit(code if isinstance(code, int) else 0)


@functools.cache
def _command() -> Any:
    """The click command of the app, built once per process: building it took ~0.2 s of CPU, paid
    again by every call of `main` in one process (the tests run the CLI in theirs)."""
    command = typer.main.get_command(app)
    _tidy_help(command)
    return command


def _tidy_help(command: Any) -> None:
    """Help that reads like the README: arguments as `KEY` or `[KEY]` (typer writes `{key}`) and
    flags, `--help` included, without a `<bool>` type (they take no value)."""
    for param in getattr(command, "params", []):
        if getattr(param, "param_type_name", "") == "argument":
            many = param.nargs != 1 and param.metavar is None
            if param.metavar is None:
                param.metavar = (param.name or "").upper()
            shown_as_is = param.required or param.metavar.startswith("[")  # it brackets what is optional itself
            usage = (param.metavar if shown_as_is else f"[{param.metavar}]") + ("..." if many else "")
            param._usage_display_name = lambda usage=usage: usage
        elif getattr(param, "is_flag", False):
            param.display_type_rich = lambda ctx: None
    help_option = command.get_help_option

    def flag_help(ctx: Any) -> Any:
        option = help_option(ctx)
        if option is not None:
            option.display_type_rich = lambda ctx: None
        return option

    command.get_help_option = flag_help
    for sub in getattr(command, "commands", {}).values():
        _tidy_help(sub)
