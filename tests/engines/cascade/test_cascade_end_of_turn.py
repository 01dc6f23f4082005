"""Whether a transcript reads as a finished sentence (no model)."""

from __future__ import annotations

import pytest

from rtserve.engines.cascade.end_of_turn import reads_complete


@pytest.mark.parametrize(
    "text", ["What is the capital of France?", "Thanks.", "Tell me a joke!", ' He said "yes."', "Is it 3.5?"]
)
def test_finished_sentences(text: str) -> None:
    assert reads_complete(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "What is the capital of",
        "I want to go to...",
        "I was thinking…",
        "I would like to.",
        "Me and.",
        "Well, so,",
        "The answer is the.",
    ],
)
def test_unfinished_sentences(text: str) -> None:
    assert not reads_complete(text)
