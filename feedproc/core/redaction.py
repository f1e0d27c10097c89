"""Credentials never shown: URLs with their user information and their secret query values
replaced by `***`.

A handler URL may carry `user:password@` and query parameters such as `?api_key=...`; it is used as
given for requests, and shown only through these functions (health reasons, logs, `last_error`,
stored pipelines). A query parameter is secret when its name contains one of `SECRET_NAMES`
(case-insensitive): `api_key`, `access_token`, `X-Amz-Signature`, `client_secret`, `password`, ...
Other parameters (`?mode=fast`) are shown as they are.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import parse_qsl, unquote, unquote_plus, urlsplit, urlunsplit

#: Words that make a query parameter's value a secret when its name contains one of them.
SECRET_NAMES = ("key", "token", "secret", "pass", "pwd", "sig", "auth", "credential", "session")
_NAME = "|".join(SECRET_NAMES)

# `scheme://userinfo@` inside any text; the userinfo runs to the authority's last `@` (greedy, and
# it never crosses the `/`, `?` or `#` that ends the authority).
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#\s]*@")
# `?name=value` or `&name=value` (also `;`) whose name contains a secret word, inside any text: the
# value runs to the next separator, fragment or white space.
_SECRET_PARAM = re.compile(rf"(?i)([?&;][^=&;#\s?]*(?:{_NAME})[^=&;#\s?]*=)[^&;#\s]*")


def _is_secret_name(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in SECRET_NAMES)


def redact_url(url: str) -> str:
    """`http://user:secret@host:8080/x?api_key=k&mode=fast` -> `http://***@host:8080/x?api_key=***&mode=fast`;
    other URLs unchanged."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if "@" in parts.netloc:
        parts = parts._replace(netloc=f"***@{parts.netloc.rsplit('@', 1)[1]}")
    if parts.query:
        parts = parts._replace(query=_SECRET_PARAM.sub(r"\1***", "?" + parts.query)[1:])
    return urlunsplit(parts)


def url_secrets(url: str) -> list[str]:
    """The secrets of `url` as they may appear in a text: its user information (raw,
    percent-decoded, and its password alone) and the values of its secret query parameters (raw and
    decoded); longest first, empty ones left out."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found: set[str] = set()
    if "@" in parts.netloc:
        userinfo = parts.netloc.rsplit("@", 1)[0]
        password = userinfo.partition(":")[2]
        found |= {userinfo, unquote(userinfo), password, unquote(password)}
    for pair in re.split(r"[&;]", parts.query):
        name, _, value = pair.partition("=")
        if value and _is_secret_name(unquote_plus(name)):
            found |= {value, unquote_plus(value)}
    found |= {value for name, value in parse_qsl(parts.query) if _is_secret_name(name)}
    return sorted((s for s in found if s), key=len, reverse=True)


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with the user information and the secret query values of every URL in it, and each of
    `secrets`, replaced by `***`."""
    if "@" in text:
        text = _USERINFO.sub(r"\1***@", text)
    if "=" in text:
        text = _SECRET_PARAM.sub(r"\1***", text)
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def credentials_conflict(url: str, header_names: Iterable[str]) -> str | None:
    """Why `url` cannot be sent with these headers, or None: credentials in the URL become an
    `Authorization` header, so a second one would make every request fail."""
    try:
        has_userinfo = "@" in urlsplit(url).netloc
    except ValueError:
        return None
    if has_userinfo and any(name.strip().lower() == "authorization" for name in header_names):
        return (
            f"handler {redact_url(url)} has credentials in its URL and an Authorization header is given too: "
            "use one of them"
        )
    return None
