"""OpenAI Realtime and native duplex protocol: ``WS /v1/realtime`` and ``WS /v1/duplex``."""

from rtserve.web.realtime.routes import setup

__all__ = ["setup"]
