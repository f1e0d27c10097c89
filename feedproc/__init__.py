"""feedproc: partitioned fan-out/fan-in workflows, kept in SQLite or PostgreSQL.

Public API: `Feed` (producers), `Processor`, `Item`, `Response`, `HTTPProcessor`,
`PermanentError`, `RetryLater`, and `Watcher` for running a watcher inside your own program.
"""

from __future__ import annotations

from ._version import __version__
from .core.errors import (
    DatabaseUnavailable,
    DuplicateKey,
    FeedprocError,
    InvalidInput,
    NotFound,
    PermanentError,
    Refused,
    RetryLater,
    SchemaMissing,
)
from .core.models import Item, NewItem, Response
from .feed import Feed
from .processors import HTTPProcessor, Processor
from .watcher import Watcher, WatcherConfig

__all__ = [
    "DatabaseUnavailable",
    "DuplicateKey",
    "Feed",
    "FeedprocError",
    "HTTPProcessor",
    "InvalidInput",
    "Item",
    "NewItem",
    "NotFound",
    "PermanentError",
    "Processor",
    "Refused",
    "Response",
    "RetryLater",
    "SchemaMissing",
    "Watcher",
    "WatcherConfig",
    "__version__",
]
