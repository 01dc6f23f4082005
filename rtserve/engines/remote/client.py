"""Front-end proxies of the engines that run in the engine process.

``RemoteSessionEngine`` is a ``SessionEngine``; its sessions are ``EngineSession``s; the
turn-engine proxies are ``ASREngine``/``LLMEngine``/``TTSEngine`` (and the streaming STT's,
``speech_streams.py``, ``tts_streams.py``); ``RemotePolicy`` has the
policy batcher's interface. Front-ends use them exactly as the in-process engines, so
the session core and every transport run unchanged over either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, generate_latest

from rtserve.engines.events import EngineEvent, EngineFailure, OutputAudio
from rtserve.engines.lockstep.framing import check_audio
from rtserve.engines.protocols import SessionEngine, TurnEngines
from rtserve.engines.remote.link import ENGINE_LOST_FAILURE, EngineLink, EngineUnavailable, engine_lost
from rtserve.engines.remote.offer import EngineOffer, TurnEngineInfo
from rtserve.engines.remote.speech_streams import RemoteSpeechStreams
from rtserve.engines.remote.tts_streams import RemoteTTSStreams
from rtserve.engines.remote.wire import Kind
from rtserve.engines.values import (
    ChatMessage,
    EngineCapabilities,
    Pcm,
    ResponseRequest,
    SamplingParams,
    SessionOptions,
    TokenDelta,
    TranscriptPiece,
    VoiceInfo,
)
from rtserve.weights import DownloadStatus

log = logging.getLogger(__name__)

_METRICS_PUSH_S = 1.0


class RemoteEngineSession:
    """One engine session living in the engine process. Methods never block the loop."""

    def __init__(self, link: EngineLink, handle: int, capabilities: EngineCapabilities, max_queued_events: int) -> None:
        self.capabilities = capabilities
        self._link = link
        self._handle = handle
        self._events: deque[EngineEvent | None] = deque()
        self._max_queued = max_queued_events
        self._ready = asyncio.Event()
        self._emptied = asyncio.Event()
        self._emptied.set()
        self._epoch = 0
        self._closed = False
        self._dropped_audio = 0
        if capabilities.mode == "lockstep":  # its frames say what input they stepped
            link.uplink.time_arrivals(handle)
        link.register_session(handle, self._receive)

    # ------------------------------------------------------------------ engine -> session

    def _receive(self, event: Any) -> None:
        self._emptied.clear()
        if engine_lost(event):
            self._events.append(ENGINE_LOST_FAILURE)
            self._events.append(None)
        else:
            self._events.append(event)
            if len(self._events) > self._max_queued:
                self._drop_oldest_audio()
        self._ready.set()

    def _drop_oldest_audio(self) -> None:
        # A consumer that fell behind loses audio, never text or lifecycle events.
        for index, queued in enumerate(self._events):
            if isinstance(queued, OutputAudio) and not queued.text:
                del self._events[index]
                if self._dropped_audio == 0:  # once per session: the count is in the warning at close
                    log.warning("engine session %d: its reader fell behind; dropping its oldest audio", self._handle)
                self._dropped_audio += 1
                return

    async def events(self) -> AsyncGenerator[EngineEvent, None]:
        while True:
            while not self._events:
                self._ready.clear()
                await self._ready.wait()
            event = self._events.popleft()
            if not self._events:
                self._emptied.set()
            if event is None:
                return
            if isinstance(event, OutputAudio) and event.epoch < self._epoch:
                continue  # fenced here too: frames already in transit when the epoch moved
            yield event
            if isinstance(event, EngineFailure):
                return

    # ------------------------------------------------------------------ session -> engine

    def push_audio(self, pcm: Pcm) -> None:
        if self._closed:
            return
        self._link.uplink.push(self._handle, check_audio(pcm))

    async def commit_input(self) -> None:
        if not self._closed:
            await self._call("commit_input")

    async def drain(self) -> None:
        """The engine process's drain, then until this side's consumer read what it produced."""
        if self._closed:
            return
        await self._call("drain")
        await self._emptied.wait()

    def clear_input(self) -> None:
        self._link.uplink.drop_pending(self._handle)
        self._link.command("session", "clear_input", self._handle)

    def respond(self, request: ResponseRequest) -> None:
        self._link.command("session", "respond", self._handle, request)

    def set_epoch(self, epoch: int) -> None:
        self._epoch = epoch
        self._link.command("session", "set_epoch", self._handle, epoch)

    def configure_turn_detection(self, settings: Any) -> None:
        self._link.command("session", "configure_turn_detection", self._handle, settings)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._dropped_audio:
            log.warning(
                "engine session %d closed; %d audio frames were dropped for a slow reader",
                self._handle,
                self._dropped_audio,
            )
        self._link.uplink.drop(self._handle)
        with contextlib.suppress(EngineUnavailable):  # the engine process is gone, and its slots with it
            await self._call("close")

    async def _call(self, method: str) -> None:
        await self._link.call("session", method, self._handle)


class RemoteSessionEngine:
    """The ``SessionEngine`` of the engine process, seen from a worker."""

    def __init__(self, link: EngineLink, offer: EngineOffer, *, max_queued_events: int) -> None:
        self._link = link
        self._offer = offer
        self._max_queued_events = max_queued_events
        link.on_offer(self._offer_changed)
        self._offer_changed()

    @property
    def capabilities(self) -> EngineCapabilities:
        return self._offer.capabilities

    @property
    def ready(self) -> bool:
        return self._link.offer is not None and self._link.offer.ready

    @property
    def failure(self) -> str | None:
        offer = self._link.offer
        return "the engine process is not reachable" if offer is None else offer.failure

    @property
    def sleeping(self) -> tuple[int, ...]:
        """Sleep mode: the stage ids asleep now."""
        offer = self._link.offer
        return () if offer is None else offer.sleeping

    def _offer_changed(self) -> None:
        if self._link.offer is not None:
            self._offer = self._link.offer
        caps = self._offer.capabilities
        self._link.uplink.set_period(caps.chunk_period_ms / 1000 if caps.mode == "lockstep" else None)

    async def start(self) -> None:
        """The engine process starts its engines itself; readiness arrives with its offer."""

    async def stop(self) -> None:
        """The link belongs to ``RemoteEngines``, which closes it."""

    async def open_session(self, session_id: str, options: SessionOptions) -> RemoteEngineSession:
        handle, capabilities = await self._link.call_opening(
            lambda opened: self._link.command("session", "close", opened[0]),
            "engine",
            "open_session",
            session_id,
            options,
        )
        return RemoteEngineSession(self._link, handle, capabilities, self._max_queued_events)

    def model_ids(self) -> list[str]:
        return list(self._offer.model_ids)


class _RemoteTurnEngine:
    def __init__(self, link: EngineLink, info: TurnEngineInfo) -> None:
        self._link = link
        self.model_name = info.model_name
        self.sample_rate = info.sample_rate
        self.voices = info.voices


class RemoteLLM(_RemoteTurnEngine):
    def generate(
        self, messages: Sequence[ChatMessage], params: SamplingParams, *, fit_history: bool = False
    ) -> AsyncGenerator[TokenDelta, None]:
        return self._link.stream("llm", "generate", tuple(messages), params, fit_history)

    async def tokenize(
        self, prompt: Sequence[ChatMessage] | str, params: SamplingParams, *, add_special_tokens: bool = False
    ) -> list[int]:
        prompt = prompt if isinstance(prompt, str) else tuple(prompt)
        ids: list[int] = await self._link.call("llm", "tokenize", prompt, params, add_special_tokens)
        return ids

    async def context_tokens(self) -> int | None:
        context: int | None = await self._link.call("llm", "context_tokens")
        return context


class RemoteTTS(_RemoteTurnEngine):
    def synthesize(self, text: str, *, voice: str | None = None, speed: float = 1.0) -> AsyncGenerator[Pcm, None]:
        return self._link.stream("tts", "synthesize", text, {"voice": voice, "speed": speed})

    # Voices live where the TTS runs: every worker sees a registration at once.
    async def voice_list(self) -> list[VoiceInfo]:
        voices: list[VoiceInfo] = await self._link.call("tts", "voice_list")
        return voices

    async def add_voice(self, name: str, model: bytes, config: bytes) -> VoiceInfo:
        added: VoiceInfo = await self._link.call("tts", "add_voice", name, model, config)
        return added

    async def remove_voice(self, name: str) -> None:
        await self._link.call("tts", "remove_voice", name)


class RemoteASR(_RemoteTurnEngine):
    def transcribe(
        self, audio: AsyncIterator[Pcm], *, language: str | None = None, prompt: str | None = None
    ) -> AsyncGenerator[TranscriptPiece, None]:
        return self._link.stream("asr", "transcribe", {"language": language, "prompt": prompt}, input_items=audio)


class _RemotePolicyModel:
    """The parts of the policy itself a connection reads: its handshake and validation."""

    def __init__(self, server_config: dict[str, Any]) -> None:
        self._server_config = server_config

    def server_config(self) -> dict[str, Any]:
        return self._server_config

    def validate(self, observation: dict[str, Any]) -> None:
        """Checked by the engine process with each request, before batching (``infer`` raises)."""


class RemotePolicy:
    """The policy batcher of the engine process: requests from every worker batch together."""

    def __init__(self, link: EngineLink, server_config: dict[str, Any]) -> None:
        self._link = link
        self.policy = _RemotePolicyModel(server_config)

    async def infer(self, request: Any) -> Any:
        return await self._link.call("policy", "infer", request)

    def reset_session(self, key: str) -> None:
        self._link.command("policy", "reset_session", key)

    def client_connected(self) -> None:
        self._link.command("policy", "client_connected")

    def client_disconnected(self) -> None:
        self._link.command("policy", "client_disconnected")


class WorkerSessions(SessionEngine, Protocol):
    """Realtime sessions a worker hosts itself on the engine process's models."""

    @property
    def failure(self) -> str | None:
        """Why no session can open (a model of its own failed to load); None while fine."""
        ...


