"""The transport-agnostic session core: manager, runners, bounded output buffers, resume.

In-process API (what transports wrap)::

    manager = SessionManager(engine, config.sessions, clock=SystemClock(), registry=registry)
    await manager.start()                                  # the reaper
    handle = await manager.open(SessionConfig(...), projection=RealtimeProjection("ga", duplex=True))
    async for delivery in handle.attachment.deliveries():  # or: async for event in handle.attachment
        send(delivery.text)                                # compact JSON incl. server_event_seq
    handle.submit(AppendAudio(audio=pcm, event_id="evt_1"))   # -> None or the ErrorEvent refusal
    handle.attachment.detach()                             # transport lost its client: grace starts
    attachment = manager.resume(session_id, resume_token=..., expected_generation=...,
                                control_id=..., last_received_seq=...)
    await handle.close()                                   # session.closed after engine cleanup
    await manager.shutdown()
"""

from rtserve.engines.turn_detection import TurnDetection
from rtserve.sessions.attachment import Attachment, Delivery
from rtserve.sessions.buffer import OutputBuffer
from rtserve.sessions.errors import OutputOverflowError, SessionError
from rtserve.sessions.handle import SessionHandle
from rtserve.sessions.manager import SessionManager
from rtserve.sessions.projections import NativeDuplexProjection, Projection, RealtimeProjection
from rtserve.sessions.session_config import SessionConfig

__all__ = [
    "Attachment",
    "Delivery",
    "NativeDuplexProjection",
    "OutputBuffer",
    "OutputOverflowError",
    "Projection",
    "RealtimeProjection",
    "SessionConfig",
    "SessionError",
    "SessionHandle",
    "SessionManager",
    "TurnDetection",
]
