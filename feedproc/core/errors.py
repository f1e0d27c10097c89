"""Every exception of feedproc, in one place.

`FeedprocError`s are what callers of `Feed`, the CLI and the API see: each carries the CLI's exit code
(`exit_code`: 2 for malformed input, 1 for a refusal or a failure) and the HTTP API's status
(`http_status`). The rest are signals between parts of feedproc (`StaleWrite`, `WatcherGone`) or
raised by processors (`PermanentError`, `RetryLater`) and about them (`InvalidAnswer`)."""

from __future__ import annotations


class FeedprocError(Exception):
    """Base class of feedproc's own errors."""

    exit_code = 1
    http_status = 400


class InvalidInput(FeedprocError, ValueError):
    """The input itself is malformed (bad JSON, negative gate, bad key, bad processor path)."""

    exit_code = 2
    http_status = 400  # (422: a request that does not match the API's schema)


class TooLarge(InvalidInput):
    """A request over a size limit: more items in one request than `feedproc serve --max-items`,
    more children in one answer than `--max-children` (HTTP 413; nothing is written)."""

    http_status = 413


class Refused(FeedprocError):
    """A well-formed request the current state does not allow (sealed, finished, gate too low...)."""

    http_status = 409


class StaleClaim(Refused):
    """A pull worker's token no longer holds its item: `reason` is "expired" (the claim ran out),
    "cancelled" (the item or its partition was cancelled) or "superseded" (the item changed
    otherwise: answered already, retried, delivered by a watcher). Nothing was changed."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class DuplicateKey(Refused):
    """A partition with that key exists already."""


class NotFound(FeedprocError, KeyError):
    """No partition with that key."""

    http_status = 404

    def __str__(self) -> str:  # KeyError would print the repr of its argument
        return str(self.args[0]) if self.args else "not found"


class SchemaMissing(FeedprocError):
    """The database has no (or an outdated) feedproc schema."""

    http_status = 503


class SchemaAhead(SchemaMissing):
    """The database's schema is newer than this feedproc knows: feedproc must be upgraded (migrating
    cannot help, and changes nothing)."""


class DatabaseUnavailable(FeedprocError):
    """The database cannot do its work now: it cannot be reached, is shutting down or restarting, or
    has no connection left (and the subclasses below). Transient: the watcher's loops wait it out
    with backoff, and the command line and the API say so in one line (exit 1, 503)."""

    http_status = 503


class DatabaseRefusesWrites(DatabaseUnavailable):
    """The database answers but refuses to write: it is read-only (a replica, a demoted primary,
    read-only storage) or its disk is full. Reads still work, so only a write shows it is over."""


class DatabaseConflict(DatabaseUnavailable):
    """The database aborted a transaction in a conflict with another one (a serialization failure,
    a deadlock, a lock wait timeout): nothing of it was written, and running it again succeeds.
    `Feed` retries it; the watcher's loops retry it as they retry an outage."""


class DatabaseRefused(FeedprocError):
    """The database refused a statement for a reason that is not an outage (a value or a constraint
    it does not accept). Its message is the first line of the database's, never the statement or its
    parameters; `unique` says whether a unique constraint refused it."""

    http_status = 500

    def __init__(self, message: str, *, unique: bool = False) -> None:
        super().__init__(message)
        self.unique = unique


class PermanentError(Exception):
    """Raise from a Processor to fail an item at once, without retries."""


class TooManyChildren(PermanentError):
    """An answer with more child items than the limit (`--max-children`): a permanent failure of
    its item, since the same answer would be refused every time. Raised before any child is built."""

    def __init__(self, count: int, limit: int) -> None:
        super().__init__(f"answer has {count} children; the limit is {limit} (--max-children)")
        self.count = count
        self.limit = limit


class RetryLater(Exception):
    """Raise from a Processor for a transient failure with a minimum delay before the next attempt.

    `pushback`: the handler pushed back ("429": too many requests, not processed; "503": unavailable;
    "timeout": it did not answer in time): the fleet's concurrency for its gate backs off (adaptive
    concurrency), and a "429" is a "not yet" (the item was not worked on), not a spent attempt."""

    def __init__(
        self, message: str = "retry later", *, after: float | None = None, pushback: str | None = None
    ) -> None:
        super().__init__(message)
        self.after = after
        self.pushback = pushback


class Accepted(Exception):
    """A handler answered `202 {"accepted": true}`: it will send the item's answer later to the
    worker API with `token`, within `lease_seconds` (heartbeats extend it)."""

    def __init__(self, token: str, lease_seconds: float) -> None:
        super().__init__(f"accepted: the answer comes later (within {lease_seconds:g}s)")
        self.token = token
        self.lease_seconds = lease_seconds


class InvalidAnswer(Exception):
    """A processor's answer does not follow the contract (a transient failure)."""

    def __str__(self) -> str:
        return f"invalid answer: {self.args[0] if self.args else ''}"


class StaleWrite(Exception):
    """A guarded write matched fewer rows than it must have; the transaction was rolled back."""


class WatcherGone(Exception):
    """The watcher's registration was removed (it was presumed dead)."""
