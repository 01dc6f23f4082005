"""The seam every layer builds against: engine protocols and what flows across them.

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

Audio crossing this seam is always mono float32 in [-1, 1] at the sample rate the
capabilities name; transports resample before and after.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rtserve.errors import ENGINE_ERROR, RESOURCE_EXHAUSTED, UNSUPPORTED_TURN_DETECTION, RtserveError

Pcm = np.ndarray  # 1-D float32, mono


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine can do; copied verbatim into ``session.created.session.capabilities``."""

    name: str
    mode: Literal["lockstep", "turn"]  # lockstep: frame in -> frame out, no turn control
    input_sample_rate: int
    output_sample_rate: int
    chunk_period_ms: int  # one frame (lockstep) or one streamed audio chunk (turn)
    max_sessions: int
    supports_barge_in: bool
    supports_text_output: bool = True
    supports_server_vad: bool = False
    modalities: tuple[str, ...] = ("audio", "text")
    supports_tools: bool = False  # responses can call functions (``tools`` of session.update)
    supports_speak: bool = False  # a response can say given text verbatim (``ResponseRequest.speak``)

    @property
    def input_frame_samples(self) -> int:
        return self.input_sample_rate * self.chunk_period_ms // 1000

    def public(self) -> dict[str, Any]:
        return {
            "engine": self.name,
            "mode": self.mode,
            "duplex": self.mode == "lockstep",
            "input_sample_rate": self.input_sample_rate,
            "output_sample_rate": self.output_sample_rate,
            "chunk_period_ms": self.chunk_period_ms,
            "max_sessions": self.max_sessions,
            "supports_barge_in": self.supports_barge_in,
            "supports_text_output": self.supports_text_output,
            "supports_server_vad": self.supports_server_vad,
            "modalities": list(self.modalities),
            "supports_tools": self.supports_tools,
            # The keys vLLM-Omni's duplex clients read (docs/sessions.md#capabilities): a lockstep model owns
            # its duplex behaviour; a turn engine's turns come from server VAD in the session core.
            "implementation_level": "model_native_duplex" if self.mode == "lockstep" else "server_vad_turns",
            "input_modes": ["append_audio_chunk"],
            "supports_multi_session": self.max_sessions >= 2,
            "supports_multi_session_same_replica": self.max_sessions >= 2,
            "supports_playback_ack": True,
            # ``response.speak`` (say this text): only an engine with its own text-to-speech stage
            # can be made to; a lockstep model's speech is its own (response_speak_unsupported).
            "supports_response_speak": self.supports_speak,
        }


class EngineError(RtserveError):
    """A failure an engine reports to its caller with a stable, client-safe ``code``."""

    code = ENGINE_ERROR


class CapacityExhausted(EngineError):
    """Every slot is taken; the caller refuses the session at once (never queues)."""

    code = RESOURCE_EXHAUSTED


# ---------------------------------------------------------------------------
# Lockstep frame models (engine thread side)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SlotSampling:
    """Token sampling a client asked for (PersonaPlex's ``/api/chat`` query parameters).

    A ``None`` field keeps the engine's default; a temperature of 0 decodes that stream
    greedily. Frame models without sampling ignore it.
    """

    text_temperature: float | None = None
    text_top_k: int | None = None
    audio_temperature: float | None = None
    audio_top_k: int | None = None


@dataclass(frozen=True)
class SlotPrompt:
    """Conditioning applied when a slot is (re)opened: persona text, voice, seed, sampling."""

    text: str | None = None
    voice: str | None = None
    seed: int | None = None
    sampling: SlotSampling | None = None  # None: the engine's own sampling settings


@dataclass(frozen=True)
class FrameOutput:
    """One frame produced for one slot: exactly ``frame_size`` samples, optional text piece."""

    audio: Pcm
    text: str | None = None
    # Set by the lockstep scheduler, not the model: the slot's input samples gone from its
    # backlog (stepped, trimmed or discarded) once the tick that made this frame took its own.
    input_samples: int | None = None


class FrameModel(Protocol):
    """A batched lockstep model. Every method runs on the one engine thread.

    A model may also declare ``output_delay_frames`` (ticks between an input frame and the
    output frame that answers it); drains then wait for that answer too.
    """

    batch_size: int
    frame_size: int  # samples per frame, in and out
    sample_rate: int

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

    def step(self, frames: np.ndarray, live: np.ndarray) -> list[FrameOutput | None]:
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


# ---------------------------------------------------------------------------
# Turn engines (asyncio side; each streams and can be cancelled mid-stream)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TranscriptPiece:
    text: str
    final: bool


