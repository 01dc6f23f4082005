"""One validated configuration: YAML file, then ``RTSERVE_*`` environment, then CLI flags.

Every limit the server enforces lives here so operators can change it without code.
Nested fields are addressed in the environment with ``__``:
``RTSERVE_SESSIONS__MAX_SESSIONS=64``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

ENV_PREFIX = "RTSERVE_"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class SessionLimits(_Section):
    """Per-session and per-server limits of the session core (docs/sessions.md#concurrency)."""

    max_sessions: int = Field(64, ge=1, description="live sessions admitted at once; beyond -> resource_exhausted")
    idle_ttl_s: float | None = Field(300.0, gt=0, description="expire a session idle this long; null disables")
    disconnect_grace_s: float = Field(30.0, ge=0, description="keep a detached session resumable this long")
    max_detached_sessions: int = Field(
        32,
        ge=0,
        description="detached sessions kept resumable at once (they hold admission slots); beyond, the one "
        "detached longest ends (detached_limit), so clients that drop connections cannot "
        "fill the server",
    )
    max_session_duration_s: float | None = Field(
        3600.0,
        gt=0,
        description="a turn-based OpenAI Realtime session (not resumable) ends this long after it "
        "opened, as OpenAI's do (error session_expired); idle_ttl_s applies to resumable "
        "(duplex) sessions only; inactivity_timeout_s to both",
    )
    inactivity_timeout_s: float | None = Field(
        300.0,
        gt=0,
        description="end a realtime session (turn-based or duplex, WebSocket or WebRTC) that had no client "
        "event, no response in progress and no output waiting for its client this long (error "
        "session_idle_timeout, then session.expired and the close); null disables",
    )
    reaper_interval_s: float = Field(5.0, gt=0)
    resume_replay_ttl_s: float = Field(60.0, ge=0, description="how long journal entries stay replayable")
    resume_replay_max_bytes_per_session: int = Field(8 * 1024 * 1024, ge=0)
    max_pending_input_bytes_per_session: int = Field(16 * 1024 * 1024, ge=1)
    max_pending_turns_per_session: int = Field(4, ge=1)
    max_pending_output_bytes_per_session: int = Field(2 * 1024 * 1024, ge=1)
    max_pending_output_events_per_session: int = Field(512, ge=1)
    output_reserve_bytes: int = Field(64 * 1024, ge=0, description="extra budget for errors and response endings")
    output_reserve_events: int = Field(8, ge=0)
    close_details_max_bytes: int = Field(4 * 1024, ge=256)
    mailbox_size: int = Field(256, ge=1, description="queued commands + engine events per session runner")
    engine_close_timeout_s: float = Field(
        5.0, gt=0, description="one engine-session cleanup attempt; the reaper retries"
    )
    input_transcript_timeout_s: float = Field(10.0, gt=0, description="wait for a committed turn's final transcript")
    shutdown_timeout_s: float = Field(10.0, gt=0, description="bound on the graceful drain at SIGTERM")
    max_instructions_chars: int = Field(
        32 * 1024, ge=1, description="longest session or response 'instructions'; longer -> invalid_value"
    )
    max_voice_chars: int = Field(256, ge=1, description="longest 'voice' name; longer -> invalid_value")
    max_output_tokens: int = Field(
        4096, ge=1, description="largest 'max_output_tokens' a session or response may ask for; larger -> invalid_value"
    )
    max_conversation_items: int = Field(
        1024,
        ge=1,
        description="items a session's conversation holds; a client item beyond -> conversation_limit_exceeded",
    )
    max_conversation_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="UTF-8 text bytes a session's "
        "conversation holds; a client item beyond -> conversation_limit_exceeded",
    )
    max_video_frames: int = Field(
        4,
        ge=1,
        le=64,
        description="camera frames a session holds for its next user turn (docs/video.md); the oldest go beyond",
    )
    max_conversation_images: int = Field(
        8,
        ge=1,
        description="images (frames and input_image parts) a session's conversation keeps; the oldest go beyond",
    )
    max_speak_chars: int = Field(
        4096,
        ge=1,
        description="longest text a duplex 'response.speak' may ask the engine to say; longer -> invalid_value",
    )
    max_tools: int = Field(
        128,
        ge=0,
        description="function tools in one chat request, session or response (OpenAI's limit); more -> invalid_value",
    )
    max_tool_schema_bytes: int = Field(
        512 * 1024,
        ge=1024,
        description="JSON bytes of all tools' parameter schemas together in one chat request, session or "
        "response, checked before any schema compiles (about 0.4 us a byte, on the codec executor); "
        "more -> invalid_value",
    )
    client_session_ids: bool = Field(
        True,
        description="a duplex connection's '?session_id=' names the session it "
        "opens (else ids are always server-allocated and the parameter is refused)",
    )
    max_session_id_chars: int = Field(
        128, ge=8, description="longest client-chosen session id; longer -> invalid_value"
    )


class TransportLimits(_Section):
    """Wire-level limits shared by every WebSocket and HTTP route."""

    max_ws_message_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    max_http_body_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    ws_heartbeat_s: float = Field(
        20.0,
        gt=0,
        description="WebSocket ping interval (a peer that misses its pong is dropped); not on the routes whose "
        "client reads audio at its own pace: /api/tts_streaming, /v1/audio/speech/stream",
    )
    max_concurrent_http_generations: int = Field(8, ge=1, description="beyond -> 429, never an unbounded queue")
    codec_threads: int = Field(
        2,
        ge=1,
        description="the app's codec executor: threads shared by every route for "
        "codec work (Opus pages, speech encoding, upload decoding)",
    )
    duplex_sessions: bool = Field(
        True,
        description="serve full-duplex sessions (/v1/duplex, /v1/realtime?duplex=1); "
        "off: ?duplex=1 falls back to turn-based, /v1/duplex refuses",
    )
    ws_send_buffer_bytes: int | None = Field(
        None,
        ge=4096,
        description="realtime WebSockets: kernel send buffer and write high-water mark; small values "
        "make a stalled reader's backlog reach its session's bounded output buffer (and "
        "its overflow policy) sooner; null keeps the OS autotuning",
    )
    # aiohttp has one timer for an idle keep-alive connection and for a request head still
    # arriving: it restarts when a connection opens and after each response, not on each byte.
    http_keepalive_timeout_s: float = Field(
        75.0,
        gt=0,
        description="close a connection that has not delivered a whole request head this long after "
        "it opened or after its last response (idle keep-alive, slow or silent headers); "
        "above a reverse proxy's usual 60 s upstream keep-alive",
    )
    http_body_timeout_s: float = Field(
        10.0,
        gt=0,
        description="time allowed to read a request body, plus "
        "its size at http_body_min_bytes_per_s; beyond -> "
        "408 request_timeout and the connection closes",
    )
    http_body_min_bytes_per_s: int = Field(
        64 * 1024,
        ge=1,
        description="slowest body upload served: each byte a "
        "body declares (or, chunked, may hold) adds 1/this seconds to its time",
    )
    http_lingering_s: float = Field(
        10.0,
        ge=0,
        description="after an answer that left the request body unread (401, "
        "408, 413, 429, ...), discard what still arrives this long, "
        "then close the connection",
    )


class LockstepConfig(_Section):
    """The lockstep frame scheduler (docs/engines.md#lockstep-slot-table)."""

    batch_size: int = Field(64, ge=1, description="slots = sessions stepped together")
    max_input_backlog_ms: float = Field(
        1200.0,
        gt=0,
        description="input a slot may hold queued (at least one frame): enough for a stall of about "
        "a second of the engine thread (its missed ticks are then caught up back to back, "
        "at most this many ms of them) or of the event loop (a burst, brought back within "
        "jitter_cushion_ms by underrun_repay_ms and drift_trim_ms); beyond it the oldest "
        "input is dropped, counted and logged",
    )
    latency_trim_window_frames: int | None = Field(
        25,
        ge=1,
        description="when more than jitter_cushion_ms of a slot's input stood queued through this many "
        "ticks in a row, drop drift_trim_ms of its quietest queued samples at every tick until "
        "it is back within the cushion (jitter, clock drift); null disables",
    )
    jitter_cushion_ms: float = Field(
        10.0,
        ge=0,
        description="input a slot may keep queued after a tick as a cushion against network jitter; "
        "all of it is added latency. 10 ms is half a 20 ms packet: a late packet steps 10 ms "
        "of silence, then 10 ms of the quietest queued audio goes, where a whole-packet cushion "
        "adds 20 ms to every frame after the first late packet",
    )
    drift_trim_ms: float = Field(
        5.0,
        gt=0,
        description="input dropped per tick while standing latency stays above the cushion (quietest samples first)",
    )
    underrun_repay_ms: float = Field(
        20.0,
        ge=0,
        description="after the engine stepped silence for a slot (its audio "
        "came late), input dropped per tick at once, without the "
        "trim window, while that audio stands above the cushion; "
        "0 waits for the window",
    )
    late_cushion_window_frames: int | None = Field(
        125,
        ge=1,
        description="a slot whose input misses a tick, comes on time, and misses again within this many "
        "ticks grows its jitter cushion by the silence that miss stepped (to a frame at most; a stall's run "
        "of misses counts once) and keeps the late audio "
        "instead of repaying it: a stream whose packets reach the engine at the very edge of the "
        "tick stops stepping silence and losing audio every few seconds, for that much latency; "
        "null disables",
    )
    late_cushion_release_frames: int = Field(
        250,
        ge=1,
        description="ticks in a row whose take did not reach into such a slot's grown cushion before "
        "the growth goes; the trim window then takes the audio standing in it away",
    )
    output_queue_frames: int = Field(
        16,
        ge=1,
        description="per-slot output frames awaiting their reader (socket "
        "writer or session runner); drop-oldest audio beyond, "
        "text carried into the next frame; 16 frames of 80 ms "
        "outlast max_input_backlog_ms, so an event-loop stall "
        "that loses no input loses no output either",
    )
    run_ahead_refill_frames: int = Field(
        4,
        ge=1,
        description="a model running ahead of playback (text-to-speech) steps out of its tick for a stream only "
        "once that stream's reader has this many frames of room (at most output_queue_frames; a stream with "
        "nothing queued at once); every stream with room steps along, and the tick tops every queue up. 1: a "
        "step whenever any reader takes a frame, each a step of the whole batch for the few streams read since",
    )
    release_timeout_s: float = Field(
        2.0, gt=0, description="session close waits this long for the engine thread to free its slot"
    )
    gil_switch_interval_ms: float = Field(
        5.0,
        ge=0.05,
        le=100,
        description="Python's thread switch interval in every process that runs engines: how long a "
        "thread holding the GIL may run before one waiting for it is let in (Python's own default, 5 ms)",
    )
    device: str = Field(
        "cpu",
        pattern=r"^(cpu|cuda(:[0-9]+)?)$",
        description="torch device the engine thread steps torch frame models on ('tiny'): "
        "'cpu', 'cuda' or 'cuda:N'; a CUDA device that is not there fails at startup",
    )


