"""What the voice agent's LLM is told when the client says nothing, or only who to be.

The embedded LLM is small (SmolLM2-135M): without a rule for how to answer it drifts. Given
only a PersonaPlex persona ("You enjoy having a good conversation.", written for a 7B
full-duplex model that was trained on such lines), it answered "What is the capital of
France?" with French word salad; persona plus the answering rule: "The capital of France is
Paris." (docs/peers.md#personaplex).
"""

from __future__ import annotations

ANSWER_RULE = "Answer the question directly and correctly in one short sentence."
DEFAULT_INSTRUCTIONS = f"You are a helpful assistant. {ANSWER_RULE}"


def persona_instructions(persona: str | None) -> str:
    """Instructions for a turn engine from a Moshi client's persona: who to be, then how to answer."""
    return f"{persona.strip()} {ANSWER_RULE}" if persona and persona.strip() else ""
