"""``SttFrameModel``: a Kyutai STT checkpoint as a lockstep ``FrameModel`` (docs/engines.md#kyutai-stt-engine).

One ``step`` = one 80 ms tick for all B slots: Mimi-encode every row's frame, one temporal
step (``TokenStream`` with no depformer: the text token is the only output), and the
extra heads on the same temporal output. Every row steps every tick (idle rows on
silence), so the batch is one fixed shape; only live rows' outputs are returned.

Opening a slot resets just that row of every cache (the transformer's KV and position, the
token ring, the Mimi encoder's convolution and transformer state) and plans the silence
prefix as prefill: the scheduler steps a prefilling row with silence, exactly the frames the
reference feeds before an utterance. Other rows' outputs stay bit-identical (isolation).

Each live row's output carries a ``TranscriptStep``: the step number, the text token that
came out (the reference ``LMGen``'s output: it trails the token's generation by the LM's
largest stream delay), and per extra head the probability of its first class (end of turn).
No audio comes out.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from rtserve.codecs.pcm import FloatArray
from rtserve.engines.kyutai_stt.loader import SttModel
from rtserve.engines.moshi.generator import TokenStream
from rtserve.engines.moshi.sampling import MoshiSampling, SlotSampler
from rtserve.engines.values import FrameOutput, SlotPrompt, TranscriptStep

_NO_AUDIO = np.zeros(0, np.float32)


class SttFrameModel:
    def __init__(self, model: SttModel, batch_size: int, *, temperature: float = 0.0) -> None:
        """``temperature`` 0 is greedy (the reference servers' default)."""
        loaded = model.loaded
        self.model = model
        self.settings = model.settings
        self.config = loaded.lm_config
        self.batch_size = batch_size
        self.sample_rate = loaded.mimi_config.sample_rate
        self.frame_size = loaded.mimi_config.frame_size
        # A token comes out max_delay steps after it is made (drains wait for it).
        self.output_delay_frames = self.config.max_delay
        self.lm = loaded.lm
        self.mimi = loaded.mimi
        self.device = loaded.lm.text_linear.weight.device
        self.mimi.start(batch_size)
        sampling = MoshiSampling(use_sampling=temperature > 0, temperature_text=temperature, top_k_text=0)
        self.sampler = SlotSampler(batch_size, self.device, sampling)
        self.stream = TokenStream(loaded.lm, batch_size, self.sampler)
        self.steps = np.zeros(batch_size, np.int64)  # per row: steps since it opened
        self._prefill_left = np.zeros(batch_size, np.int64)
        self._pieces = [
            model.tokenizer.id_to_piece(i).replace("\u2581", " ") for i in range(model.tokenizer.vocab_size())
        ]

    def open_slot(self, slot: int, prompt: SlotPrompt) -> int:
        mask = torch.zeros(self.batch_size, dtype=torch.bool, device=self.device)
        mask[slot] = True
        self.stream.reset_rows(mask)
        self.mimi.reset_encoder_rows(mask)
        self.sampler.configure(slot, None, prompt.seed)
        self.steps[slot] = 0
        self._prefill_left[slot] = self.settings.prefix_frames
        return self.settings.prefix_frames

    def prefill_step(self, slot: int) -> bool:
        self._prefill_left[slot] -= 1
        return bool(self._prefill_left[slot] <= 0)

    def release(self, slot: int) -> None:
        self._prefill_left[slot] = 0

    @torch.no_grad()
    def step(self, frames: FloatArray, live: npt.NDArray[np.bool_]) -> list[FrameOutput | None]:
        pcm = torch.from_numpy(np.ascontiguousarray(frames, dtype=np.float32)).to(self.device)
        codes = self.mimi.encode(pcm)[:, : self.config.user_codebooks]
        result = self.stream.step(codes)
        self.steps += 1
        tokens = result.tokens[:, 0].tolist()
        ready = result.ready.tolist()
        if self.config.extra_heads:
            scores = self.lm.extra_head_probs(result.hidden)[:, :, 0].tolist()
        else:
            scores = [[] for _ in range(self.batch_size)]
        outputs: list[FrameOutput | None] = [None] * self.batch_size
        for slot in np.flatnonzero(live):
            if not ready[slot]:
                outputs[slot] = FrameOutput(_NO_AUDIO)
                continue
            token = tokens[slot]
            step = TranscriptStep(int(self.steps[slot]) - 1, token, tuple(scores[slot]))
            outputs[slot] = FrameOutput(_NO_AUDIO, self._piece(token), transcript=step)
        return outputs

    def _piece(self, token: int) -> str | None:
        c = self.config
        if token in (c.text_padding_id, c.text_end_padding_id) or not 0 <= token < len(self._pieces):
            return None
        return self._pieces[token] or None