class ReferenceEngineConfig(_Section):
    """The reference lockstep engines (``loopback``, ``tone``; engines/reference.py)."""

    loopback_delay_frames: int = Field(
        1, ge=0, description="loopback engine: output = input delayed by this many frames"
    )
    loopback_step_ms: float = Field(
        0.0,
        ge=0,
        le=1000,
        description="loopback engine: each step takes at least this long (the engine thread waits, as on a "
        "GPU step), so a machine without the model shows the served path of one as slow",
    )
    tone_base_hz: float = Field(180.0, gt=0, description="tone engine: slot b plays tone_base_hz + b * tone_step_hz")
    tone_step_hz: float = Field(90.0, ge=0)


class RobotConfig(_Section):
    """Robot policy route (docs/serving.md#robot-policy)."""

    policy: str = Field(
        "demo",
        description="'demo', 'module:factory', a TorchScript file path, "
        "or 'none' (the route answers 'Robot policy not available')",
    )
    max_message_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    idle_timeout_s: float = Field(30.0, gt=0)
    batch_window_ms: float = Field(2.0, ge=0, description="wait this long after a batch's first request for more")
    max_batch: int = Field(32, ge=1, description="observations per policy call; 1 disables batching")
    max_pending_requests: int = Field(256, ge=1, description="queued observations; beyond -> 'overloaded' error")
    max_sessions: int = Field(1024, ge=1, description="per-session policy state kept (least recently used dropped)")
    torch_threads: int | None = Field(
        None, ge=1, description="torch intra-op threads for torch policies; null keeps torch's default (one per core)"
    )


class MoshiConfig(_Section):
    """Moshi/PersonaPlex-compatible routes ``/api/chat`` and ``/v1/audio/duplex`` (docs/serving.md#moshi-routes)."""

    flush_timeout_s: float = Field(
        5.0,
        gt=0,
        description="after a duplex 'close', bound on draining the tail (stepped, answered and sent) before 'done'",
    )
    opus_bitrate: int = Field(32000, ge=6000, le=510000, description="/api/chat agent audio bit rate")
    opus_application: Literal["audio", "voip", "lowdelay"] = Field(
        "lowdelay",
        description="/api/chat agent audio: 'lowdelay' (CELT only) has 2.5 ms lookahead instead "
        "of 6.5 ms and costs ~40% less CPU per stream than 'audio'",
    )
    opus_complexity: int = Field(
        5,
        ge=0,
        le=10,
        description="/api/chat agent audio encoder complexity: 5 costs ~6 ms "
        "CPU per audio second vs ~10-14 at 10 (libopus default), "
        "for a small quality loss; lower it when encoding is the "
        "bottleneck at many concurrent streams",
    )
    inline_decode_packets: int = Field(
        4,
        ge=0,
        description="/api/chat: a client message of at most this many Opus "
        "packets (each at most 120 ms of audio) is decoded on the "
        "event loop (~0.1 ms per 80 ms page), larger ones on the "
        "codec executor; 0 sends every message there",
    )
    idle_timeout_s: float = Field(
        30.0,
        gt=0,
        description="a live conversation with no client audio this long is "
        "closed (1000, 'idle timeout') and its engine slot freed",
    )
    open_timeout_s: float = Field(
        10.0,
        gt=0,
        description="/v1/audio/duplex: a socket that sent no valid 'open' this "
        "long after connecting is closed (1000, 'open timeout')",
    )
    send_timeout_s: float = Field(
        10.0,
        gt=0,
        description="a socket whose reader took no bytes for this long (a frame, "
        "'done' or the close frame stuck behind a full send buffer) "
        "is dropped; with aiohttp's 64 KiB write limit this also "
        "bounds the unsent bytes held for it",
    )


class KvCacheSection(_Section):
    """How an engine on the Moshi transformer keeps its slots' attention context
    (docs/engines.md#paged-int8-kv)."""

    kv_cache: Literal["ring", "paged_int8", "paged_int4"] = Field(
        "ring",
        description="temporal transformer KV: 'ring' (a ring of the model's context per slot, in dtype, "
        "allocated up front), 'paged_int8' (int8 blocks from one pool shared by all slots, "
        "taken as each conversation grows; a session that finds no free block is refused "
        "with resource_exhausted) or 'paged_int4' (the same in 4 bits: about twice the "
        "conversations per pool, at the agreement cost in docs/engines.md#paged-int8-kv)",
    )
    kv_pool_frames: int | None = Field(
        None,
        ge=1,
        description="paged KV: frames of context the pool holds for "
        "all slots together (null: batch_size x the model's "
        "context, so every slot can reach it)",
    )
    kv_block_frames: int = Field(64, ge=1, le=4096, description="paged KV: frames per KV block (a power of two)")

    @field_validator("kv_block_frames")
    @classmethod
    def _power_of_two(cls, value: int) -> int:
        if value & (value - 1):
            raise ValueError("must be a power of two")
        return value


