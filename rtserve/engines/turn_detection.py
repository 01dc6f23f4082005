"""OpenAI's ``turn_detection`` object, parsed once where it enters: the session config holds
the typed ``TurnDetection`` and hands it to the engine as is."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rtserve.engines.errors import EngineError
from rtserve.errors import INVALID_TURN_DETECTION, UNSUPPORTED_TURN_DETECTION

# ``semantic_vad`` eagerness -> end-of-turn silence: ``high`` ends a turn at server_vad's
# default pause, ``low`` lets the user pause for two seconds (OpenAI's own maximum waits are
# 2, 4 and 8 s; a pause-based detector cannot wait for a thought to finish, so these are shorter).
SEMANTIC_SILENCE_MS: dict[str, int] = {"high": 500, "medium": 1000, "auto": 1000, "low": 2000}


class InvalidTurnDetection(EngineError):
    code = INVALID_TURN_DETECTION


class TurnDetection(BaseModel):
    """Server VAD settings (OpenAI ``server_vad``; docs/peers.md#openai-realtime), defaults as OpenAI's.

    ``create_response``/``interrupt_response`` steer the session core, the rest detection.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    threshold: float = Field(0.5, ge=0.0, le=1.0)
    prefix_padding_ms: int = Field(300, ge=0, le=10_000)
    silence_duration_ms: int = Field(500, ge=0, le=60_000)
    create_response: bool = True
    interrupt_response: bool = True
    # ``semantic_vad``: no turn model here, so eagerness picks the silence that ends a turn
    # (``SEMANTIC_SILENCE_MS``); the VAD's threshold and padding keep their defaults.
    eagerness: Literal["low", "medium", "high", "auto"] | None = None
    # ``server_vad`` only (as OpenAI): with no speech this long after the agent's audio ended,
    # the session core triggers a response (``input_audio_buffer.timeout_triggered``).
    idle_timeout_ms: int | None = Field(None, ge=1, le=3_600_000)

    @property
    def stop_silence_ms(self) -> int:
        """The silence after speech that ends a turn."""
        if self.type == "semantic_vad":
            return SEMANTIC_SILENCE_MS[self.eagerness or "auto"]
        return self.silence_duration_ms

    @classmethod
    def parse(cls, value: Mapping[str, Any]) -> TurnDetection:
        """An OpenAI ``turn_detection`` object -> settings; fields this server has no use
        for are ignored. Raises ``InvalidTurnDetection``."""
        if value.get("type", "server_vad") not in ("server_vad", "semantic_vad"):
            raise InvalidTurnDetection(
                f"turn_detection type {value.get('type')!r} is not supported by this "
                "engine; use 'server_vad', 'semantic_vad' or null",
                code=UNSUPPORTED_TURN_DETECTION,
            )
        try:
            return cls.model_validate({k: v for k, v in value.items() if k in cls.model_fields})
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            field = ".".join(str(p) for p in err["loc"])
            raise InvalidTurnDetection(f"turn_detection.{field}: {err['msg']}") from None
