"""Credentials never shown: URLs with their user and password replaced by `***`.

A handler URL may carry `user:password@`; it is used as given for requests, and shown only through
these functions (health reasons, logs, `last_error`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import unquote, urlsplit, urlunsplit

# `scheme://userinfo@` inside any text; the userinfo runs to the authority's last `@` (greedy, and
# it never crosses the `/`, `?` or `#` that ends the authority).
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#\s]*@")


def redact_url(url: str) -> str:
    """`http://user:secret@host:8080/x` -> `http://***@host:8080/x`; other URLs unchanged."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"***@{host}"))


def url_secrets(url: str) -> list[str]:
    """The user information of `url` as it may appear in a text: raw, percent-decoded, and its
    password alone (longest first, empty ones left out)."""
    try:
        netloc = urlsplit(url).netloc
    except ValueError:
        return []
    if "@" not in netloc:
        return []
    userinfo = netloc.rsplit("@", 1)[0]
    password = userinfo.partition(":")[2]
    found = {userinfo, unquote(userinfo), password, unquote(password)}
    return sorted((s for s in found if s), key=len, reverse=True)


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with the user information of every URL in it, and each of `secrets`, replaced by `***`."""
    text = _USERINFO.sub(r"\1***@", text)
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text
