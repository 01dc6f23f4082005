"""moshi-server's text-to-speech protocol: ``WS /api/tts_streaming`` (MessagePack; Kyutai TTS, else Piper)."""

from rtserve.web.tts_streaming.routes import setup

__all__ = ["setup"]
