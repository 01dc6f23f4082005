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

The model runs on ``config.lockstep.device``: weights and per-slot state live there, and
a tick costs one host->device copy of the whole input batch and one device->host copy of
the whole output batch. Weights come from the same seed on every device, and on CPU the
step reads the caller's arrays in place, so CPU numerics do not depend on this option.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch
from prometheus_client import CollectorRegistry
from torch import nn

from rtserve.codecs.pcm import FloatArray
from rtserve.config import ServerConfig
from rtserve.engines.lockstep.session import LockstepSessionEngine
from rtserve.engines.reference import FRAME_SIZE, SAMPLE_RATE
from rtserve.engines.torch_device import resolve_device
from rtserve.engines.values import FrameOutput, SlotPrompt

PROMPT_BYTES_PER_STEP = 16
TEXT_VOCAB = " abcdefghijklmnopqrstuvwxyz"  # head index 0 means "no text this frame"
OUTPUT_GAIN = 0.5


class _InPlaceTransfer:
    """CPU: the step reads the caller's arrays in place, and its results are host memory already."""

    def upload(self, frames: FloatArray, live: npt.NDArray[np.bool_]) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.from_numpy(frames), torch.from_numpy(live)

    def download(self, audio: torch.Tensor, letters: torch.Tensor) -> tuple[FloatArray, list[int]]:
        return audio.numpy(), letters.tolist()


class _PinnedTransfer:
    """CUDA: one host->device and one device->host copy of the whole batch per tick."""

    def __init__(self, device: torch.device, batch_size: int, frame_size: int) -> None:
        self._device = device
        # The frames plus one column for the live flags, so one copy carries a tick's whole input.
        # Pinned, so that copy is a true async DMA rather than a staged one.
        self._staging = torch.empty((batch_size, frame_size + 1), dtype=torch.float32, pin_memory=True)
        self._staging_np = self._staging.numpy()
        # torch leaves Event.__new__ unannotated.
        self._uploaded = torch.cuda.Event()  # type: ignore[no-untyped-call]

    def upload(self, frames: FloatArray, live: npt.NDArray[np.bool_]) -> tuple[torch.Tensor, torch.Tensor]:
        # Normally long done (each step ends in a blocking download); this guards a step that raised midway.
        self._uploaded.synchronize()
        self._staging_np[:, :-1] = frames
        self._staging_np[:, -1] = live
        packed = self._staging.to(self._device, non_blocking=True)
        self._uploaded.record(torch.cuda.current_stream(self._device))
        return packed[:, :-1], packed[:, -1] != 0

    def download(self, audio: torch.Tensor, letters: torch.Tensor) -> tuple[FloatArray, list[int]]:
        # The letter indices ride along as one more float column (exact below 2**24): one copy for the batch.
        # A blocking copy into fresh pageable memory: the frames belong to the caller and may wait in output
        # queues for a while, which must not keep page-locked memory pinned.
        host = torch.cat((audio, letters.unsqueeze(1).to(audio.dtype)), dim=1).cpu().numpy()
        return host[:, :-1], host[:, -1].astype(np.int64).tolist()


class TinyRecurrentFrameModel:
    def __init__(
        self,
        batch_size: int,
        *,
        seed: int = 0,
        frame_size: int = FRAME_SIZE,
        sample_rate: int = SAMPLE_RATE,
        sub_frames: int = 16,
        features: int = 32,
        hidden: int = 64,
        device: str | torch.device = "cpu",
    ) -> None:
        if frame_size % sub_frames:
            raise ValueError("frame_size must be a multiple of sub_frames")
        self.device = resolve_device(device, "lockstep.device")
        self.batch_size = batch_size
        self.frame_size = frame_size
        self.sample_rate = sample_rate
        self.output_delay_frames = 0  # each step answers the frame it was given
        self.sub_frames = sub_frames
        block = frame_size // sub_frames
        # Seed a private copy of the global RNG so building the model never disturbs it; built on the
        # CPU and then moved, so every device gets the same weights.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.encoder = nn.Linear(block, features)
            self.prompt_embedding = nn.Embedding(256, features)
            self.gru = nn.GRU(features, hidden, batch_first=True)
            self.decoder = nn.Linear(hidden, block)
            self.text_head = nn.Linear(hidden, len(TEXT_VOCAB) + 1)
        for module in (self.encoder, self.prompt_embedding, self.gru, self.decoder, self.text_head):
            module.eval().requires_grad_(False).to(self.device)
        # The GRU hidden state, one row per slot.
        self.state = torch.zeros(1, batch_size, hidden, device=self.device)
        self._prompts: dict[int, bytes] = {}
        self._transfer: _InPlaceTransfer | _PinnedTransfer
        if self.device.type == "cuda":
            self._transfer = _PinnedTransfer(self.device, batch_size, frame_size)
            self._warm_up()
        else:
            self._transfer = _InPlaceTransfer()

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
            tokens = torch.tensor(list(chunk), dtype=torch.long, device=self.device).unsqueeze(0)
            _, hidden = self.gru(self.prompt_embedding(tokens), self.state[:, slot : slot + 1].contiguous())
            self.state[:, slot : slot + 1] = hidden
        if rest:
            self._prompts[slot] = rest
            return False
        self._prompts.pop(slot, None)
        return True

    @torch.no_grad()
    def step(self, frames: FloatArray, live: npt.NDArray[np.bool_]) -> list[FrameOutput | None]:
        frames_in, live_in = self._transfer.upload(frames, live)
        blocks = frames_in.reshape(self.batch_size, self.sub_frames, -1)
        sequence, hidden = self.gru(torch.tanh(self.encoder(blocks)), self.state)
        self.state = torch.where(live_in.view(1, -1, 1), hidden, self.state)  # only live slots advance
        audio = (OUTPUT_GAIN * torch.tanh(self.decoder(sequence))).reshape(self.batch_size, -1)
        audio_out, letters = self._transfer.download(audio, self.text_head(hidden[0]).argmax(dim=-1))
        outputs: list[FrameOutput | None] = [None] * self.batch_size
        for slot in np.flatnonzero(live):
            letter = letters[slot]
            outputs[slot] = FrameOutput(audio_out[slot], TEXT_VOCAB[letter - 1] if letter else None)
        return outputs

    def release(self, slot: int) -> None:
        self.state[:, slot] = 0.0
        self._prompts.pop(slot, None)

    @torch.no_grad()
    def _warm_up(self) -> None:
        """Load the device's kernels and library handles now, so the first served tick does not overrun."""
        self.step(np.zeros((self.batch_size, self.frame_size), np.float32), np.zeros(self.batch_size, bool))
        tokens = torch.zeros((1, PROMPT_BYTES_PER_STEP), dtype=torch.long, device=self.device)
        self.gru(self.prompt_embedding(tokens), self.state[:, :1].contiguous())  # the prefill shape


def create_engine(config: ServerConfig, registry: CollectorRegistry) -> LockstepSessionEngine:
    model = TinyRecurrentFrameModel(config.lockstep.batch_size, device=config.lockstep.device)
    return LockstepSessionEngine("tiny", model, config, registry, supports_text_output=True)
