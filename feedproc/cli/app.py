"""The `feedproc` Typer app, its shared options and the parsing helpers every command uses."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn, cast

import typer

from .. import logs
from .._version import __version__
from ..core.errors import InvalidInput, Refused
from ..core.models import NewItem, check_table_prefix, item_from_row

DEFAULT_DB = "sqlite:///feedproc.db"
ITEMS_PAGE = 1000  # items read per query by `feedproc items`


app = typer.Typer(
    name="feedproc",
    add_completion=False,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    help="Partitioned fan-out/fan-in workflows on SQLite, PostgreSQL or MariaDB/MySQL.",
)


@dataclass(frozen=True, slots=True)
class GlobalOptions:
    """The options given before the command (`feedproc --db URL --table-prefix P COMMAND`): the
    app's callback puts them on typer's context (`ctx.obj`), where every command finds them."""

    db: str | None = None
    table_prefix: str | None = None


def global_options(ctx: typer.Context | None = None) -> GlobalOptions:
    """The global options of `ctx` (by default the command running now); the defaults outside one."""
    current = ctx if ctx is not None else _current_context()
    found = current.find_object(GlobalOptions) if current is not None else None
    return found if isinstance(found, GlobalOptions) else GlobalOptions()


def _current_context() -> typer.Context | None:
    """The running command's context, for the helpers every command calls without passing theirs
    (`database_url`, `_feed`). Typer 0.29 runs on a copy of click of its own, whose context stack is
    not click's."""
    from typer._click.globals import get_current_context

    return cast("typer.Context | None", get_current_context(silent=True))


DbOption = Annotated[
    str | None,
    typer.Option(
        "--db", metavar="URL", help="Database URL (env FEEDPROC_DATABASE_URL; default sqlite:///feedproc.db)."
    ),
]
ListenDbOption = Annotated[
    str | None,
    typer.Option(
        "--listen-db",
        metavar="URL",
        envvar="FEEDPROC_LISTEN_DATABASE_URL",
        help="A direct PostgreSQL URL for notifications when --db goes through PgBouncer in transaction mode "
        "(?feedproc_pooler=transaction); without one, new work is found by polling, as on SQLite and MariaDB.",
    ),
]
LogLevelOption = Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")]
# Completion hooks' delivery, the same options for `watch` and `serve` (both deliver hooks).
HookAttemptsOption = Annotated[
    int,
    typer.Option(
        envvar="FEEDPROC_HOOK_ATTEMPTS", min=1, metavar="N", help="Calls of a completion hook before it fails."
    ),
]
HookTimeoutOption = Annotated[
    float,
    typer.Option(
        envvar="FEEDPROC_HOOK_TIMEOUT", min=0.1, metavar="S", help="Seconds one call of a completion hook may take."
    ),
]
HookMaxDelayOption = Annotated[
    float,
    typer.Option(
        envvar="FEEDPROC_HOOK_MAX_DELAY",
        min=0.1,
        metavar="S",
        help="Longest wait between a hook's attempts (doubling from 1 s). Hooks are signed with $FEEDPROC_HOOK_SECRET.",
    ),
]
LogFormatOption = Annotated[
    str,
    typer.Option(
        metavar="text|json",
        envvar="FEEDPROC_LOG_FORMAT",
        help="Log lines as text, or one JSON object per line (env FEEDPROC_LOG_FORMAT).",
    ),
]
ItemsOption = Annotated[
    str | None,
    typer.Option(
        "--items",
        metavar="FILE|-",
        help='JSON Lines: one {"gate": int, "data": ...} per line (a row without "gate" is at gate 0).',
    ),
]


def database_url(db: str | None) -> str:
    """--db, else $FEEDPROC_DATABASE_URL, else the default SQLite file; with
    $FEEDPROC_REQUIRE_DATABASE_URL set (the container image), no default: one must be given."""
    from ..feed import Feed

    given = db or global_options().db or os.environ.get("FEEDPROC_DATABASE_URL")
    if given:
        Feed.check_url(given)  # malformed: one line and exit 2 before any command does its work
        return given
    if os.environ.get("FEEDPROC_REQUIRE_DATABASE_URL"):
        raise Refused("no database: set FEEDPROC_DATABASE_URL (or give --db)")
    return DEFAULT_DB


def listen_database_url(listen_db: str | None) -> str | None:
    """--listen-db (or $FEEDPROC_LISTEN_DATABASE_URL), checked: exit 2 in one line when malformed."""
    from ..feed import Feed

    if listen_db:
        Feed.check_url(listen_db)
        logs.add_url_secrets(listen_db)
    return listen_db or None


def _feed(db: str | None, *, create: bool = False) -> Any:
    """A Feed on the command's database. A SQLite file that does not exist is created only by
    `migrate` (`create`): any other command refuses, rather than leave an empty file behind."""
    from ..feed import Feed

    url = database_url(db)
    path = sqlite_path(url)
    if path is not None and not create and not Path(path).exists():
        raise Refused(f"no database at {path}: create it with feedproc migrate (or give --db)")
    return Feed(url, table_prefix=global_options().table_prefix)


