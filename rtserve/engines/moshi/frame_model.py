"""``MoshiFrameModel``: the Moshi/PersonaPlex model as a lockstep ``FrameModel`` (docs/engines.md#moshi-engine).

One ``step`` = one 80 ms tick for all B slots: Mimi-encode every row's user frame, one
temporal step + ``dep_q`` depformer steps, Mimi-decode every row's agent frame. Idle and
prefilling rows ride the same batched step (silence in); only live rows' outputs are
returned. Opening a slot resets just that row of every cache (state is batched tensors
with per-row reset), so other slots' outputs stay bit-identical (isolation).
"""

from __future__ import annotations

import copy
import logging
from collections import OrderedDict
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch

from rtserve.codecs.pcm import FloatArray
from rtserve.engines.moshi.frame_step import FrameStep
from rtserve.engines.moshi.loader import LoadedModel
from rtserve.engines.moshi.mimi import Mimi
from rtserve.engines.moshi.paged_kv import PagedKVSpec
from rtserve.engines.moshi.prompts import (
    PrefillStep,
    PromptError,
    audio_steps,
    embedding_steps,
    load_voice_audio,
    load_voice_embeddings,
    persona_tokens,
    text_steps,
)
from rtserve.engines.moshi.sampling import MoshiSampling, SlotSampler
from rtserve.engines.values import FrameOutput, SlotPrompt

log = logging.getLogger(__name__)

_VOICE_CACHE_SIZE = 32
_GOLDEN = (5**0.5 - 1) / 2  # 0.618...: successive multiples mod 1 spread evenly over [0, 1)
EMBEDDING_SUFFIXES = (".pt", ".pth")


def _fresh(host: FloatArray, device_tensor: torch.Tensor) -> FloatArray:
    """``host`` itself when the copy to the host made it (a GPU step), else a copy: on the CPU
    ``.cpu()`` may hand back the step's own buffer, which a later step overwrites."""
    return host.copy() if device_tensor.device.type == "cpu" else host


