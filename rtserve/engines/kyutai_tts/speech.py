"""The Kyutai TTS engine as a turn-engine ``TTSEngine`` (docs/engines.md#kyutai-tts-over-http), so the
speech routes (``POST /v1/audio/speech``, ``WS /v1/audio/speech/stream``, ``GET /v1/audio/voices``)
speak with it through their own code, as they speak with Piper.

``synthesize`` is one stream on the engine: the whole text in, its end, then the audio frames as
the engine makes them (ahead of playback, ``tts_engine.run_ahead``). The voice is checked before a
slot is taken: a name in ``tts_engine.voices``; none, or one of OpenAI's names (clients send one by
default), is ``tts_engine.default_voice``. The model has no speaking-rate control, so ``speed``
other than 1 is refused; its voices are files an operator puts in the folder, so registering or
deleting one over HTTP is refused too.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncGenerator

from rtserve.codecs.pcm import FloatArray
from rtserve.engines.errors import EngineError
from rtserve.engines.kyutai_tts.engine import KyutaiTTSEngine
from rtserve.engines.kyutai_tts.stream import SpeechAudio
from rtserve.engines.values import VoiceInfo
from rtserve.errors import INVALID_VALUE, VOICE_NOT_DELETABLE, VOICE_REGISTRATION_UNSUPPORTED

MODEL_NAME = "kyutai-tts"


class KyutaiSpeech:
    def __init__(self, engine: KyutaiTTSEngine) -> None:
        self._engine = engine
        self.model_name = MODEL_NAME
        self.sample_rate = engine.sample_rate  # Mimi's 24 kHz
        self.voices: tuple[str, ...] = ()  # the folder's voices as last listed (``voice_list``)
        self._ids = itertools.count()

    async def synthesize(
        self, text: str, *, voice: str | None = None, speed: float = 1.0
    ) -> AsyncGenerator[FloatArray, None]:
        """The speech of ``text``, one engine frame (80 ms) at a time as it is made."""
        if speed != 1.0:
            raise EngineError(
                "this voice model speaks at one rate: speed must be 1.0", code=INVALID_VALUE, param="speed"
            )
        stream = await self._engine.open_stream(f"speech-{next(self._ids)}", voice)
        try:
            stream.send_text(text)
            stream.end()
            async for event in stream.events():
                if isinstance(event, SpeechAudio):
                    yield event.pcm
        finally:
            with contextlib.suppress(asyncio.CancelledError):
                await stream.close()

    async def voice_list(self) -> list[VoiceInfo]:
        names = await asyncio.to_thread(self._engine.voice_names)
        self.voices = tuple(names)
        return [VoiceInfo(name, builtin=True, sample_rate=self._engine.sample_rate) for name in names]

    async def add_voice(self, name: str, model: bytes, config: bytes) -> VoiceInfo:
        raise EngineError(
            "the Kyutai TTS engine's voices are embeddings in tts_engine.voices; they cannot be uploaded",
            code=VOICE_REGISTRATION_UNSUPPORTED,
        )

    async def remove_voice(self, name: str) -> None:
        raise EngineError(
            f"the voice {name!r} is a file in tts_engine.voices and cannot be deleted over HTTP",
            code=VOICE_NOT_DELETABLE,
            param="name",
        )
