"""`storable`: text as every database stores it (NUL and lone surrogates escaped, cut to a column
without cutting an escape in half)."""

from __future__ import annotations

import pytest

from feedproc.store.escaping import storable


@pytest.mark.parametrize(
    ("text", "limit", "stored"),
    [
        ("plain", None, "plain"),
        ("x\x00y", None, "x\\u0000y"),
        ("\udcff", None, "\\udcff"),
        ("é€😀", None, "é€😀"),  # characters beyond ASCII, and a whole pair, are not escapes
        ("ab\x00", 7, "ab"),  # the escape would not fit whole
        ("ab\x00", 8, "ab\\u0000"),
        ("abcdef", 3, "abc"),
    ],
)
def test_storable_text(text: str, limit: int | None, stored: str) -> None:
    assert storable(text, limit) == stored
