"""Row buckets (docs/engines.md#row-buckets): a step computes only the first rows up to the last
one that may step, rounded up to the bucket, its attention reads the ring slots up to the
furthest position among them, rounded up too, and every stream comes out as when each step
computes every row over the whole ring: the same sampled tokens, the same audio but for float
rounding, through pre-audio steps, a stream opening past the rows in use, one closing, and
positions past the ring's end."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from rtserve.engines.kyutai_tts.loader import load_folder
from rtserve.engines.kyutai_tts.model import KyutaiTTSModel, TTSFrame, TTSSettings
from rtserve.engines.kyutai_tts.voices import VoiceFolder
from rtserve.weights.source import WeightSource
from tests.engines.kyutai_tts.test_pre_audio_steps import DEVICES, same_frame, start
from tests.engines.kyutai_tts.tiny import VOICE_DIM, VOICE_FRAMES, TinyTTS

SLOTS = 6


def model(tiny: TinyTTS, device: str, row_bucket: int, span_bucket: int = 0, cfg_coef: float = 2.0) -> KyutaiTTSModel:
    """On CUDA every row count's and span's steps replay as captured graphs."""
    loaded = load_folder(tiny.folder, device=torch.device(device), dtype=torch.float32)
    settings = TTSSettings(temperature=0.8, cfg_coef=cfg_coef, voice_frames=VOICE_FRAMES)
    voices = VoiceFolder(
        WeightSource(tiny.voices, "voices", progress_interval_s=1), loaded.arch.voice_suffix, VOICE_DIM, VOICE_FRAMES
    )
    return KyutaiTTSModel(
        loaded, SLOTS, settings=settings, voices=voices, row_bucket=row_bucket, span_bucket=span_bucket
    )


def step_both(
    ours: KyutaiTTSModel, every_row: KyutaiTTSModel, slots: list[int], *, speak: bool = True
) -> list[TTSFrame | None]:
    """The same tokens; the same audio but for float rounding (the decoder's kernels may sum in
    another order for another number of rows)."""
    mine, theirs = ours.step(speak=speak), every_row.step(speak=speak)
    for slot in slots:
        a, b = mine[slot], theirs[slot]
        assert a is not None and b is not None
        same_frame(replace(a, audio=None), replace(b, audio=None))
        assert (a.audio is None) == (b.audio is None)
        if a.audio is not None and b.audio is not None:
            np.testing.assert_allclose(a.audio, b.audio, atol=1e-5)
    return mine


@pytest.mark.parametrize("device", DEVICES)
def test_a_step_over_the_rows_in_use_says_what_a_step_over_every_row_says(tiny_tts: TinyTTS, device: str) -> None:
    ours, every_row = model(tiny_tts, device, row_bucket=2, span_bucket=16), model(tiny_tts, device, row_bucket=0)
    ring = every_row.spans[-1]  # the tiny checkpoint's context
    assert ours.row_counts == [2, 4, 6] and every_row.row_counts == [6]
    assert ours.spans == [16, 32, 48, ring] and every_row.spans == [ring]
    for each in (ours, every_row):
        start(each, 0, "alice", seed=7)
    for step in range(ours.young_steps + 3):
        step_both(ours, every_row, [0])
        assert ours.step_rows == 2 and every_row.step_rows == SLOTS
        assert ours.step_span == (16 if step < 16 else 32) and every_row.step_span == ring
    # A new reply in slot 4: its pre-audio steps compute the rows up to it; then all speak.
    for each in (ours, every_row):
        start(each, 4, "bob", seed=11)
    for _ in range(ours.young_steps):
        step_both(ours, every_row, [0, 4], speak=False)
        assert ours.step_rows == SLOTS and ours.step_span == 16  # the young row's positions
    heard = 0
    for _ in range(12):
        frame = step_both(ours, every_row, [0, 4])[4]
        heard += frame is not None and frame.audio is not None
    assert heard >= 8
    # Slot 4 closes: the steps are down to the first two rows again, slot 0 unchanged by it all.
    for each in (ours, every_row):
        each.release(4)
    spans = set()
    for _ in range(2 * ring):  # on past the ring's end: its slots wrap
        step_both(ours, every_row, [0])
        assert ours.step_rows == 2
        spans.add(ours.step_span)
    assert ours.steps[0] > ring and spans >= {32, 48, ring}
    # A stream opened between a step's launch and its read waited for that step.
    launched = ours.launch()
    start(ours, 5, "bob", seed=3)
    frames = ours.read(launched)
    assert frames[5] is not None and not frames[5].stepped and frames[5].audio is None


def test_direct_cfg_steps_every_row(tiny_tts_direct_cfg: TinyTTS) -> None:
    """Its conditioned-on-nothing twins sit after every slot's row: no first rows to step alone."""
    direct = model(tiny_tts_direct_cfg, "cpu", row_bucket=2, cfg_coef=3.0)
    start(direct, 0, "alice", seed=7)
    direct.step()
    assert direct.row_counts == [SLOTS] and direct.step_rows == SLOTS