class MoshiEngineConfig(KvCacheSection):
    """The native Moshi / PersonaPlex engine (``--engine moshi``; docs/engines.md#moshi-engine)."""

    weights: str | None = Field(
        None,
        description="Kyutai-format weights (config.json, LM and Mimi safetensors, SentencePiece "
        "tokenizer): a local folder, hf://ORG/NAME[@REVISION] or ORG/NAME (docs/engines.md#hub-weights); "
        "required for --engine moshi (--weights)",
    )
    voice_dir: str | None = Field(
        None,
        description="folder that voice prompts (.pt embeddings or audio) must be "
        "inside; null falls back to models.voice_prompt_dir",
    )
    batch_size: int = Field(4, ge=1, description="slots stepped together (concurrent conversations)")
    device: str = Field("cpu", pattern=r"^(cpu|cuda(:[0-9]+)?)$", description="'cpu', 'cuda' or 'cuda:N'")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="LM weights and activations (Mimi: encoder_dtype, decoder_dtype)"
    )
    encoder_dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="Mimi's encoder (the user's audio to codes; its quantizer stays float32). bfloat16 changes "
        "what the model hears: on the tests' tiny checkpoint the conversation takes other words "
        "(docs/engines.md#mimi-in-bf16-for-moshi)",
    )
    decoder_dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="Mimi's decoder (the agent's codes to audio). bfloat16: the same tokens (the decoder feeds "
        "nothing back), the agent's audio within 30 dB SNR of float32's (docs/engines.md#mimi-in-bf16-for-moshi)",
    )
    use_sampling: bool = Field(True, description="false: greedy decoding (what the parity tests pin)")
    temperature: float = Field(0.8, ge=0, description="audio token temperature")
    temperature_text: float = Field(0.7, ge=0, description="text token temperature")
    top_k: int = Field(250, ge=0, description="audio token top-k (0: no cut)")
    top_k_text: int = Field(25, ge=0, description="text token top-k (0: no cut)")
    max_prompt_tokens: int = Field(512, ge=1, description="longest persona text, in tokens; longer is refused")
    max_voice_seconds: float = Field(30.0, gt=0, description="longest voice prompt audio")
    fuse_glue: bool = Field(
        True,
        description="on CUDA, compile the elementwise work between the matrix "
        "products (norms, RoPE, gated SiLU, embeddings, sampling) into single "
        "kernels with torch.compile (compiled once at startup; 6 ms "
        "less per frame at the 7B shape and batch 64 on an H200, see "
        "benchmarks/notes/moshi_speed.md); no effect on CPU",
    )
    random_weights: bool = Field(
        False,
        description="benchmarking only: random weights instead of a checkpoint, "
        "at the shape of weights/config.json (and its Mimi config) or, "
        "with weights null, the published 7B shape; no tokenizer, so "
        "no text output and no persona text",
    )
    context_fill_frames: tuple[int, int] | None = Field(
        None,
        description="benchmarking only: [LOW, HIGH] frames; every opened slot starts as if that many "
        "frames of conversation (spread evenly over the range, random KV) had already been "
        "stepped, so a served benchmark measures long conversations' steady state rather than "
        "their first seconds (docs/engines.md#context-fill); null: every session starts fresh",
    )

    @field_validator("context_fill_frames")
    @classmethod
    def _ordered(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and not 0 <= value[0] <= value[1]:
            raise ValueError("needs 0 <= LOW <= HIGH")
        return value


class SttEngineConfig(KvCacheSection):
    """The Kyutai streaming speech-to-text engine behind ``WS /api/asr-streaming``
    (docs/engines.md#kyutai-stt-engine)."""

    weights: str | None = Field(
        None,
        description="Kyutai STT weights (config.json with stt_config, LM and Mimi safetensors, "
        "tokenizer), e.g. kyutai/stt-1b-en_fr: a local folder, hf://ORG/NAME[@REVISION] or "
        "ORG/NAME; null: /api/asr-streaming is not served",
    )
    batch_size: int = Field(8, ge=1, description="streams stepped together (concurrent clients)")
    device: str = Field("cpu", pattern=r"^(cpu|cuda(:[0-9]+)?)$", description="'cpu', 'cuda' or 'cuda:N'")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="LM weights and activations (Mimi: codec_dtype)"
    )
    codec_dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="Mimi's encoder (SEANet, transformer, downsampler); its quantizer stays float32. "
        "bfloat16: ~40% less codec time on a GPU, codes checked only on random weights "
        "(docs/engines.md#mimi-encoder-in-bf16)",
    )
    temperature: float = Field(0.0, ge=0, description="text token temperature (0: greedy)")
    max_buffered_s: float = Field(
        30.0,
        gt=0,
        description="audio a stream may hold received and not yet stepped (clients may send faster "
        "than real time); beyond it the oldest is dropped, counted and logged",
    )
    drain_waiting_input: bool = Field(
        True,
        description="between two ticks, while the period has room, step only the streams whose input "
        "stood through drain_after_ticks ticks in a row (a burst, or a client ahead of real time), the "
        "others held: waiting input is paid back instead of staying as latency "
        "(docs/engines.md#draining-waiting-input)",
    )
    drain_after_ticks: int = Field(
        12,
        ge=1,
        description="ticks in a row a stream's input must leave whole frames standing before drain steps "
        "take them: input standing once may be a client's frames arriving about when the tick takes "
        "them, and draining it would leave a later tick to step silence",
    )
    flush_between_ticks: bool = Field(
        True,
        description="with drain_waiting_input: a stream's flush (a turn's end stepping the model's delay at once) "
        "gets its drain steps when it comes, between ticks, rather than after the next tick "
        "(docs/engines.md#flush-between-ticks)",
    )
    drain_room: float = Field(
        1.5,
        ge=1.0,
        le=10.0,
        description="with drain_waiting_input: a drain step runs between ticks only while this many times its "
        "expected duration (the last one's) fits before the next tick. Lower fits more drain steps a period, "
        "so a turn's end flushes the model's delay sooner, at the risk of a late tick when a step runs long "
        "(docs/engines.md#draining-waiting-input)",
    )
    flush_rows: int = Field(
        0,
        ge=0,
        le=1024,
        description="with drain_waiting_input and kv_cache ring: a drain step of this many streams or fewer "
        "(a turn's end flushing the model's delay, input that waited) runs in a batch of this many rows of its "
        "own on the same weights, their state copied in and back, instead of a step of the whole batch with "
        "the others held, and as many of its frames as fit before the next tick go in one burst "
        "(docs/engines.md#drain-bursts); 0: off (docs/engines.md#flush-rows)",
    )
    late_input_grace_ticks: int = Field(
        4,
        ge=0,
        description="with drain_waiting_input: a stream with no audio at a tick is held (not stepped on "
        "silence) for up to this many ticks in a row, and its late audio is stepped by a drain step when "
        "it comes; no silence is written into the stream for a frame that was only late (0: step silence). "
        "A client that stops sending waits this long before its silence flushes the words in flight",
    )

    @model_validator(mode="after")
    def _flush_rows_need_rings(self) -> SttEngineConfig:
        if self.flush_rows and self.kv_cache != "ring":
            raise ValueError("flush_rows needs kv_cache 'ring' (paged KV hands its blocks out per row of one pool)")
        return self


class AsrStreamingConfig(_Section):
    """Limits of ``WS /api/asr-streaming`` (moshi-server's speech-to-text protocol; docs/serving.md#asr-streaming)."""

    max_message_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="largest client message; larger: closed with 1009 (refused from its header)",
    )
    max_pending_markers: int = Field(
        64, ge=1, description="markers awaiting their answer per stream; more: 'Error' then close"
    )
    idle_timeout_s: float = Field(
        120.0, gt=0, description="a stream whose client sent no valid message this long is closed"
    )
    send_timeout_s: float = Field(
        10.0,
        gt=0,
        description="a client that took no bytes for this long (its events piling up) gets 'Error' and is closed",
    )
    max_queued_events: int = Field(
        1024, ge=16, description="events waiting for a slow reader; more: 'Error' then close"
    )


class TtsEngineConfig(_Section):
    """The Kyutai streaming text-to-speech engine behind ``WS /api/tts_streaming`` (docs/engines.md#kyutai-tts)."""

    weights: str | None = Field(
        None,
        description="Kyutai TTS weights (config.json with model_type 'tts', LM and Mimi safetensors, "
        "tokenizer), e.g. kyutai/tts-1.6b-en_fr: a local folder, hf://ORG/NAME[@REVISION] or ORG/NAME; "
        "null: the server's Piper voice speaks /api/tts_streaming",
    )
    voices: str | None = Field(
        None,
        description="voice embeddings (*.safetensors with speaker_wavs): a local folder, or a hub repo as "
        "hf://ORG/NAME[@REVISION] or ORG/NAME (e.g. kyutai/tts-voices; each voice fetched when first asked for)",
    )
    default_voice: str | None = Field(None, description="the voice of a stream that names none")
    max_sessions: int = Field(8, ge=1, description="streams stepped together (concurrent clients)")
    row_bucket: int = Field(
        32,
        ge=0,
        description="a step computes the slots up to the last one in use, rounded up to a multiple of this (new "
        "streams take the lowest free slot; on CUDA one graph per multiple below max_sessions); 0: every slot, "
        "always (docs/engines.md#row-buckets)",
    )
    span_bucket: int = Field(
        128,
        ge=0,
        multiple_of=8,
        description="attention reads the ring slots up to the furthest position of the streams that step, rounded "
        "up to a multiple of this (a multiple of 8; on CUDA one graph per multiple below the context, for each row "
        "count); 0: the whole ring, always (docs/engines.md#row-buckets)",
    )
    codebooks: int | None = Field(
        None,
        ge=1,
        description="audio codebooks generated and decoded, the first ones of the checkpoint's (the reference's n_q): "
        "fewer make a cheaper step (the depformer walks one per codebook) and coarser audio; Kyutai's own servers "
        "run tts-1.6b-en_fr with 24 of its 32; null: all (docs/engines.md#tts-codebooks)",
    )
    cfg_coef: float = Field(
        2.0, gt=0, description="classifier-free guidance: a value the checkpoint was distilled with, or direct CFG"
    )
    temperature: float = Field(0.6, ge=0, description="sampling temperature (0: greedy)")
    padding_between: int = Field(1, ge=0, description="pads forced after each word (clearer articulation)")
    device: str = Field("cpu", pattern=r"^(cpu|cuda(:[0-9]+)?)$", description="'cpu', 'cuda' or 'cuda:N'")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="LM weights and activations; conditioners and Mimi run in float32 (Mimi: codec_dtype)"
    )
    codec_dtype: Literal["float32", "bfloat16"] = Field(
        "float32",
        description="Mimi's decoder (upsampler, transformer, SEANet); the codebook lookup stays float32 and the "
        "audio comes out float32. The tokens are the same (the decoder feeds nothing back); bfloat16: the audio "
        "within 30 dB SNR of float32's (docs/engines.md#mimi-decoder-in-bf16)",
    )
    run_ahead: bool = Field(
        True,
        description="step as fast as the model allows while a stream with text has room in its output queue "
        "(audio made ahead of playback: first audio without waiting for 80 ms ticks); false: one step per tick",
    )
    catch_up_lead_ms: float = Field(
        80.0,
        ge=0,
        le=5000,
        description="with run_ahead: new replies (inside their audio delay) step alone in the cheaper pre-audio "
        "step while every older stream that would step has this much audio made ahead of its playback; brings "
        "first audio forward (0: never hold an older stream back)",
    )
    full_step_cadence_ms: float = Field(
        60.0,
        ge=0,
        le=1000,
        description="with catch_up_lead_ms: while new replies catch up, a full step for an older stream short "
        "of that lead, or about to make its first audio, comes at most this long after the last full step "
        "(unless one is down to half the lead), so they share full steps; 0: each takes one at once",
    )
    young_batch: int = Field(
        0,
        ge=0,
        le=1024,
        description="new replies step through their audio delay in a batch of this many rows of their own (same "
        "weights, a few ms a step, several steps a call) before joining the others (at most max_sessions); a "
        "reply that finds it full starts with the others; 0: off. At 128 streams on an H200, 16 rows lower first "
        "audio's median (15 words/s: 544-648 -> 474-482 ms) but not its p95 (588-708 -> 670-698), and with the "
        "STT in the same process (the voice agent at 256 sessions) they made it worse (2074-2392 -> 2955-3958 ms "
        "p50): off by default (docs/engines.md#young-batch)",
    )
    young_row_bucket: int = Field(
        8,
        ge=0,
        description="with young_batch: a young step computes its rows up to the last one in use, rounded up to a "
        "multiple of this (row_bucket for the young batch: new replies take its lowest free row), so a large young "
        "batch costs what its busy rows cost; 0: every row, always (docs/engines.md#young-batch)",
    )
    young_burst_ms: float = Field(
        20.0,
        ge=0,
        le=40,
        description="with young_batch: its steps go on back to back in a call for up to this long (beside a step "
        "of the others, until that ends if sooner); 0: one step a call. At most 40: 80 held the calls long enough "
        "for older replies to run dry (a TTS server at 256 voice-agent sessions: tick p99 113 ms, 43 replies "
        "underran; benchmarks/notes/voice_agent_gpu.md)",
    )
    young_queue: int = Field(
        3,
        ge=1,
        le=8,
        description="with young_batch: how many of a burst's steps are queued on the GPU ahead of the host's read "
        "of the first, so the GPU goes on while the host reads one; a burst may then run this many steps minus one "
        "past young_burst_ms; 1: each step read before the next is queued (docs/engines.md#young-batch)",
    )
    young_wait_ms: float = Field(
        160.0,
        ge=0,
        le=2000,
        description="with young_batch: a reply that finds every row of it taken waits this long for one (its text "
        "queues meanwhile, so it loses little while the text still comes) before it starts with the others; 0: "
        "with the others at once (docs/engines.md#young-batch)",
    )
    tried_steps: bool = Field(
        True,
        description="a reply before its first audio that lacks the words its next step may pop (the next word "
        "and its lookahead) tries that step: kept where the model pads, as it would have with all the text, put "
        "back where it asks for a word; false: such a row waits for the words (docs/engines.md#tried-steps)",
    )


