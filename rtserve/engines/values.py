"""The values that cross the engine seam (``protocols.py``): capabilities, slot prompts and
frames of lockstep models, chat messages, tool calls and sampling of turn engines, policy
requests, and what a session asks of its engine.

Audio is always mono float32 in [-1, 1] at the sample rate the capabilities name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rtserve.codecs.pcm import FloatArray
from rtserve.engines.turn_detection import TurnDetection

Pcm = FloatArray  # 1-D, mono


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
    # ``semantic_vad`` turn detection: the turn's end judged from what was said, not only the pause
    supports_semantic_vad: bool = False
    modalities: tuple[str, ...] = ("audio", "text")
    supports_tools: bool = False  # responses can call functions (``tools`` of session.update)
    supports_speak: bool = False  # a response can say given text verbatim (``ResponseRequest.speak``)
    supports_vision: bool = False  # user messages may carry images (``ChatMessage.images``: camera frames)

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
            "supports_semantic_vad": self.supports_semantic_vad,
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
            "supports_vision": self.supports_vision,
        }


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
class TranscriptStep:
    """What a listening model (streaming speech-to-text) read in one frame of one slot; its
    client assembles words from these (the tokenizer's padding ids mark word boundaries)."""

    index: int  # the slot's step number since it opened, prefill steps included
    token: int  # the text token id, padding ids included
    scores: tuple[float, ...] = ()  # per extra head, the probability of its first class (end of turn)


@dataclass(frozen=True)
class SpeechStep:
    """Where a speaking model (streaming text-to-speech) stands after a step of one slot. Counts
    are totals since the slot opened, so a frame dropped on the way loses only its audio."""

    steps: int  # steps the slot took
    words_started: int  # words (pauses included) the model began to speak
    done: bool  # the text ran out after end of stream and the final padding was spoken
    overflow: bool = False  # the words could not be fed (lookahead overflow): the stream must end
    full_steps: int = 0  # of ``steps``, those taken in a full step of the batch (the rest: pre-audio steps)
    # ``steps`` when each word begun since the slot's previous output began (an output may cover
    # several steps); a word missing here (an output dropped) is placed at ``steps``
    word_starts: tuple[int, ...] = ()


@dataclass(frozen=True)
class FrameOutput:
    """One frame produced for one slot: exactly ``frame_size`` samples (none from a model that
    only listens), optional text piece, and a listening model's ``transcript`` step."""

    audio: Pcm
    text: str | None = None
    # Set by the lockstep scheduler, not the model: the slot's input samples gone from its
    # backlog (stepped, trimmed or discarded) once the tick that made this frame took its own.
    input_samples: int | None = None
    transcript: TranscriptStep | None = None
    speech: SpeechStep | None = None  # a speaking model's progress (its audio may be empty)

    def with_input_samples(self, input_samples: int) -> FrameOutput:
        """This frame with the scheduler's ``input_samples``. Every field written out, not
        ``dataclasses.replace``: the scheduler calls this for every row of every tick, and
        ``replace`` (which inspects the fields each call) costs twice as much."""
        return FrameOutput(self.audio, self.text, input_samples, self.transcript, self.speech)


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
    # user: images as ``data:image/jpeg;base64,...`` URLs, shown to a vision LLM after the text
    images: tuple[str, ...] = ()


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


@dataclass
class PolicyRequest:
    session_id: str
    observation: dict[str, Any]
    reset: bool  # first call of a session, a changed session id, or an explicit reset
    seed: int | None = None  # the client's sampling seed: same seed, same actions (None: the policy's default)


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


@dataclass(frozen=True)
class SessionOptions:
    prompt: SlotPrompt = SlotPrompt()
    server_vad: TurnDetection | None = None  # None = manual commit
    # The sampling the session's responses will ask for, when known: lets a turn engine
    # start a reply before the turn has ended (the cascade's preemptive reply).
    sampling: SamplingParams | None = None
    route: str = ""  # the URL path the session came in on: labels the engine's per-route metrics

    def __post_init__(self) -> None:
        if isinstance(self.server_vad, Mapping):  # a raw OpenAI object given straight to an engine
            object.__setattr__(self, "server_vad", TurnDetection.parse(self.server_vad))
