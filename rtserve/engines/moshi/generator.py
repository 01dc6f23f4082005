"""The Moshi per-frame token layout: delays, the token ring, teacher forcing (docs/engines.md#token-layout).

Each frame is one column of ``K = 1 + n_q`` tokens: row 0 the inner-monologue text, rows
``1..dep_q`` the agent's audio codebooks, the rest the user's. Codebook ``k`` is shifted
by ``delays[k]`` frames (the acoustic delay): the model emits the semantic codebook of a
frame one frame before its acoustic codebooks. A small per-row ring of columns holds
what was generated or heard, and undoes the delays on the way out.

Everything here is batched tensor state with a per-row offset; ``reset_rows(mask)``
returns rows to a fresh conversation without touching the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rtserve.engines.moshi.layers import step_holding
from rtserve.engines.moshi.lm import UNGENERATED_TOKEN, MoshiLM
from rtserve.engines.moshi.sampling import SlotSampler


@dataclass
class StepOverrides:
    """Per-row teacher forcing for one step (prefill rides the normal batched step).

    ``force_mask[b, k]`` replaces output token ``k`` (0 = text, 1..dep_q = depformer
    codebooks) of row ``b`` with ``force_tokens[b, k]``; ``embed_mask[b]`` replaces row
    ``b``'s temporal input with ``embeddings[b]``.
    """

    force_mask: torch.Tensor
    force_tokens: torch.Tensor
    embed_mask: torch.Tensor
    embeddings: torch.Tensor

    @classmethod
    def none(cls, batch: int, columns: int, dim: int, device: torch.device, dtype: torch.dtype) -> StepOverrides:
        return cls(
            torch.zeros(batch, columns, dtype=torch.bool, device=device),
            torch.zeros(batch, columns, dtype=torch.long, device=device),
            torch.zeros(batch, dtype=torch.bool, device=device),
            torch.zeros(batch, dim, dtype=dtype, device=device),
        )

    def clear(self) -> None:
        self.force_mask.zero_()
        self.embed_mask.zero_()


@dataclass(frozen=True)
class StepResult:
    tokens: torch.Tensor  # [B, 1 + dep_q]: text + depformer codebooks, delays undone
    ready: torch.Tensor  # [B] bool: False for a row's first max_delay frames (nothing to emit yet)
    hidden: torch.Tensor  # [B, 1, dim]: this step's temporal output (what the extra heads read)


class TokenStream:
    """Drives ``MoshiLM`` one frame at a time for ``batch`` rows."""

    def __init__(self, lm: MoshiLM, batch: int, sampler: SlotSampler) -> None:
        self.lm = lm
        self.config = c = lm.config
        self.batch = batch
        self.sampler = sampler
        device = lm.text_linear.weight.device
        self.device = device
        lm.start(batch)
        self.ring = c.max_delay + 2
        self.cache = torch.full((batch, c.num_codebooks, self.ring), UNGENERATED_TOKEN, dtype=torch.long, device=device)
        self.offsets = torch.zeros(batch, dtype=torch.long, device=device)
        self.delays = torch.tensor(c.delays, dtype=torch.long, device=device)
        self.initial = torch.tensor([c.text_card] + [c.card] * c.n_q, dtype=torch.long, device=device)
        # Teacher-forced layout: the user's codes of the previous frame, for the delayed codebooks.
        self.previous_user = torch.full((batch, c.user_codebooks), c.card, dtype=torch.long, device=device)

    def reset_rows(self, mask: torch.Tensor) -> None:
        self.lm.reset_rows(mask)
        self.cache.masked_fill_(mask.view(-1, 1, 1), UNGENERATED_TOKEN)
        self.offsets.masked_fill_(mask, 0)
        self.previous_user.masked_fill_(mask.view(-1, 1), self.config.card)

    def take_rows(self, rows: torch.Tensor, source: TokenStream, source_rows: torch.Tensor) -> None:
        """Rows ``rows`` continue ``source``'s ``source_rows`` (``[N]`` indices; a stream of another
        batch on the same weights): the LM's keys, values and positions and the token ring (the
        random streams are the sampler's: ``SlotSampler.take_rows``)."""
        self.lm.transformer.take_rows(rows, source.lm.transformer, source_rows)
        self.cache[rows] = source.cache[source_rows]
        self.offsets[rows] = source.offsets[source_rows]
        self.previous_user[rows] = source.previous_user[source_rows]

    @torch.no_grad()
    def step(
        self, user_codes: torch.Tensor, overrides: StepOverrides | None = None, hold: torch.Tensor | None = None
    ) -> StepResult:
        """``user_codes``: ``[B, user_codebooks]`` Mimi codes of this frame's user audio. Rows in
        ``hold`` (``[B]`` bool) do not advance: their outputs mean nothing and their state stays
        as it was (what they wrote into the ring and the KV sits where their next real step
        writes before it reads)."""
        if hold is None:
            return self._step(user_codes, overrides)
        # The per-row state a step advances, less the ring and the KV.
        carry = [self.offsets, self.lm.transformer.offset, self.sampler.draws, self.previous_user]
        return step_holding(hold, carry, lambda: self._step(user_codes, overrides))

    def _step(self, user_codes: torch.Tensor, overrides: StepOverrides | None) -> StepResult:
        c = self.config
        rows = torch.arange(self.batch, device=self.device)
        first_user = 1 + c.dep_q
        if not c.teacher_forced_user:
            # The user's codes enter the ring at their delayed positions.
            user_delays = self.delays[first_user:]
            positions = (self.offsets[:, None] + user_delays[None]) % self.ring
            self.cache[
                rows[:, None], torch.arange(first_user, c.num_codebooks, device=self.device)[None], positions
            ] = user_codes
        current = self.offsets % self.ring
        column = self.cache[rows, :, current]  # [B, K]
        fresh = self.offsets[:, None] <= self.delays[None]
        column = torch.where(fresh, self.initial[None], column)

        x = self.lm.embed(column)
        if overrides is not None:
            x = torch.where(overrides.embed_mask.view(-1, 1, 1), overrides.embeddings[:, None].to(x.dtype), x)
        hidden, text_logits = self.lm.temporal(x)
        forced = self._forced(user_codes, overrides)
        text = self.sampler.sample(text_logits, text=True)
        text = torch.where(forced[0][:, 0], forced[1][:, 0], text)

        tokens = [text]
        previous = text
        self.lm.depformer_begin()
        for codebook in range(c.dep_q):
            logits = self.lm.depformer_logits(codebook, hidden, previous)
            token = self.sampler.sample(logits, text=False)
            token = torch.where(forced[0][:, 1 + codebook], forced[1][:, 1 + codebook], token)
            tokens.append(token)
            previous = token
        generated = torch.stack(tokens, dim=1)  # [B, 1 + dep_q]

        self.offsets.add_(1)
        self.cache[rows, : 1 + c.dep_q, self.offsets % self.ring] = generated
        if c.teacher_forced_user:
            self.previous_user.copy_(user_codes)
        gen_delays = self.delays[: 1 + c.dep_q]
        index = (self.offsets[:, None] - c.max_delay + gen_delays[None]) % self.ring
        out = self.cache[rows[:, None], torch.arange(1 + c.dep_q, device=self.device)[None], index]
        return StepResult(out, self.offsets > c.max_delay, hidden)

    def _forced(self, user_codes: torch.Tensor, overrides: StepOverrides | None) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        columns = 1 + c.dep_q
        mask = torch.zeros(self.batch, columns, dtype=torch.bool, device=self.device)
        values = torch.zeros(self.batch, columns, dtype=torch.long, device=self.device)
        if c.teacher_forced_user:
            # The depformer's user steps are forced to what the user said: codebook j of frame
            # t - delay_j (the previous frame for delayed codebooks).
            first = 1 + c.agent_codebooks
            user_delays = self.delays[first:]
            mask[:, first:] = True
            values[:, first:] = torch.where(user_delays[None] > 0, self.previous_user, user_codes)
        if overrides is not None:
            mask = mask | overrides.force_mask
            values = torch.where(overrides.force_mask, overrides.force_tokens, values)
        return mask, values
