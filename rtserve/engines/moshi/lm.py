"""The Moshi RQ-Transformer: token embeddings, the temporal transformer, the depformer and
the output heads (docs/engines.md#token-layout).

Per 80 ms frame the temporal transformer sees one column of ``1 + n_q`` tokens (text,
agent audio, user audio), summed as embeddings, and predicts the text token; the
depformer then walks the ``dep_q`` audio codebooks of that frame one at a time, each step
with its own weights, conditioned on the temporal output and the previous token.

A listener (Kyutai STT, ``dep_q = 0``) has no depformer; its ``extra_heads`` read the same
temporal output (the end-of-turn probabilities).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from rtserve.engines.moshi.fused import fused
from rtserve.engines.moshi.layers import Transformer, TypedModuleList, make_norm
from rtserve.engines.moshi.lm_config import LMConfig

# Token id meaning "no input": its embedding is exactly zero.
ZERO_TOKEN = -1
# Token id of a position not generated yet (never fed to the model).
UNGENERATED_TOKEN = -2


def _embed(tokens: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    out = F.embedding(tokens.clamp(min=0), table)
    return torch.where((tokens == ZERO_TOKEN)[..., None], torch.zeros(1, dtype=out.dtype, device=out.device), out)


embed_tokens = fused(_embed)


@fused
def summed_embeddings(column: torch.Tensor, text_table: torch.Tensor, *audio_tables: torch.Tensor) -> torch.Tensor:
    """``[B, 1 + K]`` tokens (text, then K audio streams) -> ``[B, 1, dim]``: the sum of their embeddings
    (one kernel on CUDA instead of five per stream)."""
    x: torch.Tensor | None = None
    for k, table in enumerate(audio_tables):
        audio = _embed(column[:, 1 + k : 2 + k], table)
        x = audio if x is None else x + audio
    text = _embed(column[:, :1], text_table)
    return text if x is None else x + text


class TokenEmbedding(nn.Embedding):
    """An embedding where ``ZERO_TOKEN`` maps to the zero vector."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return embed_tokens(tokens, self.weight)


class MoshiLM(nn.Module):
    def __init__(self, config: LMConfig, *, cross_attention: bool = False) -> None:
        """``cross_attention``: every layer also attends to per-row conditioning (Kyutai TTS)."""
        super().__init__()
        self.config = config
        c = config
        self.emb = TypedModuleList(TokenEmbedding(c.card + 1, c.dim) for _ in range(c.n_q))
        self.text_emb = TokenEmbedding(c.text_card + 1, c.dim)
        self.text_linear = nn.Linear(c.dim, c.text_card, bias=False)
        self.transformer = Transformer(
            c.dim,
            c.num_heads,
            c.num_layers,
            c.dim_feedforward,
            norm=c.norm,
            gating=True,
            layer_scale=False,
            rope_max_period=c.max_period,
            context=c.context,
            capacity=c.context,
            cross_attention=cross_attention,
        )
        self.out_norm = make_norm(c.norm, c.dim)
        num_weights = max(c.depformer_schedule, default=-1) + 1
        num_in = num_weights if c.depformer_multi_linear else 1
        self.depformer_in = TypedModuleList(nn.Linear(c.dim, c.depformer_dim, bias=False) for _ in range(num_in))
        self.depformer_emb = TypedModuleList(TokenEmbedding(c.card + 1, c.depformer_dim) for _ in range(c.dep_q - 1))
        self.depformer_text_emb = TokenEmbedding(c.text_card + 1, c.depformer_dim) if c.dep_q else None
        self.depformer = (
            Transformer(
                c.depformer_dim,
                c.depformer_num_heads,
                c.depformer_num_layers,
                c.depformer_dim_feedforward,
                norm=c.norm,
                gating=True,
                layer_scale=False,
                num_weights=num_weights,
                rope_max_period=None,
                context=c.depformer_context,
                capacity=c.depformer_context or c.dep_q,
                shared_positions=c.dep_q,
            )
            if c.dep_q
            else None
        )
        self.linears = TypedModuleList(nn.Linear(c.depformer_dim, c.card, bias=False) for _ in range(c.dep_q))
        self.extra_heads = TypedModuleList(
            nn.Linear(c.dim, c.extra_heads_dim, bias=False) for _ in range(c.extra_heads)
        )

    def start(self, batch: int) -> None:
        param = self.text_linear.weight
        self.transformer.start(batch, param.device, param.dtype)
        if self.depformer is not None:
            self.depformer.start(batch, param.device, param.dtype)

    def reset_rows(self, mask: torch.Tensor) -> None:
        self.transformer.reset_rows(mask)

    def embed(self, column: torch.Tensor) -> torch.Tensor:
        """``[B, 1 + n_q]`` tokens -> ``[B, 1, dim]`` summed input embedding."""
        return summed_embeddings(column, self.text_emb.weight, *(emb.weight for emb in self.emb))

    def temporal(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One temporal step on ``[B, 1, dim]`` inputs -> (hidden ``[B, 1, dim]``, text logits ``[B, text_card]``)."""
        hidden = self.out_norm(self.transformer(x))
        return hidden, self.text_linear(hidden)[:, 0]

    def extra_head_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[B, 1, dim]`` temporal output -> ``[B, extra_heads, extra_heads_dim]`` softmax probabilities."""
        return torch.stack([F.softmax(head(hidden)[:, 0].float(), dim=-1) for head in self.extra_heads], dim=1)

    def depformer_begin(self) -> None:
        """Every row restarts its depformer at codebook 0 (the depformer state lives one frame)."""
        if self.depformer is not None:
            self.depformer.restart()

    def depformer_logits(self, index: int, hidden: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        """Codebook ``index`` logits ``[B, card]`` given the temporal hidden state and the previous token ``[B]``."""
        c = self.config
        assert self.depformer is not None and self.depformer_text_emb is not None  # index < dep_q
        weight = c.depformer_schedule[index]
        projected = self.depformer_in[weight if c.depformer_multi_linear else 0](hidden)
        token = previous[:, None]
        token_emb = self.depformer_text_emb(token) if index == 0 else self.depformer_emb[index - 1](token)
        out = self.depformer(projected + token_emb, weight_index=weight)
        logits: torch.Tensor = self.linears[index](out)[:, 0]
        return logits
