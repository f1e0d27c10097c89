"""`Feed`: the one front door of the library, a handle on one feedproc database. Its methods come in
parts a newcomer reads one at a time: producing (`producing.py`: add partitions and items, seal,
pipelines), operating (`operating.py`: retry, cancel, skip, checkpoint, cleanup, queue settings),
reading (`reading.py`: status, items, history, summary...: typed views) and pull workers
(`workers.py`: claim, heartbeat, answer); `base.py` holds what they share."""

from __future__ import annotations

import os

from ..core.policy import RetryPolicy
from ..store import Store
from .base import CONFLICT_RETRIES, FeedBase, ItemLike, retried
from .operating import Operating
from .producing import Producing
from .workers import Workers, check_claim, read_worker_answer


class Feed(Producing, Operating, Workers, FeedBase):
    """A handle on one feedproc database: `url`, else $FEEDPROC_DATABASE_URL, else sqlite:///feedproc.db.

    >>> feed = Feed("sqlite:///feedproc.db")
    >>> feed.migrate()
    >>> feed.add_partition("upload-42", items=[(0, b'{"file": "a.pdf"}')], priority=5)
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        pool_size: int = 5,
        policy: RetryPolicy | None = None,
        table_prefix: str | None = None,
        listen_url: str | None = None,
    ) -> None:
        url = url or os.environ.get("FEEDPROC_DATABASE_URL") or "sqlite:///feedproc.db"
        # table_prefix: whose tables in that database (else $FEEDPROC_TABLE_PREFIX, else feedproc_);
        # listen_url: a direct PostgreSQL connection for notifications beside a transaction pooler
        # (`?feedproc_pooler=transaction`; else $FEEDPROC_LISTEN_DATABASE_URL)
        listen_url = listen_url or os.environ.get("FEEDPROC_LISTEN_DATABASE_URL") or None
        self.store = Store(url, pool_size=pool_size, table_prefix=table_prefix, listen_url=listen_url)
        self.policy = policy or RetryPolicy()  # pull workers' retries: attempts and backoff
        self._twins: list[Feed] = []

    @staticmethod
    def check_url(url: str) -> None:
        """Raise InvalidInput, one line naming the problem (its password hidden), unless `url` is a
        database URL feedproc can use: `sqlite:///PATH`, `postgresql://...` or `mysql://...`."""
        from ..store.foundations import normalize_url

        normalize_url(url)

    def check_schema(self) -> None:
        """Raise SchemaMissing unless the database holds this version's schema."""
        self.store.check_schema()

    def ping(self) -> None:
        """Raise DatabaseUnavailable unless the database answers a trivial query now."""
        self.store.ping()

    def close(self) -> None:
        """Release the database connections (and those of its twins)."""
        for twin in self._twins:
            twin.close()
        self.store.close()

    def twin(self, *, pool_size: int = 1) -> Feed:
        """Another handle on the same database and tables, with a pool of its own (a health check
        must not queue for a connection behind busy reads); closed with this one."""
        twin = Feed(
            self.store.url,
            pool_size=pool_size,
            policy=self.policy,
            table_prefix=self.store.table_prefix,
            listen_url=self.store.listen_url,
        )
        self._twins.append(twin)
        return twin

    def __enter__(self) -> Feed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def migrate(self) -> tuple[str | None, str | None]:
        """Create or upgrade the schema (idempotent); the revisions before (None: none) and after."""
        return self.store.migrate()


__all__ = ["CONFLICT_RETRIES", "Feed", "ItemLike", "check_claim", "read_worker_answer", "retried"]
