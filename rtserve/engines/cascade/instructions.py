"""What the voice agent's LLM is told when the client says nothing, or only who to be.

The embedded LLM is small (SmolLM2-135M): without a rule for how to answer it drifts. Given
only a PersonaPlex persona ("You enjoy having a good conversation.", written for a 7B
full-duplex model that was trained on such lines), it answered "What is the capital of
France?" with French word salad; persona plus the answering rule: "The capital of France is
Paris." (docs/peers.md#personaplex).

The rule comes with five short question-and-answer examples (none asks a question of
``benchmarks/bench_answer_quality.py``; some share a form with it: a sum, a yes or no, a list).
Answers take the examples' shape (one sentence naming the answer) instead of talk about the
question: the README's "Voice agent quality" has the score they gained with the default,
docs/peers.md#personaplex behind that persona. Their computed state is kept with the rest of the opening, so
they cost the first turn nothing after the first conversation.
"""

from __future__ import annotations

ANSWER_RULE = "Answer the question directly and correctly in one short sentence."
ANSWER_EXAMPLES = (
    ("Who painted the Mona Lisa?", "Leonardo da Vinci painted the Mona Lisa."),
    ("How many hours are in a day?", "A day has twenty-four hours."),
    ("Name two animals.", "A dog and a horse."),
    ("What is four plus four?", "Four plus four is eight."),
    ("Is ice cold? Answer yes or no.", "Yes, ice is cold."),
)
ANSWER_GUIDE = f"{ANSWER_RULE} Examples of good answers: " + " ".join(
    f"'{question}' {answer}" for question, answer in ANSWER_EXAMPLES
)
DEFAULT_INSTRUCTIONS = f"You are a helpful assistant. {ANSWER_GUIDE}"


def persona_instructions(persona: str | None) -> str:
    """Instructions for a turn engine from a Moshi client's persona: who to be, then how to answer."""
    return f"{persona.strip()} {ANSWER_GUIDE}" if persona and persona.strip() else ""
