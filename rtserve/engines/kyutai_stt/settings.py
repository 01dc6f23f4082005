"""What a Kyutai STT checkpoint's ``stt_config`` says, in frames (docs/engines.md#kyutai-stt-engine).

The text stream lags the audio by ``audio_delay_seconds``: the token about the audio of
frame ``f`` comes out at step ``f + delay``. Training put ``audio_silence_prefix_seconds``
of silence before every utterance, so a fresh stream is first fed that much silence (the
reference inference scripts do the same, ``ceil(seconds x frame rate)`` frames), and
draining a stream feeds ``ceil(delay x frame rate)`` frames of silence after its audio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rtserve.engines.moshi.lm_config import CheckpointError


@dataclass(frozen=True)
class SttSettings:
    delay_s: float  # audio_delay_seconds
    prefix_s: float  # audio_silence_prefix_seconds
    frame_rate: float  # Mimi frames per second (12.5)
    max_delay: int  # the LM's largest stream delay: tokens come out this many steps after they are made

    @property
    def prefix_frames(self) -> int:
        return math.ceil(self.prefix_s * self.frame_rate)

    @property
    def delay_frames(self) -> int:
        """Steps between an audio frame and the step whose output reports its text."""
        return math.ceil(self.delay_s * self.frame_rate) + self.max_delay

    @classmethod
    def from_config(cls, stt_config: dict[str, Any], frame_rate: float, max_delay: int) -> SttSettings:
        values = {}
        for key, default in (("audio_delay_seconds", None), ("audio_silence_prefix_seconds", 0.0)):
            value = stt_config.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 60:
                raise CheckpointError(f"config.json: stt_config.{key} must be a number of seconds in [0, 60]")
            values[key] = float(value)
        return cls(values["audio_delay_seconds"], values["audio_silence_prefix_seconds"], frame_rate, max_delay)
