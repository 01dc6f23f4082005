"""Streaming Mimi codec, batched over slots with per-row reset (docs/engines.md#mimi).

24 kHz mono in, 12.5 Hz frames of ``n`` RVQ codes out, and back. One 1920-sample frame
goes through the SEANet encoder (hop 960 -> two 25 Hz latents), a causal transformer, a
stride-2 downsampling conv and the split RVQ; decoding runs the mirror path.

Why our own and not ``transformers.MimiModel``: its decoder has no streaming state for
the transposed convolutions (it decodes whole sequences), and its conv padding cache is a
per-layer list that cannot reset one batch row. Here every streaming module keeps its
state as ``[B, ...]`` tensors and ``reset_rows(mask)`` refreshes just those rows; the
numerics follow the reference codec (parity-tested: identical codes, decode < 1e-4).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.nn import functional as F

from rtserve.engines.moshi.layers import Transformer, step_holding
from rtserve.engines.moshi.lm_config import MimiConfig
from rtserve.engines.moshi.precision_scope import SharedPrecision

# A convolution with at most this many steps on its short side (a streamed frame's 12.5 <-> 25 Hz
# layers: kernel 16, 1024 channels, 2 steps) runs as one matmul: cuDNN took 0.4 ms for that conv
# and 1 ms for that transposed conv at B=64 on an H200 (benchmarks/notes/kyutai_speed.md).
MATMUL_STEPS = 4


# cuBLAS's fp32 precision is process-wide: shared by the codecs of every engine thread.
_TF32_MATMULS = SharedPrecision(torch.backends.cuda.matmul, "tf32")


@contextlib.contextmanager
def _conv_precision(x: torch.Tensor) -> Iterator[None]:
    """A convolution done as a matmul runs at the precision PyTorch gives cuDNN's fp32
    convolutions (TF32 unless switched off), not the stricter one of its matmuls: what the conv
    it replaces, and the reference codec, compute. In IEEE fp32 the encoder's last conv took
    0.25 ms at B=256 on an H200. The setting is process-wide, so it is switched for as short a
    time as the matmul takes (``precision_scope``); a CUDA graph keeps the kernels chosen at
    capture."""
    conv = getattr(torch.backends.cudnn, "conv")  # noqa: B009  # set on the module's class at runtime: no stub
    if not (x.is_cuda and x.dtype == torch.float32 and conv.fp32_precision == "tf32"):
        yield
        return
    with _TF32_MATMULS.scope():
        yield


def _overlap_add(taps: torch.Tensor, stride: int) -> torch.Tensor:
    """``[B, C, T, K]`` outputs of each input step -> ``[B, C, (T - 1) * stride + K]``, step ``t``'s
    landing at ``t * stride`` and summed where they overlap (``K`` a multiple of ``stride``)."""
    batch, channels, steps, kernel = taps.shape
    y = taps.new_zeros(batch, channels, (steps - 1) * stride + kernel)
    for shift in range(0, kernel, stride):
        y[..., shift : shift + steps * stride] += taps[..., shift : shift + stride].reshape(batch, channels, -1)
    return y


class StreamConv1d(nn.Module):
    """Causal conv whose left context is the tail of the previous call (zeros when fresh).

    ``replicate`` pads a fresh row with its first sample instead of zeros (Mimi's
    downsampler), tracked by a per-row ``first`` flag."""

    def __init__(
        self,
        cin: int,
        cout: int,
        kernel: int,
        stride: int = 1,
        dilation: int = 1,
        groups: int = 1,
        bias: bool = True,
        replicate: bool = False,
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(cout, cin // groups, kernel))
        self.bias = nn.Parameter(torch.zeros(cout)) if bias else None
        self.stride, self.dilation, self.groups, self.replicate = stride, dilation, groups, replicate
        self.context = (kernel - 1) * dilation + 1 - stride
        self.previous = torch.zeros(0)
        self.first = torch.zeros(0, dtype=torch.bool)

    def start(self, batch: int, device: torch.device, dtype: torch.dtype) -> None:
        self.previous = torch.zeros(batch, self.weight.shape[1] * self.groups, self.context, device=device, dtype=dtype)
        self.first = torch.ones(batch, dtype=torch.bool, device=device)

    def reset_rows(self, mask: torch.Tensor) -> None:
        self.previous.masked_fill_(mask.view(-1, 1, 1), 0.0)
        self.first.masked_fill_(mask, True)

    def narrow_rows(self, rows: int) -> None:
        self.previous, self.first = self.previous[:rows], self.first[:rows]

    def take_rows(self, rows: torch.Tensor, source: StreamConv1d, source_rows: torch.Tensor) -> None:
        self.previous[rows] = source.previous[source_rows]
        self.first[rows] = source.first[source_rows]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.context:
            if self.replicate:
                self.previous.copy_(torch.where(self.first.view(-1, 1, 1), x[..., :1], self.previous))
                self.first.zero_()
            x = torch.cat([self.previous, x], dim=-1)
            self.previous.copy_(x[..., -self.context :])
        cout, cin, kernel = self.weight.shape
        steps = (x.shape[-1] - self.dilation * (kernel - 1) - 1) // self.stride + 1
        if self.groups == 1 and self.dilation == 1 and steps <= MATMUL_STEPS:
            patches = x.unfold(-1, kernel, self.stride).transpose(1, 2).reshape(x.shape[0], steps, cin * kernel)
            with _conv_precision(x):
                y = F.linear(patches, self.weight.view(cout, cin * kernel), self.bias)
            # cuDNN's layout: the compiled glue downstream specializes on strides.
            return y.transpose(1, 2).contiguous()
        return F.conv1d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)


class StreamConvTranspose1d(nn.Module):
    """Transposed conv whose overlapping tail is carried into the next call."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, groups: int = 1, bias: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(cin, cout // groups, kernel))
        self.bias = nn.Parameter(torch.zeros(cout)) if bias else None
        self.stride, self.groups = stride, groups
        self.tail = kernel - stride
        self.partial = torch.zeros(0)

    def _taps(self, x: torch.Tensor) -> torch.Tensor | None:
        """``[B, Cout, T, K]``: what each input step adds to the output, where that beats cuDNN:
        when every channel has its own kernel (Mimi's upsampler: 4 products per channel, which
        cuDNN ran through a generic kernel taking ~1 ms of a B=64 frame on an H200), or as one
        matmul when there are few input steps. None: cuDNN."""
        batch, cin, steps = x.shape
        _, per_group, kernel = self.weight.shape
        if kernel % self.stride:
            return None
        if self.groups == cin and per_group == 1:  # channel-wise
            return x.unsqueeze(-1) * self.weight[:, 0].unsqueeze(1)
        if self.groups == 1 and steps <= MATMUL_STEPS:
            with _conv_precision(x):
                taps = x.transpose(1, 2) @ self.weight.view(cin, per_group * kernel)
            return taps.view(batch, steps, per_group, kernel).transpose(1, 2)
        return None

    def start(self, batch: int, device: torch.device, dtype: torch.dtype) -> None:
        self.partial = torch.zeros(batch, self.weight.shape[1] * self.groups, self.tail, device=device, dtype=dtype)

    def reset_rows(self, mask: torch.Tensor) -> None:
        self.partial.masked_fill_(mask.view(-1, 1, 1), 0.0)

    def narrow_rows(self, rows: int) -> None:
        self.partial = self.partial[:rows]

    def take_rows(self, rows: torch.Tensor, source: StreamConvTranspose1d, source_rows: torch.Tensor) -> None:
        self.partial[rows] = source.partial[source_rows]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        taps = self._taps(x)
        if taps is None:
            y = F.conv_transpose1d(x, self.weight, self.bias, self.stride, groups=self.groups)
        else:
            y = _overlap_add(taps, self.stride)
            y = y if self.bias is None else y + self.bias[:, None]
        if not self.tail:
            return y
        head = y[..., : self.tail] + self.partial
        carry = y[..., -self.tail :]
        if self.bias is not None:
            carry = carry - self.bias[:, None]  # the bias is added once, when the samples are complete
        self.partial.copy_(carry)
        return torch.cat([head, y[..., self.tail : -self.tail]], dim=-1)


