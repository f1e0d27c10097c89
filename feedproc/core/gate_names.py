"""Gate names: where a gate number is accepted, a name of the queue's pipeline is too.

A name means something only within one queue's pipeline, and the code that makes an item or an
answer (`Response(gate="rank")`, an HTTP answer `{"gate": "rank"}`, a JSON Lines row
`{"gate": "ocr", ...}`) does not know the queue. Whoever does — the watcher around a processor
call, `Feed` around an insert — names the gates for the duration with `naming(...)`, and
`resolve_gate` turns a name into its number there, at the moment the value is made: everything
past that point (policy, store) sees only numbers. Outside `naming`, a name is an error that says
so.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

#: A gate's name: a letter or _ first, so no name can be mistaken for a number.
GATE_NAME_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,62}")

#: The names of the gates in scope: a mapping name -> number, or a function that returns it (read
#: only when a name is met: adding items by number costs no pipeline lookup), and whose they are.
_names: ContextVar[tuple[Callable[[], Mapping[str, int]], str] | None] = ContextVar("feedproc_gate_names", default=None)


def check_gate_name(name: Any) -> str:
    """Return `name` if it can name a gate, else raise ValueError."""
    if not isinstance(name, str) or not GATE_NAME_PATTERN.fullmatch(name):
        raise ValueError(
            f"gate name {name!r} must be 1-63 characters of A-Z a-z 0-9 _ . -, starting with a letter or _"
        )
    return name


@contextmanager
def naming(names: Mapping[str, int] | Callable[[], Mapping[str, int]], whose: str) -> Iterator[None]:
    """Within the block, `resolve_gate` reads gate names from `names` (a mapping, or a function
    called once, when the first name is met); `whose` says whose names they are in errors
    ("queue 'uploads'")."""
    cache: dict[str, Mapping[str, int]] = {}

    def lookup() -> Mapping[str, int]:
        if "names" not in cache:
            cache["names"] = names() if callable(names) else names
        return cache["names"]

    token = _names.set((lookup, whose))
    try:
        yield
    finally:
        _names.reset(token)


def resolve_gate(name: str) -> int:
    """The number of gate `name` in the pipeline in scope: ValueError when there is none or it has
    no gate of that name (the message lists the names it has)."""
    scope = _names.get()
    if scope is None:
        raise ValueError(f"gate {name!r} is a name, and names need a pipeline: give the gate's number")
    lookup, whose = scope
    names = lookup()
    if not names:
        raise ValueError(f"gate {name!r} is a name, and {whose} has no pipeline naming its gates")
    number = names.get(name)
    if number is None:
        known = ", ".join(sorted(names, key=names.__getitem__))
        raise ValueError(f"unknown gate {name!r}: the pipeline of {whose} has {known}")
    return number
