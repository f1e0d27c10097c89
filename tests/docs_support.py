"""The documentation as the tests that run its examples read it: README.md (the front page, and
the site's home) and every page of the site under docs/. An example is found by what it is (a
Python file's first line, `# words.py`; a shell session's command), not by the page it is on, so
moving a section between pages keeps its example running. The same example may be shown on two
pages (the front page repeats one of a guide's): it is one example, and two that differ under one
name are an error, so the copies cannot drift apart."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def text() -> str:
    """Every page, one after the other."""
    return "\n".join(page.read_text() for page in PAGES)


def blocks(language: str) -> list[str]:
    """The fenced code blocks in `language` of every page, in page order, each distinct one once."""
    found = re.findall(rf"^```{language}\n(.*?)^```", text(), re.S | re.M)
    return list(dict.fromkeys(found))


def python_files() -> dict[str, str]:
    """The Python blocks that are whole files: {"classify.py": source, ...}."""
    found: dict[str, str] = {}
    for block in blocks("python"):
        first = block.splitlines()[0]
        if re.fullmatch(r"# [a-z_]+\.py", first):
            name = first[2:]
            assert name not in found, f"two different files named {name} in the documentation"
            found[name] = block
    return found


def sh_block(containing: str) -> str:
    """The one shell block that contains `containing`."""
    [block] = [block for block in blocks("sh") if containing in block]
    return block
