"""What an engine process offers its workers, sent on connect and whenever it changes.

Workers build their app from the first offer (capabilities, turn-engine names), so it is
complete before any engine has finished starting."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rtserve.engines.engine_set import EngineSet
from rtserve.engines.values import EngineCapabilities
from rtserve.weights import DownloadStatus


@dataclass(frozen=True)
class TurnEngineInfo:
    """The attributes front-ends read off a turn engine without calling it."""

    model_name: str
    sample_rate: int = 0
    voices: tuple[str, ...] = ()


@dataclass(frozen=True)
class SpeechStreamsInfo:
    """A streaming speech engine (the STT, ``TurnEngines.stt``; the Kyutai TTS behind
    ``/api/tts_streaming``) as workers see it: its streams cross the link
    (``remote/speech_streams.py``, ``remote/tts_streams.py``)."""

    sample_rate: int
    release_timeout_s: float
    ready: bool
    failure: str | None = None


@dataclass(frozen=True)
class EngineOffer:
    capabilities: EngineCapabilities
    model_ids: tuple[str, ...]
    ready: bool
    failure: str | None = None  # why the engine could not start: /health says it
    asr: TurnEngineInfo | None = None
    llm: TurnEngineInfo | None = None
    tts: TurnEngineInfo | None = None
    stt: SpeechStreamsInfo | None = None
    tts_streams: SpeechStreamsInfo | None = None
    policy_loading: bool = False  # a configured robot policy is still loading
    policy_config: dict[str, Any] | None = None  # the openpi handshake dict, once a policy is served
    sleeping: tuple[int, ...] = ()  # sleep mode: the stage ids asleep now
    downloading: DownloadStatus | None = None  # weights downloading (docs/engines.md#hub-weights)
    # Load, for front-ends choosing among several engines (cluster admission): sessions open
    # on this engine from every front-end, and whether it takes new ones.
    sessions: int = 0
    draining: bool = False

    @property
    def free_slots(self) -> int:
        return 0 if self.draining else max(0, self.capabilities.max_sessions - self.sessions)


def offer_of(engines: EngineSet) -> EngineOffer:
    session_engine, turn = engines.session_engine, engines.turn_engines
    batcher = engines.policy_batcher
    stt, speech = turn.stt, engines.speech_engine
    release_timeout_s = engines.config.lockstep.release_timeout_s  # what the TTS streams wait for a slot
    return EngineOffer(
        capabilities=session_engine.capabilities,
        model_ids=tuple(session_engine.model_ids()),
        ready=engines.ready,
        failure=engines.failure,
        asr=None if turn.asr is None else TurnEngineInfo(turn.asr.model_name, turn.asr.sample_rate),
        llm=None if turn.llm is None else TurnEngineInfo(turn.llm.model_name),
        tts=None if turn.tts is None else TurnEngineInfo(turn.tts.model_name, turn.tts.sample_rate, turn.tts.voices),
        stt=None if stt is None else SpeechStreamsInfo(stt.sample_rate, stt.release_timeout_s, stt.ready, stt.failure),
        tts_streams=None
        if speech is None
        else SpeechStreamsInfo(speech.sample_rate, release_timeout_s, speech.ready, speech.failure),
        policy_loading=engines.policy_loading,
        policy_config=None if batcher is None else batcher.policy.server_config(),
        sleeping=engines.sleeping,
        downloading=engines.downloading,
    )
