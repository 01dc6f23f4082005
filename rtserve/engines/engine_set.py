"""Every engine a server runs, built in one place and started and stopped together.

In one process the app holds the ``EngineSet``; with ``--workers N`` the engine process
holds it and workers reach it through ``engines.remote`` (``RemoteEngines`` has the same
surface). Transports never build engines.

Engines start in the background: ``/health`` answers 503 while models load, and says why
if the session engine failed to start. The robot policy loads off the loop the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from rtserve.config import ConfigError, ServerConfig
from rtserve.engines.kyutai_tts.service import SpeaksWithStreams
from rtserve.engines.policy.batcher import PolicyBatcher
from rtserve.engines.protocols import HostedSessionEngine, SleepStage, TTSEngine
from rtserve.engines.registry import create_engine, create_text_engine, load_policy_batcher
from rtserve.engines.sleep import SleepController
from rtserve.weights import BOARD, DownloadStatus

if TYPE_CHECKING:
    from rtserve.engines.kyutai_stt.engine import KyutaiSttEngine
    from rtserve.engines.kyutai_tts.engine import KyutaiTTSEngine

log = logging.getLogger(__name__)


class EngineSet:
    def __init__(
        self, config: ServerConfig, registry: CollectorRegistry, *, session_engine: HostedSessionEngine | None = None
    ) -> None:
        self.config = config
        self.registry = registry
        self.session_engine = session_engine or create_engine(config.engine, config, registry)
        self._text_engine = create_text_engine(config, registry)
        # One Kyutai TTS engine (tts_engine.weights) for the speech routes and the cascade.
        self.speech_engine, speech = _speech_engine(config, registry)
        self._speech_needed = False  # the session engine speaks with it: not ready without it
        if isinstance(self.session_engine, SpeaksWithStreams):
            if config.cascade.tts == "tts_engine" and self.speech_engine is None:
                raise ConfigError("invalid config field 'cascade.tts': 'tts_engine' needs tts_engine.weights set")
            if self.speech_engine is not None:
                self._speech_needed = self.session_engine.speak_with(self.speech_engine)
        lent = self.session_engine.turn_engines()
        # The one Kyutai STT engine (stt_engine.weights): the cascade's where it hears with it, else
        # one built and run here; every front-end's speech-to-text streams go to it.
        self.stt_engine = None if lent.stt is not None else _stt_engine(config, registry)
        if self.stt_engine is not None:
            lent = dataclasses.replace(lent, stt=self.stt_engine)
        # A configured text engine (vLLM, or the embedded LLM alone) replaces the session engine's LLM for chat.
        self.turn_engines = lent if self._text_engine is None else dataclasses.replace(lent, llm=self._text_engine)
        if speech is not None:  # and the Kyutai TTS engine its TTS for speech
            self.turn_engines = dataclasses.replace(self.turn_engines, tts=speech)
        self.failure: str | None = None  # why an engine (session, or vLLM text) could not start: /health says it
        # A config the session engine refused while starting (weights that cannot be found or
        # fetched): no restart heals it, so the server stops and exits 2 with this one line.
        self.fatal: ConfigError | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self.policy_batcher: PolicyBatcher | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._policy_loading: asyncio.Task[PolicyBatcher | None] | None = None
        self._listeners: list[Callable[[], None]] = []
        self._sleep: SleepController | None = None  # built on first use: only sleep mode asks for stages

    @property
    def ready(self) -> bool:
        """The session engine serves, and so does the text engine (vLLM, or the embedded LLM unless an
        operator put it to sleep) where one is configured."""
        return (
            self.session_engine.ready
            and (
                self._text_engine is None
                or self._text_engine.ready
                or self._text_engine.asleep  # an operator's sleep (a vLLM's never is)
            )
            and (
                not self._speech_needed
                or self.speech_engine is None
                or self.speech_engine.ready
                or self.speech_engine.asleep  # an operator's sleep, as the session engine's stages
            )
        )

    @property
    def settled(self) -> bool:
        """Ready, and nothing left loading in the background: the robot policy, and engines that
        the session engine does not wait for (a Kyutai STT or TTS engine beside a loopback one)."""
        return self.ready and not self.policy_loading and all(task.done() for task in self._tasks)

    @property
    def policy_configured(self) -> bool:
        return self.config.robot.policy != "none"

    @property
    def policy_loading(self) -> bool:
        """A configured policy that is not loaded (or failed) yet, also before ``start()``."""
        return self.policy_configured and (self._policy_loading is None or not self._policy_loading.done())

    @property
    def downloading(self) -> DownloadStatus | None:
        """Weights downloading now (docs/engines.md#hub-weights); None when nothing is."""
        return BOARD.status()

    def on_change(self, listener: Callable[[], None]) -> None:
        """Called when readiness, a failure or the policy changes (the engine process tells its workers)."""
        self._listeners.append(listener)

    def start(self) -> None:
        """Start everything in the background; returns at once."""
        # How long a thread may hold the GIL while another waits. Python's 5 ms is the default:
        # 0.5 ms seemed to help 512 STT streams until their stalls proved to be full collections
        # (rtserve/heap.py); then it measured no better there and much worse for the cascade's
        # seven threads at 256 voice sessions (benchmarks/notes/voice_agent_gpu.md).
        sys.setswitchinterval(self.config.lockstep.gil_switch_interval_ms / 1e3)
        _import_before_loaders()
        loop = asyncio.get_running_loop()

        def download_changed() -> None:  # called on the downloading thread
            loop.call_soon_threadsafe(self._changed)

        self._unsubscribe = BOARD.subscribe(download_changed)
        starts = [self._start_session_engine()]
        if self._text_engine is not None:
            starts.append(self._start_text_engine())
        for side in (self.speech_engine, self.stt_engine):
            if side is not None:
                starts.append(self._start_side_engine(side))
        for start in starts:  # each one done (served or failed): the workers and the heap freeze learn it
            self._tasks.append(asyncio.create_task(start))
            self._tasks[-1].add_done_callback(lambda _: self._changed())
        self._policy_loading = asyncio.create_task(self._load_policy())
        self._policy_loading.add_done_callback(lambda _: self._changed())

    async def exposition(self, own: bytes) -> bytes:
        """Metrics of every process serving: here, one process, whose registry holds them all."""
        return own

    async def policy(self) -> PolicyBatcher | None:
        """The robot policy's running batcher once loaded; None when none is configured or it failed."""
        return None if self._policy_loading is None else await asyncio.shield(self._policy_loading)

    async def stop(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._text_engine is not None:
            self._text_engine.stop()
        if self._policy_loading is not None:
            self._policy_loading.cancel()  # a cancelled wait leaves a still-running load thread to finish alone
            await asyncio.gather(self._policy_loading, return_exceptions=True)
        if self.policy_batcher is not None:
            await asyncio.to_thread(self.policy_batcher.stop)
        await self.session_engine.stop()
        if self.speech_engine is not None:
            await self.speech_engine.stop()
        if self.stt_engine is not None:
            await self.stt_engine.stop()

    # ------------------------------------------------------------------ sleep mode (docs/serving.md#sleep-mode)

    @property
    def sleeping(self) -> tuple[int, ...]:
        """Stage ids asleep now; while any is, the engine refuses new work (``engine_sleeping``)."""
        return () if self._sleep is None else self._sleep.sleeping

    def _sleep_controller(self) -> SleepController:
        if self._sleep is None:
            stages: tuple[SleepStage, ...] = tuple(self.session_engine.sleep_stages())
            # The Kyutai TTS: the session engine's own TTS stage where it speaks with it, else one more;
            # the Kyutai STT: the session engine's ASR stage where it hears with it, else one more.
            if self.speech_engine is not None and not self._speech_needed:
                stages += (self.speech_engine,)
            if self.stt_engine is not None:
                stages += (self.stt_engine,)
            # The embedded LLM (http.text_engine: embedded) sleeps as a stage of its own; a vLLM server
            # sleeps by its own API (as a stage here it would refuse every sleep).
            if self._text_engine is not None and self.config.http.text_engine == "embedded":
                stages += (self._text_engine,)
            self._sleep = SleepController(self.session_engine.capabilities.name, stages)
        return self._sleep

    async def sleep(self, stage_ids: Sequence[int] | None, level: int) -> list[dict[str, Any]]:
        try:
            return await self._sleep_controller().sleep(stage_ids, level)
        finally:
            self._changed()  # workers learn the sleeping set, to refuse work before reaching the engine

    async def wake_up(self, stage_ids: Sequence[int] | None) -> list[dict[str, Any]]:
        try:
            return await self._sleep_controller().wake_up(stage_ids)
        finally:
            self._changed()

    def _changed(self) -> None:
        for listener in self._listeners:
            listener()

    async def _start_session_engine(self) -> None:
        name = self.session_engine.capabilities.name
        try:
            await self.session_engine.start()
            log.info("engine %s ready", name)
        except ConfigError as exc:  # the process stops; its entry point prints the one line
            self.failure = f"{type(exc).__name__}: {exc}"
            self.fatal = exc
        except Exception as exc:  # the server stays up and says why on /health
            self.failure = f"{type(exc).__name__}: {exc}"
            log.exception("engine %s failed to start", name)

    async def _start_side_engine(self, engine: KyutaiTTSEngine | KyutaiSttEngine) -> None:
        """A Kyutai TTS or STT engine. Its failure is kept by the engine (its routes refuse with it)
        and makes /health "failed": a configured engine that does not serve, whether or not the
        session engine speaks or hears with it (a TTS server's engine that failed once said "ok")."""
        await engine.start()
        if engine.failure:
            self.failure = engine.failure

    async def _start_text_engine(self) -> None:
        assert self._text_engine is not None
        try:
            await self._text_engine.start()
        except Exception as exc:  # chat answers 503 model_unavailable, /health failed; the log says why
            self.failure = f"{type(exc).__name__}: {exc}"
            log.exception("the text engine (http.text_engine %s) failed to start", self.config.http.text_engine)

    async def _load_policy(self) -> PolicyBatcher | None:
        robot = self.config.robot
        if not self.policy_configured:
            return None
        try:
            batcher = await asyncio.to_thread(load_policy_batcher, robot, self.registry)
        except Exception:
            log.exception(
                "robot policy %r failed to load; the openpi route answers 'Robot policy not available'", robot.policy
            )
            return None
        batcher.start()
        self.policy_batcher = batcher
        log.info(
            "robot policy %r ready (max_batch=%d, window=%.1f ms)", robot.policy, robot.max_batch, robot.batch_window_ms
        )
        return batcher


def _stt_engine(config: ServerConfig, registry: CollectorRegistry) -> KyutaiSttEngine | None:
    """The Kyutai STT engine when ``stt_engine.weights`` is set (docs/engines.md#kyutai-stt-engine)."""
    if not config.stt_engine.weights:
        return None
    from rtserve.engines.kyutai_stt.engine import KyutaiSttEngine  # torch: only when configured

    return KyutaiSttEngine(config, registry=registry)


def _speech_engine(
    config: ServerConfig, registry: CollectorRegistry
) -> tuple[KyutaiTTSEngine | None, TTSEngine | None]:
    """The Kyutai TTS engine when ``tts_engine.weights`` is set, and the same engine as the speech
    routes' ``TTSEngine`` (docs/engines.md#kyutai-tts-over-http)."""
    if not config.tts_engine.weights:
        return None, None
    from rtserve.engines.kyutai_tts.engine import KyutaiTTSEngine  # torch: only when configured
    from rtserve.engines.kyutai_tts.speech import KyutaiSpeech

    engine = KyutaiTTSEngine(config, registry=registry)
    return engine, KyutaiSpeech(engine)


def _import_before_loaders() -> None:
    """anyio (under huggingface_hub, which transformers and faster-whisper import) compiles its own
    source to an AST when first imported, and CPython 3.11's AST builder is not thread-safe: in a
    Ray engine actor the cascade's LLM-loading thread failed with "SystemError: AST constructor
    recursion depth mismatch" while the other loaders ran beside it. Import it here, on the
    engine's loop thread, before any loading thread starts."""
    with contextlib.suppress(ImportError):  # not installed: nothing imports it
        import anyio  # noqa: F401