class DiffusionEngineConfig(_Section):
    """A step-batched diffusion engine on a ``diffusers`` pipeline (docs/engines.md#diffusion-step-batching)."""

    weights: str | None = Field(
        None,
        description="a diffusers pipeline (model_index.json and its component folders): a local folder, "
        "hf://ORG/NAME[@REVISION] or ORG/NAME; null: the routes this engine serves answer 404",
    )
    device: str = Field(
        "auto", pattern=r"^(auto|cpu|cuda(:[0-9]+)?)$", description="'auto' (CUDA when present), 'cpu', 'cuda[:N]'"
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="weights and activations")
    max_batch: int = Field(8, ge=1, description="requests denoised together in one batched step")
    max_queued: int = Field(64, ge=1, description="requests waiting for the batch; more: 429 resource_exhausted")


class ImagesConfig(_Section):
    """Limits of ``/v1/images/generations`` and ``/v1/images/edits`` (docs/serving.md#images)."""

    default_size: str = Field("512x512", pattern=r"^[0-9]+x[0-9]+$", description="WIDTHxHEIGHT when none is given")
    max_pixels: int = Field(1024 * 1024, ge=64 * 64, description="largest width*height accepted")
    default_steps: int = Field(30, ge=1, description="num_inference_steps when none is given")
    max_steps: int = Field(200, ge=1, description="largest num_inference_steps accepted")
    default_guidance_scale: float = Field(7.5, ge=0, description="guidance_scale when none is given")
    max_n: int = Field(10, ge=1, description="largest n (images per request)")
    max_prompt_chars: int = Field(4000, ge=1, description="longest prompt or negative_prompt accepted")
    max_upload_bytes: int = Field(
        20 * 1024 * 1024, ge=1024, description="largest image upload of /v1/images/edits, checked while it arrives"
    )
    max_upload_pixels: int = Field(4096 * 4096, ge=64 * 64, description="largest uploaded image (width*height)")
    default_strength: float = Field(0.8, gt=0, le=1, description="edits: how much of the source image is re-noised")
    url_ttl_s: float = Field(3600.0, gt=0, description="response_format=url: how long an image stays downloadable")
    max_stored_images: int = Field(256, ge=1, description="response_format=url: images kept; the oldest go first")


class VideoRoutesConfig(_Section):
    """``/v1/videos`` jobs and ``WS /v1/realtime/video`` (docs/serving.md#videos): defaults, bounds, the job store."""

    store_dir: str = Field(
        str(Path.home() / ".cache" / "rtserve" / "videos"),
        description="folder of the job database (SQLite) and the finished MP4 files (created on first use)",
    )
    job_ttl_s: float = Field(24 * 3600.0, gt=0, description="a finished job and its video are kept this long")
    max_jobs: int = Field(1000, ge=1, description="jobs kept; the oldest finished go first, all running -> 429")
    max_store_bytes: int = Field(
        8 * 1024**3, ge=1024, description="bytes of stored videos; the oldest completed videos go first beyond"
    )
    cleanup_interval_s: float = Field(60.0, gt=0, description="seconds between sweeps of expired jobs")
    max_upload_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, description="one reference image as uploaded or as a data URL; larger -> 413"
    )
    max_reference_pixels: int = Field(
        16_000_000, ge=1024, description="width x height of a reference image (read from its header); larger -> 400"
    )
    default_size: str = Field("832x480", pattern=r"^[0-9]+x[0-9]+$", description="WIDTHxHEIGHT when none is asked")
    default_seconds: float = Field(4.0, gt=0, description="clip length when neither seconds nor num_frames is asked")
    default_fps: int = Field(16, ge=1, le=120, description="frames per second when none is asked")
    default_num_inference_steps: int = Field(50, ge=1, description="denoising steps when none is asked")
    default_guidance_scale: float = Field(5.0, ge=0, description="classifier-free guidance when none is asked")
    max_side: int = Field(1920, ge=16, description="largest width or height; larger -> 400")
    max_frames: int = Field(241, ge=1, description="most frames in one video; more -> 400")
    max_inference_steps: int = Field(200, ge=1, description="most denoising steps one request may ask; more -> 400")
    model_aliases: list[str] = Field(
        default_factory=lambda: ["sora-2", "sora-2-pro"],
        description="model names accepted for the served video model (what OpenAI clients send)",
    )
    sync_timeout_s: float = Field(
        1800.0, gt=0, description="POST /v1/videos/sync waits this long for the video; longer -> 504"
    )
    start_timeout_s: float = Field(
        10.0, gt=0, description="WS /v1/realtime/video: a connection without session.start this long is closed"
    )
    stall_timeout_s: float = Field(
        60.0,
        gt=0,
        description="WS /v1/realtime/video: no generation progress and no session.ping this long -> error, closed",
    )
    send_timeout_s: float = Field(
        10.0, gt=0, description="WS /v1/realtime/video: a client that takes no chunk this long is closed"
    )
    max_message_bytes: int = Field(64 * 1024, ge=1024, description="WS /v1/realtime/video: largest client message")


class TtsStreamingConfig(_Section):
    """Limits of ``WS /api/tts_streaming`` (moshi-server's text-to-speech protocol; docs/serving.md#tts-streaming)."""

    max_message_bytes: int = Field(
        64 * 1024, ge=256, description="largest client message; larger: 'Error' then close (over 4x: closed with 1009)"
    )
    max_pending_words: int = Field(
        1024, ge=8, description="words sent and not yet spoken per stream; more: 'Error' then close"
    )
    idle_timeout_s: float = Field(
        30.0, gt=0, description="a stream whose client sent nothing this long, before its end of stream, is closed"
    )
    send_timeout_s: float = Field(
        10.0, gt=0, description="a client that took no bytes for this long gets 'Error' and is closed"
    )
    max_queued_messages: int = Field(
        256, ge=16, description="messages waiting for a slow reader; more: 'Error' then close"
    )
    max_audio_ahead_s: float = Field(
        4.0,
        gt=0,
        description="a stream's audio goes out at most this far ahead of real time from its first audio "
        "(a client reading at playback pace would meet more only seconds late in its socket's buffers; "
        "keep it well under send_timeout_s)",
    )


