"""Sentence cutting for streamed TTS (no model)."""

from __future__ import annotations

import time

from hypothesis import given
from hypothesis import strategies as st

from rtserve.engines.cascade.sentences import SentenceSplitter, speakable, split_sentences


def test_sentences_complete_as_soon_as_the_next_word_starts() -> None:
    splitter = SentenceSplitter()
    assert splitter.feed("The capital of France is Paris.") == []  # could still be "Paris.com"
    assert splitter.feed(" It is") == ["The capital of France is Paris."]
    assert splitter.feed(" lovely!") == []
    assert splitter.flush() == "It is lovely!"
    assert splitter.flush() is None


def test_abbreviations_decimals_and_quotes() -> None:
    text = 'Dr. Smith paid 3.50 dollars, e.g. for tea. "Really?" she asked. Yes\nNext line'
    assert split_sentences(text) == [
        "Dr. Smith paid 3.50 dollars, e.g. for tea.",
        '"Really?"',
        "she asked.",
        "Yes",
        "Next line",
    ]


def test_a_run_without_an_end_is_cut_at_a_comma_or_space() -> None:
    splitter = SentenceSplitter(max_chars=40)
    pieces = splitter.feed("one two three four five six, seven eight nine ten eleven twelve")
    assert pieces == ["one two three four five six,"]
    assert all(len(p) <= 40 for p in pieces)


def test_a_long_first_sentence_is_never_cut_inside_a_number() -> None:
    """The voice would say "three hundred eighty-four" ... "four hundred": a wrong number."""
    splitter = SentenceSplitter(first_max_chars=48, first_clause_chars=12)
    text = "The moon is approximately 384,400 kilometres away from the Earth on average."
    pieces = [p for word in text.split(" ") for p in splitter.feed(word + " ")]
    assert pieces[0] == "The moon is approximately 384,400 kilometres"
    assert " ".join(pieces) == text


@given(st.text(alphabet="ab .!?,\n", max_size=200), st.integers(1, 7))
def test_streaming_in_any_pieces_gives_the_same_sentences(text: str, step: int) -> None:
    splitter = SentenceSplitter()
    streamed = []
    for start in range(0, len(text), step):
        streamed += splitter.feed(text[start : start + step])
    tail = splitter.flush()
    streamed += [tail] if tail else []
    assert streamed == split_sentences(text)
    # Nothing is lost but whitespace.
    assert "".join(streamed).replace(" ", "").replace("\n", "") == text.replace(" ", "").replace("\n", "")


def test_speakable_drops_markup() -> None:
    assert speakable("**Paris** is the `capital`  of #France") == "Paris is the capital of France"


def test_the_first_piece_has_a_tighter_bound() -> None:
    splitter = SentenceSplitter(max_chars=60, first_max_chars=20)
    text = "Well, one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
    pieces = [p for start in range(0, len(text), 3) for p in splitter.feed(text[start : start + 3])]
    assert pieces[0] == "Well,"
    assert all(len(p) <= 60 for p in pieces[1:]) and any(len(p) > 20 for p in pieces[1:])


def test_the_first_piece_ends_at_its_first_long_enough_clause() -> None:
    splitter = SentenceSplitter(max_chars=240, first_max_chars=80, first_clause_chars=12)
    text = "Sure, the capital of France, as you know, is Paris. It is big, and old. Yes"
    pieces = [p for word in text.split(" ") for p in splitter.feed(" " + word)]
    # "Sure," is too short to speak alone; later pieces are whole sentences again.
    assert pieces == ["Sure, the capital of France,", "as you know, is Paris.", "It is big, and old."]
    assert splitter.flush() == "Yes"


def test_clause_marks_inside_words_and_numbers_do_not_cut() -> None:
    splitter = SentenceSplitter(first_clause_chars=5)
    assert splitter.feed("It costs 1,000 dollars") == []  # no space after the comma
    assert splitter.feed(" - or so; ") == ["It costs 1,000 dollars -"]
    assert splitter.flush() == "or so;"
    for mark in (";", ":", " —"):
        clause = SentenceSplitter(first_clause_chars=5)
        assert clause.feed(f"First part{mark} second part") == [f"First part{mark}"]


def test_a_sentence_that_ends_first_wins_and_no_clause_setting_keeps_sentences() -> None:
    splitter = SentenceSplitter(first_clause_chars=5)
    assert splitter.feed("Hello there, friend. And then,") == ["Hello there, friend."]
    assert splitter.feed(" more") == []  # past the first piece: sentences only
    whole = SentenceSplitter()
    assert whole.feed("Hello there, my friend, how") == []


@given(st.text(alphabet="ab .!?,;\n", max_size=200), st.integers(1, 7), st.integers(1, 30))
def test_clause_cuts_lose_nothing(text: str, step: int, clause: int) -> None:
    splitter = SentenceSplitter(max_chars=60, first_max_chars=30, first_clause_chars=clause)
    streamed = [p for start in range(0, len(text), step) for p in splitter.feed(text[start : start + step])]
    tail = splitter.flush()
    streamed += [tail] if tail else []
    assert "".join(streamed).replace(" ", "").replace("\n", "") == text.replace(" ", "").replace("\n", "")


def test_a_stream_of_abbreviations_costs_time_linear_in_its_length() -> None:
    # Before: each candidate end reread the whole sentence so far; 16 KiB of "e.g. " took 0.8 s
    # of the event loop per streamed-speech event. Now each end reads the few characters before it.
    splitter = SentenceSplitter(240)
    started = time.perf_counter()
    pieces = splitter.feed("e.g. " * 3276)
    assert time.perf_counter() - started < 0.3
    assert all(len(piece) <= 240 for piece in pieces)
    assert " ".join([*pieces, splitter.flush() or ""]).strip() == ("e.g. " * 3276).strip()  # nothing lost


def test_only_a_whole_word_is_an_abbreviation() -> None:
    assert split_sentences("I saw Dr. Who. Then xdr. Who.") == ["I saw Dr. Who.", "Then xdr.", "Who."]
    assert split_sentences("Ask the prof. Then " + "a" * 20 + "etc. Go.") == [
        "Ask the prof. Then " + "a" * 20 + "etc.",
        "Go.",
    ]
