"""Greedy parity with the reference ``moshi`` package on the same random weights (CPU, fp32).

The oracle is ``moshi==0.2.13`` (dev/test dependency only). The weights are written in
Kyutai's published format and read back by our loader, so loader, LM, token layout and
Mimi are all under test.
"""

from __future__ import annotations

import numpy as np
import torch
from moshi.models.lm import LMGen

from rtserve.engines.moshi.frame_model import MoshiFrameModel
from rtserve.engines.moshi.generator import TokenStream
from rtserve.engines.moshi.loader import LoadedModel
from rtserve.engines.moshi.sampling import MoshiSampling, SlotSampler
from rtserve.engines.values import SlotPrompt
from tests.engines.moshi.reference_run import run_reference
from tests.engines.moshi.tiny import CARD, TinyCheckpoint

FRAME = 1920


def speech_like(steps: int, batch: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (0.3 * rng.standard_normal((steps, batch, FRAME))).astype(np.float32)


def test_lm_greedy_tokens_match_the_reference_for_60_frames(tiny: TinyCheckpoint, loaded: LoadedModel) -> None:
    batch, frames = 2, 60
    stream = TokenStream(loaded.lm, batch, SlotSampler(batch, torch.device("cpu"), MoshiSampling()))
    reference = LMGen(tiny.lm, use_sampling=False)
    generator = torch.Generator().manual_seed(3)
    compared = 0
    texts: set[int] = set()
    with reference.streaming(batch):
        for t in range(frames):
            user = torch.randint(0, CARD, (batch, 8), generator=generator)
            expected = reference.step(user[:, :, None])
            ours = stream.step(user)
            if expected is None:
                assert not ours.ready.any(), f"frame {t}: we emitted before the acoustic delay elapsed"
                continue
            assert ours.ready.all()
            assert torch.equal(ours.tokens, expected[:, :, 0]), f"frame {t}: {ours.tokens} != {expected[:, :, 0]}"
            texts.update(ours.tokens[:, 0].tolist())
            compared += 1
    assert compared == frames - 1  # one frame of acoustic delay
    assert len(texts) > 3, "degenerate weights: the text stream never varies"


def test_mimi_streaming_codes_identical_and_decode_within_1e_4(tiny: TinyCheckpoint, loaded: LoadedModel) -> None:
    batch, frames = 3, 30  # 60 transformer steps: the ring (context 20) wraps several times
    mimi = loaded.mimi
    mimi.start(batch)
    audio = speech_like(frames, batch, seed=1)
    worst = 0.0
    with torch.no_grad(), tiny.mimi.streaming(batch):
        for t in range(frames):
            pcm = torch.from_numpy(audio[t])
            expected = tiny.mimi.encode(pcm[:, None])[:, :, 0]
            assert torch.equal(mimi.encode(pcm), expected), f"frame {t}: codes differ"
            ref_pcm = tiny.mimi.decode(expected[:, :, None])[:, 0]
            ours = mimi.decode(expected)
            assert ours.shape == (batch, FRAME)
            worst = max(worst, float((ours - ref_pcm).norm() / ref_pcm.norm()))
    assert worst < 1e-4, f"decode relative error {worst:.2e}"


def test_frame_model_audio_and_text_match_the_reference_pipeline(tiny: TinyCheckpoint, loaded: LoadedModel) -> None:
    batch, frames = 2, 50
    model = MoshiFrameModel(loaded, batch, sampling=MoshiSampling(use_sampling=False))
    for slot in range(batch):
        assert model.open_slot(slot, SlotPrompt()) == 0
    audio = speech_like(frames, batch, seed=2)
    reference = run_reference(tiny, audio)
    live = np.ones(batch, bool)
    outputs = [model.step(audio[t], live) for t in range(frames)]
    for t in range(reference.skipped):  # the acoustic delay: silence, no text
        for out in outputs[t]:
            assert out is not None and not out.audio.any() and out.text is None
    assert model.tokenizer is not None
    pieces = [model.tokenizer.id_to_piece(i).replace("\u2581", " ") for i in range(model.tokenizer.vocab_size())]
    worst = 0.0
    for i, (tokens, ref_audio) in enumerate(zip(reference.tokens, reference.audio)):
        for slot in range(batch):
            out = outputs[reference.skipped + i][slot]
            assert out is not None
            token = int(tokens[slot, 0])
            want = None if token in (0, 3) or token >= len(pieces) else pieces[token]
            assert out.text == want, f"frame {i} slot {slot}"
            worst = max(worst, float(np.linalg.norm(out.audio - ref_audio[slot]) / np.linalg.norm(ref_audio[slot])))
    assert worst < 1e-4, f"agent audio relative error {worst:.2e}"
    assert len(reference.tokens) == frames - reference.skipped >= 49
