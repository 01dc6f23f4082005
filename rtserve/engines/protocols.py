"""The seam every layer builds against: the engine protocols.

Three families (docs/design.md#engine-protocols):

* ``FrameModel`` — a lockstep model stepped by the engine thread: one batched
  ``step`` advances every live slot by exactly one frame.
* Turn engines — ``ASREngine``, ``LLMEngine``, ``TTSEngine``: streamed
  request/response, cancellable mid-stream (``aclose()`` on the iterator, or cancelling
  the task that iterates it).
* ``PolicyEngine`` — robot policies: a batch of observations in, a batch of actions out.

On top of them, sessions talk to exactly one thing: a ``SessionEngine`` that opens an
``EngineSession`` per conversation. A session never learns which concrete engine serves
it; it reads ``EngineCapabilities`` and advertises them to clients.

What crosses the seam lives beside it: ``values.py`` (capabilities, prompts, messages,
requests), ``events.py`` (what a session's engine emits), ``errors.py``, and
``turn_detection.py`` (OpenAI's ``turn_detection`` settings). Audio crossing it is always
mono float32 in [-1, 1] at the sample rate the capabilities name; transports resample
before and after.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from rtserve.codecs.pcm import FloatArray
from rtserve.engines.errors import EngineError
from rtserve.engines.events import EngineEvent
from rtserve.engines.kyutai_stt.service import SpeechStreamEngine
from rtserve.engines.turn_detection import TurnDetection
from rtserve.engines.values import (
    ChatMessage,
    EngineCapabilities,
    FrameOutput,
    Pcm,
    PolicyRequest,
    ResponseRequest,
    SamplingParams,
    SessionOptions,
    SlotPrompt,
    TokenDelta,
    TranscriptPiece,
    VoiceInfo,
)
from rtserve.errors import TOKENIZE_UNSUPPORTED


class FrameModel(Protocol):
    """A batched lockstep model. Every method runs on the one engine thread."""

    batch_size: int
    frame_size: int  # samples per frame, in and out
    sample_rate: int
    # Ticks between an input frame and the output frame that answers it (0: the same tick);
    # drains wait for that answer too.
    output_delay_frames: int

    def open_slot(self, slot: int, prompt: SlotPrompt) -> int:
        """Reset slot state to fresh; return how many prefill steps the slot needs (0 = live now)."""
        ...

    def prefill_step(self, slot: int) -> bool:
        """Advance the slot's prefill by one step; True when the slot is ready to go live.

        Called once per tick for each prefilling slot, right before that tick's ``step``
        (a model whose prefill rides the batched step may stage the row here and consume
        it in ``step``). The slot is live from the tick after the one that returned True.
        """
        ...

    def step(self, frames: FloatArray, live: npt.NDArray[np.bool_]) -> list[FrameOutput | None]:
        """Advance all slots by one frame.

        ``frames``: float32 ``[batch_size, frame_size]`` (silence for slots without input);
        ``live``: bool ``[batch_size]``. Returns one entry per slot, ``None`` where not live.
        A slot's output must depend only on that slot's own history (isolation).
        Both arrays are reused by the caller after the call returns: copy what you keep.
        Returned audio belongs to the caller (do not reuse it in a later step).
        """
        ...

    def release(self, slot: int) -> None:
        """Forget the slot's state; it will be reopened with ``open_slot`` before reuse."""
        ...


class ASREngine(Protocol):
    model_name: str  # listed by GET /v1/models, matched against a request's ``model``
    sample_rate: int

    def transcribe(
        self, audio: AsyncIterator[Pcm], *, language: str | None = None, prompt: str | None = None
    ) -> AsyncGenerator[TranscriptPiece, None]:
        """Partial pieces while audio arrives, then exactly one ``final=True`` piece."""
        ...


class LLMEngine(Protocol):
    model_name: str

    def generate(
        self, messages: Sequence[ChatMessage], params: SamplingParams, *, fit_history: bool = False
    ) -> AsyncGenerator[TokenDelta, None]:
        """Token deltas; the last carries ``finish_reason`` and usage counts. ``fit_history`` (voice
        sessions) drops the oldest non-system messages when the conversation outgrows the
        context; without it that is ``context_length_exceeded``."""
        ...


@runtime_checkable
class CountsTokens(Protocol):
    """An ``LLMEngine`` that tells its prompts' tokens and its context (``POST /tokenize`` and
    ``max_model_len`` in ``/v1/models``, as vLLM reports them)."""

    async def tokenize(
        self, prompt: Sequence[ChatMessage] | str, params: SamplingParams, *, add_special_tokens: bool = False
    ) -> list[int]:
        """The ids of ``prompt``: a conversation chat-templated with the generation prompt (and
        ``params.tools``) as ``generate`` would send it whole, however long; or a plain text
        (``add_special_tokens``: with the tokenizer's own, e.g. BOS)."""
        ...

    async def context_tokens(self) -> int | None:
        """The tokens a prompt and its reply may take together; None while the model loads."""
        ...


def token_counter(llm: LLMEngine) -> CountsTokens:
    """``llm`` as a ``CountsTokens``, or the error that says it cannot count."""
    if not isinstance(llm, CountsTokens):
        raise EngineError(f"the LLM {llm.model_name!r} does not count tokens here", code=TOKENIZE_UNSUPPORTED)
    return llm


