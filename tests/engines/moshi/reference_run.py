"""Runs the reference ``moshi`` pipeline (Mimi encode -> LMGen -> Mimi decode) frame by frame."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from moshi.models.lm import LMGen

from tests.engines.moshi.tiny import TinyCheckpoint


@dataclass
class ReferenceTrace:
    tokens: list[np.ndarray] = field(default_factory=list)  # per emitted frame: [B, 1 + dep_q]
    audio: list[np.ndarray] = field(default_factory=list)  # per emitted frame: [B, 1920]
    skipped: int = 0  # leading frames with no output (the acoustic delay)


@torch.no_grad()
def run_reference(tiny: TinyCheckpoint, frames: np.ndarray) -> ReferenceTrace:
    """``frames``: ``[T, B, 1920]`` user audio; greedy decoding."""
    steps, batch, _ = frames.shape
    gen = LMGen(tiny.lm, use_sampling=False)
    trace = ReferenceTrace()
    with gen.streaming(batch), tiny.mimi.streaming(batch):
        for t in range(steps):
            codes = tiny.mimi.encode(torch.from_numpy(frames[t])[:, None])
            out = gen.step(codes[:, :8])
            if out is None:
                trace.skipped += 1
                continue
            trace.tokens.append(out[:, :, 0].numpy())
            trace.audio.append(tiny.mimi.decode(out[:, 1:9]).numpy()[:, 0])
    return trace
