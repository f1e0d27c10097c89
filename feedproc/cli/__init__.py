"""The `feedproc` command line (also `python -m feedproc`).

Errors are one line on stderr; exit 2 for malformed input, 1 for a refused or failed operation.
"""

from __future__ import annotations

from typer.exceptions import Abort, TyperException

from ..core.errors import FeedprocError

# isort: off
# Importing them registers their commands, in the order `feedproc --help` lists them.
from . import produce, operate, run  # noqa: F401

# isort: on
from .app import _fail, app, database_url, parse_duration, parse_headers, parse_time, read_items

__all__ = ["app", "database_url", "main", "parse_duration", "parse_headers", "parse_time", "read_items"]


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `feedproc` console script."""
    try:
        code = app(args=argv, prog_name="feedproc", standalone_mode=False)
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
