"""Hypothesis strategies shared by the socket fuzz modules."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(["", "inf", "-1", "audio", "text", "user", "\x00", "\ud7ff", "9" * 40]),
)


def json_values(max_leaves: int = 8) -> st.SearchStrategy[Any]:
    """Any JSON value (NaN and infinities included, as Python's encoder writes them)."""
    return st.recursive(
        _scalars,
        lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
        max_leaves=max_leaves,
    )


def mutated(data: bytes) -> st.SearchStrategy[bytes]:
    """``data`` with a few bytes overwritten, truncated, or with random bytes appended."""
    edits = st.lists(st.tuples(st.integers(0, max(0, len(data) - 1)), st.integers(0, 255)), max_size=6)

    def apply(args: tuple[list[tuple[int, int]], int, bytes]) -> bytes:
        changes, cut, tail = args
        out = bytearray(data)
        for position, value in changes:
            if out:
                out[position % len(out)] = value
        return bytes(out[:cut]) + tail

    return st.tuples(edits, st.integers(0, len(data)), st.binary(max_size=16)).map(apply)
