"""JSON from clients is parsed with its nesting bounded, never at the recursion limit."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rtserve import untrusted_json
from rtserve.untrusted_json import MAX_DEPTH, JsonTooDeep, nesting_depth
from rtserve.web.webrtc.channel import client_event_type

DEEP = "[" * 100_000 + "]" * 100_000

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab\n\u00e9'),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet='[{"\\x'), inner, max_size=3),
    max_leaves=30,
)


def depth_of(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    return 0


@given(json_values, st.booleans())
def test_the_depth_counts_brackets_outside_strings_only(value: Any, ascii_only: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert nesting_depth(text) == nesting_depth(text.encode()) == depth_of(value)


@pytest.mark.parametrize("as_bytes", [False, True])
def test_nesting_up_to_the_bound_parses_and_deeper_is_refused(as_bytes: bool) -> None:
    def nested(levels: int) -> str | bytes:
        text = '{"a": ' * (levels - 1) + "[]" + "}" * (levels - 1)
        return text.encode() if as_bytes else text

    assert depth_of(untrusted_json.loads(nested(MAX_DEPTH))) == MAX_DEPTH
    with pytest.raises(JsonTooDeep, match=f"{MAX_DEPTH + 1} levels"):
        untrusted_json.loads(nested(MAX_DEPTH + 1))


def test_many_brackets_inside_strings_are_not_nesting() -> None:
    text = json.dumps({"text": "[{" * 10_000, "escaped": '\\"[' * 1000})
    assert untrusted_json.loads(text) == json.loads(text)


def test_an_unterminated_string_hides_no_nesting_from_the_count() -> None:
    with pytest.raises(ValueError):
        untrusted_json.loads('"' + '\\"' * 50_000 + "[" * 5000)
    with pytest.raises(JsonTooDeep):
        untrusted_json.loads("[" * 5000 + '"\\"')


@pytest.fixture
def gc_on_every_allocation() -> Iterator[list[BaseException]]:
    """A collection at (nearly) every allocation, each running a callback that needs a little stack."""
    failures: list[BaseException] = []

    def needs_stack(levels: int) -> int:
        return 0 if levels == 0 else 1 + needs_stack(levels - 1)

    def callback(_phase: str, _info: dict[str, int]) -> None:
        try:
            needs_stack(20)
        except RecursionError as exc:
            failures.append(exc)

    thresholds = gc.get_threshold()
    gc.callbacks.append(callback)
    gc.set_threshold(1)
    try:
        yield failures
    finally:
        gc.set_threshold(*thresholds)
        gc.callbacks.remove(callback)


def test_deep_input_is_refused_before_the_parser_reaches_the_recursion_limit(
    gc_on_every_allocation: list[BaseException],
) -> None:
    # The server's gc callback (the pause metrics) failed this way when the parser hit the limit.
    with pytest.raises(JsonTooDeep):
        untrusted_json.loads(DEEP)
    assert gc_on_every_allocation == []


def test_a_deep_data_channel_event_has_no_type_instead_of_raising() -> None:
    assert client_event_type("[" * 2048 + "]" * 2048) is None
    assert client_event_type('{"type": "output_audio_buffer.clear"}') == "output_audio_buffer.clear"
