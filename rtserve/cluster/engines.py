"""A front-end's view of every engine of the cluster: one ``Engines`` over several links.

Each engine (a Ray actor) is reached through its own ``EngineLink``, so frames still cross
in one batch per tick per front-end and engine. Admission is cluster-wide: every engine's
offer carries its open sessions (re-sent on each open and close, to the opener before its
answer), a new session goes to the least-loaded engine with a free slot and stays there
for its life (its ``EngineSession`` is that engine's), and ``resource_exhausted`` comes
only when every engine is full. The engine's slot table stays the authority: an engine
that fills up (or starts draining) between our look and our open refuses, and the next
engine is tried. Turn-engine streams and robot-policy connections go to the least-loaded
ready engine the same way.

What changes state on every engine goes to every reachable engine at once: sleep and wake
(``sleeping`` is every stage asleep on any of them, so new work is refused while one still
sleeps) and voice registration (any engine may be the one that speaks with the voice). Each
is the control call ``RemoteEngines`` makes to one engine process; the answers are merged
(one sleep/wake ack per stage), and an engine's refusal is the caller's error.

No Ray here: links are built from plain ``connect()`` functions (``frontend.py`` makes
them from actor handles), so this is tested without a cluster too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from rtserve.config import EngineLinkConfig
from rtserve.engines.errors import CapacityExhausted, EngineError
from rtserve.engines.kyutai_tts.service import TTSStreamEngine
from rtserve.engines.protocols import EngineSession, LLMEngine, TTSEngine, TurnEngines, token_counter
from rtserve.engines.remote.client import RemoteEngines, RemotePolicy
from rtserve.engines.remote.link import EngineLink, EngineUnavailable
from rtserve.engines.remote.offer import EngineOffer, TurnEngineInfo
from rtserve.engines.remote.wire import LinkMetrics
from rtserve.engines.values import (
    ChatMessage,
    Pcm,
    SamplingParams,
    SessionOptions,
    TokenDelta,
    TranscriptPiece,
    VoiceInfo,
)
from rtserve.errors import MODEL_NOT_FOUND
from rtserve.process_metrics import merge_expositions
from rtserve.weights import DownloadStatus

log = logging.getLogger(__name__)

Connect = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]
_METRICS_TIMEOUT_S = 2.0
T = TypeVar("T")


@dataclass
class EngineMember:
    """One engine of the cluster as this front-end reaches it."""

    name: str
    link: EngineLink
    remote: RemoteEngines

    @property
    def reachable(self) -> bool:
        return self.link.connected.is_set()

    @property
    def serving(self) -> bool:
        offer = self.link.offer
        return self.reachable and offer is not None and offer.ready

    @property
    def free_slots(self) -> int:
        return self.link.offer.free_slots if self.serving and self.link.offer is not None else 0

    @property
    def load(self) -> float:
        offer = self.link.offer
        return 1.0 if offer is None else offer.sessions / max(1, offer.capabilities.max_sessions)


class ClusterSessionEngine:
    """The ``SessionEngine`` of the whole cluster: opens each session on one engine."""

    def __init__(self, members: Sequence[EngineMember], template: EngineOffer) -> None:
        self.capabilities = template.capabilities
        self._members = members
        self._model_ids = list(template.model_ids)
        self._turn_engines = TurnEngines(
            asr=RoutedASR(members, template.asr) if template.asr else None,
            llm=RoutedLLM(members, template.llm) if template.llm else None,
            tts=RoutedTTS(members, template.tts) if template.tts else None,
        )

    @property
    def ready(self) -> bool:
        return any(member.serving for member in self._members)

    async def start(self) -> None:
        """Every engine actor starts its engines itself; readiness arrives with each offer."""

    async def stop(self) -> None:
        """The links belong to ``ClusterEngines``, which closes them."""

    def model_ids(self) -> list[str]:
        return list(self._model_ids)

    def turn_engines(self) -> TurnEngines:
        """Each stream goes to the least-loaded serving engine."""
        return self._turn_engines

    def sleep_stages(self) -> tuple[()]:
        """Sleep mode unloads stages inside each engine actor (``ClusterEngines.sleep``), not here."""
        return ()

    async def open_session(self, session_id: str, options: SessionOptions) -> EngineSession:
        candidates = sorted((m for m in self._members if m.free_slots > 0), key=lambda m: (m.load, m.name))
        for member in candidates:
            try:
                return await member.remote.session_engine.open_session(session_id, options)
            except (CapacityExhausted, EngineUnavailable):
                continue  # filled (or drained, or lost) since its last offer: the next engine
        if not self.ready:
            raise EngineUnavailable("no engine of the cluster is serving")
        raise CapacityExhausted(f"every engine's slots are in use ({len(self._members)} engines)")


def least_loaded(members: Sequence[EngineMember]) -> EngineMember:
    serving = [m for m in members if m.serving]
    if not serving:
        raise EngineUnavailable("no engine of the cluster is serving")
    return min(serving, key=lambda m: (m.load, m.name))


async def on_every_engine(
    members: Sequence[EngineMember], call: Callable[[RemoteEngines], Awaitable[T]]
) -> list[tuple[str, T]]:
    """``call`` on every reachable engine at once: (name, answer) of each that answered. An
    engine lost meanwhile is left out (a restarted actor starts afresh); any other refusal is
    raised once every engine has answered (the others have acted)."""
    reachable = [m for m in members if m.reachable]

    async def attempt(member: EngineMember) -> T:
        return await call(member.remote)

    results = await asyncio.gather(*(attempt(m) for m in reachable), return_exceptions=True)
    answered: list[tuple[str, T]] = []
    refusals: list[BaseException] = []
    for member, result in zip(reachable, results):
        if isinstance(result, EngineUnavailable):
            log.warning("engine actor %s was lost during a call to every engine: %s", member.name, result)
        elif isinstance(result, BaseException):
            refusals.append(result)
        else:
            answered.append((member.name, result))
    if refusals:
        raise refusals[0]
    if not answered:
        raise EngineUnavailable("no engine of the cluster is reachable")
    return answered


def merged_acks(answers: Sequence[tuple[str, list[dict[str, Any]]]], measure: str) -> list[dict[str, Any]]:
    """One sleep/wake ack per stage, as one engine gives them: ``measure`` (``freed_bytes``,
    ``restored_bytes``) summed over the engines that acted on the stage, named in ``engines``;
    ``level`` the highest."""
    merged: dict[int, dict[str, Any]] = {}
    for name, acks in answers:
        for ack in acks:
            into = merged.setdefault(ack["stage_id"], {**ack, measure: 0, "engines": []})
            into[measure] += ack[measure]
            into["engines"].append(name)
            if "level" in ack:
                into["level"] = max(into["level"], ack["level"])
    return [merged[stage_id] for stage_id in sorted(merged)]


class _RoutedTurnEngine:
    def __init__(self, members: Sequence[EngineMember], info: TurnEngineInfo) -> None:
        self._members = members
        self.model_name = info.model_name
        self.sample_rate = info.sample_rate
        self.voices = info.voices

    def _turn_engines(self) -> TurnEngines:
        return least_loaded(self._members).remote.turn_engines


class RoutedLLM(_RoutedTurnEngine):
    def _llm(self) -> LLMEngine:
        llm = self._turn_engines().llm
        if llm is None:
            raise EngineError("the engine has no LLM loaded", code=MODEL_NOT_FOUND)
        return llm

    async def generate(
        self, messages: Sequence[ChatMessage], params: SamplingParams, *, fit_history: bool = False
    ) -> AsyncGenerator[TokenDelta, None]:
        async with contextlib.aclosing(self._llm().generate(messages, params, fit_history=fit_history)) as items:
            async for item in items:
                yield item

    async def tokenize(
        self, prompt: Sequence[ChatMessage] | str, params: SamplingParams, *, add_special_tokens: bool = False
    ) -> list[int]:
        return await token_counter(self._llm()).tokenize(prompt, params, add_special_tokens=add_special_tokens)

    async def context_tokens(self) -> int | None:
        return await token_counter(self._llm()).context_tokens()


class RoutedTTS(_RoutedTurnEngine):
    async def synthesize(self, text: str, *, voice: str | None = None, speed: float = 1.0) -> AsyncGenerator[Pcm, None]:
        tts = _tts(least_loaded(self._members).remote)
        async with contextlib.aclosing(tts.synthesize(text, voice=voice, speed=speed)) as items:
            async for item in items:
                yield item

    # A voice is registered with (and removed from) every engine: any of them may speak with it.
    async def voice_list(self) -> list[VoiceInfo]:
        return await _tts(least_loaded(self._members).remote).voice_list()

    async def add_voice(self, name: str, model: bytes, config: bytes) -> VoiceInfo:
        answers = await on_every_engine(self._members, lambda remote: _tts(remote).add_voice(name, model, config))
        return answers[0][1]

    async def remove_voice(self, name: str) -> None:
        await on_every_engine(self._members, lambda remote: _tts(remote).remove_voice(name))


def _tts(remote: RemoteEngines) -> TTSEngine:
    if remote.turn_engines.tts is None:
        raise EngineError("the engine has no TTS model loaded", code=MODEL_NOT_FOUND)
    return remote.turn_engines.tts


class RoutedASR(_RoutedTurnEngine):
    async def transcribe(
        self, audio: AsyncIterator[Pcm], *, language: str | None = None, prompt: str | None = None
    ) -> AsyncGenerator[TranscriptPiece, None]:
        asr = self._turn_engines().asr
        if asr is None:
            raise EngineError("the engine has no ASR model loaded", code=MODEL_NOT_FOUND)
        async with contextlib.aclosing(asr.transcribe(audio, language=language, prompt=prompt)) as items:
            async for item in items:
                yield item


class ClusterEngines:
    """Every engine actor behind one ``Engines`` surface (``web/context.Engines``)."""

    def __init__(self, members: Sequence[EngineMember], template: EngineOffer) -> None:
        self.members = list(members)
        self.session_engine = ClusterSessionEngine(self.members, template)
        self.turn_engines = self.session_engine.turn_engines()
        # Streaming speech is not routed among engines yet: front-ends load their own Kyutai TTS.
        self.speech_engine: TTSStreamEngine | None = None

    @staticmethod
    def links(
        connects: Sequence[tuple[str, Connect]],
        settings: EngineLinkConfig,
        *,
        worker_index: int,
        registry: CollectorRegistry,
    ) -> list[tuple[str, EngineLink]]:
        """One (not yet started) link per engine."""
        metrics = LinkMetrics(registry)  # one set for every link: a registry takes each name once
        return [
            (
                name,
                EngineLink(
                    connect,
                    worker_index,
                    settings=settings,
                    metrics=metrics,
                ),
            )
            for name, connect in connects
        ]

    @classmethod
    async def connect(
        cls, links: Sequence[tuple[str, EngineLink]], settings: EngineLinkConfig, *, startup_timeout_s: float
    ) -> ClusterEngines:
        """Starts the links; waits up to ``startup_timeout_s`` for every engine to answer (at
        least one must). One that has not answered yet joins once it does."""
        for _, link in links:
            link.start()
        waits = [asyncio.ensure_future(link.connected.wait()) for _, link in links]
        await asyncio.wait(waits, timeout=startup_timeout_s)
        for wait in waits:
            wait.cancel()
        answered = [link.offer for _, link in links if link.offer is not None]
        if not answered:
            await asyncio.gather(*(link.close() for _, link in links))
            raise EngineUnavailable(f"no engine actor answered within {startup_timeout_s:g} s")
        template = answered[0]
        absent = replace(template, ready=False, failure="the engine actor has not answered yet", sessions=0)
        for name, link in links:
            if link.offer is None:
                log.warning("engine actor %s has not answered yet; it joins once it does", name)
        members = [
            EngineMember(
                name, link, RemoteEngines(link, link.offer or absent, max_queued_events=settings.max_queued_events)
            )
            for name, link in links
        ]
        return cls(members, template)

    @property
    def ready(self) -> bool:
        return self.session_engine.ready

    @property
    def failure(self) -> str | None:
        if self.ready:
            return None
        reasons = [
            f"{m.name}: {(m.link.offer.failure if m.link.offer else None) or 'not reachable'}" for m in self.members
        ]
        return "no engine of the cluster is serving (" + "; ".join(reasons) + ")"

    def start(self) -> None:
        for member in self.members:
            member.remote.start()

    async def stop(self) -> None:
        await asyncio.gather(*(member.remote.stop() for member in self.members))

    @property
    def downloading(self) -> DownloadStatus | None:
        """Weights downloading on the reachable engines, summed; None when none is."""
        each = [status for m in self.members if m.reachable and (status := m.remote.downloading) is not None]
        return DownloadStatus(sum(s.done for s in each), sum(s.total for s in each)) if each else None

    @property
    def sleeping(self) -> tuple[int, ...]:
        """Sleep mode: every stage id asleep on any reachable engine (new work is refused while
        any is, as with one engine)."""
        return tuple(sorted({stage for m in self.members if m.reachable for stage in m.remote.sleeping}))

    async def sleep(self, stage_ids: Sequence[int] | None, level: int) -> list[dict[str, Any]]:
        """Every reachable engine puts the stages to sleep; one ack per stage (``freed_bytes``
        summed over the engines)."""
        answers = await on_every_engine(self.members, lambda remote: remote.sleep(stage_ids, level))
        return merged_acks(answers, "freed_bytes")

    async def wake_up(self, stage_ids: Sequence[int] | None) -> list[dict[str, Any]]:
        """Every reachable engine wakes the stages it has asleep; one ack per stage woken
        anywhere (``restored_bytes`` summed)."""
        answers = await on_every_engine(self.members, lambda remote: remote.wake_up(stage_ids))
        return merged_acks(answers, "restored_bytes")

    async def policy(self) -> RemotePolicy | None:
        """The robot policy of the least-loaded serving engine: a connection keeps it for its life."""
        try:
            member = least_loaded(self.members)
        except EngineUnavailable:
            member = self.members[0]
        return await member.remote.policy()

    async def exposition(self, own: bytes) -> bytes:
        """This front-end's metrics and every reachable engine actor's, labelled ``engine="NAME"``."""
        texts = await asyncio.gather(*(self._engine_metrics(m) for m in self.members))
        return merge_expositions(own, {m.name: text for m, text in zip(self.members, texts) if text}, label="engine")

    @staticmethod
    async def _engine_metrics(member: EngineMember) -> bytes:
        if not member.link.connected.is_set():
            return b""
        try:
            return await asyncio.wait_for(member.link.call("engine", "metrics", b""), _METRICS_TIMEOUT_S)
        except (EngineError, TimeoutError):
            return b""

    def placement(self) -> dict[str, Any]:
        """Which engine is serving and how loaded it is (for logs and tests)."""
        return {
            m.name: {
                "serving": m.serving,
                "sessions": m.link.offer.sessions if m.link.offer else None,
                "draining": bool(m.link.offer and m.link.offer.draining),
            }
            for m in self.members
        }
