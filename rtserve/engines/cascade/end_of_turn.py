"""Does a transcript read as a finished sentence? (the early end of a server-VAD turn)

A pause-based detector waits ``silence_duration_ms`` after every pause, because it cannot
tell "What is the capital of France?" from "What is the capital of ..." (a speaker looking
for a word). Whisper can: it punctuates what it hears, closing a finished sentence with
``.``, ``?`` or ``!`` and trailing off with ``...``. A transcript that ends a sentence,
and whose last word is not one a sentence cannot end on ("to", "and", "the", ...), lets
the cascade end the turn sooner (``config.cascade.complete_turn_silence_ms``).
"""

from __future__ import annotations

_CLOSERS = "\"')]”’"
# Words a finished English sentence does not end on: a speaker pausing after one goes on.
_OPEN_ENDINGS = frozenset(
    {
        "a",
        "an",
        "the",
        "and",
        "or",
        "but",
        "so",
        "because",
        "if",
        "than",
        "that",
        "to",
        "of",
        "in",
        "on",
        "at",
        "for",
        "with",
        "from",
        "by",
        "about",
        "into",
        "my",
        "your",
        "our",
        "their",
        "his",
        "her",
        "its",
        "is",
        "are",
        "was",
        "were",
        "um",
        "uh",
        "er",
        "like",
        "which",
        "who",
        "whose",
        "where",
        "when",
        "while",
    }
)


def reads_complete(transcript: str) -> bool:
    """True when ``transcript`` ends a sentence on a word a sentence can end on."""
    text = transcript.strip().rstrip(_CLOSERS)
    if not text or text.endswith(("...", "…")) or text[-1] not in ".?!":
        return False
    words = text.rstrip(".?!").split()
    return bool(words) and words[-1].strip(",;:-").lower() not in _OPEN_ENDINGS
