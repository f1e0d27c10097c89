"""Text as every database stores it.

PostgreSQL refuses a NUL character in text (MariaDB and SQLite keep it), and no driver can send an
unpaired surrogate (`"\\ud800"`, which JSON allows and UTF-8 cannot encode). Text from outside (a
processor's error, a worker's name, an HTTP body quoted in an error, a search term) may hold
either: the store writes each as the six characters of its JSON escape (`\\u0000`), on every
database alike, instead of failing the write and everything in its transaction with it.
"""

from __future__ import annotations

import re

#: What a database refuses in text: NUL, and the surrogates (valid only in pairs, in UTF-16).
_REFUSED = re.compile("[\x00\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def storable(value: str, limit: int | None = None) -> str:
    """`value` with NUL and unpaired surrogates escaped (`\\u0000`), cut to `limit` characters (a
    `String(n)` column's) without cutting an escape in half."""
    if ("\x00" in value or not value.isascii()) and _REFUSED.search(value) is not None:
        if limit is not None and len(value) > limit // 6:  # escaping lengthens: cut on the original's characters
            kept, size = [], 0
            for char in value:
                piece = _REFUSED.sub(_escape, char)
                size += len(piece)
                if size > limit:
                    break
                kept.append(piece)
            return "".join(kept)
        value = _REFUSED.sub(_escape, value)
    return value if limit is None or len(value) <= limit else value[:limit]
