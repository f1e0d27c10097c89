"""The documentation site's pages generated from the code, as an MkDocs hook (mkdocs.yml `hooks:`).

- `index.md`: README.md, the front page on GitHub too, with its `docs/` links made site-relative;
- `reference/cli.md`: every command of the `feedproc` command line, walked from the Typer app's
  command tree (usage, help, and each option with its environment variable and default);
- `reference/http-api.md` and `reference/openapi.json`: the HTTP API from the OpenAPI document that
  `feedproc serve` publishes (built from `create_app`, on a database that is never opened).

The Python API's page is written by hand as mkdocstrings directives (docs/reference/python.md).
Nothing is written into docs/: the pages exist only in the build, so they cannot go stale; the
reference pages' files in docs/ are placeholders (for links followed on GitHub) that the build
replaces.
`python cmds/docs_reference.py DIR` writes them to DIR, to read them without building the site.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


# -- MkDocs hooks ---------------------------------------------------------------------------------


def on_files(files: Any, config: Any) -> Any:
    """Add the generated pages to the build."""
    from mkdocs.structure.files import File

    for path, content in generated().items():
        placeholder = files.get_file_from_path(path)
        if placeholder is not None:  # what GitHub shows in its place: how to read the generated page
            files.remove(placeholder)
        files.append(File.generated(config, path, content=content))
    return files


def on_serve(server: Any, config: Any, builder: Any) -> Any:
    """`mkdocs serve` rebuilds when the README or the code behind the reference changes."""
    server.watch(str(ROOT / "README.md"))
    server.watch(str(ROOT / "feedproc"))
    return server


def generated() -> dict[str, str]:
    """Each generated page's path in the site's sources, and its Markdown (or JSON)."""
    spec = openapi()
    return {
        "index.md": front_page((ROOT / "README.md").read_text()),
        "reference/cli.md": cli_reference(),
        "reference/http-api.md": http_reference(spec),
        "reference/openapi.json": json.dumps(spec, indent=2) + "\n",
    }


# -- The front page -------------------------------------------------------------------------------


def front_page(readme: str) -> str:
    """README.md as the site's home: its links into docs/ (which GitHub follows from the repository's
    root) made relative to the site's root."""
    return re.sub(r"\]\(docs/", "](", readme)


# -- The command line -----------------------------------------------------------------------------


def cli_reference() -> str:
    """Markdown for every command of the Typer app, in the order `feedproc --help` lists them."""
    import typer

    from feedproc.cli import app

    root = typer.main.get_command(app)
    lines = [
        "# Command line reference",
        "",
        "Generated from the command line's own definitions: each command's usage, what it does, and",
        "its options with their environment variables and defaults (the same as `feedproc COMMAND",
        "--help`). Every command also takes the global options of `feedproc` itself, before or after",
        "the command's name.",
        "",
    ]
    for path, command, ctx in _commands(root, ["feedproc"], None):
        lines += _command_section(path, command, ctx)
    return "\n".join(lines)


def _commands(command: Any, path: list[str], parent: Any) -> Iterator[tuple[list[str], Any, Any]]:
    """The command tree depth first: each command with its path and a context to render it in. (Typer
    carries its own copy of click, so the tree is walked by its attributes, not click's classes.)"""
    ctx = command.context_class(command, info_name=path[-1], parent=parent)
    yield path, command, ctx
    for name, sub in getattr(command, "commands", {}).items():
        if not getattr(sub, "hidden", False):
            yield from _commands(sub, [*path, name], ctx)