class WeightsConfig(_Section):
    """How every engine's weight setting is resolved from the hub (docs/engines.md#hub-weights)."""

    progress_interval_s: float = Field(
        10.0, gt=0, description="seconds between download progress lines in the log (and /health updates)"
    )
    max_archive_bytes: int = Field(
        4 * 1024**3, ge=1, description="largest unpacked size of an archive a repo ships (PersonaPlex voices.tgz)"
    )
    max_archive_members: int = Field(10_000, ge=1, description="most files and folders in such an archive")


class CodecLimits(_Section):
    """Bounds of the Ogg-Opus stream reader (``rtserve.codecs.oggopus.OggOpusReader``)."""

    ogg_max_page_bytes: int = Field(65307, ge=282, le=65307, description="largest Ogg page accepted (format max 65307)")
    ogg_max_packet_bytes: int = Field(65536, ge=1024, description="largest packet reassembled across pages")
    ogg_max_feed_audio_s: float = Field(
        60.0, gt=0, description="audio one received chunk may decode to; beyond -> audio_limit_exceeded"
    )
    max_decoded_audio_ratio: float = Field(
        2.0,
        gt=0,
        description="Ogg-Opus audio one connection may decode per "
        "second of wall time (a live client needs 1.0); beyond the burst -> "
        "decode_rate_exceeded, /api/chat closes with 1008",
    )
    decoded_audio_burst_s: float = Field(
        10.0,
        gt=0,
        description="decoded audio a connection may run ahead of that rate (network jitter, a client catching up)",
    )


class ModelPaths(_Section):
    """Where the embedded-default models live. ``None`` resolves to the shipped wheel."""

    vad: str | None = None
    asr: str | None = None
    llm: str | None = None
    tts: str | None = None
    cache_dir: str = Field(str(Path.home() / ".cache" / "rtserve"), description="converted model folders")
    cpu_threads: int = Field(2, ge=1, description="bound on intra-op threads per model")
    voice_prompt_dir: str | None = Field(None, description="directory that voice_prompt names resolve inside")


class SemanticVadThresholds(_Section):
    """``semantic_vad`` on the streaming STT (``cascade.asr: stt_engine``): a pause in the user's
    speech ends the turn at once when the STT's end-of-turn head says at least this (per
    eagerness); otherwise the pause of the eagerness ends it (docs/engines.md#cascade-streaming-asr)."""

    high: float = Field(0.5, ge=0, le=1, description="eagerness high: the turn ends on an even chance")
    medium: float = Field(0.75, ge=0, le=1, description="eagerness medium")
    auto: float = Field(0.75, ge=0, le=1, description="eagerness auto (as medium)")
    low: float = Field(0.9, ge=0, le=1, description="eagerness low: the head must be nearly sure")


class TTSServerConfig(_Section):
    """A TTS server the cascade speaks through (``cascade.tts: tts_server``): another rtserve's
    ``/api/tts_streaming`` or Kyutai's moshi-server (docs/engines.md#a-tts-server-in-the-cascade)."""

    url: str = Field(
        "",
        pattern=r"^(wss?://\S+)?$",
        description="its WebSocket endpoint, e.g. ws://127.0.0.1:8001/api/tts_streaming; required with "
        "cascade.tts tts_server",
    )
    api_key: str = Field("", description="sent as the kyutai-api-key header (empty: none)")
    connect_timeout_s: float = Field(5.0, gt=0, description="a reply's connection and Ready wait at most this")
    read_timeout_s: float = Field(
        30.0, gt=0, description="a reply whose server sends nothing this long fails (engine_unavailable)"
    )
    max_message_bytes: int = Field(
        1 << 20, ge=1024, description="largest message taken from the server (an Audio frame is ~10 KB)"
    )
    max_queued_messages: int = Field(
        1024, ge=1, description="text messages of a reply waiting to be sent; beyond -> input_backpressure"
    )
    startup_timeout_s: float = Field(
        600.0,
        gt=0,
        description="at startup the voice agent waits this long for the server to serve a stream (it may be "
        "loading its model); not by then, or refused (a wrong key or path): the engine fails (/health 503)",
    )


class CascadeLimits(_Section):
    """The cascade engine's (VAD -> ASR -> LLM -> TTS) per-session and per-model limits."""

    sleep_drain_timeout_s: float = Field(
        30.0,
        gt=0,
        description="a sleep request waits this long for the TTS stage's speech in flight to finish "
        "(new speech is refused meanwhile); still busy -> 409 stage_busy and the stage stays awake",
    )
    tts: Literal["piper", "tts_engine", "tts_server"] = Field(
        "piper",
        description="what realtime sessions speak with: piper (the embedded Piper voice, sentence by "
        "sentence), tts_engine (the Kyutai TTS engine of tts_engine.weights, fed word by word as the "
        "LLM writes; the same engine serves the speech routes; docs/engines.md#kyutai-tts-in-the-cascade) "
        "or tts_server (the same protocol to the server at cascade.tts_server.url, in a process or on a "
        "host of its own; docs/engines.md#a-tts-server-in-the-cascade)",
    )
    tts_server: TTSServerConfig = TTSServerConfig()

    asr_partial_interval_ms: int = Field(1000, ge=100, description="re-decode a growing utterance at most this often")
    asr_window_s: float = Field(
        10.0,
        ge=2,
        le=30,
        description="Whisper reads a voice session's utterance up to half this long in a window of this length "
        "instead of its 30 s one (10 s: ~5x faster, word error rate 7.4% -> 11.1% on "
        "bench_answer_quality's questions); a decode there that loops or is unsure "
        "is redone in 30 s (30 = off)",
    )
    max_turn_audio_s: float = Field(60.0, gt=0, description="longest user turn kept for ASR; oldest audio dropped")
    max_input_backlog_ms: int = Field(2000, ge=100, description="unanalysed input per session; drop-oldest beyond")
    output_queue_ms: int = Field(2000, ge=100, description="reply audio queued per session before TTS waits")
    max_audio_ahead_s: float = Field(
        8.0,
        gt=0,
        description="a reply's audio runs at most this far ahead of real time from its first chunk; the reply "
        "waits beyond (a long answer made at once would overflow the session's output buffer behind a "
        "real-time listener, e.g. a WebRTC track: docs/engines.md#reply-pacing)",
    )
    worker_queue_depth: int = Field(256, ge=1, description="jobs waiting per VAD/ASR/TTS thread; beyond -> busy")
    llm_runtime: Literal["ctranslate2", "transformers", "transformers_batched", "transformers_vision"] = Field(
        "ctranslate2",
        description="the embedded LLM's runtime: ctranslate2 (CPU, batched, quantized; function calls still "
        "decode on transformers), transformers (everything, unbatched), transformers_batched (transformers' "
        "continuous batching on llm_device, e.g. a GPU: every active request's next token in one forward "
        "pass; function calls and seeded sampling on transformers) or transformers_vision (a "
        "vision-language model folder for AutoModelForImageTextToText: sees camera frames and images)",
    )
    llm_device: str = Field(
        "cpu",
        pattern=r"^(cpu|cuda(:[0-9]+)?)$",
        description="llm_runtime transformers_batched: where the LLM runs ('cpu', 'cuda' or 'cuda:N')",
    )
    llm_dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="llm_runtime transformers_batched: the LLM's weights and activations (bfloat16 on a GPU)"
    )
    llm_kv_tokens: int | None = Field(
        None,
        ge=256,
        description="llm_runtime transformers_batched: tokens its paged KV cache holds, shared by the requests "
        "decoded together; unset: llm_max_active x llm_context_tokens, so that none ever waits for room",
    )
    llm_cuda_graphs: bool = Field(
        False,
        description="llm_runtime transformers_batched on a GPU: replay each step as a CUDA graph (batches padded "
        "to a few captured sizes) instead of launching its kernels one by one from Python",
    )
    llm_compute_type: Literal["int8", "int8_float32", "int16", "float32"] = Field(
        "int8", description="CTranslate2 weight type of the LLM (converted once into models.cache_dir)"
    )
    llm_max_active: int | None = Field(
        None,
        ge=1,
        description="LLM requests decoded together (CTranslate2 batches, shared among llm_lanes, or "
        "transformers round-robin); more wait. Unset: 4 per LLM lane (docs/engines.md#cascade-cores)",
    )
    llm_max_waiting: int = Field(64, ge=0, description="LLM requests waiting for a decode slot; beyond -> busy")
    asr: Literal["whisper", "stt_engine"] = Field(
        "whisper",
        description="what realtime sessions hear with: whisper (the embedded Whisper, re-decoding each "
        "VAD-cut turn) or stt_engine (the streaming Kyutai STT of stt_engine.weights, in the engine "
        "process: word-by-word transcripts, semantic_vad on its end-of-turn head; "
        "docs/engines.md#cascade-streaming-asr)",
    )
    sessions_in_workers: bool = Field(
        True,
        description="with asr stt_engine and tts tts_engine or tts_server under --workers > 1: each front-end worker "
        "hosts its own realtime sessions (a Silero VAD per worker; the STT, LLM and TTS stay in the "
        "engine process, reached over the engine link); false: every session lives in the engine "
        "process (docs/engines.md#cascade-sessions-in-workers)",
    )
    semantic_vad: SemanticVadThresholds = Field(
        default_factory=SemanticVadThresholds,
        description="cascade.asr stt_engine: the end-of-turn probabilities semantic_vad's eagerness maps to",
    )
    llm_context_tokens: int = Field(2048, ge=256, description="prompt + reply token budget of one LLM request")
    llm_engine: Literal["embedded", "vllm"] = Field(
        "embedded", description="the voice replies' LLM: the embedded CPU model, or the vLLM server of http.vllm"
    )
    pause_transcript_ms: int = Field(
        96,
        ge=0,
        description="silence in a server-VAD turn after which its audio so far is transcribed; the "
        "transcript is the turn's final one when the turn ends in that pause (0 = off)",
    )
    preemptive_reply: bool = Field(
        True,
        description="start the reply from the pause transcript before the turn has ended; kept unheard "
        "until the session asks for exactly that reply, dropped if the user speaks on",
    )
    preemptive_buffer_chunks: int = Field(
        128, ge=1, description="reply pieces (audio chunks, text deltas) a preemptive reply holds before it waits"
    )
    complete_turn_silence_ms: int = Field(
        250,
        ge=0,
        description="server_vad with silence_duration_ms left unset: a pause whose transcript reads as "
        "a finished sentence ends the turn after this much silence (0 = off)",
    )
    first_clause_min_chars: int = Field(
        12,
        ge=0,
        description="the reply's first spoken piece ends at the first clause (comma, semicolon, colon, "
        "dash) this long, not at the end of its sentence (0 = whole sentence)",
    )
    first_piece_max_chars: int = Field(
        48,
        ge=8,
        description="longest first spoken piece of a reply; cut at a "
        "comma or space beyond (its LLM and TTS time delay the "
        "first audio)",
    )
    llm_max_temperature: float = Field(
        0.2,
        ge=0,
        le=2,
        description="LLM sampling temperature ceiling: requests "
        "asking for more (chat clients default to 0.7-1.0) decode at this; 2 keeps "
        "requests as sent (benchmarks/bench_answer_quality.py)",
    )
    llm_max_top_p: float = Field(0.9, gt=0, le=1, description="LLM nucleus ceiling, applied like llm_max_temperature")
    llm_top_k: int = Field(
        50,
        ge=0,
        description="LLM sampling draws from the k most likely tokens (then top_p); "
        "0 = the whole vocabulary, which CTranslate2 sorts every step",
    )
    llm_cached_openings: int = Field(
        16,
        ge=0,
        description="distinct conversation openings (system prompts) whose "
        "computed state CTranslate2 keeps, skipping their prefill on later requests; "
        "kept until the model is released (0 = off)",
    )
    llm_gather_ms: float = Field(
        10.0,
        ge=0,
        description="CTranslate2: a request reaching an idle LLM waits up to "
        "this long for others, so that a burst is one batch, not a batch restarted by "
        "each newcomer (0 = start at once)",
    )
    llm_first_piece_tokens: int = Field(
        16,
        ge=1,
        description="CTranslate2: a reply's first this many tokens hold its first spoken piece "
        "(first_piece_max_chars); past them its decoding may step aside for other turns' first audio",
    )
    llm_step_aside_ms: float = Field(
        500.0,
        ge=0,
        description="CTranslate2: a batch whose every reply is past its first piece pauses while a final "
        "transcript or a first spoken piece waits for the ASR or TTS, at most this long in all per "
        "reply (its first piece is still playing); 0 = never (docs/engines.md#cascade-cores)",
    )
    llm_threads: int = Field(
        1,
        ge=1,
        description="CTranslate2 intra-op threads of the LLM (the voice agent's TTS "
        "and the server need the other cores; benchmarks/bench_http.py)",
    )
    llm_lanes: int | None = Field(
        None,
        ge=1,
        description="CTranslate2 batches decoded at once, llm_threads each; "
        "llm_max_active is shared among them (2 cores: two batches of 4 "
        "decode ~1.5x one of 8; one request still decodes alone in a lane). "
        "Unset: one per 2 cores, at least 2 (docs/engines.md#cascade-cores)",
    )
    asr_lanes: int | None = Field(
        None,
        ge=1,
        description="Whisper decodes run at once (models.cpu_threads each, one shared model). "
        "Unset: one per 4 cores, at least 2 (docs/engines.md#cascade-cores)",
    )
    vad_lanes: int | None = Field(
        None,
        ge=1,
        description="Silero VAD calls run at once (one shared ONNX session, one thread each; calls "
        "waiting meanwhile are scored together in the next; a session's audio is still analysed "
        "in order). Unset: one per 4 cores, at least 1 (docs/engines.md#cascade-cores)",
    )
    tts_lanes: int | None = Field(
        None,
        ge=1,
        description="sentences the built-in voice speaks at once (models.cpu_threads each, one shared "
        "model). Unset: one per 4 cores, at least 1 (docs/engines.md#cascade-cores)",
    )


