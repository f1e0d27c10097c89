"""feedproc: partitioned fan-out/fan-in workflows, kept in SQLite, PostgreSQL or MariaDB/MySQL.

Public API: `Feed` (producers), `Processor`, `Item`, `Response`, `HTTPProcessor`,
`PermanentError`, `RetryLater`, `Pipeline` (a queue's gates as Python functions), `Watcher` for
running a watcher inside your own program, and `RemoteWorker` for a pull worker that claims items
from `feedproc serve`.
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
from .processors.pipeline import Pipeline
from .watcher import Watcher, WatcherConfig
from .worker import RemoteWorker

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
    "Pipeline",
    "Processor",
    "Refused",
    "RemoteWorker",
    "Response",
    "RetryLater",
    "SchemaMissing",
    "Watcher",
    "WatcherConfig",
    "__version__",
]