class ResBlock(nn.Module):
    def __init__(self, dim: int, kernel: int, dilation: int, compress: int) -> None:
        super().__init__()
        hidden = dim // compress
        self.block = nn.Sequential(
            nn.ELU(), StreamConv1d(dim, hidden, kernel, dilation=dilation), nn.ELU(), StreamConv1d(hidden, dim, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update: torch.Tensor = self.block(x)
        return x + update


def _encoder(c: MimiConfig) -> nn.Sequential:
    layers: list[nn.Module] = [StreamConv1d(1, c.n_filters, c.kernel_size)]
    mult = 1
    for ratio in reversed(c.ratios):
        width = mult * c.n_filters
        layers += [
            ResBlock(width, c.residual_kernel_size, c.dilation_base**j, c.compress) for j in range(c.n_residual_layers)
        ]
        layers += [nn.ELU(), StreamConv1d(width, width * 2, ratio * 2, stride=ratio)]
        mult *= 2
    layers += [nn.ELU(), StreamConv1d(mult * c.n_filters, c.dimension, c.last_kernel_size)]
    return nn.Sequential(*layers)


def _decoder(c: MimiConfig) -> nn.Sequential:
    mult = 2 ** len(c.ratios)
    layers: list[nn.Module] = [StreamConv1d(c.dimension, mult * c.n_filters, c.kernel_size)]
    for ratio in c.ratios:
        width = mult * c.n_filters
        layers += [nn.ELU(), StreamConvTranspose1d(width, width // 2, ratio * 2, ratio)]
        layers += [
            ResBlock(width // 2, c.residual_kernel_size, c.dilation_base**j, c.compress)
            for j in range(c.n_residual_layers)
        ]
        mult //= 2
    layers += [nn.ELU(), StreamConv1d(c.n_filters, 1, c.last_kernel_size)]
    return nn.Sequential(*layers)


def kernel_tiles(dim: int) -> bool:
    """Whether ``rvq_search``'s kernels tile codebooks of width ``dim``: a power of two, at least
    a dot's 16 (Mimi's is 256; the tiny test codecs' are smaller and take the matmul path)."""
    return dim >= 16 and dim & (dim - 1) == 0


class _RVQ(nn.Module):
    """One residual VQ with its in/out projections; codebooks are filled by the loader."""

    codebooks: torch.Tensor  # a buffer: [layers, bins, codebook_dim]

    def __init__(self, dim: int, codebook_dim: int, layers: int, bins: int) -> None:
        super().__init__()
        self.input_proj = nn.Conv1d(dim, codebook_dim, 1, bias=False)
        self.output_proj = nn.Conv1d(codebook_dim, dim, 1, bias=False)
        self.register_buffer("codebooks", torch.zeros(layers, bins, codebook_dim))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, D, T]`` -> ``[B, layers, T]`` codes."""
        residual = self.input_proj(x)
        batch, dim, steps = residual.shape
        flat = residual.transpose(1, 2).reshape(-1, dim).contiguous()
        # The nearest entry by |c|^2 - 2 x.c (|x|^2 is the same for every entry).
        norms = (self.codebooks * self.codebooks).sum(-1)
        if flat.is_cuda and kernel_tiles(dim):
            from rtserve.engines.moshi.rvq_search import nearest_codes  # Triton: CUDA hosts only

            codes = nearest_codes(flat, self.codebooks, norms)
        else:
            # One matmul per codebook, where cdist takes several kernels and a square root that
            # cannot change the order.
            picked = []
            for codebook, norm in zip(self.codebooks, norms, strict=True):
                index = torch.addmm(norm, flat, codebook.t(), alpha=-2).argmin(dim=-1)
                flat = flat - F.embedding(index, codebook)
                picked.append(index)
            codes = torch.stack(picked, dim=1)
        return codes.view(batch, steps, -1).transpose(1, 2)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        quantized: torch.Tensor | float = 0.0
        for layer, codebook in enumerate(self.codebooks):
            quantized = quantized + F.embedding(codes[:, layer], codebook).transpose(1, 2)
        assert isinstance(quantized, torch.Tensor)
        projected: torch.Tensor = self.output_proj(quantized)
        return projected


class _SplitRVQ(nn.Module):
    def __init__(self, c: MimiConfig, codebooks: int) -> None:
        super().__init__()
        self.rvq_first = _RVQ(c.dimension, c.quantizer_dim, 1, c.bins)
        self.rvq_rest = _RVQ(c.dimension, c.quantizer_dim, codebooks - 1, c.bins)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.rvq_first.encode(x), self.rvq_rest.encode(x)], dim=1)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        return self.rvq_first.decode(codes[:, :1]) + self.rvq_rest.decode(codes[:, 1:])


_Streaming = StreamConv1d | StreamConvTranspose1d | Transformer


def _streaming_children(module: nn.Module) -> list[_Streaming]:
    return [m for m in module.modules() if isinstance(m, (StreamConv1d, StreamConvTranspose1d, Transformer))]


class Mimi(nn.Module):
    """The codec with ``batch`` rows of streaming state; encoder and decoder reset separately."""

    def __init__(self, config: MimiConfig, codebooks: int) -> None:
        super().__init__()
        c = self.config = config
        self.codebooks = codebooks
        self.encoder = _encoder(c)
        self.decoder = _decoder(c)

        def transformer() -> Transformer:
            return Transformer(
                c.tr_dim,
                c.tr_heads,
                c.tr_layers,
                c.tr_ff,
                norm="layer_norm",
                gating=False,
                layer_scale=c.tr_layer_scale,
                rope_max_period=c.tr_max_period,
                context=c.tr_context,
                capacity=c.tr_context,
            )

        self.encoder_transformer = transformer()
        self.decoder_transformer = transformer()
        stride = c.downsample_stride
        self.downsample = StreamConv1d(c.dimension, c.dimension, 2 * stride, stride=stride, bias=False, replicate=True)
        # groups=dimension: the published upsampler is channel-wise (kept for weight compatibility).
        self.upsample = StreamConvTranspose1d(
            c.dimension, c.dimension, 2 * stride, stride, groups=c.dimension, bias=False
        )
        self.quantizer = _SplitRVQ(c, codebooks)
        self.relink()

    def relink(self) -> None:
        """The modules holding streaming state, listed once rather than found by walking the
        module tree at every slot opening (on the engine thread); on a copy
        (``row_views.sharing_weights``), the copy's own."""
        encode = (self.encoder, self.encoder_transformer, self.downsample)
        decode = (self.upsample, self.decoder_transformer, self.decoder)
        self._encode_side = [m for side in encode for m in _streaming_children(side)]
        self._decode_side = [m for side in decode for m in _streaming_children(side)]

    @property
    def frame_size(self) -> int:
        return self.config.frame_size

    @property
    def decoder_delay_frames(self) -> int:
        """Calls before a frame's decoded samples are complete: the upsampler's overlapping
        tail (kernel = 2 x stride at 12.5 Hz) finishes each frame in the next call."""
        return 1 if self.upsample.tail else 0

    def start(self, batch: int) -> None:
        """Fresh streaming state for ``batch`` rows, each module's in its own dtype."""
        for module in _streaming_children(self):
            param = next(module.parameters())
            module.start(batch, param.device, param.dtype)

    def encoder_to(self, dtype: torch.dtype) -> None:
        """Run the encoder (SEANet, its transformer, the downsampler) in ``dtype``; the quantizer
        stays as it is, so the nearest codebook entries are still picked in fp32
        (docs/engines.md#mimi-encoder-in-bf16). Call before ``start``."""
        for part in (self.encoder, self.encoder_transformer, self.downsample):
            part.to(dtype)

    def decoder_to(self, dtype: torch.dtype) -> None:
        """Run the decoder (the upsampler, its transformer, SEANet) in ``dtype``; the quantizer's
        codebook lookup stays as it is, and the audio comes out in fp32
        (docs/engines.md#mimi-decoder-in-bf16). Call before ``start``."""
        for part in (self.upsample, self.decoder_transformer, self.decoder):
            part.to(dtype)

    def take_encoder_rows(self, rows: torch.Tensor, source: Mimi, source_rows: torch.Tensor) -> None:
        """Rows ``rows`` of the encoder's streaming state continue ``source``'s ``source_rows``
        (``source``: this codec for another batch on the same weights, ``row_views.sharing_weights``)."""
        for mine, theirs in zip(self._encode_side, source._encode_side, strict=True):
            mine.take_rows(rows, theirs, source_rows)  # type: ignore[arg-type]  # the lists pair modules of one kind

    def reset_encoder_rows(self, mask: torch.Tensor) -> None:
        for module in self._encode_side:
            module.reset_rows(mask)

    def reset_decoder_rows(self, mask: torch.Tensor) -> None:
        for module in self._decode_side:
            module.reset_rows(mask)

    @staticmethod
    def _carry(side: list[_Streaming]) -> list[torch.Tensor]:
        """The streaming state that a call on ``side`` carries into the next (each ``[B, ...]``),
        less the transformer's KV rings: a held row's new keys land in the ring slots at its
        unchanged position, which its next real call overwrites before it attends."""
        state: list[torch.Tensor] = []
        for module in side:
            if isinstance(module, StreamConv1d):
                state += [module.previous, module.first]
            elif isinstance(module, StreamConvTranspose1d):
                state.append(module.partial)
            else:
                state.append(module.offset)
        return state

    @torch.no_grad()
    def encode(self, pcm: torch.Tensor, hold: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, frame_size]`` float audio -> ``[B, codebooks]`` codes for one frame. Rows in
        ``hold`` (``[B]`` bool) keep their streaming state and their codes mean nothing: a batch
        where only some rows take a frame (Kyutai STT draining input that waited)."""
        if hold is None:
            return self._encode(pcm)
        return step_holding(hold, self._carry(self._encode_side), lambda: self._encode(pcm))

    def _encode(self, pcm: torch.Tensor) -> torch.Tensor:
        x = self.encoder(pcm[:, None, :].to(self.downsample.weight.dtype))
        x = self.encoder_transformer(x.transpose(1, 2)).transpose(1, 2)
        x = self.downsample(x)
        return self.quantizer.encode(x.to(self.quantizer.rvq_first.codebooks.dtype))[:, :, 0]

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, hold: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, codebooks]`` codes -> ``[B, frame_size]`` audio for one frame. Rows in ``hold``
        (``[B]`` bool; no host sync, so a captured graph can do it) keep their streaming state as
        it was and their audio means nothing: a batch where only some rows decode (Kyutai TTS)."""
        if hold is None:
            return self._decode(codes)
        return step_holding(hold, self._carry(self._decode_side), lambda: self._decode(codes))

    def _decode(self, codes: torch.Tensor) -> torch.Tensor:
        x = self.upsample(self.quantizer.decode(codes[:, :, None]).to(self.upsample.weight.dtype))
        x = self.decoder_transformer(x.transpose(1, 2)).transpose(1, 2)
        audio: torch.Tensor = self.decoder(x)[:, 0, :]
        return audio.float()