class VideoInputConfig(_Section):
    """Camera frames and images into the conversation (docs/video.md): WebRTC video,
    ``WS /v1/video/chat/stream``, ``input_image`` items."""

    sample_fps: float = Field(1.0, gt=0, le=30, description="camera frames kept per second; the others are dropped")
    max_side: int = Field(
        384, ge=32, le=4096, description="longest side of a kept frame or image in pixels (downscaled beyond)"
    )
    jpeg_quality: int = Field(80, ge=10, le=95, description="JPEG quality of kept frames (what the LLM is given)")
    max_image_bytes: int = Field(
        2 * 1024 * 1024, ge=1024, description="one JPEG/PNG frame or image as sent; larger -> image_too_large"
    )
    max_image_pixels: int = Field(
        16_000_000, ge=1024, description="width x height of one sent image; larger -> image_too_large (no decode)"
    )
    max_frames_per_s: float = Field(
        10.0, gt=0, description="frames a WS /v1/video/chat/stream client may send per second; faster -> closed"
    )
    max_text_chars: int = Field(4096, ge=1, description="one question on WS /v1/video/chat/stream")


class VllmSettings(_Section):
    """A vLLM server (``vllm serve``) serving the LLM over its OpenAI-compatible API, for chat
    (``http.text_engine: vllm``) and/or the cascade's voice replies (``cascade.llm_engine: vllm``)."""

    url: str | None = Field(
        None, description="the vLLM server's root, e.g. http://127.0.0.1:8000; required when vLLM is selected"
    )
    model: str | None = Field(
        None, description="the model name vLLM serves (its --served-model-name); required when vLLM is selected"
    )
    served_model_name: str | None = Field(None, description="rtserve's name for it in /v1/models; defaults to model")
    api_key: str | None = Field(None, description="vLLM's --api-key, sent as a bearer token")
    connect_timeout_s: float = Field(10.0, gt=0, description="one connection to vLLM; longer -> model_unavailable")
    read_timeout_s: float = Field(
        120.0,
        gt=0,
        description="longest wait for vLLM's next bytes (the first token included); longer -> model_unavailable",
    )
    vision: bool = Field(
        False,
        description="the served model is a vision-language model: user turns may carry images "
        "(camera frames, input_image), sent as image_url parts",
    )
    startup_timeout_s: float = Field(
        900.0,
        gt=0,
        description="how long rtserve waits for vLLM to serve the model "
        "(vLLM on a CPU loads for minutes); then it stays "
        "unavailable (503 model_unavailable)",
    )


ModelTask = Literal["chat", "speech", "transcription"]

# OpenAI's own model names, so apps written for OpenAI run unchanged.
OPENAI_MODEL_ALIASES: dict[str, ModelTask] = {
    "gpt-4o": "chat",
    "gpt-4o-mini": "chat",
    "tts-1": "speech",
    "tts-1-hd": "speech",
    "gpt-4o-mini-tts": "speech",
    "whisper-1": "transcription",
    "gpt-4o-transcribe": "transcription",
    "gpt-4o-mini-transcribe": "transcription",
    "gpt-4o-audio-preview": "chat",
    "gpt-4o-mini-audio-preview": "chat",  # chat with audio in/out (chat_audio)
}


