"""Moshi / PersonaPlex protocol: ``WS /api/chat`` (Ogg-Opus) and ``WS /v1/audio/duplex`` (raw PCM)."""

from rtserve.web.moshi.routes import setup

__all__ = ["setup"]
