"""A client's token-id prompt, checked and converted once: `TokenIds`.

A prompt of token ids arrives as the list that orjson parsed. It must be checked (integers >= 0, no
booleans, no floats) and sent to the scheduler as an int32 array. Element-wise Python checks (type
count, min, max) and numpy's conversion of the list each walked all ids again (for 2,176 ids, ~13% of the
front end's CPU per streamed request); `token_ids` walks the list once in C (array.array) and checks
the bounds on the array.
"""

from __future__ import annotations

import array
from typing import Any

import numpy as np

_INT32_MAX = 2**31 - 1


class TokenIds(list):  # type: ignore[type-arg]
    """A checked token-id prompt: the list of ids (what the handlers read) with the same ids as an
    int32 array [len] (what the scheduler gets). Both are built once by `token_ids` and must not be
    changed afterwards (the array would no longer match)."""

    __slots__ = ("array",)

    def __init__(self, ids: list[int], ids_array: np.ndarray) -> None:
        super().__init__(ids)
        self.array = ids_array


def token_ids(value: list[Any]) -> TokenIds | None:
    """`value` as TokenIds when it is a non-empty list of ints in [0, 2**31) (bools excluded), else None
    (then the caller names the offending element).

    array.array("q") takes exactly the ints and the bools (a float, a string, None or a list raises
    TypeError; an int beyond int64 OverflowError). A bool becomes 0 or 1, so only an array holding a
    0 or a 1 needs the element types counted as well."""
    try:
        arr = np.frombuffer(array.array("q", value), dtype=np.int64)
    except (TypeError, OverflowError):
        return None
    if not arr.size:
        return None
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi > _INT32_MAX:
        return None
    if lo <= 1 and list(map(type, value)).count(int) != len(value):  # a bool among the ids
        return None
    return TokenIds(value, arr.astype(np.int32))


def ids_array(ids: list[int]) -> np.ndarray:
    """int32 [len] array of a prompt: TokenIds' own, else converted (a tokenizer's or template's ids)."""
    return ids.array if type(ids) is TokenIds else np.asarray(ids, dtype=np.int32)


def own_ids(ids: list[int]) -> list[int]:
    """A prompt the request may keep: TokenIds as they are (made for it), any other list copied."""
    return ids if type(ids) is TokenIds else list(ids)
