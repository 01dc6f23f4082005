"""A turn engine (the embedded cascade) behind a Moshi route.

Moshi's wire has no turn events: the client streams its microphone and plays whatever
comes back. A lockstep engine answers frame by frame on its own (``EngineBridge``); a
turn engine only answers when told that a turn ended. So on a turn engine both Moshi
routes open a session through the session core (``SessionManager``, the same runner
``/v1/realtime`` uses) with OpenAI ``server_vad`` turn detection on: the engine's VAD
ends each spoken turn, the core commits it, transcribes it, starts the response, keeps
the history and cuts an answer short when the user speaks over it. This bridge only
moves audio in and agent audio/text out; it has ``EngineBridge``'s surface, so the
routes do not care which one they hold.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import numpy as np

from rtserve.codecs.pcm import WIRE_SAMPLE_RATE, FloatArray
from rtserve.codecs.resample import StreamResampler
from rtserve.engines.cascade.instructions import persona_instructions
from rtserve.engines.events import EngineFailure
from rtserve.engines.turn_detection import TurnDetection
from rtserve.engines.values import SlotPrompt
from rtserve.errors import ENGINE_ERROR, INTERNAL_ERROR, OUTPUT_BACKPRESSURE, SERVER_ERROR
from rtserve.sessions import SessionConfig, SessionHandle, SessionManager
from rtserve.sessions import commands as cmd
from rtserve.sessions import events as ev
from rtserve.sessions.session_config import check_bounds
from rtserve.web.moshi.bridge import AgentFrame
from rtserve.web.moshi.metrics import MoshiMetrics

log = logging.getLogger(__name__)

_NO_AUDIO = np.zeros(0, np.float32)
# How a session the core ended reads to the route: a failure closes the socket with 1011.
_FAILED_REASONS = frozenset({"engine_closed", INTERNAL_ERROR, OUTPUT_BACKPRESSURE})


def turn_session_config(prompt: SlotPrompt, sessions: SessionManager) -> SessionConfig:
    """The session a Moshi client gets on a turn engine: the persona and how to answer as
    instructions, server VAD with OpenAI's defaults, agent audio at the Moshi wire rate (24 kHz float).
    Raises ``ConfigUpdateError`` for a persona over ``sessions.max_instructions_chars``."""
    check_bounds(sessions.limits, instructions=prompt.text)
    temperature = prompt.sampling.text_temperature if prompt.sampling is not None else None
    return SessionConfig(
        instructions=persona_instructions(prompt.text),
        turn_detection=TurnDetection(),
        output_audio_format="pcm_f32le",
        output_sample_rate=WIRE_SAMPLE_RATE,
        **({"temperature": min(temperature, 2.0)} if temperature is not None else {}),
    )


class TurnBridge:
    """One Moshi conversation on a session-core session (see the module note)."""

    def __init__(self, handle: SessionHandle, *, route: str, metrics: MoshiMetrics) -> None:
        caps = handle.capabilities
        self.handle = handle
        self.failure: EngineFailure | None = None
        self.ended_by_server: str | None = None  # why the core ended the session (e.g. max duration)
        self._frame_samples = caps.input_frame_samples
        self._to_engine = StreamResampler(WIRE_SAMPLE_RATE, caps.input_sample_rate)
        self._frames_in = metrics.frames_in.labels(route)
        self._closed = False

    def push(self, pcm: FloatArray) -> None:
        """User audio at 24 kHz, any length: appended to the session's input (server VAD
        decides where each turn ends)."""
        if self._closed or pcm.size == 0:
            return
        self._append(self._to_engine.process(pcm))

    async def drain(self, timeout_s: float) -> bool:
        """Hand over the resampler's tail. A turn engine has no continuous output to wait for:
        an answer in progress is streamed by ``frames`` until ``close``."""
        if not self._closed:
            self._append(self._to_engine.flush())
        return True

    async def frames(self) -> AsyncIterator[AgentFrame]:
        """Agent audio and its spoken text until the session ends."""
        attachment = self.handle.attachment
        if attachment is None:
            return
        loop = asyncio.get_running_loop()
        async for event in attachment:
            if isinstance(event, ev.AudioDelta):
                yield AgentFrame(event.pcm, None, loop.time())
            elif isinstance(event, ev.TranscriptDelta | ev.TextDelta):
                if event.delta:
                    yield AgentFrame(_NO_AUDIO, event.delta, loop.time())
            elif isinstance(event, ev.ErrorEvent) and event.error_type == SERVER_ERROR:
                log.info("session error on a Moshi route: %s (%s)", event.message, event.code)
            elif isinstance(event, ev.SessionClosed | ev.SessionExpired):
                if event.reason in _FAILED_REASONS:
                    self.failure = EngineFailure(ENGINE_ERROR, f"session ended: {event.reason}")
                elif not self._closed:
                    self.ended_by_server = f"session ended: {event.reason}"
                return

    async def close(self) -> None:
        """End the session (its engine slot is released by the core); idempotent."""
        if self._closed:
            return
        self._closed = True
        await self.handle.close("client_close")

    def _append(self, pcm: FloatArray) -> None:
        if not pcm.size:
            return
        # A refusal (input backpressure) drops this audio; the core counts it.
        self.handle.submit(cmd.AppendAudio(audio=pcm))
        self._frames_in.inc(pcm.size / self._frame_samples)
