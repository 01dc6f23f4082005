"""What a registered voice may be called: one safe path component.

Letters, digits, ``_``, ``-`` and single inner dots, 1-64 characters, starting and ending
with a letter or digit: never ``..``, never a separator, never a hidden file, so a name
cannot leave the voice folder. Checked where an upload enters (before its bytes are read)
and again where it is stored."""

from __future__ import annotations

import re

from rtserve.engines.errors import EngineError
from rtserve.errors import INVALID_VALUE

# OpenAI's built-in voice names: clients send them by default, so each selects an engine's own voice.
OPENAI_VOICES = frozenset(
    {"alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse", "marin", "cedar"}
)

_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_-]|\.(?!\.)){0,62}[A-Za-z0-9]$|^[A-Za-z0-9]$")


def is_voice_name(name: str) -> bool:
    return bool(_NAME.match(name)) and not name.lower().endswith((".onnx", ".json"))


def check_voice_name(name: str) -> None:
    if not is_voice_name(name):
        raise EngineError(
            "voice name must be 1-64 letters, digits, '_', '-' or single inner dots, starting and "
            "ending with a letter or digit",
            code=INVALID_VALUE,
            param="name",
        )
