"""Collected results (fan-in): what the items of an earlier gate of a partition produced, read for
the item that collects them, counted and a page at a time (`core.fanin.Collected`)."""

from __future__ import annotations

from .base import StoreBase


class Collecting(StoreBase):
    """The results an item at a collecting gate receives."""
