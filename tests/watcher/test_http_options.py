"""The settings of a watcher's HTTP processors are typed (`HTTPOptions`); the untyped mapping they
were before is still taken, with a DeprecationWarning. SQLite only: no SQL is involved."""

from __future__ import annotations

import pytest

from feedproc.processors import HTTPOptions
from feedproc.store import Store
from feedproc.watcher import Watcher, WatcherConfig

pytestmark = pytest.mark.sqlite_only


def test_a_watcher_without_http_options_gives_its_gates_its_own_max_children(store: Store) -> None:
    watcher = Watcher(store, None, WatcherConfig(max_children=7))
    assert watcher.http_options == HTTPOptions(max_children=7)


def test_http_options_given_are_the_watchers(store: Store) -> None:
    options = HTTPOptions(timeout=5.0, headers={"X-A": "1"}, callback_url="http://127.0.0.1:9/")
    assert Watcher(store, None, WatcherConfig(), http_options=options).http_options is options


def test_http_options_given_as_a_mapping_are_taken_with_a_deprecation_warning(store: Store) -> None:
    with pytest.warns(DeprecationWarning, match="pass an HTTPOptions"):
        watcher = Watcher(store, None, WatcherConfig(max_children=7), http_options={"timeout": 5.0})
    assert watcher.http_options == HTTPOptions(timeout=5.0, max_children=7)