def _command_section(path: list[str], command: Any, ctx: Any) -> list[str]:
    params = [p for p in command.get_params(ctx) if p.name != "help"]
    arguments = [p for p in params if p.param_type_name == "argument"]
    options = [p for p in params if p.param_type_name == "option"]
    usage = " ".join([*path, *(["[OPTIONS]"] if options else []), *map(_argument_usage, arguments)])
    if getattr(command, "commands", None):
        usage += " COMMAND [ARGS]..."
    lines = [f"## `{' '.join(path)}`", "", "```", usage, "```", ""]
    if command.help:
        lines += [_help_text(command.help), ""]
    if arguments:
        lines += ["| argument | meaning |", "| --- | --- |"]
        lines += [f"| `{_argument_usage(p)}` | {_cell(getattr(p, 'help', None) or '')} |" for p in arguments]
        lines.append("")
    if options:
        lines += ["| option | env | default | meaning |", "| --- | --- | --- | --- |"]
        lines += [_option_row(p) for p in options]
        lines.append("")
    subcommands = getattr(command, "commands", {})
    if subcommands:
        lines += ["| command | does |", "| --- | --- |"]
        for name, sub in subcommands.items():
            if not getattr(sub, "hidden", False):
                anchor = "-".join([*path, name])
                summary = (sub.short_help or (sub.help or "").split("\n\n")[0]).replace("\n", " ")
                lines.append(f"| [`{name}`](#{anchor}) | {_cell(summary)} |")
        lines.append("")
    return lines


def _argument_usage(param: Any) -> str:
    name = param.metavar or (param.name or "").upper()
    shown = name if param.required else f"[{name}]"
    return shown + ("..." if param.nargs != 1 and param.metavar is None else "")


def _option_row(param: Any) -> str:
    names = " / ".join([*param.opts, *param.secondary_opts])
    if not param.is_flag:
        names += f" {param.metavar or _value_name(param)}"
    envvar = param.envvar if isinstance(param.envvar, str) else ", ".join(param.envvar or [])
    default = "" if param.is_flag or param.default in (None, (), []) else param.default
    if param.required:
        default = "required"
    help_text = (param.help or "") + _bounds(param)
    return f"| `{names}` | {f'`{envvar}`' if envvar else ''} | {_cell(str(default))} | {_cell(help_text)} |"


def _value_name(param: Any) -> str:
    """What an option without a metavar takes, by its annotation: N, NUMBER or TEXT."""
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    return "N" if annotation is int else "NUMBER" if annotation is float else "TEXT"


def _bounds(param: Any) -> str:
    """An option's range, as its --help says it (`x>=1`), in words."""
    low, high = getattr(param, "min", None), getattr(param, "max", None)
    if low is not None and high is not None:
        return f" From {low} to {high}."
    if low is not None:
        return f" At least {low}."
    if high is not None:
        return f" At most {high}."
    return ""


def _help_text(text: str) -> str:
    """Click's help as Markdown: its `\\b` (keep these lines as they are) paragraphs become line breaks."""
    paragraphs = []
    for paragraph in text.strip().split("\n\n"):
        if paragraph.startswith("\b\n"):
            paragraph = "  \n".join(paragraph[2:].splitlines())
        paragraphs.append(_escape_html(paragraph))
    return "\n\n".join(paragraphs)


def _cell(text: str) -> str:
    """Text for one cell of a Markdown table: one line, `|` escaped."""
    return _escape_html(" ".join(text.split())).replace("|", "\\|")