class HttpGenerationConfig(_Section):
    """Batch/streaming HTTP generation routes: chat, speech, transcriptions (docs/serving.md)."""

    text_engine: Literal["session", "vllm", "embedded"] = Field(
        "session",
        description="LLM behind /v1/chat/completions and /tokenize: the session engine's own, vLLM, or the "
        "cascade's embedded LLM loaded alone (a server of another engine, e.g. loopback: an LLM server)",
    )
    default_max_tokens: int = Field(256, ge=1, description="completion length when a request names none")
    max_completion_tokens: int = Field(4096, ge=1, description="largest max_tokens a request may ask for")
    max_batch_conversations: int = Field(32, ge=1, description="conversations in one /v1/chat/completions/batch")
    max_json_body_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="JSON request body (chat, speech); "
        "larger -> 413 request_too_large, judged from Content-Length and while reading; "
        "uploads only by transport.max_http_body_bytes, which bounds every body",
    )
    max_prompt_chars: int | None = Field(
        None,
        ge=1,
        description="characters of one chat conversation's messages, checked before tokenization; "
        "larger -> 400 context_length_exceeded; null: 8 per token of the text engine's "
        "context (cascade.llm_context_tokens; 131072 on vLLM, which checks its own)",
    )
    max_speech_input_chars: int = Field(4096, ge=1)
    max_speech_batch_items: int = Field(32, ge=1, description="inputs in one /v1/audio/speech/batch; more -> 400")
    max_speech_batch_s: float = Field(
        300.0,
        gt=0,
        description="seconds of audio one /v1/audio/speech/batch may produce in all, counted as it is produced; "
        "the item that crosses it and every later one -> error 422 speech_too_long",
    )
    max_transcription_audio_s: float = Field(1800.0, gt=0, description="decoded upload length; longer -> 413")
    transcription_window_s: float = Field(30.0, ge=1, description="a long upload goes to the ASR in windows this long")
    disconnect_poll_s: float = Field(
        0.1, gt=0, description="how often a running generation checks its client is still there"
    )
    model_aliases: dict[str, ModelTask] = Field(
        default_factory=lambda: dict(OPENAI_MODEL_ALIASES),
        description="model names a request may use for the served model of a task (chat, speech, "
        "transcription); defaults to OpenAI's names; {} accepts only the served names",
    )
    vllm: VllmSettings = VllmSettings()


class EngineLinkConfig(_Section):
    """Front-end workers <-> the engine process (``--workers`` > 1)."""

    uplink_lead_ms: float = Field(
        30.0,
        ge=0,
        le=40,
        description="a worker sends its sessions' audio this long before the engine's next tick (one message a tick)",
    )
    uplink_last_call_ms: list[Annotated[float, Field(ge=0, le=40)]] = Field(
        [8.0, 2.0],
        max_length=4,
        description="audio that arrived after that main send goes in small top-ups this long before the tick, "
        "each with what came since the send before it: the earlier one reaches a busy engine process in time, "
        "the last takes what came after it",
    )
    serve_frames_per_turn: int | None = Field(
        1,
        ge=1,
        description="a tick's frames are handed to this many of a worker's sessions per event-loop turn, so that "
        "the clients' sockets are read and the uplink's last calls sent while the rest are served; null: all at once "
        "(a worker's share in one turn of 15-30 ms)",
    )
    max_queued_events: int = Field(
        256,
        ge=8,
        description="engine events a worker holds per session for a slow "
        "consumer; beyond, the oldest audio without text is dropped (a speech-to-text stream ends "
        "with output_backpressure)",
    )
    max_send_buffer_bytes: int = Field(
        64 * 1024 * 1024, ge=1024 * 1024, description="the engine drops a worker link that stopped reading past this"
    )


class SpeechStreamConfig(_Section):
    """``WS /v1/audio/speech/stream``: streamed text in, speech out (docs/serving.md#streaming-speech)."""

    max_connections: int = Field(64, ge=1, description="open streaming-speech sockets; beyond -> refused (1013)")
    max_event_bytes: int = Field(64 * 1024, ge=1024, description="one client text event; larger -> close 1009")
    max_buffered_chars: int = Field(
        16 * 1024,
        ge=64,
        description="text received but not yet spoken; more -> input_backpressure error, that text dropped",
    )
    max_queued_sentences: int = Field(
        64, ge=1, description="sentences waiting for the TTS; more -> input_backpressure error, that text dropped"
    )
    idle_timeout_s: float = Field(
        60.0, gt=0, description="no client event and nothing to speak this long -> close 1000 'idle timeout'"
    )
    send_timeout_s: float = Field(
        10.0, gt=0, description="a write the reader has not taken this long (it stopped reading) drops the connection"
    )
    max_audio_ahead_s: float = Field(
        4.0,
        gt=0,
        description="an utterance's audio goes out at most this far ahead of real time from its first audio "
        "(as tts_streaming.max_audio_ahead_s; keep it well under send_timeout_s)",
    )


class VoiceStoreConfig(_Section):
    """Piper voices registered at run time (``POST /v1/audio/voices``)."""

    dir: str = Field(
        str(Path.home() / ".cache" / "rtserve" / "voices"),
        description="folder registered voices are stored in (created on first use)",
    )
    max_voices: int = Field(16, ge=0, description="registered voices kept; more -> 400 voice_limit_exceeded")
    max_model_bytes: int = Field(
        128 * 1024 * 1024, ge=1024, description="one uploaded .onnx voice model; larger -> 413"
    )
    max_config_bytes: int = Field(256 * 1024, ge=256, description="one uploaded .onnx.json voice config; larger -> 413")
    max_loaded_voices: int = Field(
        4, ge=1, description="voice models held in memory at once (least recently used unloaded, reloaded on use)"
    )
    max_concurrent_uploads: int = Field(
        2, ge=1, description="uploads being proven at once (each in its own sandbox child); more -> 429"
    )
    sandbox_memory_bytes: int = Field(
        1024 * 1024 * 1024,
        ge=256 * 1024 * 1024,
        description="address space (RLIMIT_AS) of a child process that loads and speaks uploaded voices: "
        "the one proving an upload, and the one speaking registered voices; beyond -> 422 voice_model_rejected",
    )
    sandbox_cpu_s: float = Field(
        30.0,
        gt=0,
        description="CPU seconds (RLIMIT_CPU, all threads) for proving one upload, or for one sentence spoken "
        "with an uploaded voice; beyond -> the child is ended, 422 voice_model_rejected",
    )
    sandbox_wall_s: float = Field(
        30.0,
        gt=0,
        description="wall-clock seconds for proving one upload (start, load, speak), or for one sentence spoken "
        "with an uploaded voice; beyond -> the child is killed, 422 voice_model_rejected",
    )
    max_speech_s_per_char: float = Field(
        2.0,
        gt=0,
        description="seconds of speech per character of text (at speed 1; 16 characters at least), any voice, "
        "checked as each sentence is produced; beyond -> synthesis stops, 422 speech_too_long",
    )


class ClusterConfig(_Section):
    """Engines as Ray actors (``rtserve serve --ray-address ADDR``; rtserve/cluster/). Unset address: no Ray."""

    address: str | None = Field(
        None,
        description="Ray cluster address ('auto', 'HOST:6379'); set, the engines run "
        "as Ray actors and this process is a front-end of them",
    )
    namespace: str = Field("rtserve", min_length=1, description="Ray namespace of the named engine actors")
    engine_prefix: str = Field(
        "rtserve-engine",
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="engine actors are named PREFIX-0 .. PREFIX-(engines-1)",
    )
    engines: int = Field(
        1, ge=1, le=1024, description="engine actors: one per accelerator (engine_num_gpus: 1) or per CPU engine"
    )
    engine_num_cpus: float = Field(1.0, ge=0, description="CPUs Ray reserves for each engine actor")
    engine_num_gpus: float = Field(
        0.0,
        ge=0,
        description="GPUs per engine actor (1: one actor per GPU; Ray sets "
        "its CUDA_VISIBLE_DEVICES, so lockstep.device 'cuda')",
    )
    engine_resources: dict[str, float] = Field(
        default_factory=dict,
        description="custom Ray resources per engine actor, e.g. {rtserve_engine: 1} on the nodes meant for engines",
    )
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "SPREAD", description="Ray placement group strategy of the engine actors' bundles"
    )
    placement_timeout_s: float = Field(
        120.0,
        gt=0,
        description="wait this long for the cluster to have room for every engine actor, then refuse to start",
    )
    max_restarts: int = Field(-1, ge=-1, description="times Ray restarts a dead engine actor (-1: always)")
    secret: str | None = Field(
        None,
        min_length=16,
        description="the cluster's shared secret: engine links over TCP "
        "prove it (HMAC) before any message is read; required with address "
        "(set RTSERVE_CLUSTER__SECRET rather than writing it in a file)",
    )
    engine_host: str | None = Field(None, description="address engine actors listen on; null: their node's IP")
    connect_timeout_s: float = Field(
        5.0, gt=0, description="one attempt to reach an engine actor (address, TCP, handshake); a failed one is retried"
    )
    startup_timeout_s: float = Field(
        120.0,
        gt=0,
        description="a front-end waits this long for every engine actor "
        "to answer at startup; those that have not are admitted once they do",
    )


class PeersConfig(_Section):
    """Front-ends reaching each other (``web/peers``): resume relays and the front-end drain route."""

    host: str | None = Field(
        None,
        description="address a cluster front-end serves its peers on (TCP, signed "
        "requests); null: its node's IP. One host's workers use Unix sockets",
    )
    connect_timeout_s: float = Field(
        5.0,
        gt=0,
        description="a front-end reaching the owner of a session to relay "
        "a resume (lookup, connect, the owner's first answer)",
    )
    health_timeout_s: float = Field(
        1.0,
        gt=0,
        le=30,
        description="/health on one of a host's workers asks the others (they share its port); one that does "
        "not answer within this is left out, with a warning",
    )
    max_clock_skew_s: float = Field(
        30.0,
        gt=0,
        description="a signed peer request older or newer than this (wall "
        "clock) is refused; its nonce is remembered this long",
    )
    max_remembered_nonces: int = Field(
        4096,
        ge=16,
        description="signed peer requests remembered against replay; "
        "beyond, new ones are refused until old ones age out",
    )
    drain_deadline_s: float = Field(
        300.0,
        gt=0,
        description="a drained front-end's sessions may go on this long "
        "(when the drain request names no deadline), then close with reason shutdown",
    )


