"""openpi robot-policy protocol: ``WS /v1/realtime/robot/openpi`` (MessagePack + numpy markers)."""

from rtserve.web.openpi.routes import setup

__all__ = ["setup"]