def _escape_html(text: str) -> str:
    """`<` outside code spans as an entity: help text is prose, never HTML."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(part if part.startswith("`") else part.replace("<", "&lt;") for part in parts)


# -- The HTTP API ---------------------------------------------------------------------------------


def openapi() -> dict[str, Any]:
    """The OpenAPI document of `feedproc serve`, as /api/v1/openapi.json serves it."""
    from feedproc import Feed
    from feedproc.api import create_app

    with tempfile.TemporaryDirectory() as directory, Feed(f"sqlite:///{directory}/unused.db") as feed:
        return create_app(feed).openapi()  # builds the routes; no statement is run


def http_reference(spec: dict[str, Any]) -> str:
    """Markdown for every operation of the OpenAPI document, grouped by tag, and its schemas."""
    info = spec["info"]
    lines = [
        "# HTTP API reference",
        "",
        f"Generated from the OpenAPI document of `feedproc serve` (version {info['version']}), which a",
        "running server also publishes at `/api/v1/openapi.json` and shows at `/api/v1/docs`; the",
        "document itself: [openapi.json](openapi.json).",
        "",
        _escape_html(info.get("description", "")),
        "",
    ]
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for route, operations in spec["paths"].items():
        for method, operation in operations.items():
            by_tag.setdefault((operation.get("tags") or ["other"])[0], []).append((method, route, operation))
    for tag, operations in by_tag.items():
        lines += [f"## {tag.capitalize()}", ""]
        for method, route, operation in operations:
            lines += _operation(method, route, operation)
    lines += ["## Schemas", ""]
    for name, schema in spec.get("components", {}).get("schemas", {}).items():
        lines += _schema(name, schema)
    return "\n".join(lines)


#: The OpenAPI document's security schemes, as a request carries them.
SCHEMES = {"HTTPBearer": "`Authorization: Bearer TOKEN`", "HTTPBasic": "`Authorization: Basic` (the token as password)"}


def _operation(method: str, route: str, operation: dict[str, Any]) -> list[str]:
    lines = [f"### {operation.get('summary') or route}", "", f"`{method.upper()} {route}`", ""]
    if operation.get("description"):
        lines += [_escape_html(operation["description"]), ""]
    security = [SCHEMES.get(name, name) for requirement in operation.get("security", []) for name in requirement]
    if security:
        lines += [f"Authorization: {' or '.join(security)}.", ""]
    if operation.get("parameters"):
        lines += ["| parameter | in | type | required | meaning |", "| --- | --- | --- | --- | --- |"]
        for param in operation["parameters"]:
            schema = param.get("schema", {})
            meaning = param.get("description") or schema.get("description") or ""
            required = "yes" if param.get("required") else ""
            kind = _type(schema)
            lines.append(f"| `{param['name']}` | {param['in']} | {kind} | {required} | {_cell(meaning)} |")
        lines.append("")
    body = operation.get("requestBody")
    if body:
        for media, content in body.get("content", {}).items():
            lines += [f"Request body ({media}): {_type(content.get('schema', {}))}.", ""]
    lines += ["| status | meaning |", "| --- | --- |"]
    for status, response in operation.get("responses", {}).items():
        media_types: dict[str, Any] = next(iter(response.get("content", {}).values()), {})
        schema = media_types.get("schema")
        shape = f" ({_type(schema)})" if schema and "$ref" in schema else ""
        lines.append(f"| {status} | {_cell(response.get('description', ''))}{shape} |")
    return [*lines, ""]


def _schema(name: str, schema: dict[str, Any]) -> list[str]:
    lines = [f"### {name} {{#schema-{name.lower()}}}", ""]  # its own id: a schema may share an operation's name
    if schema.get("description"):
        lines += [_escape_html(schema["description"]), ""]
    properties = schema.get("properties", {})
    if properties:
        required = set(schema.get("required", []))
        lines += ["| field | type | required | meaning |", "| --- | --- | --- | --- |"]
        for field, spec in properties.items():
            meaning = spec.get("description", "")
            if "default" in spec and spec["default"] is not None:
                meaning = f"{meaning} (default `{json.dumps(spec['default'])}`)".strip()
            mark = "yes" if field in required else ""
            lines.append(f"| `{field}` | {_type(spec)} | {mark} | {_cell(meaning)} |")
    else:
        lines.append(f"Type: {_type(schema)}.")
    return [*lines, ""]


def _type(schema: dict[str, Any]) -> str:
    """A schema in a few words: a link to a named schema, `string`, `integer (0..2147483647)`, `A or B`."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        return f"[{name}](#schema-{name.lower()})"
    for combined in ("anyOf", "oneOf"):
        if combined in schema:
            kinds = [_type(part) for part in schema[combined] if part.get("type") != "null"]
            return " or ".join(dict.fromkeys(kinds)) or "null"
    if "enum" in schema:
        return " \\| ".join(f"`{value}`" for value in schema["enum"])
    kind = schema.get("type", "any")
    if kind == "array":
        return f"list of {_type(schema.get('items', {}))}"
    if kind == "object" and "additionalProperties" in schema and isinstance(schema["additionalProperties"], dict):
        return f"object of {_type(schema['additionalProperties'])}"
    bounds = [schema.get(key) for key in ("minimum", "maximum")]
    if any(bound is not None for bound in bounds):
        low, high = ("" if bound is None else bound for bound in bounds)
        return f"{kind} ({low}..{high})"
    return str(kind)


def main(argv: list[str]) -> None:
    """Write the generated pages to a directory, to read them without building the site."""
    [directory] = argv or ["site-generated"]
    for path, content in generated().items():
        target = Path(directory) / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        print(target)


if __name__ == "__main__":
    main(sys.argv[1:])