@dataclass(frozen=True)
class ToolSpec:
    """A function the model may call (OpenAI ``{"type": "function", ...}``); ``parameters``
    is the JSON schema its arguments follow (checked by ``rtserve.engines.tools``)."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})


@dataclass(frozen=True)
class ToolChoice:
    """OpenAI ``tool_choice``: ``auto`` (text or a call), ``none`` (text only), ``required``
    (a call to any tool) or, with ``name``, a call to that one function."""

    mode: Literal["auto", "none", "required"] = "auto"
    name: str | None = None  # a forced function (mode "required")


@dataclass(frozen=True)
class ToolCall:
    """A call the assistant made: ``arguments`` is its JSON text, as the model wrote it."""

    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a call being generated: the first piece of call ``index`` names it."""

    index: int
    arguments: str  # the next characters of the JSON arguments
    call_id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class ChatMessage:
    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # assistant: the calls it made
    tool_call_id: str | None = None  # tool: the call this message answers


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.7
    top_p: float = 1.0
    max_tokens: int = 256
    seed: int | None = None
    stop: tuple[str, ...] = ()
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice = ToolChoice()


@dataclass(frozen=True)
class TokenDelta:
    text: str
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_call: ToolCallDelta | None = None  # set on deltas of a function call (``text`` is then "")


class ASREngine(Protocol):
    model_name: str  # listed by GET /v1/models, matched against a request's ``model``
    sample_rate: int

    def transcribe(
        self, audio: AsyncIterator[Pcm], *, language: str | None = None, prompt: str | None = None
    ) -> AsyncIterator[TranscriptPiece]:
        """Partial pieces while audio arrives, then exactly one ``final=True`` piece."""
        ...


class LLMEngine(Protocol):
    model_name: str

    def generate(self, messages: Sequence[ChatMessage], params: SamplingParams) -> AsyncIterator[TokenDelta]:
        """Token deltas; the last carries ``finish_reason`` and usage counts."""
        ...


@dataclass(frozen=True)
class VoiceInfo:
    """One voice a TTS engine speaks with (``GET /v1/audio/voices``)."""

    name: str
    builtin: bool  # shipped or configured: not deletable
    sample_rate: int = 0  # the voice model's own rate (0: not known)
    file_size: int = 0  # registered voices: bytes of the model file
    created_at: int = 0  # registered voices: unix time of registration

    def public(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "builtin": self.builtin,
            "sample_rate": self.sample_rate,
            "file_size": self.file_size,
            "created_at": self.created_at,
        }


class TTSEngine(Protocol):
    model_name: str  # listed by GET /v1/models, matched against a request's ``model``
    sample_rate: int
    voices: tuple[str, ...]  # the built-in voices

    def synthesize(self, text: str, *, voice: str | None = None, speed: float = 1.0) -> AsyncIterator[Pcm]:
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


# ---------------------------------------------------------------------------
# Robot policies
# ---------------------------------------------------------------------------


@dataclass
class PolicyRequest:
    session_id: str
    observation: dict[str, Any]
    reset: bool  # first call of a session, a changed session id, or an explicit reset
    seed: int | None = None  # the client's sampling seed: same seed, same actions (None: the policy's default)


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


# ---------------------------------------------------------------------------
# What sessions talk to
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SpeechStarted:
    audio_ms: int  # offset in the session's input audio


@dataclass(frozen=True)
class SpeechStopped:
    audio_ms: int


@dataclass(frozen=True)
class InputTranscript:
    text: str
    final: bool


@dataclass(frozen=True)
class OutputAudio:
    """Agent audio. ``response_id`` is None for continuous (lockstep) output."""

    pcm: Pcm
    epoch: int
    response_id: str | None = None
    text: str | None = None  # text spoken with this chunk (transcript piece), if any
    tick_due: float | None = None  # lockstep: when (time.monotonic) a tick of its engine was due
    input_samples: int | None = None  # lockstep: ``FrameOutput.input_samples`` of this frame


@dataclass(frozen=True)
class OutputText:
    text: str
    epoch: int
    response_id: str | None = None


@dataclass(frozen=True)
class OutputToolCall:
    """A piece of a function call the response makes (``ToolCallDelta``); text stays in ``OutputText``."""

    delta: ToolCallDelta
    epoch: int
    response_id: str | None = None


@dataclass(frozen=True)
class ResponseFinished:
    response_id: str
    epoch: int
    status: Literal["completed", "cancelled", "failed"]
    usage: dict[str, int] = field(default_factory=dict)
    reason: str | None = None


@dataclass(frozen=True)
class EngineFailure:
    code: str
    message: str