class IceServer(_Section):
    """One STUN or TURN server, as in the browser's ``RTCIceServer``."""

    urls: list[str] = Field(min_length=1, description="stun:host:port, turn:host:port?transport=udp|tcp, turns:...")
    username: str | None = None
    credential: str | None = None


class WebRtcConfig(_Section):
    """``POST /v1/realtime/calls`` (WebRTC, aiortc) and ``POST /v1/realtime/client_secrets``."""

    ice_servers: list[IceServer] = Field(
        default_factory=list,
        description="STUN/TURN servers the server's ICE "
        "agent uses; [] = host candidates only (aiortc's public STUN default is off)",
    )
    host_addresses: list[str] | None = Field(
        None,
        description="the only local addresses offered as host "
        "candidates (process-wide); null = every interface but loopback",
    )
    connect_timeout_s: float = Field(
        15.0, gt=0, description="offer answered -> ICE+DTLS connected; else the call ends with reason connect_timeout"
    )
    max_calls: int = Field(
        64,
        ge=1,
        description="live WebRTC calls per front-end process; beyond -> 429 "
        "resource_exhausted (sessions.max_sessions also applies)",
    )
    inbound_backlog_frames: int = Field(
        25,
        ge=1,
        description="decoded 20 ms microphone frames waiting for the reader; beyond, the oldest are dropped (counted)",
    )
    outbound_queue_ms: int = Field(
        4000,
        ge=100,
        description="agent audio queued for the paced 20 ms track; when "
        "full the call reads no further events until it drains",
    )
    max_pending_events: int = Field(
        256,
        ge=1,
        description="data channel client events awaiting the session; "
        "beyond, new ones are dropped with an input_backpressure error",
    )
    data_channel_buffer_bytes: int = Field(
        1024 * 1024, ge=16 * 1024, description="unsent data channel bytes before the event sender waits for the peer"
    )
    client_secret_ttl_s: int = Field(600, ge=10, description="lifetime of a client secret without expires_after")
    client_secret_max_ttl_s: int = Field(7200, ge=10, description="longest expires_after.seconds accepted")
    max_client_secret_session_bytes: int = Field(
        8 * 1024, ge=256, description="JSON session bound into a client secret; larger -> 400 invalid_value"
    )
    client_secret_keys: list[str] = Field(
        default_factory=list,
        description="keys signing client secrets (ek_...), at least 32 characters each: the first signs, "
        "every one verifies (rotate: put a new key first, drop the old one after client_secret_max_ttl_s); "
        "[] = derived from cluster.secret in a Ray cluster, else random per server start (shared by its workers)",
    )
    max_sdp_bytes: int = Field(
        64 * 1024, ge=4096, description="an SDP offer (a browser's is 2-6 KiB); larger -> 413 request_too_large"
    )
    max_offer_parts: int = Field(
        4, ge=2, description="parts of a multipart call offer ('sdp', 'session'); more -> 400 invalid_sdp"
    )

    @field_validator("client_secret_keys")
    @classmethod
    def _long_keys(cls, keys: list[str]) -> list[str]:
        if any(len(key) < 32 for key in keys):
            raise ValueError("each client secret key needs at least 32 characters")
        return keys


def default_workers() -> int:
    """One front-end process per two cores beyond the first two: codec work scales with cores,
    and small machines keep everything in one process."""
    cores = os.cpu_count() or 1
    return 1 if cores <= 2 else min(16, cores // 2)


class ServerConfig(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8091, ge=0, le=65535)
    engine: str = Field("cascade", description="engine serving realtime sessions: cascade, loopback, tone, ...")
    api_key: str | None = Field(None, description="when set, every route requires it")
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    workers: int = Field(
        default_factory=default_workers,
        ge=1,
        le=256,
        description="front-end worker processes; 1 = engines and front-end in one process",
    )
    engine_link: EngineLinkConfig = EngineLinkConfig()
    sessions: SessionLimits = SessionLimits()
    transport: TransportLimits = TransportLimits()
    lockstep: LockstepConfig = LockstepConfig()
    reference: ReferenceEngineConfig = ReferenceEngineConfig()
    robot: RobotConfig = RobotConfig()
    moshi: MoshiConfig = MoshiConfig()
    moshi_engine: MoshiEngineConfig = MoshiEngineConfig()
    stt_engine: SttEngineConfig = SttEngineConfig()
    asr_streaming: AsrStreamingConfig = AsrStreamingConfig()
    tts_engine: TtsEngineConfig = TtsEngineConfig()
    tts_streaming: TtsStreamingConfig = TtsStreamingConfig()
    image_engine: DiffusionEngineConfig = DiffusionEngineConfig()
    video_engine: DiffusionEngineConfig = DiffusionEngineConfig()
    videos: VideoRoutesConfig = VideoRoutesConfig()
    images: ImagesConfig = ImagesConfig()
    weights: WeightsConfig = WeightsConfig()
    models: ModelPaths = ModelPaths()
    cascade: CascadeLimits = CascadeLimits()
    codecs: CodecLimits = CodecLimits()
    http: HttpGenerationConfig = HttpGenerationConfig()
    speech_stream: SpeechStreamConfig = SpeechStreamConfig()
    voices: VoiceStoreConfig = VoiceStoreConfig()
    enable_sleep_mode: bool = Field(
        False, description="serve POST /v1/omni/sleep and /v1/omni/wakeup (--enable-sleep-mode)"
    )
    cluster: ClusterConfig = ClusterConfig()
    peers: PeersConfig = PeersConfig()
    webrtc: WebRtcConfig = WebRtcConfig()
    video_input: VideoInputConfig = VideoInputConfig()
    ssl_certfile: str | None = Field(None, description="PEM certificate chain: serve HTTPS/WSS (with ssl_keyfile)")
    ssl_keyfile: str | None = Field(None, description="PEM private key of ssl_certfile")

    @model_validator(mode="after")
    def _stt_for_the_cascade(self) -> ServerConfig:
        if self.cascade.asr == "stt_engine" and not self.stt_engine.weights:
            raise ValueError("cascade.asr 'stt_engine' needs stt_engine.weights (the streaming STT to hear with)")
        return self

    @model_validator(mode="after")
    def _tts_server_for_the_cascade(self) -> ServerConfig:
        if self.cascade.tts == "tts_server" and not self.cascade.tts_server.url:
            raise ValueError("cascade.tts 'tts_server' needs cascade.tts_server.url (the TTS server to speak through)")
        return self

    @model_validator(mode="after")
    def _heartbeat_outlasts_reply_audio(self) -> ServerConfig:
        # A client that reads a cascade reply at playback pace finds a ping behind up to
        # max_audio_ahead_s of audio, and its pong is due within half the heartbeat.
        if self.engine == "cascade" and self.transport.ws_heartbeat_s / 2 <= self.cascade.max_audio_ahead_s:
            raise ValueError(
                f"transport.ws_heartbeat_s ({self.transport.ws_heartbeat_s:g} s) must be more than twice "
                f"cascade.max_audio_ahead_s ({self.cascade.max_audio_ahead_s:g} s): a client reading a reply at "
                "playback pace meets the ping behind that much audio and would be dropped for a late pong"
            )
        return self

    @model_validator(mode="after")
    def _fill_client_secret_keys(self) -> ServerConfig:
        # Filled once, where the configuration is loaded: workers are started with this
        # configuration, so they verify each other's secrets; cluster front-ends agree through
        # the one secret they share. Never derived from the API key, which a client secret's
        # holder could then test guesses against offline.
        if not self.webrtc.client_secret_keys:
            secret = self.cluster.secret
            self.webrtc.client_secret_keys = [
                hmac.new(secret.encode(), b"rtserve client secrets", hashlib.sha256).hexdigest()
                if secret
                else secrets.token_hex(32)
            ]
        return self


class ConfigError(Exception):
    """An invalid configuration; ``str()`` is one readable line naming the field."""


def _env_overrides(environ: dict[str, str]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, value in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        path = key[len(ENV_PREFIX) :].lower().split("__")
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
        # YAML scalars give ints, floats, bools and null the same way the file does.
        node[path[-1]] = yaml.safe_load(value) if value != "" else None
    return tree


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _first_error_line(exc: ValidationError) -> str:
    err = exc.errors()[0]
    if not err["loc"]:  # a rule across fields: its message names them; its input is the whole config (secrets too)
        return f"invalid config: {err['msg'].removeprefix('Value error, ')}"
    field = ".".join(str(p) for p in err["loc"])
    return f"invalid config field '{field}': {err['msg']} (got {err.get('input')!r})"


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
) -> ServerConfig:
    """Build the config; later sources win: file < environment < ``overrides`` (flags)."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}".splitlines()[0]) from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        data = loaded
    data = _merge(data, _env_overrides(dict(os.environ if environ is None else environ)))
    data = _merge(data, {k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return ServerConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_first_error_line(exc)) from None
