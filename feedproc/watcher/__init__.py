"""The watcher: leases partitions, dispatches their ready items to a Processor, writes the answers.

`engine` holds the `Watcher`, which builds its parts and runs their loops; each part is an object
owning its state: `routing` (the pipeline and queue settings followed), `leases` (the lease book,
the heartbeat), `flight` (the items in flight, the ready buffer), `fetching` (the poll loop),
`maintenance` (the poll loop's bookkeeping, schedules, retention), `isolation` (suspects delivered
alone), `delivery` (the workers) and `writing` (the completer: group commits). `calls` is what they
share: database calls and their health, the lifecycle, the poll loop's wake-ups.
"""

from .config import WatcherConfig
from .engine import Watcher

__all__ = ["Watcher", "WatcherConfig"]
