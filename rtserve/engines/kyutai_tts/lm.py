"""The TTS LM: the Moshi RQ-Transformer (``MoshiLM``) with what delayed-streams TTS adds
(docs/engines.md#kyutai-tts): a text embedding that demultiplexes the lookahead stream, low
rank depformer embeddings, cross-attention on the voice, and the conditioners.

Every module keeps the reference's parameter names, so a published checkpoint loads with
the Moshi loader's renaming (``tts_rename`` adds the cross-attention projections).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
from torch import nn

from rtserve.engines.kyutai_tts.config import TTSArch
from rtserve.engines.moshi.checkpoint import lm_rename
from rtserve.engines.moshi.layers import TypedModuleList
from rtserve.engines.moshi.lm import ZERO_TOKEN, MoshiLM, TokenEmbedding, embed_tokens

_CROSS_STACKED = re.compile(r"\.cross_attention\.(in_proj_weight|in_proj\.weight|out_proj\.weight)$")


class StreamEmbedding(TokenEmbedding):
    """A ``TokenEmbedding`` optionally low rank (a table of ``low_rank`` columns, then a linear up
    to ``dim``) and optionally demultiplexing a second stream: token ``(second + 1) * rows + first``
    embeds as ``out1(E[first]) + out2(E[second])``, the second term zero where ``second`` is -1.
    ``ZERO_TOKEN`` embeds to exactly zero."""

    def __init__(self, rows: int, dim: int, *, low_rank: int | None, demux: bool) -> None:
        nn.Embedding.__init__(self, rows, low_rank or dim)
        self.rows = rows
        self.demux = demux
        self.low_rank = nn.Linear(low_rank, dim, bias=False) if low_rank is not None and not demux else None
        self.out1 = nn.Linear(low_rank or dim, dim, bias=False) if demux else None
        self.out2 = nn.Linear(low_rank or dim, dim, bias=False) if demux else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.out1 is None or self.out2 is None:  # a depformer codebook's, 32 times a frame: one fused kernel
            y = embed_tokens(tokens, self.weight)
            return y if self.low_rank is None else self.low_rank(y)
        is_zero = (tokens == ZERO_TOKEN)[..., None]
        tokens = tokens.clamp(min=0)
        zero = torch.zeros(1, dtype=self.weight.dtype, device=tokens.device)
        first = nn.functional.embedding(tokens % self.rows, self.weight)
        second = tokens // self.rows - 1
        second_zero = (second < 0)[..., None]
        second_emb = nn.functional.embedding(second.clamp(min=0), self.weight)
        y = self.out1(first) + torch.where(second_zero, zero, self.out2(second_emb))
        return torch.where(is_zero, zero, y)


class TTSLM(MoshiLM):
    def __init__(self, arch: TTSArch) -> None:
        super().__init__(arch.lm, cross_attention=arch.cross_attention)
        c = arch.lm
        self.arch = arch
        low_rank = arch.depformer_low_rank
        self.text_emb = StreamEmbedding(c.text_card + 1, c.dim, low_rank=None, demux=arch.demux_text)
        self.depformer_text_emb = StreamEmbedding(
            c.text_card + 1, c.depformer_dim, low_rank=low_rank, demux=arch.demux_text
        )
        self.depformer_emb = TypedModuleList(
            StreamEmbedding(c.card + 1, c.depformer_dim, low_rank=low_rank, demux=False) for _ in range(c.dep_q - 1)
        )

    def embed(self, column: torch.Tensor) -> torch.Tensor:
        """``[B, 1 + n_q]`` tokens (the text one possibly muxed) -> ``[B, 1, dim]``, audio first then text."""
        x: torch.Tensor | None = None
        for k, emb in enumerate(self.emb):
            audio: torch.Tensor = emb(column[:, 1 + k : 2 + k])
            x = audio if x is None else x + audio
        text: torch.Tensor = self.text_emb(column[:, :1])
        return text if x is None else x + text


def tts_rename(arch: TTSArch) -> Callable[[str], str | None]:
    """Kyutai TTS LM names -> ``TTSLM`` names: the Moshi renaming, cross-attention projections
    stored stacked (one weight set); the conditioners (loaded apart, in fp32) and the low-rank
    projection the reference builds for a demultiplexing embedding but never applies are dropped."""
    unused = "depformer_text_emb.low_rank.weight" if arch.demux_text else None

    def rename(key: str) -> str | None:
        if key.startswith(("condition_provider.", "fuser.")) or key == unused:
            return None
        return _rename(key)

    return rename


def _rename(key: str) -> str | None:
    match = _CROSS_STACKED.search(key)
    if match is not None:
        target = "out_projs" if match[1] == "out_proj.weight" else "in_projs"
        key = key[: match.start()] + f".cross_attention.{target}.0.weight"
    return lm_rename(key)
