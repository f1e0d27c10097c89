"""The watcher: leases partitions, dispatches their ready items to a Processor, writes the answers.

`engine` holds the `Watcher` and the overview of its loops; the parts are mixins over one shared
state (`state`): `leases` (heartbeat, leasing, hand-overs), `fetching` (the poll loop and the
buffer), `delivery` (workers, suspects delivered alone) and `writing` (group commits).
"""

from .config import WatcherConfig
from .engine import Watcher

__all__ = ["Watcher", "WatcherConfig"]
