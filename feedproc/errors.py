"""Exceptions users of feedproc see. The CLI maps each to its exit code."""

from __future__ import annotations


class FeedprocError(Exception):
    """Base class of feedproc's own errors."""

    exit_code = 1


class InvalidInput(FeedprocError, ValueError):
    """The input itself is malformed (bad JSON, negative gate, bad key, bad processor path)."""

    exit_code = 2


class Refused(FeedprocError):
    """A well-formed request the current state does not allow (sealed, finished, gate too low...)."""


class DuplicateKey(Refused):
    """A partition with that key exists already."""


class NotFound(FeedprocError, KeyError):
    """No partition with that key."""

    def __str__(self) -> str:  # KeyError would print the repr of its argument
        return str(self.args[0]) if self.args else "not found"


class SchemaMissing(FeedprocError):
    """The database has no (or an outdated) feedproc schema."""


class DatabaseUnavailable(FeedprocError):
    """The database could not be reached."""


class PermanentError(Exception):
    """Raise from a Processor to fail an item at once, without retries."""


class RetryLater(Exception):
    """Raise from a Processor for a transient failure with a minimum delay before the next attempt."""

    def __init__(self, message: str = "retry later", *, after: float | None = None) -> None:
        super().__init__(message)
        self.after = after
