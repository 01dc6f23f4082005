"""Reference lockstep engines that need no weights: ``loopback`` and ``tone``.

Both speak Moshi's framing (24 kHz, 80 ms = 1920-sample frames) so clients and the
session layer see exactly the cadence a real duplex model produces.

* ``loopback`` returns each slot's own input ``config.reference.loopback_delay_frames``
  frames later (silence before that): the latency probe of the whole server path. With
  ``loopback_step_ms`` each step lasts that long, the engine thread waiting as it would on a
  GPU's step: the served path of a slow model, reproduced without it.
* ``tone`` ignores its input and plays a continuous sine per slot, slot ``b`` at
  ``tone_base_hz + b * tone_step_hz``, so overlapping sessions are told apart by ear.
"""

from __future__ import annotations

import time
from collections import deque

import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry

from rtserve.codecs.pcm import WIRE_SAMPLE_RATE, FloatArray
from rtserve.config import ConfigError, ServerConfig
from rtserve.engines.lockstep.session import LockstepSessionEngine
from rtserve.engines.values import FrameOutput, SlotPrompt

SAMPLE_RATE = WIRE_SAMPLE_RATE
FRAME_SIZE = 1920  # 80 ms at 24 kHz, one Mimi frame
TONE_AMPLITUDE = 0.2


class LoopbackModel:
    """Per-slot delay line: output frame t = input frame t - delay."""

    def __init__(
        self,
        batch_size: int,
        delay_frames: int,
        *,
        step_s: float = 0.0,
        frame_size: int = FRAME_SIZE,
        sample_rate: int = SAMPLE_RATE,
    ) -> None:
        if delay_frames < 0:
            raise ValueError("delay_frames must be >= 0")
        self.batch_size = batch_size
        self.step_s = step_s
        self.frame_size = frame_size
        self.sample_rate = sample_rate
        self.delay_frames = delay_frames
        self.output_delay_frames = delay_frames  # the answer to an input frame comes this much later
        self._lines: list[deque[FloatArray]] = [deque() for _ in range(batch_size)]

    def open_slot(self, slot: int, prompt: SlotPrompt) -> int:
        self._lines[slot] = deque(np.zeros(self.frame_size, np.float32) for _ in range(self.delay_frames))
        return 0

    def prefill_step(self, slot: int) -> bool:
        return True

    def step(self, frames: FloatArray, live: npt.NDArray[np.bool_]) -> list[FrameOutput | None]:
        ends = time.monotonic() + self.step_s
        outputs: list[FrameOutput | None] = [None] * self.batch_size
        for slot in np.flatnonzero(live):
            line = self._lines[slot]
            line.append(frames[slot].copy())  # the scheduler reuses its frame buffer
            outputs[slot] = FrameOutput(line.popleft())
        if (left := ends - time.monotonic()) > 0:
            time.sleep(left)  # the GIL is free meanwhile, as while a GPU step runs
        return outputs

    def release(self, slot: int) -> None:
        self._lines[slot].clear()


class ToneModel:
    """A phase-continuous sine per slot; the phase restarts when a slot is reopened."""

    def __init__(
        self,
        batch_size: int,
        base_hz: float,
        step_hz: float,
        *,
        frame_size: int = FRAME_SIZE,
        sample_rate: int = SAMPLE_RATE,
        amplitude: float = TONE_AMPLITUDE,
    ) -> None:
        self.batch_size = batch_size
        self.frame_size = frame_size
        self.sample_rate = sample_rate
        self.amplitude = amplitude
        self.output_delay_frames = 0  # a tone answers no input
        self.frequencies = base_hz + step_hz * np.arange(batch_size, dtype=np.float64)
        if self.frequencies[-1] >= sample_rate / 2:
            raise ValueError(
                f"tone for slot {batch_size - 1} ({self.frequencies[-1]:.0f} Hz) "
                f"is above the Nyquist frequency ({sample_rate / 2:.0f} Hz)"
            )
        self._phase = np.zeros(batch_size, np.float64)  # in cycles, kept in [0, 1)
        self._ramp = np.arange(frame_size, dtype=np.float64) / sample_rate

    def open_slot(self, slot: int, prompt: SlotPrompt) -> int:
        self._phase[slot] = 0.0
        return 0

    def prefill_step(self, slot: int) -> bool:
        return True

    def step(self, frames: FloatArray, live: npt.NDArray[np.bool_]) -> list[FrameOutput | None]:
        outputs: list[FrameOutput | None] = [None] * self.batch_size
        slots = np.flatnonzero(live)
        if slots.size == 0:
            return outputs
        freqs = self.frequencies[slots]
        cycles = self._phase[slots, None] + freqs[:, None] * self._ramp[None, :]
        audio = (self.amplitude * np.sin(2 * np.pi * cycles)).astype(np.float32)
        self._phase[slots] = (self._phase[slots] + freqs * self.frame_size / self.sample_rate) % 1.0
        for row, slot in enumerate(slots):
            outputs[slot] = FrameOutput(audio[row])
        return outputs

    def release(self, slot: int) -> None:
        self._phase[slot] = 0.0


def create_loopback_engine(config: ServerConfig, registry: CollectorRegistry) -> LockstepSessionEngine:
    reference = config.reference
    model = LoopbackModel(
        config.lockstep.batch_size, reference.loopback_delay_frames, step_s=reference.loopback_step_ms / 1000
    )
    return LockstepSessionEngine("loopback", model, config, registry, supports_text_output=False)


def create_tone_engine(config: ServerConfig, registry: CollectorRegistry) -> LockstepSessionEngine:
    try:
        model = ToneModel(config.lockstep.batch_size, config.reference.tone_base_hz, config.reference.tone_step_hz)
    except ValueError as exc:
        raise ConfigError(f"invalid config field 'reference.tone_step_hz': {exc}") from None
    return LockstepSessionEngine("tone", model, config, registry, supports_text_output=False)