class MoshiFrameModel:
    def __init__(
        self,
        model: LoadedModel,
        batch_size: int,
        *,
        sampling: MoshiSampling = MoshiSampling(),
        max_prompt_tokens: int = 512,
        max_voice_seconds: float = 30.0,
        voice_dir: str | Path | None = None,
        graph: bool | None = None,
        paged_kv: PagedKVSpec | None = None,
        context_fill: tuple[int, int] | None = None,
    ) -> None:
        """``graph``: replay the tick as CUDA graphs (default: on a CUDA device); ``paged_kv``:
        int8 KV blocks from one pool instead of a ring per slot (``open_slot`` then raises
        ``KVMemoryExhausted`` when no block is free); ``context_fill`` (benchmarking): every
        opened slot starts with a context of random KV between these two frame counts
        (``context_fill_frames``)."""
        self.loaded = model
        self.config = model.lm_config
        self.batch_size = batch_size
        self.sample_rate = model.mimi_config.sample_rate
        self.frame_size = model.mimi_config.frame_size
        self.device = model.lm.text_linear.weight.device
        self.dtype = model.lm.text_linear.weight.dtype
        self.max_prompt_tokens = max_prompt_tokens
        self.max_voice_seconds = max_voice_seconds
        self.voice_dir = None if voice_dir is None else Path(voice_dir).resolve()
        self.tokenizer = model.tokenizer
        # A private batch-1 encoder for voice prompts, so encoding one never touches the slots' state.
        self._prompt_mimi: Mimi = copy.deepcopy(model.mimi)
        self._prompt_mimi.start(1)
        self.silence = self._silence_codes()
        self.mimi = model.mimi
        # Read by drains (the scheduler): the answer to an input frame is out this many ticks
        # later, after the acoustic delay and the decoder finishing the frame's samples.
        self.output_delay_frames = self.config.max_delay + self.mimi.decoder_delay_frames
        self.sampler = SlotSampler(batch_size, self.device, sampling)
        # On a GPU the whole tick replays as CUDA graphs (captured here, before any slot opens).
        graph = self.device.type == "cuda" if graph is None else graph
        model.lm.transformer.use_paged_kv(paged_kv)
        self.frame = FrameStep(model.lm, self.mimi, self.sampler, batch_size, graph=graph)
        self.stream = self.frame.stream
        self.context_fill = context_fill
        if context_fill is not None:
            self.frame.randomize_kv_pools()
        # Slots between open_slot and release (prefilling or live): the rows whose context
        # attention must cover; idle rows would otherwise grow the span for nothing.
        self._open = np.zeros(batch_size, bool)
        self._plans: dict[int, list[PrefillStep]] = {}
        self._staged: dict[int, PrefillStep] = {}
        self._voices: OrderedDict[str, list[PrefillStep]] = OrderedDict()
        # No tokenizer (random weights): no text out, persona text refused.
        self._pieces = (
            []
            if self.tokenizer is None
            else [self.tokenizer.id_to_piece(i).replace("\u2581", " ") for i in range(self.tokenizer.vocab_size())]
        )

    # -- slot lifecycle ---------------------------------------------------------------

    def open_slot(self, slot: int, prompt: SlotPrompt) -> int:
        plan = self._plan(prompt)  # may raise PromptError before any state is touched
        self.frame.admit(slot)  # may raise KVMemoryExhausted (paged KV): the row then holds no blocks
        mask = torch.zeros(self.batch_size, dtype=torch.bool, device=self.device)
        mask[slot] = True
        self.frame.reset_rows(mask)
        sampling = None if prompt.sampling is None else self.sampler.default.requested(prompt.sampling)
        self.sampler.configure(slot, sampling, prompt.seed)
        if self.context_fill is not None:
            self.frame.advance(slot, self.context_fill_frames(slot))  # may raise KVMemoryExhausted
        self._open[slot] = True
        self._staged.pop(slot, None)
        if plan:
            self._plans[slot] = plan
        else:
            self._plans.pop(slot, None)
        return len(plan)

    def context_fill_frames(self, slot: int) -> int:
        """The context ``slot`` starts with under ``context_fill``: the slots' fills spread evenly
        over the range (golden-ratio steps, so any first N slots average near its middle)."""
        if self.context_fill is None:
            return 0
        low, high = self.context_fill
        return low + round((slot * _GOLDEN) % 1.0 * (high - low))

    def prefill_step(self, slot: int) -> bool:
        plan = self._plans.get(slot)
        if not plan:
            return True
        self._staged[slot] = plan.pop(0)
        if plan:
            return False
        del self._plans[slot]
        return True

    def release(self, slot: int) -> None:
        self.frame.release(slot)
        self._open[slot] = False
        self._plans.pop(slot, None)
        self._staged.pop(slot, None)

    # -- the batched step ------------------------------------------------------------

    @torch.no_grad()
    def step(self, frames: FloatArray, live: npt.NDArray[np.bool_]) -> list[FrameOutput | None]:
        pcm = torch.from_numpy(np.ascontiguousarray(frames, dtype=np.float32)).to(self.device)
        self._stage_overrides()
        result = self.frame(pcm, self._open)
        # One fresh host block per tick, its rows handed out as views: a copy per row cost more
        # than the whole block's (an allocation each, 2 ms at 256 rows on a loaded 2-core host).
        # Across the engine link a row lives until pickled; an in-process reader gets its own
        # copy (``LockstepSession.events``), so no kept frame pins the batch.
        audio_host = _fresh(result.audio.float().cpu().numpy(), result.audio)
        text_host = result.tokens[:, 0].tolist()
        ready_host = result.ready.tolist()
        outputs: list[FrameOutput | None] = [None] * self.batch_size
        for slot in np.flatnonzero(live).tolist():
            outputs[slot] = FrameOutput(audio_host[slot], self._piece(text_host[slot]) if ready_host[slot] else None)
        return outputs

    def _stage_overrides(self) -> None:
        """Write this tick's prefill steps into the frame step's override buffers (cleared by the step)."""
        o = self.frame.overrides
        for slot, step in self._staged.items():
            o.force_mask[slot] = torch.from_numpy(step.mask)
            o.force_tokens[slot] = torch.from_numpy(step.tokens)
            if step.embedding is not None:
                o.embed_mask[slot] = True
                o.embeddings[slot] = step.embedding.to(o.embeddings)
        self._staged.clear()

    def _piece(self, token: int) -> str | None:
        if token in (self.config.text_padding_id, self.config.text_end_padding_id) or not 0 <= token < len(
            self._pieces
        ):
            return None
        return self._pieces[token] or None

    # -- prompts ---------------------------------------------------------------------

    def _plan(self, prompt: SlotPrompt) -> list[PrefillStep]:
        plan: list[PrefillStep] = []
        if prompt.voice:
            plan += self._voice_steps(prompt.voice)
        if prompt.text:
            if self.tokenizer is None:
                raise PromptError("persona text needs a tokenizer; this engine runs random weights")
            ids = persona_tokens(prompt.text, self.tokenizer.encode, self.max_prompt_tokens)
            plan += text_steps(ids, self.silence, self.config)
        return plan

    def resolve_voice(self, voice: str) -> Path:
        """The voice file ``voice`` names (a bare name or a path), which must lie inside ``voice_dir``."""
        if self.voice_dir is None:
            raise PromptError("voice prompts are not configured on this server")
        given = Path(voice)
        candidates = [given] if given.suffix else [given.with_name(given.name + s) for s in (".pt", ".wav")]
        for candidate in candidates:
            # resolve() follows symlinks, so a link pointing outside the folder is refused too.
            path = (self.voice_dir / candidate).resolve()
            if not path.is_relative_to(self.voice_dir):
                raise PromptError("voice prompt must be inside the voice folder")
            if path.is_file():
                return path
        raise PromptError(f"unknown voice prompt {given.name!r}")

    def _voice_steps(self, voice: str) -> list[PrefillStep]:
        path = self.resolve_voice(voice)
        key = str(path)
        cached = self._voices.get(key)
        if cached is not None:
            self._voices.move_to_end(key)
            return list(cached)
        max_steps = int(self.max_voice_seconds * self.sample_rate / self.frame_size)
        if path.suffix.lower() in EMBEDDING_SUFFIXES:
            steps = embedding_steps(load_voice_embeddings(path, self.config.dim, max_steps), self.config)
        else:
            pcm = load_voice_audio(path, self.sample_rate, self.max_voice_seconds)
            steps = audio_steps(self._encode_prompt_audio(pcm), self.silence, self.config)
        self._voices[key] = steps
        if len(self._voices) > _VOICE_CACHE_SIZE:
            self._voices.popitem(last=False)
        return list(steps)

    def _encode_prompt_audio(self, pcm: FloatArray) -> npt.NDArray[np.int64]:
        frames = -(-pcm.size // self.frame_size)
        padded = np.zeros(frames * self.frame_size, np.float32)
        padded[: pcm.size] = pcm
        mimi = self._prompt_mimi
        mimi.reset_encoder_rows(torch.ones(1, dtype=torch.bool, device=self.device))
        codes: list[npt.NDArray[np.int64]] = []
        for frame in padded.reshape(frames, self.frame_size):
            chunk = torch.from_numpy(frame).to(self.device)[None]
            codes.append(mimi.encode(chunk)[0, : self.config.agent_codebooks].cpu().numpy())
        return np.stack(codes)

    def _silence_codes(self) -> npt.NDArray[np.int64]:
        """Agent codes of steady-state silence (the second frame of a fresh encoder)."""
        mimi = self._prompt_mimi
        mimi.reset_encoder_rows(torch.ones(1, dtype=torch.bool, device=self.device))
        zeros = torch.zeros(1, self.frame_size, device=self.device)
        mimi.encode(zeros)
        codes = mimi.encode(zeros)[0, : self.config.agent_codebooks].cpu().numpy()
        return codes.astype(np.int64)
