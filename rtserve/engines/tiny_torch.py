"""``tiny``: a small torch frame model with real per-slot recurrent state.

It exists to prove slot isolation with an actual batched neural step, on CPU, without
weights to download: random weights from a fixed seed, a GRU whose hidden state is one
row per slot, every slot advanced by one batched forward per frame.

Per frame: the 1920 samples are cut into ``sub_frames`` blocks, each block is encoded to
a feature vector, the GRU runs over the blocks starting from the slot's state, and each
GRU output is decoded back into a block of audio. A text head on the final state picks
a letter (or nothing) per frame. A slot opened with ``SlotPrompt(text=...)`` is
conditioned on the prompt's UTF-8 bytes, ``PROMPT_BYTES_PER_STEP`` bytes per prefill
step, through the same GRU.
"""

from __future__ import annotations

import numpy as np
import torch
from prometheus_client import CollectorRegistry
from torch import nn

from rtserve.config import ServerConfig
from rtserve.engines.lockstep.session import LockstepSessionEngine
from rtserve.engines.protocols import FrameOutput, SlotPrompt
from rtserve.engines.reference import FRAME_SIZE, SAMPLE_RATE

PROMPT_BYTES_PER_STEP = 16
TEXT_VOCAB = " abcdefghijklmnopqrstuvwxyz"  # head index 0 means "no text this frame"
OUTPUT_GAIN = 0.5


class TinyRecurrentFrameModel:
    def __init__(self, batch_size: int, *, seed: int = 0, frame_size: int = FRAME_SIZE,
                 sample_rate: int = SAMPLE_RATE, sub_frames: int = 16, features: int = 32,
                 hidden: int = 64) -> None:
        if frame_size % sub_frames:
            raise ValueError("frame_size must be a multiple of sub_frames")
        self.batch_size = batch_size
        self.frame_size = frame_size
        self.sample_rate = sample_rate
        self.sub_frames = sub_frames
        block = frame_size // sub_frames
        # Seed a private copy of the global RNG so building the model never disturbs it.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.encoder = nn.Linear(block, features)
            self.prompt_embedding = nn.Embedding(256, features)
            self.gru = nn.GRU(features, hidden, batch_first=True)
            self.decoder = nn.Linear(hidden, block)
            self.text_head = nn.Linear(hidden, len(TEXT_VOCAB) + 1)
        for module in (self.encoder, self.prompt_embedding, self.gru, self.decoder, self.text_head):
            module.eval().requires_grad_(False)
        self.state = torch.zeros(1, batch_size, hidden)  # the GRU hidden state, one row per slot
        self._prompts: dict[int, bytes] = {}

    def open_slot(self, slot: int, prompt: SlotPrompt) -> int:
        self.state[:, slot] = 0.0
        data = (prompt.text or "").encode()
        if data:
            self._prompts[slot] = data
        else:
            self._prompts.pop(slot, None)
        return -(-len(data) // PROMPT_BYTES_PER_STEP)

    @torch.no_grad()
    def prefill_step(self, slot: int) -> bool:
        data = self._prompts.get(slot, b"")
        chunk, rest = data[:PROMPT_BYTES_PER_STEP], data[PROMPT_BYTES_PER_STEP:]
        if chunk:
            tokens = torch.tensor(list(chunk), dtype=torch.long).unsqueeze(0)
            _, hidden = self.gru(self.prompt_embedding(tokens), self.state[:, slot:slot + 1].contiguous())
            self.state[:, slot:slot + 1] = hidden
        if rest:
            self._prompts[slot] = rest
            return False
        self._prompts.pop(slot, None)
        return True

    @torch.no_grad()
    def step(self, frames: np.ndarray, live: np.ndarray) -> list[FrameOutput | None]:
        blocks = torch.from_numpy(frames).view(self.batch_size, self.sub_frames, -1)
        sequence, hidden = self.gru(torch.tanh(self.encoder(blocks)), self.state)
        keep = torch.from_numpy(live).view(1, -1, 1)
        self.state = torch.where(keep, hidden, self.state)  # only live slots advance
        audio = (OUTPUT_GAIN * torch.tanh(self.decoder(sequence))).reshape(self.batch_size, -1).numpy()
        letters = self.text_head(hidden[0]).argmax(dim=-1).tolist()
        outputs: list[FrameOutput | None] = [None] * self.batch_size
        for slot in np.flatnonzero(live):
            letter = letters[slot]
            outputs[slot] = FrameOutput(audio[slot], TEXT_VOCAB[letter - 1] if letter else None)
        return outputs

    def release(self, slot: int) -> None:
        self.state[:, slot] = 0.0
        self._prompts.pop(slot, None)


def create_engine(config: ServerConfig, registry: CollectorRegistry) -> LockstepSessionEngine:
    model = TinyRecurrentFrameModel(config.lockstep.batch_size)
    return LockstepSessionEngine("tiny", model, config, registry, supports_text_output=True)