class TTSEngine(Protocol):
    model_name: str  # listed by GET /v1/models, matched against a request's ``model``
    sample_rate: int
    voices: tuple[str, ...]  # the built-in voices

    def synthesize(self, text: str, *, voice: str | None = None, speed: float = 1.0) -> AsyncGenerator[Pcm, None]:
        """Audio chunks as they are produced (sentence-level or finer)."""
        ...

    async def voice_list(self) -> list[VoiceInfo]:
        """Every voice ``synthesize`` accepts now: built-in, then registered."""
        ...

    async def add_voice(self, name: str, model: bytes, config: bytes) -> VoiceInfo:
        """Register a voice (checked, stored, usable at once); an engine that cannot refuses
        with ``EngineError`` code ``voice_registration_unsupported``."""
        ...

    async def remove_voice(self, name: str) -> None:
        """Forget a registered voice (``voice_not_found``; built-in: ``voice_not_deletable``)."""
        ...


class PolicyEngine(Protocol):
    def server_config(self) -> dict[str, Any]:
        """The handshake dict sent as the first frame (openpi ``policy_server_config``)."""
        ...

    def validate(self, observation: dict[str, Any]) -> None:
        """Raise ``EngineError`` naming the offending key; runs before batching."""
        ...

    def infer(self, batch: Sequence[PolicyRequest]) -> list[dict[str, Any]]:
        """One batched call on the engine thread; one action dict per request, same order."""
        ...

    def reset(self, session_id: str) -> None: ...


@runtime_checkable
class EngineSession(Protocol):
    """One conversation's handle on an engine. All methods are called from the event loop
    and never block it; heavy work happens on the engine's own thread(s)."""

    capabilities: EngineCapabilities

    def push_audio(self, pcm: Pcm) -> None:
        """Queue user audio at ``capabilities.input_sample_rate``. Never blocks; a full
        backlog drops the oldest audio (counted in metrics)."""
        ...

    async def commit_input(self) -> None:
        """End of the user's turn: finalize ASR (emits a final ``InputTranscript``)."""
        ...

    def clear_input(self) -> None: ...

    async def drain(self) -> None:
        """Until all audio pushed so far was stepped and every output frame it produced was
        read from ``events()``: what a lockstep caller awaits (with a timeout) before
        ``close``. Turn engines have no continuous output to drain and return at once."""
        ...

    def respond(self, request: ResponseRequest) -> None:
        """Start generating a response (turn engines); a no-op for lockstep engines."""
        ...

    def set_epoch(self, epoch: int) -> None:
        """Fence: drop every queued or in-flight output stamped with an older epoch and
        cancel work that would produce it."""
        ...

    def configure_turn_detection(self, settings: TurnDetection | None) -> None:
        """New server VAD settings (None = manual commit); the uncommitted turn is dropped.
        Called only when ``capabilities.supports_server_vad``; other engines refuse it."""
        ...

    def events(self) -> AsyncGenerator[EngineEvent, None]: ...

    async def close(self) -> None:
        """Release the slot and every resource. Idempotent."""
        ...


@runtime_checkable
class ForwardsEvents(Protocol):
    """An ``EngineSession`` that can push its events instead of being iterated: what a
    consumer of many sessions uses to take one batch per tick without a task per session."""

    def forward_events(self, sink: Callable[[EngineEvent | None], None]) -> None:
        """From now on call ``sink`` with each event, on the loop, and with ``None`` after the last."""
        ...


@dataclass(frozen=True)
class TurnEngines:
    """Streamed engines behind the HTTP generation routes (``/v1/chat/completions``,
    ``/v1/audio/speech``, ``/v1/audio/transcriptions``). ``None`` = that task is not served.
    Usable once the engine lending them has started."""

    asr: ASREngine | None = None
    llm: LLMEngine | None = None
    tts: TTSEngine | None = None
    # The streaming speech-to-text engine the session engine hears with (``cascade.asr:
    # stt_engine``), lent to ``/api/asr-streaming`` in the same process: one model copy.
    stt: SpeechStreamEngine | None = None


class SessionEngine(Protocol):
    """What sessions and routes use of the engine that serves realtime sessions, wherever it runs
    (in this process, behind the engine link, on a Ray actor)."""

    @property
    def capabilities(self) -> EngineCapabilities: ...

    @property
    def ready(self) -> bool: ...

    async def start(self) -> None:
        """Load models / start threads. ``/health`` is 200 only after this returns."""
        ...

    async def open_session(self, session_id: str, options: SessionOptions) -> EngineSession:
        """A new engine session, or ``CapacityExhausted`` at once."""
        ...

    async def stop(self) -> None: ...

    def model_ids(self) -> list[str]:
        """Names listed by ``GET /v1/models``."""
        ...


class HostedSessionEngine(SessionEngine, Protocol):
    """A session engine whose models this process holds: it also lends them to the HTTP routes
    and to sleep mode (``EngineSet`` builds around one)."""

    def turn_engines(self) -> TurnEngines:
        """The loaded turn engines this engine lends to the HTTP generation routes, so a
        server holds one copy of each model; empty for an engine without any."""
        ...

    def sleep_stages(self) -> Sequence[SleepStage]:
        """The stages sleep mode may unload (``POST /v1/omni/sleep``), in stage-id order;
        empty for an engine that cannot sleep."""
        ...


class SleepStage(Protocol):
    """One model of an engine that sleep mode unloads and wake restores (docs/serving.md#sleep-mode).

    While a stage sleeps its engine refuses new work with ``engine_sleeping``; work in
    flight when it fell asleep ends with that error too, unless the stage lets it finish
    first (the cascade's TTS does, or refuses the sleep with ``stage_busy``)."""

    stage: str  # "vad", "asr", ...

    @property
    def asleep(self) -> bool: ...

    async def release(self) -> None:
        """Drop the model's weights and caches (waits for the model's running job)."""
        ...

    async def restore(self) -> None:
        """Load the weights again; the stage serves once this returns."""
        ...