EngineEvent = (
    SpeechStarted
    | SpeechStopped
    | InputTranscript
    | OutputAudio
    | OutputText
    | ResponseFinished
    | EngineFailure
    | OutputToolCall
)


@dataclass(frozen=True)
class ResponseRequest:
    response_id: str
    epoch: int
    messages: tuple[ChatMessage, ...]
    voice: str | None = None
    modalities: tuple[str, ...] = ("audio", "text")
    params: SamplingParams = SamplingParams()
    # Say exactly this (``response.speak``): no generation, the text goes to speech as is.
    # Only sent to engines whose capabilities say ``supports_speak``.
    speak: str | None = None


# ``semantic_vad`` eagerness -> end-of-turn silence: ``high`` ends a turn at server_vad's
# default pause, ``low`` lets the user pause for two seconds (OpenAI's own maximum waits are
# 2, 4 and 8 s; a pause-based detector cannot wait for a thought to finish, so these are shorter).
SEMANTIC_SILENCE_MS: dict[str, int] = {"high": 500, "medium": 1000, "auto": 1000, "low": 2000}

# The one typed form of OpenAI's ``turn_detection`` object: the session config holds one and
# hands it to the engine as is, so it is validated once, where it enters.


class InvalidTurnDetection(EngineError):
    code = "invalid_turn_detection"


class TurnDetection(BaseModel):
    """Server VAD settings (OpenAI ``server_vad``; docs/peers.md#openai-realtime), defaults as OpenAI's.

    ``create_response``/``interrupt_response`` steer the session core, the rest detection.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["server_vad", "semantic_vad"] = "server_vad"
    threshold: float = Field(0.5, ge=0.0, le=1.0)
    prefix_padding_ms: int = Field(300, ge=0, le=10_000)
    silence_duration_ms: int = Field(500, ge=0, le=60_000)
    create_response: bool = True
    interrupt_response: bool = True
    # ``semantic_vad``: no turn model here, so eagerness picks the silence that ends a turn
    # (``SEMANTIC_SILENCE_MS``); the VAD's threshold and padding keep their defaults.
    eagerness: Literal["low", "medium", "high", "auto"] | None = None
    # ``server_vad`` only (as OpenAI): with no speech this long after the agent's audio ended,
    # the session core triggers a response (``input_audio_buffer.timeout_triggered``).
    idle_timeout_ms: int | None = Field(None, ge=1, le=3_600_000)

    @property
    def stop_silence_ms(self) -> int:
        """The silence after speech that ends a turn."""
        if self.type == "semantic_vad":
            return SEMANTIC_SILENCE_MS[self.eagerness or "auto"]
        return self.silence_duration_ms

    @classmethod
    def parse(cls, value: Mapping[str, Any]) -> TurnDetection:
        """An OpenAI ``turn_detection`` object -> settings; fields this server has no use
        for are ignored. Raises ``InvalidTurnDetection``."""
        if value.get("type", "server_vad") not in ("server_vad", "semantic_vad"):
            raise InvalidTurnDetection(
                f"turn_detection type {value.get('type')!r} is not supported by this "
                "engine; use 'server_vad', 'semantic_vad' or null",
                code=UNSUPPORTED_TURN_DETECTION,
            )
        try:
            return cls.model_validate({k: v for k, v in value.items() if k in cls.model_fields})
        except ValidationError as exc:
            err = exc.errors(include_url=False)[0]
            field = ".".join(str(p) for p in err["loc"])
            raise InvalidTurnDetection(f"turn_detection.{field}: {err['msg']}") from None


@dataclass(frozen=True)
class SessionOptions:
    prompt: SlotPrompt = SlotPrompt()
    server_vad: TurnDetection | None = None  # None = manual commit
    # The sampling the session's responses will ask for, when known: lets a turn engine
    # start a reply before the turn has ended (the cascade's preemptive reply).
    sampling: SamplingParams | None = None

    def __post_init__(self) -> None:
        if isinstance(self.server_vad, Mapping):  # a raw OpenAI object given straight to an engine
            object.__setattr__(self, "server_vad", TurnDetection.parse(self.server_vad))


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

    def events(self) -> AsyncIterator[EngineEvent]: ...

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


class SessionEngine(Protocol):
    capabilities: EngineCapabilities

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
    flight when it fell asleep ends with that error too."""

    stage: str  # "vad", "asr", ...

    @property
    def asleep(self) -> bool: ...

    async def release(self) -> None:
        """Drop the model's weights and caches (waits for the model's running job)."""
        ...

    async def restore(self) -> None:
        """Load the weights again; the stage serves once this returns."""
        ...
