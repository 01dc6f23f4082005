"""Persona / voice / seed from a Moshi-style client into a ``SlotPrompt``.

Voice names come straight from the network, so they are resolved strictly inside
``models.voice_prompt_dir``: no absolute paths, no ``..``, and a symlink that points
outside the directory is refused like any unknown name (PersonaPlex joins the name to
its directory unsanitised; peers.md §2).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from rtserve.engines.protocols import SlotPrompt
from rtserve.errors import INVALID_PROMPT, RtserveError

# Tried in order when a name has no suffix ("NATF2" finds "NATF2.pt").
VOICE_SUFFIXES = (".pt", ".wav")
MAX_VOICE_NAME_CHARS = 255


class PromptError(RtserveError, ValueError):
    """A persona/voice/seed the server refuses; ``str()`` is safe to show the client."""

    code = INVALID_PROMPT


def resolve_voice(name: str | None, voice_dir: str | None) -> str | None:
    """The absolute path of voice ``name`` inside ``voice_dir``; ``None`` for no voice."""
    if not name:
        return None
    if voice_dir is None:
        raise PromptError("voice prompts are not configured on this server")
    if len(name) > MAX_VOICE_NAME_CHARS or "\x00" in name or "\\" in name:
        raise PromptError("invalid voice prompt name")
    relative = PurePosixPath(name)
    if relative.is_absolute() or ".." in relative.parts:
        raise PromptError("voice prompt must be a name inside the voice directory")
    root = Path(voice_dir).resolve()
    candidates = [name] if relative.suffix else [name + suffix for suffix in VOICE_SUFFIXES]
    for candidate in candidates:
        # resolve() follows symlinks, so the containment check sees the real target.
        path = (root / candidate).resolve()
        if path.is_relative_to(root) and path.is_file():
            return str(path)
    raise PromptError(f"unknown voice prompt {name!r}")


def parse_seed(raw: str | int | None) -> int | None:
    if raw is None or raw == "":
        return None
    if isinstance(raw, bool):
        raise PromptError("seed must be an integer")
    try:
        seed = int(raw)
    except (TypeError, ValueError):
        raise PromptError("seed must be an integer") from None
    if not 0 <= seed < 2**63:
        raise PromptError("seed must be between 0 and 2**63-1")
    return seed


def prompt_from_query(query: Mapping[str, str], voice_dir: str | None) -> SlotPrompt:
    """``/api/chat?text_prompt=&voice_prompt=&seed=`` (PersonaPlex query parameters)."""
    return SlotPrompt(
        text=query.get("text_prompt") or None,
        voice=resolve_voice(query.get("voice_prompt"), voice_dir),
        seed=parse_seed(query.get("seed")),
    )
