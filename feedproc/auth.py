"""Who may do what on `feedproc serve`: tokens and their scopes, whether reads are open, and which
Host names it answers to. No HTTP here: `api.gate` applies it to each request, `serve` builds it
from the environment (and `--tokens-file`) and refuses to start when it is unsafe.

Scopes nest: admin ⊇ operate ⊇ read. `worker` stands apart (a worker token reads nothing) and
may be limited to queues. Every token is compared in constant time, against every token known.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .core.errors import InvalidInput, Refused
from .core.models import QUEUE_PATTERN

READ, OPERATE, ADMIN, WORKER = "read", "operate", "admin", "worker"
SCOPES = (READ, OPERATE, ADMIN, WORKER)
#: What a token of each scope may also do.
IMPLIES = {
    READ: frozenset({READ}),
    OPERATE: frozenset({READ, OPERATE}),
    ADMIN: frozenset({READ, OPERATE, ADMIN}),
    WORKER: frozenset({WORKER}),
}
#: Each scope's variable: a comma-separated list of tokens (two at once while rotating).
ENV = {
    READ: "FEEDPROC_READ_TOKENS",
    OPERATE: "FEEDPROC_OPERATE_TOKENS",
    ADMIN: "FEEDPROC_ADMIN_TOKENS",
    WORKER: "FEEDPROC_WORKER_TOKENS",
}
#: The single tokens of earlier versions, kept with their meaning (and their looser rule).
LEGACY = {"FEEDPROC_API_TOKEN": (ADMIN, WORKER), "FEEDPROC_WORKER_TOKEN": (WORKER,)}
TOKEN_PATTERN = re.compile(r"[A-Za-z0-9._~+/=-]{16,512}")
TOKEN_RULE = "at least 16 characters of A-Z a-z 0-9 . _ ~ + / = - (try: openssl rand -hex 24)"
HOST_PATTERN = re.compile(r"(\*\.)?[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?|\*")


@dataclass(frozen=True)
class Grant:
    """What a request may do: its scopes, and for a worker the queues it may work on (None: all)."""

    scopes: frozenset[str]
    queues: frozenset[str] | None = None

    def allows(self, scope: str) -> bool:
        return scope in self.scopes

    def may_work_on(self, queue: str) -> bool:
        """Whether this grant may claim from `queue` or answer its items."""
        return WORKER in self.scopes and (self.queues is None or queue in self.queues)


#: A request that presented no token, where none is needed.
ANONYMOUS = Grant(frozenset())


@dataclass(frozen=True)
class _Entry:
    digest: bytes  # SHA-256 of the token: equal-length digests compare in constant time
    scope: str
    queues: frozenset[str] | None


class Tokens:
    """Every token `serve` accepts, each with its scope (and a worker's queues)."""

    def __init__(self, entries: Iterable[tuple[str, str, frozenset[str] | None]] = ()) -> None:
        given = tuple(entries)
        self._entries = tuple(_Entry(_digest(token), scope, queues) for token, scope, queues in given)
        self._secrets = tuple(token for token, _, _ in given)

    @classmethod
    def legacy(cls, token: str | None = None, worker_token: str | None = None) -> Tokens:
        """FEEDPROC_API_TOKEN's and FEEDPROC_WORKER_TOKEN's meaning, as `create_app` took them."""
        entries = [(token, scope, None) for scope in LEGACY["FEEDPROC_API_TOKEN"] if token]
        entries += [(worker_token, WORKER, None)] if worker_token else []
        return cls(entries)

    def grant(self, presented: str) -> Grant | None:
        """What `presented` may do (the union when it is listed more than once); None if unknown.
        Every entry is compared, so the time taken does not tell which one matched."""
        digest = _digest(presented)
        matched = [entry for entry in self._entries if hmac.compare_digest(digest, entry.digest)]
        if not matched:
            return None
        scopes = frozenset().union(*(IMPLIES[entry.scope] for entry in matched))
        limits = [entry.queues for entry in matched if entry.scope == WORKER]
        queues = None
        if limits and None not in limits:  # listed only with queues: those, else every queue
            queues = frozenset(queue for limit in limits if limit is not None for queue in limit)
        return Grant(scopes, queues)

    def can(self, scope: str) -> bool:
        """Whether any token allows `scope` (without one, calls that need it are refused outright)."""
        return any(scope in IMPLIES[entry.scope] for entry in self._entries)

    def lists(self, scope: str) -> bool:
        """Whether a token was given for `scope` itself (not only through a wider scope)."""
        return any(entry.scope == scope for entry in self._entries)

    def secrets(self) -> tuple[str, ...]:
        """The tokens themselves, for the logs to redact."""
        return self._secrets

    def __len__(self) -> int:
        return len(self._entries)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


# ---------------------------------------------------------------- reading the configuration


def _entry(text: str, scope: str, where: str) -> tuple[str, str, frozenset[str] | None]:
    """One `[QUEUES:]TOKEN`; errors name `where`, never the text (it is a secret)."""
    prefix, sep, token = text.strip().rpartition(":")  # queue names may hold ':', tokens never
    if not TOKEN_PATTERN.fullmatch(token):
        raise InvalidInput(f"{where}: a token must be {TOKEN_RULE}")
    if not sep:
        return token, scope, None
    if scope != WORKER:
        raise InvalidInput(f"{where}: only worker tokens may be limited to queues (QUEUES:TOKEN)")
    queues = prefix.split("+")
    if not all(QUEUE_PATTERN.fullmatch(queue) for queue in queues):
        raise InvalidInput(f"{where}: before ':' give queue names joined by '+' (QUEUE+QUEUE:TOKEN)")
    return token, scope, frozenset(queues)


def _legacy_token(name: str, value: str) -> str:
    # The rule these had before scopes: anything of 16 characters or more without spaces.
    if len(value) < 16 or any(c.isspace() for c in value):
        raise InvalidInput(f"{name} must be at least 16 characters without spaces (try: openssl rand -hex 24)")
    return value


def load_tokens(environ: Mapping[str, str], tokens_file: str | Path | None = None) -> Tokens:
    """The tokens of FEEDPROC_{READ,OPERATE,ADMIN,WORKER}_TOKENS, FEEDPROC_API_TOKEN,
    FEEDPROC_WORKER_TOKEN and `tokens_file` (lines of `SCOPE [QUEUES:]TOKEN`, `#` comments).
    InvalidInput names the variable or line of a token that is set but unusable, never its value."""
    entries: list[tuple[str, str, frozenset[str] | None]] = []
    for name, scopes in LEGACY.items():
        value = environ.get(name)
        if value is not None:
            entries += [(_legacy_token(name, value), scope, None) for scope in scopes]
    for scope, name in ENV.items():
        value = environ.get(name)
        if value is None:
            continue
        if not value.strip():
            raise InvalidInput(f"{name} is set but holds no token")
        for n, text in enumerate(value.split(","), start=1):
            entries.append(_entry(text, scope, f"{name} entry {n}"))
    if tokens_file is not None:
        entries += _read_tokens_file(Path(tokens_file))
    return Tokens(entries)


def _read_tokens_file(path: Path) -> list[tuple[str, str, frozenset[str] | None]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InvalidInput(f"--tokens-file {path}: cannot read it ({type(error).__name__})") from None
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"--tokens-file {path} line {number}"
        if len(words) != 2 or words[0] not in SCOPES:
            raise InvalidInput(f"{where}: expected 'SCOPE [QUEUES:]TOKEN', SCOPE one of {', '.join(SCOPES)}")
        entries.append(_entry(words[1], words[0], where))
    if not entries:
        raise InvalidInput(f"--tokens-file {path}: holds no token")
    return entries


# ---------------------------------------------------------------- where serve listens


def is_loopback(host: str) -> bool:
    """Whether `--host` is a loopback address (or `localhost`)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_allowed_hosts(names: Iterable[str]) -> tuple[str, ...]:
    """`--allowed-host` values, lower-cased: a name, `*.name` (its subdomains) or `*` (any)."""
    checked = []
    for name in names:
        if not HOST_PATTERN.fullmatch(name):
            raise InvalidInput(f"--allowed-host {name!r}: expected a host name (no port), *.NAME or *")
        checked.append(name.lower().rstrip("."))
    return tuple(checked)


def host_allowed(header: str, allowed: Iterable[str] = ()) -> bool:
    """Whether a request's Host header names this server: localhost, a name under .localhost, an IP
    address (a DNS-rebinding attacker's page is reached by a name, never by an address), or one of
    `allowed` (`check_allowed_hosts`)."""
    if header.startswith("["):  # [v6] or [v6]:port
        literal, sep, _ = header[1:].partition("]")
        try:
            return bool(sep) and bool(ipaddress.IPv6Address(literal))
        except ValueError:
            return False
    name, sep, port = header.rpartition(":")
    if not sep or not port.isdigit():
        name = header
    name = name.lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ipaddress.IPv4Address(name)
        return True
    except ValueError:
        pass
    for pattern in allowed:
        if pattern == "*" or name == pattern or (pattern.startswith("*.") and name.endswith(pattern[1:])):
            return True
    return False


@dataclass(frozen=True)
class Access:
    """The whole policy of one `serve`: its tokens, whether reads need none, its extra Host names."""

    tokens: Tokens
    open_reads: bool = True
    allowed_hosts: tuple[str, ...] = ()


def serve_access(host: str, tokens: Tokens, *, public_read: bool = False, allowed_hosts: Iterable[str] = ()) -> Access:
    """The policy of a `serve` listening on `host`. On loopback reads are open unless
    FEEDPROC_READ_TOKENS (or a file's `read` line) is set; elsewhere a read-capable token is required,
    and without one `serve` refuses to start unless `public_read` opens reads on purpose."""
    hosts = check_allowed_hosts(allowed_hosts)
    if public_read:
        return Access(tokens, open_reads=True, allowed_hosts=hosts)
    if is_loopback(host):
        return Access(tokens, open_reads=not tokens.lists(READ), allowed_hosts=hosts)
    if not tokens.can(READ):
        raise Refused(
            f"refusing to listen on {host} with reads open to anyone: set FEEDPROC_READ_TOKENS (or "
            "FEEDPROC_API_TOKEN), or pass --public-read to serve reads without a token, or use 127.0.0.1"
        )
    return Access(tokens, open_reads=False, allowed_hosts=hosts)
