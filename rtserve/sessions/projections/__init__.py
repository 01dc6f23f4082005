"""Renderings of the typed session events as wire JSON: OpenAI Realtime (GA or beta
names, optional duplex extensions, or turn-based without them) and the native ``/v1/duplex`` dialect."""

from rtserve.sessions.projections.base import Projection, compact_json, utf8_len, with_seq
from rtserve.sessions.projections.native import NativeDuplexProjection
from rtserve.sessions.projections.realtime import RealtimeProjection
from rtserve.sessions.projections.turn_based import TurnBasedProjection

__all__ = [
    "NativeDuplexProjection",
    "Projection",
    "RealtimeProjection",
    "TurnBasedProjection",
    "compact_json",
    "utf8_len",
    "with_seq",
]
