"""Wires the layers: config -> engines -> session core -> transports.

Every engine is built in one place (``EngineSet``) and started and stopped with the app,
or runs in the engine process and is reached through ``RemoteEngines``; the transports in
``web/`` reach them through the ``AppContext`` only.
"""

from __future__ import annotations

import logging

from aiohttp import web
from prometheus_client import CollectorRegistry

from rtserve.config import ServerConfig
from rtserve.engines.cascade.speech_stream import WhisperSpeechStreamEngine
from rtserve.engines.diffusion.service import ImageService
from rtserve.engines.engine_set import EngineSet
from rtserve.engines.kyutai_stt.service import SpeechStreamEngine
from rtserve.engines.kyutai_tts.service import TTSStreamEngine
from rtserve.engines.protocols import HostedSessionEngine
from rtserve.engines.remote.in_process import LinkedEngines
from rtserve.process_metrics import ProcessMetrics
from rtserve.sessions import SessionManager
from rtserve.web import asr_streaming, base_routes, http, images, moshi, openpi, tts_streaming, video_chat
from rtserve.web.auth import auth_middleware
from rtserve.web.browser import routes as browser
from rtserve.web.codec_executor import CodecExecutor
from rtserve.web.context import CTX, AppContext, Engines
from rtserve.web.errors import error_middleware
from rtserve.web.peers import Peers
from rtserve.web.peers import site as peer_site
from rtserve.web.peers.drain import FrontEndDrain
from rtserve.web.realtime import routes as realtime
from rtserve.web.videos import routes as videos
from rtserve.web.webrtc import routes as webrtc
from rtserve.web.webrtc.client_secrets import ClientSecrets

log = logging.getLogger(__name__)

_PROCESS_METRICS = web.AppKey("process_metrics", ProcessMetrics)
ENGINE_CLIENTS = ("local", "link")
engine_client = "local"
"""How ``build_app`` reaches engines it builds itself: ``local`` calls them directly; ``link``
puts them behind an ``EngineServer`` in this process and reaches them through the engine
link over a socket pair, exactly as workers reach the engine process (the test suite's
second pass, ``pytest --engine-client=link``)."""


async def _on_startup(app: web.Application) -> None:
    ctx = app[CTX]
    ctx.engines.start()  # in the background: /health answers 503 while models load
    app[_PROCESS_METRICS].start()
    await ctx.sessions.start()  # the reaper: idle TTL, disconnect grace, cleanup retries


async def _close_sessions(app: web.Application) -> None:
    # Every session ends with session.closed{reason: "shutdown"} before the engine stops.
    await app[CTX].sessions.shutdown()


async def _on_cleanup(app: web.Application) -> None:
    ctx = app[CTX]
    ctx.codecs.shutdown()
    await app[_PROCESS_METRICS].stop()
    await ctx.engines.stop()


def _speech_stream_engine(config: ServerConfig, ctx: AppContext) -> SpeechStreamEngine | None:
    """The speech-to-text engine behind ``/api/asr-streaming``: the engines' Kyutai STT when
    ``stt_engine.weights`` is set, one copy for the server, reached over the engine link from
    workers (docs/engines.md#kyutai-stt-engine); without weights the app's ASR engine (the
    cascade's Whisper) cut by a VAD in this process, where the engine lends one
    (docs/serving.md#asr-streaming)."""
    if ctx.turn_engines.stt is not None:
        return ctx.turn_engines.stt
    if not config.stt_engine.weights:
        if ctx.turn_engines.asr is None:
            return None
        return WhisperSpeechStreamEngine(config.models, lambda: ctx.turn_engines.asr if ctx.engines.ready else None)
    # Engines of a cluster (several engine processes) do not route STT streams yet: a copy here.
    from rtserve.engines.kyutai_stt.engine import KyutaiSttEngine  # torch: only when configured

    log.warning("/api/asr-streaming loads a Kyutai STT copy of its own in this front-end: its engines lend none")
    return KyutaiSttEngine(config, registry=ctx.registry)