def sqlite_path(url: str) -> str | None:
    """The file of a `sqlite:///PATH` URL (None: another database, or SQLite in memory)."""
    if not url.startswith("sqlite:"):
        return None
    path = url.split("?", 1)[0].removeprefix("sqlite://").removeprefix("/")
    return path or None if path != ":memory:" else None


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"feedproc {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(
    ctx: typer.Context,
    db: DbOption = None,
    table_prefix: Annotated[
        str | None,
        typer.Option(
            metavar="PREFIX",
            envvar="FEEDPROC_TABLE_PREFIX",
            help="Begin every table, index and channel name with PREFIX (default feedproc_): feeds side by side.",
        ),
    ] = None,
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    if db is not None:  # before the command parses its own arguments: every command says the same
        from ..feed import Feed

        Feed.check_url(db)
    ctx.obj = GlobalOptions(db, check_table_prefix(table_prefix) if table_prefix is not None else None)


# ---------------------------------------------------------------- input


def read_items(source: str | None) -> Iterator[NewItem]:
    """Items from a JSON Lines file (or `-` for standard input); errors name the line."""
    if source is None:
        return
    if source == "-":
        lines: Any = sys.stdin.buffer
    else:
        path = Path(source)
        if not path.is_file():
            raise InvalidInput(f"--items {source}: no such file")
        lines = path.open("rb")
    with lines if source != "-" else contextlib.nullcontext(lines):
        for number, raw in enumerate(lines, start=1):
            try:
                line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
            except UnicodeDecodeError as error:
                raise InvalidInput(f"line {number}: not UTF-8 (byte {error.start + 1})") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise InvalidInput(f"line {number}: invalid JSON: {error.msg} at column {error.colno}") from None
            except RecursionError:
                raise InvalidInput(f"line {number}: data nests too deeply") from None
            yield item_from_row(row, where=f"line {number}: ")


def parse_time(value: str | None) -> datetime | None:
    """ISO 8601; a time without a zone is UTC."""
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value.strip())
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    except ValueError:
        raise InvalidInput(f"--not-before {value!r} is not an ISO 8601 time") from None
    except OverflowError:  # 0001-01-01T00:00+14:00 is before the first UTC moment a datetime holds
        raise InvalidInput(f"--not-before {value!r} is out of range") from None


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_deadline(value: str) -> datetime | float:
    """`--deadline`: a duration (`parse_duration`: 90, 90s, 10m, 2h) or an ISO 8601 time (no zone: UTC)."""
    text = value.strip()
    if text[:1].isdigit() and text[-1:].lower() in (*_UNITS, *"0123456789") and text.count("-") == 0:
        return parse_duration(text, "--deadline")
    try:
        parsed = datetime.fromisoformat(text)
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    except (ValueError, OverflowError):
        raise InvalidInput(f"--deadline {value!r}: expected a duration like 10m or an ISO 8601 time") from None


def parse_duration(value: str, option: str, *, unit_required: bool = False) -> float:
    """`90`, `90s`, `15m`, `12h`, `7d`, `2w` -> seconds. With `unit_required`, a bare number is
    refused (for ages in days, `7` meaning seven seconds would be a trap)."""
    text = value.strip().lower()
    if unit_required and (not text or text[-1] not in _UNITS):
        raise InvalidInput(f"{option} {value!r}: give a unit, like 90s, 15m, 12h, 7d or 2w")
    number, unit = (text[:-1], text[-1]) if text and text[-1] in _UNITS else (text, "s")
    try:
        seconds = float(number) * _UNITS[unit]
    except ValueError:
        raise InvalidInput(f"{option} {value!r}: expected a duration like 90s, 15m, 12h or 7d") from None
    if not 0 < seconds < math.inf:
        raise InvalidInput(f"{option} {value!r}: must be a positive, finite duration")
    return seconds


# ---------------------------------------------------------------- commands


def parse_headers(values: list[str]) -> dict[str, str]:
    headers = {}
    for value in values:
        name, sep, content = value.partition(":")
        if not sep or not name.strip() or any(c.isspace() for c in name.strip()):
            raise InvalidInput(f"--header {value!r}: expected 'Name: value'")
        if any(c in content for c in "\r\n\0"):  # a second header (or request) smuggled into one
            raise InvalidInput(f"--header {name.strip()!r}: its value may not contain CR, LF or NUL")
        headers[name.strip()] = content.strip()
    return headers


def check_http_url(url: str, option: str) -> str:
    """`url` if it is an http(s) URL with a host; InvalidInput naming `option` otherwise."""
    from urllib.parse import urlsplit

    from ..core.redaction import redact_url

    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError:
        host = None
    if parts.scheme not in ("http", "https") or not host:
        raise InvalidInput(f"{option} {redact_url(url)!r} is not an http:// or https:// URL with a host")
    return url


# ---------------------------------------------------------------- entry point


def _fail(message: str, code: int) -> NoReturn:
    first = logs.redact(message.strip().splitlines()[0] if message.strip() else "failed")
    if logs.is_json():  # `--log-format json`: every line on standard error is JSON, this one too
        logging.getLogger("feedproc").error("feedproc: error: %s", first, extra={"event": "exit", "error": first})
    else:
        print(f"feedproc: error: {first}", file=sys.stderr)
    raise SystemExit(code)
