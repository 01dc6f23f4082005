"""moshi-server's speech-to-text protocol: ``WS /api/asr-streaming`` (msgpack)."""

from rtserve.web.asr_streaming.routes import setup

__all__ = ["setup"]