def _tts_stream_engine(config: ServerConfig, ctx: AppContext) -> tuple[TTSStreamEngine | None, bool]:
    """The Kyutai TTS engine behind ``/api/tts_streaming`` when ``tts_engine.weights`` is set, and
    whether this app runs it: the engines' (the one the speech routes and the cascade use), in
    this process or over the engine link (docs/engines.md#kyutai-tts-over-http)."""
    if ctx.engines.speech_engine is not None or not config.tts_engine.weights:
        return ctx.engines.speech_engine, False
    # Engines of a cluster (several engine processes) do not route TTS streams yet: a copy here.
    from rtserve.engines.kyutai_tts.engine import KyutaiTTSEngine  # torch: only when configured

    log.warning("/api/tts_streaming loads a Kyutai TTS copy of its own in this front-end: its engines lend none")
    return KyutaiTTSEngine(config), True


def _image_engine(config: ServerConfig) -> ImageService | None:
    """The image engine behind ``/v1/images/*`` when ``image_engine.weights`` is set (in this
    front-end process: docs/engines.md#diffusion-step-batching)."""
    if not config.image_engine.weights:
        return None
    from rtserve.engines.diffusion.image_engine import ImageEngine  # torch and diffusers: only when configured

    return ImageEngine(config)


def _video_engine(config: ServerConfig) -> videos.VideoEngineLike | None:
    """The Wan video engine behind ``/v1/videos`` and ``WS /v1/realtime/video`` when
    ``video_engine.weights`` is set (in this front-end process: docs/engines.md#video-generation)."""
    if not config.video_engine.weights:
        return None
    from rtserve.engines.diffusion.video_engine import VideoEngine  # torch and diffusers: only when configured

    return VideoEngine(config)


def build_app(
    config: ServerConfig,
    *,
    engine: HostedSessionEngine | None = None,
    registry: CollectorRegistry | None = None,
    engines: Engines | None = None,
    peers: Peers | None = None,
) -> web.Application:
    """The whole front-end app. ``engines``: reach engines that run elsewhere (a worker passes
    ``RemoteEngines``); otherwise they are built here, around ``engine`` when given. ``peers``:
    the other front-ends of this server or cluster (resume relays, the front-end drain route)."""
    registry = registry or CollectorRegistry()
    if engines is None:
        local = EngineSet(config, registry, session_engine=engine)
        engines = local if engine_client == "local" else LinkedEngines(local, config)
    client_secrets = ClientSecrets(config)  # short-lived keys the auth check accepts for placing calls
    app = web.Application(
        middlewares=[error_middleware, auth_middleware(config.api_key, client_secrets.admits)],
        client_max_size=config.transport.max_http_body_bytes,
    )
    sessions = SessionManager(
        engines.session_engine, config.sessions, registry=registry, owner=peers.tag if peers is not None else None
    )
    app[CTX] = AppContext(
        config=config,
        engines=engines,
        sessions=sessions,
        codecs=CodecExecutor(config.transport.codec_threads),
        registry=registry,
    )
    app[_PROCESS_METRICS] = ProcessMetrics(registry)
    base_routes.setup(app)
    http.setup(app)
    openpi.setup(app)
    moshi.setup(app)
    stt = _speech_stream_engine(config, app[CTX])
    asr_streaming.setup(app, stt, owned=stt is not app[CTX].turn_engines.stt)
    speech, owned = _tts_stream_engine(config, app[CTX])
    tts_streaming.setup(app, speech, owned=owned)
    images.setup(app, _image_engine(config))
    realtime.setup(app)
    videos.setup(app, _video_engine(config))
    if peers is not None:
        peer_site.setup(
            app, peers, app[realtime.SERVICE], FrontEndDrain(sessions, app[CTX].stop, config.peers.drain_deadline_s)
        )
    webrtc.setup(app, client_secrets)
    video_chat.setup(app)
    browser.setup(app)
    app.on_startup.append(_on_startup)
    app.on_shutdown.append(_close_sessions)
    app.on_cleanup.append(_on_cleanup)
    return app