class RemoteEngines:
    """The engine process's ``EngineSet`` as a worker sees it (same surface)."""

    def __init__(
        self,
        link: EngineLink,
        offer: EngineOffer,
        *,
        max_queued_events: int,
        registry: CollectorRegistry | None = None,
    ) -> None:
        link.offer = link.offer or offer  # the first offer: what the app is built from
        self._link = link
        self._registry = registry  # pushed to the engine process each second, for every worker's /metrics
        self._publisher: asyncio.Task[None] | None = None
        self._starting: asyncio.Task[None] | None = None
        # The engine process's session engine; ``host_sessions`` may put this worker's own in its place.
        self.remote_sessions = RemoteSessionEngine(link, offer, max_queued_events=max_queued_events)
        self.session_engine: RemoteSessionEngine | WorkerSessions = self.remote_sessions
        self.turn_engines = TurnEngines(
            asr=RemoteASR(link, offer.asr) if offer.asr else None,
            llm=RemoteLLM(link, offer.llm) if offer.llm else None,
            tts=RemoteTTS(link, offer.tts) if offer.tts else None,
            stt=RemoteSpeechStreams(link, offer.stt, max_queued_events=max_queued_events) if offer.stt else None,
        )
        # The Kyutai TTS engine behind /api/tts_streaming (``EngineSet.speech_engine``).
        self.speech_engine = RemoteTTSStreams(link, offer.tts_streams) if offer.tts_streams else None
        self._offer_changed = asyncio.Event()
        link.on_offer(self._offer_changed.set)

    def host_sessions(self, sessions: WorkerSessions) -> None:
        """This worker hosts the realtime sessions itself (before ``start``; ``worker_cascade.py``)."""
        self.session_engine = sessions

    @property
    def _hosted(self) -> WorkerSessions | None:
        hosted = self.session_engine
        return None if isinstance(hosted, RemoteSessionEngine) else hosted

    @property
    def ready(self) -> bool:
        return self.session_engine.ready

    @property
    def failure(self) -> str | None:
        return self.session_engine.failure

    def start(self) -> None:
        """Connect (and keep reconnecting); the engine process starts the engines itself, this
        worker only the VAD of the sessions it hosts."""
        self._link.start()
        if self._registry is not None:
            self._publisher = asyncio.create_task(self._publish_metrics(self._registry))
        if (hosted := self._hosted) is not None:
            self._starting = asyncio.create_task(hosted.start(), name="worker-cascade-start")

    async def stop(self) -> None:
        tasks = [task for task in (self._publisher, self._starting) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if (hosted := self._hosted) is not None:
            await hosted.stop()
        await self._link.close()

    async def exposition(self, own: bytes) -> bytes:
        """Every process's metrics (the engine's, every worker's); this worker's alone while the
        engine process is down."""
        try:
            exposition: bytes = await self._link.call("engine", "metrics", own)
        except EngineUnavailable:
            return own
        return exposition

    async def _publish_metrics(self, registry: CollectorRegistry) -> None:
        while True:
            await asyncio.sleep(_METRICS_PUSH_S)
            with contextlib.suppress(EngineUnavailable):
                self._link.send((Kind.METRICS, self._link.worker_index, generate_latest(registry)))

    @property
    def sleeping(self) -> tuple[int, ...]:
        return self.remote_sessions.sleeping

    @property
    def downloading(self) -> DownloadStatus | None:
        offer = self._link.offer
        return None if offer is None else offer.downloading

    async def sleep(self, stage_ids: Sequence[int] | None, level: int) -> list[dict[str, Any]]:
        stages: list[dict[str, Any]] = await self._link.call("engine", "sleep", stage_ids, level)
        return stages

    async def wake_up(self, stage_ids: Sequence[int] | None) -> list[dict[str, Any]]:
        stages: list[dict[str, Any]] = await self._link.call("engine", "wake_up", stage_ids)
        return stages

    async def policy(self) -> RemotePolicy | None:
        while (offer := self._link.offer) is None or offer.policy_loading:
            self._offer_changed.clear()
            await self._offer_changed.wait()
        return None if offer.policy_config is None else RemotePolicy(self._link, offer.policy_config)
