"""Completion hooks: what a queue asks to be called when one of its partitions finishes, how a
call is signed, and how long a failed call waits before the next attempt.

A queue (or its pipeline) names up to three hooks, one per way a partition finishes:

* `on_complete`: the partition completed;
* `on_fail`: it failed (an item failed past what its gate tolerates);
* `on_cancel`: it was cancelled.

Each is an `http://` or `https://` URL (POSTed the partition's summary as JSON, signed) or
`python` (a callable registered with the watchers of the queue: `Pipeline.on_complete`,
`Watcher(hooks=...)`). The hook's row is written in the transaction that finishes the partition
(the outbox) and watchers deliver it at least once, with backoff (`store/hooks.py`,
`watcher/hooks.py`).

Signatures are those Stripe's and GitHub's users know: the header
`Feedproc-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`; `verify`
checks one (`feedproc.verify_signature`).

Pure: no database, network or clock of its own (callers pass `now`).
"""

from __future__ import annotations

import hashlib
import hmac
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from .errors import InvalidInput
from .redaction import redact_url

#: Hook name -> the partition status that calls it.
HOOK_EVENTS: dict[str, str] = {"on_complete": "complete", "on_fail": "failed", "on_cancel": "cancelled"}
#: Partition status -> the hook it calls.
HOOK_OF_STATUS: dict[str, str] = {status: hook for hook, status in HOOK_EVENTS.items()}
#: The target that calls a Python callable registered with the queue's watchers.
PYTHON = "python"
#: A hook delivery's states: waiting for (another) attempt, delivered, or out of attempts.
PENDING, SENT, FAILED = "pending", "sent", "failed"
HOOK_STATES = (PENDING, SENT, FAILED)
#: The header carrying the signature, and the one carrying the idempotency key (the delivery's id).
SIGNATURE_HEADER = "Feedproc-Signature"
IDEMPOTENCY_HEADER = "Idempotency-Key"
#: How far a signature's timestamp may be from the receiver's clock, by default (Stripe's five minutes).
TOLERANCE_SECONDS = 300
MAX_URL = 2000


def check_hooks(hooks: Mapping[str, Any], *, where: str = "hooks") -> dict[str, str]:
    """`hooks` checked: only `on_complete`, `on_fail`, `on_cancel`, each an http(s) URL without
    credentials or `python`; an empty value removes that hook. InvalidInput names the problem."""
    if not isinstance(hooks, Mapping):
        raise InvalidInput(f"{where} must be a table of on_complete, on_fail, on_cancel")
    checked: dict[str, str] = {}
    for name, target in hooks.items():
        if name not in HOOK_EVENTS:
            raise InvalidInput(f"{where}: unknown hook {name!r}: give on_complete, on_fail or on_cancel")
        if target is None or target == "":
            continue
        if not isinstance(target, str):
            raise InvalidInput(f"{where}.{name} must be a URL or {PYTHON!r}")
        checked[name] = check_target(target, where=f"{where}.{name}")
    return checked


def check_target(target: str, *, where: str = "hook") -> str:
    """A hook target: `python`, or an absolute http(s) URL with a host and no credentials."""
    if target == PYTHON:
        return target
    if len(target) > MAX_URL:
        raise InvalidInput(f"{where}: a URL of at most {MAX_URL} characters")
    parts = urlsplit(target)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput(f"{where} must be an http:// or https:// URL, or {PYTHON!r}; got {target[:200]!r}")
    if "@" in parts.netloc:  # they would be stored and shown: the signature is how a receiver knows us
        raise InvalidInput(f"{where}: no credentials in a hook URL ({redact_url(target)}): verify its signature")
    return target


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The `Feedproc-Signature` header's value for `body` sent at `timestamp` (unix seconds)."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def verify(secret: str, header: str, body: bytes, *, now: float, tolerance: float = TOLERANCE_SECONDS) -> bool:
    """Whether `header` (a `Feedproc-Signature` value) signs `body` with `secret`, at a time within
    `tolerance` seconds of `now`. Compared in constant time; any `v1` of the header may match (a
    secret being rotated)."""
    timestamp, signatures = None, []
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        if name == "t" and value.isdigit():
            timestamp = int(value)
        elif name == "v1":
            signatures.append(value)
    if timestamp is None or not signatures or abs(now - timestamp) > tolerance:
        return False
    expected = sign(secret, timestamp, body).partition(",v1=")[2]
    return any(hmac.compare_digest(expected, signature) for signature in signatures)


def backoff(attempt: int, *, base: float = 1.0, cap: float = 60.0, jitter: float = 0.2) -> float:
    """Seconds before attempt `attempt + 1` of a hook whose attempt `attempt` (1-based) failed:
    doubling from `base` up to `cap`, each spread by +-`jitter` so a fleet's retries after an
    endpoint's outage do not arrive at once."""
    delay: float = min(cap, base * 2.0 ** max(attempt - 1, 0))
    return delay * random.uniform(1 - jitter, 1 + jitter)


@dataclass(frozen=True, slots=True)
class HookCall:
    """One claimed delivery of a hook: its row's id (the idempotency key), where it goes, the
    summary to send (JSON text), which attempt this is, and the claim that fences its outcome."""

    id: int
    queue: str
    key: str
    hook: str
    target: str
    payload: str
    attempt: int
    claim: str

    @property
    def status(self) -> str:
        """The partition status the hook tells of."""
        return HOOK_EVENTS[self.hook]

    def body(self) -> bytes:
        """What is sent: the summary with the hook's id and name first."""
        return f'{{"id":{self.id},"hook":"{self.hook}",{self.payload[1:]}'.encode()
