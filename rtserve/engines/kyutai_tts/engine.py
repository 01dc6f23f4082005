"""The Kyutai TTS engine: ``tts_engine`` settings -> ``KyutaiTTSModel`` on its own lockstep
scheduler, and the streams clients open on it (docs/engines.md#kyutai-tts-on-the-lockstep-runtime).

Configured by ``tts_engine`` (``weights`` set); the weights resolve (maybe downloading) and load
in ``start()``, on a thread, so the server answers meanwhile (streams are refused with
``engine_unavailable`` until then, and for good if loading failed). A stream's voice is read and
checked before a slot is taken; the slot's row is reset with it as the stream's first input.
Its lockstep metrics live in a registry of its own (the realtime engine may be lockstep too) and
show in the server's as ``rtserve_kyutai_tts_*``.

It is a sleep-mode stage (docs/serving.md#sleep-mode): ``release`` stops the scheduler (streams in
flight end with ``engine_sleeping``, new ones are refused with it) and drops the model, its voices
and CUDA graphs; ``restore`` loads the weights again as ``start`` did.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial

from prometheus_client import CollectorRegistry, Counter, Histogram

from rtserve.config import ConfigError, ServerConfig
from rtserve.engines.kyutai_tts.conditioning import Voice
from rtserve.engines.kyutai_tts.frame_model import TTSFrameModel
from rtserve.engines.kyutai_tts.loader import LoadedTTS, load_files
from rtserve.engines.kyutai_tts.model import KyutaiTTSModel, TTSSettings
from rtserve.engines.kyutai_tts.script import ScriptSplitter
from rtserve.engines.kyutai_tts.stream import TTSStream
from rtserve.engines.kyutai_tts.voices import VoiceError
from rtserve.engines.lockstep.pacing import SystemTickClock, TickClock
from rtserve.engines.lockstep.scheduler import LockstepScheduler
from rtserve.engines.moshi.lm_config import CheckpointError
from rtserve.engines.moshi.weights import resolve
from rtserve.engines.scheduled_engine import ScheduledEngine
from rtserve.engines.torch_device import resolve_device
from rtserve.engines.torch_dtypes import DTYPES
from rtserve.engines.values import SlotPrompt, SpeechStep
from rtserve.engines.voice_names import OPENAI_VOICES
from rtserve.weights import WeightsError
from rtserve.weights.source import open_source

log = logging.getLogger(__name__)

FIELD = "tts_engine.weights"
VOICES_FIELD = "tts_engine.voices"
FIRST_AUDIO_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0, 5.0)
AFTER_TEXT_BUCKETS = (0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0)
STEP_ROWS_BUCKETS = (8, 16, 32, 64, 96, 128, 160, 192, 224, 256, 384, 512, 1024)
STEP_SPAN_BUCKETS = (16, 32, 64, 128, 256, 384, 512, 1024, 2048)
YOUNG_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.08, 0.12, 0.16, 0.24, 0.32, 0.64, 1.0, 2.0)
FIRST_AUDIO_STEP_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 10, 12, 14, 16, 18, 20, 24, 32)


class KyutaiTTSEngine(ScheduledEngine):
    stage = "tts_engine"
    weights_field = FIELD
    sized_by = "tts_engine.max_sessions and young_batch"
    speaks_of_itself = "the text-to-speech engine"

    def __init__(
        self,
        config: ServerConfig,
        loaded: LoadedTTS | None = None,
        *,
        clock: TickClock | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        """``loaded``: weights already loaded (tests); otherwise ``start`` loads ``tts_engine.weights``.
        ``clock``: the scheduler's tick clock (tests run it faster than real time). ``registry``:
        the server's, where its scheduler's metrics show."""
        super().__init__(config, registry, "rtserve_kyutai_tts_")
        families = registry if registry is not None else CollectorRegistry()  # the engine's own
        self._first_audio = Histogram(
            "rtserve_kyutai_tts_first_audio_seconds",
            "A stream's first text received -> its first audio frame handed out (this engine's share of first "
            "audio: the words the model waits for, its steps before audio and the queueing around them)",
            buckets=FIRST_AUDIO_BUCKETS,
            registry=families,
        )
        self._after_text = Histogram(
            "rtserve_kyutai_tts_first_audio_after_text_seconds",
            "The text a reply last waited for before its first audio (the word, or the end of stream, that let "
            "its row step on) reaching the engine thread -> its first audio frame made: the engine's own share of "
            "first audio, without the wait for text",
            buckets=AFTER_TEXT_BUCKETS,
            registry=families,
        )
        # Where a reply's first audio goes (docs/engines.md#pre-audio-steps): the kinds of step the
        # model took, and those a reply took before its first audio.
        self._steps = Counter(
            "rtserve_kyutai_tts_model_steps",
            "Model steps by kind: young_batch (the young batch's rows), pre_audio (young rows of the main batch "
            "alone), full_no_young, and full steps taken while "
            "young rows waited: full_no_catch_up (catching up off), full_first_audio_due (a reply about to "
            "make its first audio), full_lead_short (an older reply under tts_engine.catch_up_lead_ms ahead)",
            ["kind"],
            registry=families,
        )
        # What a main-batch step computed (docs/engines.md#row-buckets).
        self._step_rows = Histogram(
            "rtserve_kyutai_tts_step_rows",
            "Slots a main-batch model step computed: those up to the last one that steps, rounded up to "
            "tts_engine.row_bucket",
            buckets=STEP_ROWS_BUCKETS,
            registry=families,
        )
        self._step_span = Histogram(
            "rtserve_kyutai_tts_step_span",
            "Ring slots a main-batch model step's attention read: up to the furthest position that steps, rounded "
            "up to tts_engine.span_bucket",
            buckets=STEP_SPAN_BUCKETS,
            registry=families,
        )
        self._young_batch_full = Counter(
            "rtserve_kyutai_tts_young_batch_full",
            "Replies that found every row of the young batch (tts_engine.young_batch) taken and waited for one "
            "(past tts_engine.young_wait_ms: started with the others; docs/engines.md#young-batch)",
            registry=families,
        )
        self._young_wait = Histogram(
            "rtserve_kyutai_tts_young_wait_seconds",
            "With a young batch (tts_engine.young_batch): how long each reply waited for a row of it (0 for most), "
            "by where it then started: young_batch, or main_batch past tts_engine.young_wait_ms",
            ["batch"],
            buckets=YOUNG_WAIT_BUCKETS,
            registry=families,
        )
        self._first_audio_steps = Histogram(
            "rtserve_kyutai_tts_first_audio_steps",
            "A reply's steps up to its first audio frame, by kind: full (the whole batch) or pre_audio",
            ["kind"],
            buckets=FIRST_AUDIO_STEP_BUCKETS,
            registry=families,
        )
        self._loaded = loaded
        self._clock = clock
        self._model: KyutaiTTSModel | None = None
        self._frame_model: TTSFrameModel | None = None
        self.sample_rate = 24000 if loaded is None else loaded.mimi_config.sample_rate

    async def _serve(self) -> None:
        """Load the weights and start stepping (``start``, and a wake from sleep mode)."""
        loaded = self._loaded if self._loaded is not None else await asyncio.to_thread(self._load)
        # Off the event loop: the batches' KV and CUDA graphs take seconds to build, and on a wake from
        # sleep mode the loop is serving the process's other engines' sessions meanwhile.
        model, young = await asyncio.to_thread(self._build_batches, loaded)
        self._model = model
        self.sample_rate = model.sample_rate
        settings = self._config.tts_engine
        # Paced (no run ahead), every stream must step every tick: no catching up at their cost.
        lead_s = settings.catch_up_lead_ms / 1e3 if settings.run_ahead else 0.0
        clock = self._clock or SystemTickClock()
        self._frame_model = TTSFrameModel(
            model,
            young=young,
            catch_up_lead_s=lead_s,
            full_step_cadence_s=settings.full_step_cadence_ms / 1e3,
            young_burst_s=settings.young_burst_ms / 1e3,
            young_queue=settings.young_queue,
            young_wait_s=settings.young_wait_ms / 1e3,
            clock=clock.monotonic,
            on_step=self._stepped,
            on_first_audio_after_text=self._after_text.observe,
            on_young_batch_full=self._young_batch_full.inc,
            on_seated=self._seated,
        )
        self._scheduler = LockstepScheduler(
            self._frame_model,
            self._config.lockstep,
            self._new_scheduler_registry(),
            name="kyutai_tts",
            clock=clock,
            audio_input=False,
            run_ahead=self._frame_model if settings.run_ahead else None,
        )
        self._scheduler.start()
        log.info("kyutai tts engine serving %d streams", model.batch_size)

    def _load(self) -> LoadedTTS:
        settings = self._config.tts_engine
        if not settings.weights:
            raise CheckpointError("not set")
        source = open_source(settings.weights, FIELD, progress_interval_s=self._config.weights.progress_interval_s)
        files = resolve(source, self._config.weights)
        device = resolve_device(settings.device, "tts_engine.device")
        return load_files(files, device=device, dtype=DTYPES[settings.dtype], codebooks=settings.codebooks)

    def _build_batches(self, loaded: LoadedTTS) -> tuple[KyutaiTTSModel, KyutaiTTSModel | None]:
        """The main batch and the young one (blocking: their KV, and their CUDA graphs on a GPU)."""
        model = self._build(loaded)
        return model, self._young_batch(model)

    def _build(self, loaded: LoadedTTS) -> KyutaiTTSModel:
        settings = self._config.tts_engine
        tts = TTSSettings(temperature=settings.temperature, cfg_coef=settings.cfg_coef)
        loaded.mimi.decoder_to(DTYPES[settings.codec_dtype])
        model = KyutaiTTSModel(
            loaded,
            settings.max_sessions,
            settings=tts,
            row_bucket=settings.row_bucket,
            span_bucket=settings.span_bucket,
            tried_steps=settings.tried_steps,
        )
        interval_s = self._config.weights.progress_interval_s
        try:
            voices = (
                open_source(settings.voices, VOICES_FIELD, progress_interval_s=interval_s) if settings.voices else None
            )
        except WeightsError as exc:  # not hf://ORG/NAME[@REVISION]: its message names the field
            raise ConfigError(str(exc)) from None
        model.voices = model.voices.at(voices)
        return model

    def _young_batch(self, model: KyutaiTTSModel) -> KyutaiTTSModel | None:
        """New replies' own small batch on the same weights (docs/engines.md#young-batch), where
        the checkpoint has an audio delay to step through."""
        rows = min(self._config.tts_engine.young_batch, model.batch_size)
        if not rows or not model.young_steps:
            return None
        return KyutaiTTSModel(
            model.loaded.sharing_weights(),
            rows,
            settings=model.settings,
            voices=model.voices,
            pre_audio_only=True,
            row_bucket=self._config.tts_engine.young_row_bucket,
            span_bucket=self._config.tts_engine.span_bucket,
            tried_steps=model.tried_steps,
        )

    def _stepped(self, kind: str) -> None:
        """A model step was launched (``TTSFrameModel``'s ``on_step``)."""
        self._steps.labels(kind).inc()
        if kind != "young_batch" and self._model is not None:
            self._step_rows.observe(self._model.step_rows)
            self._step_span.observe(self._model.step_span)

    def _seated(self, waited_s: float, in_young_batch: bool) -> None:
        """A reply took its row (``TTSFrameModel``'s ``on_seated``)."""
        self._young_wait.labels("young_batch" if in_young_batch else "main_batch").observe(waited_s)

    def _forget_model(self) -> None:
        self._frame_model = self._model = None

    async def open_stream(self, stream_id: str, voice: str | None, *, seed: int | None = None) -> TTSStream:
        """A stream with ``voice`` (None: ``tts_engine.default_voice``): ``VoiceError`` before any
        slot is taken, ``CapacityExhausted`` when every slot is busy."""
        scheduler, model, frame_model = self._serving(), self._model, self._frame_model
        assert model is not None and frame_model is not None  # set with the scheduler, dropped with it
        settings = self._config.tts_engine
        chosen = await asyncio.to_thread(self._voice, model, voice or settings.default_voice)
        lease = scheduler.acquire(SlotPrompt(voice=voice, seed=seed), session_id=stream_id)
        scheduler.between_steps(lease, partial(frame_model.begin, lease.slot, chosen, seed))
        splitter = ScriptSplitter(
            model.tokenizer,
            speaker_token=model.ids.main if model.arch.multi_speaker else None,
            frame_rate=model.frame_rate,
            padding_between=settings.padding_between,
        )
        return TTSStream(
            scheduler,
            lease,
            frame_model,
            splitter,
            frame_rate=model.frame_rate,
            max_pending_words=self._config.tts_streaming.max_pending_words,
            release_timeout_s=self.release_timeout_s,
            on_first_audio=self._observe_first_audio,
        )

    def _observe_first_audio(self, seconds: float, speech: SpeechStep) -> None:
        self._first_audio.observe(seconds)
        self._first_audio_steps.labels("full").observe(speech.full_steps)
        self._first_audio_steps.labels("pre_audio").observe(speech.steps - speech.full_steps)

    def voice_names(self) -> list[str]:
        """The voices in ``tts_engine.voices`` once loaded (blocking: lists the folder or the hub repo)."""
        return [] if self._model is None else self._model.voices.names()

    def _voice(self, model: KyutaiTTSModel, name: str | None) -> Voice | None:
        """The named voice; one of OpenAI's names that is no file here (clients send one by
        default) is ``tts_engine.default_voice``."""
        try:
            return model.resolve_voice(name)
        except VoiceError:
            if name not in OPENAI_VOICES:
                raise
            return model.resolve_voice(self._config.tts_engine.default_voice)
