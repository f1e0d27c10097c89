"""Enqueue in your transaction (issue 33), as a watcher sees it: a partition added in the caller's
transaction is served once the caller commits, within the usual latency (PostgreSQL: the NOTIFY its
commit sends; SQLite and MariaDB: the next poll), and one rolled back is never served."""

from __future__ import annotations

import pytest

from feedproc import Feed

from ..support import Done, wait_status, watching


class Abort(Exception):
    """The caller's reason to roll its transaction back."""


def test_a_committed_add_is_served_and_a_rolled_back_one_never(db_url: str, feed: Feed) -> None:
    served = Done()
    with watching(db_url, served):
        with pytest.raises(Abort), feed.begin() as conn:
            feed.add_partition("rolled-back", [(0, b'"rolled back"')], connection=conn)
            raise Abort
        with feed.begin() as conn:
            feed.add_partition("committed", [(0, b'"committed"')], connection=conn)
        wait_status(feed, "committed", "complete")
    assert served.seen == [b'"committed"']
    assert feed.queue_of("rolled-back") is None


@pytest.mark.postgres_only  # the commit's NOTIFY wakes the watcher; SQLite and MariaDB poll
def test_a_commit_wakes_the_watcher_at_once_not_at_its_next_poll(db_url: str, feed: Feed) -> None:
    served = Done()
    with watching(db_url, served, poll_interval=60.0):
        feed.add_partition("warm-up", [(0, b'"warm-up"')])  # the watcher is up and has polled
        wait_status(feed, "warm-up", "complete")
        with feed.begin() as conn:
            feed.add_partition("woken", [(0, b'"woken"')], connection=conn)
        wait_status(feed, "woken", "complete", timeout=15.0)  # a poll would come 60 s after the last
