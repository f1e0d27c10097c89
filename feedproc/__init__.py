"""feedproc: partitioned fan-out/fan-in workflows, kept in SQLite, PostgreSQL or MariaDB/MySQL.

Public API: `Feed` (producers), `Processor`, `TransactionalProcessor` (one that completes in its
answer's transaction), `Item`, `Response`, `HTTPProcessor`,
`PermanentError`, `RetryLater`, `Pipeline` (a queue's gates as Python functions), `Watcher` for
running a watcher inside your own program, `RemoteWorker` for a pull worker that claims items
from `feedproc serve`, `HookView` (a completion hook's delivery, as `Feed.hooks` reads it) and
`verify_signature` for a receiver of completion hooks.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .core.errors import (
    DatabaseConflict,
    DatabaseRefused,
    DatabaseRefusesWrites,
    DatabaseUnavailable,
    DuplicateKey,
    FeedprocError,
    InvalidInput,
    NotFound,
    PermanentError,
    Refused,
    RetryLater,
    SchemaAhead,
    SchemaMissing,
)
from .core.hooks import verify as verify_signature
from .core.models import AddedPartition, Item, NewItem, Response

if TYPE_CHECKING:
    from .core.views import HookView
    from .feed import Feed
    from .processors import HTTPProcessor, Processor
    from .processors.pipeline import Pipeline
    from .processors.transactional import TransactionalProcessor
    from .watcher import Watcher, WatcherConfig
    from .worker import RemoteWorker

# Imported on first use: each command line run (`feedproc status`, `feedproc add`) would otherwise
# import the watcher, the processors and their HTTP client first (`feedproc status` on SQLite took
# 0.68 s with them, 0.42 s without).
_LAZY = {
    "Feed": ".feed",
    "HookView": ".core.views",
    "HTTPProcessor": ".processors",
    "Processor": ".processors",
    "Pipeline": ".processors.pipeline",
    "TransactionalProcessor": ".processors.transactional",
    "Watcher": ".watcher",
    "WatcherConfig": ".watcher",
    "RemoteWorker": ".worker",
}


if not TYPE_CHECKING:  # (declared to type checkers, a module __getattr__ would let any name through)

    def __getattr__(name: str) -> Any:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module 'feedproc' has no attribute {name!r}")
        value = getattr(importlib.import_module(module, __name__), name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "AddedPartition",
    "DatabaseConflict",
    "DatabaseRefused",
    "DatabaseRefusesWrites",
    "DatabaseUnavailable",
    "DuplicateKey",
    "Feed",
    "FeedprocError",
    "HTTPProcessor",
    "HookView",
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
    "SchemaAhead",
    "SchemaMissing",
    "TransactionalProcessor",
    "Watcher",
    "WatcherConfig",
    "__version__",
    "verify_signature",
]
