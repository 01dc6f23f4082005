"""Persona / voice / seed / sampling from a Moshi-style client into a ``SlotPrompt``.

Names as PersonaPlex's server and web client use them (docs/peers.md#personaplex): ``text_prompt``,
``voice_prompt``, ``seed`` (-1 = unseeded), ``text_temperature``, ``text_topk``,
``audio_temperature``, ``audio_topk``. Parameters we do not implement (``pad_mult``,
``repetition_penalty``, ...) are ignored, as unknown query parameters are.

Voice names come straight from the network, so they are resolved strictly inside
``models.voice_prompt_dir``: no absolute paths, no ``..``, and a symlink that points
outside the directory is refused like any unknown name (PersonaPlex joins the name to
its directory unsanitised; docs/peers.md#personaplex).

PersonaPlex's web UI always sends one of its stock voices (``voice_prompt=NATF2.pt`` by
default). On a server without ``models.voice_prompt_dir`` (the embedded cascade, a Moshi
checkpoint without voice embeddings) those names get the engine's default voice, so the
UI connects as it does upstream; the fallback is logged at INFO once per process. Any
other name there, and any name missing from a configured directory, is still refused.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from rtserve.engines.values import SlotPrompt, SlotSampling
from rtserve.errors import INVALID_PROMPT, RtserveError

# Tried in order when a name has no suffix ("NATF2" finds "NATF2.pt").
VOICE_SUFFIXES = (".pt", ".wav")
MAX_VOICE_NAME_CHARS = 255
UNSEEDED = -1  # PersonaPlex's seed for "draw a fresh one"
# The voice embeddings PersonaPlex ships (its web UI offers exactly these).
STOCK_VOICES = frozenset(
    {*(f"NAT{g}{i}" for g in "FM" for i in range(4)), *(f"VAR{g}{i}" for g in "FM" for i in range(5))}
)

log = logging.getLogger(__name__)
_fallback_logged = False


class PromptQueryError(RtserveError, ValueError):
    """A persona/voice/seed the server refuses; ``str()`` is safe to show the client."""

    code = INVALID_PROMPT


def resolve_voice(name: str | None, voice_dir: str | None) -> str | None:
    """The absolute path of voice ``name`` inside ``voice_dir``; ``None`` for no voice."""
    if not name:
        return None
    if voice_dir is None:
        if is_stock_voice(name):
            _log_default_voice(name)
            return None
        raise PromptQueryError("voice prompts are not configured on this server")
    if len(name) > MAX_VOICE_NAME_CHARS or "\x00" in name or "\\" in name:
        raise PromptQueryError("invalid voice prompt name")
    relative = PurePosixPath(name)
    if relative.is_absolute() or ".." in relative.parts:
        raise PromptQueryError("voice prompt must be a name inside the voice directory")
    root = Path(voice_dir).resolve()
    candidates = [name] if relative.suffix else [name + suffix for suffix in VOICE_SUFFIXES]
    for candidate in candidates:
        # resolve() follows symlinks, so the containment check sees the real target.
        path = (root / candidate).resolve()
        if path.is_relative_to(root) and path.is_file():
            return str(path)
    raise PromptQueryError(f"unknown voice prompt {name!r}")


def is_stock_voice(name: str) -> bool:
    """``NATF2``, ``NATF2.pt`` and the other names of PersonaPlex's stock voices."""
    stem = name[: -len(".pt")] if name.endswith(".pt") else name
    return stem in STOCK_VOICES


def _log_default_voice(name: str) -> None:
    global _fallback_logged
    if not _fallback_logged:
        _fallback_logged = True
        log.info(
            "voice prompt %r asked for, but models.voice_prompt_dir is not set: using the engine's default "
            "voice (logged once)",
            name,
        )


def parse_seed(raw: str | int | None) -> int | None:
    """A seed, or ``None`` for unseeded (absent, empty, or PersonaPlex's -1)."""
    if raw is None or raw == "":
        return None
    if isinstance(raw, bool):
        raise PromptQueryError("seed must be an integer")
    try:
        seed = int(raw)
    except (TypeError, ValueError):
        raise PromptQueryError("seed must be an integer") from None
    if seed == UNSEEDED:
        return None
    if not 0 <= seed < 2**63:
        raise PromptQueryError("seed must be -1 (unseeded) or between 0 and 2**63-1")
    return seed


def _temperature(query: Mapping[str, str], name: str) -> float | None:
    raw = query.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise PromptQueryError(f"{name} must be a number") from None
    if not math.isfinite(value) or value < 0:
        raise PromptQueryError(f"{name} must be a finite number >= 0 (0 = greedy)")
    return value


def _top_k(query: Mapping[str, str], name: str) -> int | None:
    raw = query.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise PromptQueryError(f"{name} must be an integer") from None
    if value < 0:
        raise PromptQueryError(f"{name} must be >= 0 (0 = no top-k cut)")
    return value


def parse_sampling(query: Mapping[str, str]) -> SlotSampling | None:
    """The sampling parameters the client named; ``None`` when it named none."""
    sampling = SlotSampling(
        text_temperature=_temperature(query, "text_temperature"),
        text_top_k=_top_k(query, "text_topk"),
        audio_temperature=_temperature(query, "audio_temperature"),
        audio_top_k=_top_k(query, "audio_topk"),
    )
    return None if sampling == SlotSampling() else sampling


def prompt_from_query(query: Mapping[str, str], voice_dir: str | None) -> SlotPrompt:
    """``/api/chat`` query parameters (PersonaPlex's names) -> the slot's conditioning."""
    return SlotPrompt(
        text=query.get("text_prompt") or None,
        voice=resolve_voice(query.get("voice_prompt"), voice_dir),
        seed=parse_seed(query.get("seed")),
        sampling=parse_sampling(query),
    )
