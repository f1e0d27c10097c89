"""Partition keys and queue names (no database): what is accepted, and look-alikes that are not."""

from __future__ import annotations

import pytest

from feedproc.core.errors import InvalidInput
from feedproc.core.models import check_key, check_queue


@pytest.mark.parametrize("key", ["a", "upload-42", "a/b:c.d_e", "x" * 200])
def test_keys_of_the_allowed_characters_are_accepted(key: str) -> None:
    assert check_key(key) == key


@pytest.mark.parametrize("key", ["", "dup\n", "dup\r\n", "\ndup", "a b", "x" * 201, "é", "a\x00"])
def test_look_alike_and_malformed_keys_are_refused(key: str) -> None:
    with pytest.raises(InvalidInput, match="invalid partition key"):
        check_key(key)


@pytest.mark.parametrize("queue", ["gpu\n", "", "q q", "x" * 101])
def test_malformed_queue_names_are_refused(queue: str) -> None:
    with pytest.raises(InvalidInput, match="invalid queue name"):
        check_queue(queue)
