"""The LM and Mimi shapes, parsed from a Kyutai ``config.json`` (docs/engines.md#numerics-and-parity).

Only the architecture subset that Moshi, PersonaPlex and Kyutai STT checkpoints use is
supported (STT: ``dep_q = 0``, no depformer, plus ``extra_heads``); any other option is
refused by name rather than silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rtserve.engines.errors import EngineError
from rtserve.errors import MODEL_LOAD_FAILED


class CheckpointError(EngineError):
    """A weight folder that cannot be loaded; the message names the file, key or field."""

    code = MODEL_LOAD_FAILED


# The published Moshi 7B shape (the default when a config omits a field).
_LM_DEFAULTS: dict[str, Any] = {
    "dim": 4096,
    "text_card": 32000,
    "existing_text_padding_id": 3,
    "existing_text_end_padding_id": 0,
    "n_q": 16,
    "dep_q": 8,
    "card": 2048,
    "num_heads": 32,
    "num_layers": 32,
    "hidden_scale": 4.125,
    "causal": True,
    "layer_scale": None,
    "context": 3000,
    "max_period": 10000,
    "gating": "silu",
    "norm": "rms_norm_f32",
    "positional_embedding": "rope",
    "depformer_dim": 1024,
    "depformer_dim_feedforward": int(4.125 * 1024),
    "depformer_num_heads": 16,
    "depformer_num_layers": 6,
    "depformer_layer_scale": None,
    "depformer_multi_linear": True,
    "depformer_context": 8,
    "depformer_max_period": 10000,
    "depformer_gating": "silu",
    "depformer_pos_emb": "none",
    "depformer_weights_per_step": True,
    "depformer_weights_per_step_schedule": None,
    "delays": [0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1],
    "extra_heads_num_heads": 0,
    "extra_heads_dim": 6,
}
# Keys a Kyutai config carries that do not change the LM architecture.
_IGNORED = {
    "moshi_name",
    "mimi_name",
    "tokenizer_name",
    "mimi_config_name",
    "model_type",
    "lm_gen_config",
    "model_id",
    "lora_name",
    "architectures",
    "text_card_out",
    "demux_second_stream",
    "demux_second_text_stream",
    "norm_emb",
    "bias_proj",
    "depformer_low_rank_embeddings",
    "depformer_norm",
    "conditioners",
    "fuser",
    "cross_attention",
    "tts_config",
    "stt_config",
    "lora",
    "lora_rank",
    "lora_scaling",
    "depformer_causal",
    "quantize",
}
# Architecture options whose non-default value this engine does not implement.
_MUST_BE = {
    "text_card_out": None,
    "demux_second_stream": False,
    "demux_second_text_stream": False,
    "norm_emb": False,
    "bias_proj": False,
    "depformer_low_rank_embeddings": None,
    "depformer_norm": None,
    "conditioners": None,
    "fuser": None,
    "cross_attention": False,
    "lora": False,
    "quantize": False,
    "causal": True,
}


@dataclass(frozen=True)
class LMConfig:
    dim: int
    text_card: int
    text_padding_id: int
    text_end_padding_id: int
    n_q: int
    dep_q: int
    card: int
    num_heads: int
    num_layers: int
    dim_feedforward: int
    context: int
    max_period: float
    norm: str
    depformer_dim: int
    depformer_dim_feedforward: int
    depformer_num_heads: int
    depformer_num_layers: int
    depformer_multi_linear: bool
    depformer_context: int | None
    depformer_schedule: tuple[int, ...]
    delays: tuple[int, ...]
    extra_heads: int = 0  # linear heads on the temporal output (Kyutai STT: end-of-turn probabilities)
    extra_heads_dim: int = 6
    raw: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def num_codebooks(self) -> int:
        return self.n_q + 1

    @property
    def max_delay(self) -> int:
        return max(self.delays)

    @property
    def agent_codebooks(self) -> int:
        """Audio codebooks the model speaks (and Mimi decodes)."""
        return self.dep_q if self.dep_q < self.n_q else self.n_q // 2

    @property
    def user_codebooks(self) -> int:
        return self.n_q - self.agent_codebooks

    @property
    def teacher_forced_user(self) -> bool:
        """PersonaPlex layout: the depformer also walks the user codebooks, which are forced."""
        return self.dep_q == self.n_q

    @property
    def mimi_codebooks(self) -> int:
        return max(self.dep_q, self.n_q - self.dep_q) if not self.teacher_forced_user else self.n_q // 2

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> LMConfig:
        values = dict(_LM_DEFAULTS)
        for key, value in raw.items():
            if key in _MUST_BE:
                if value not in (_MUST_BE[key], None) and not (key == "causal" and value is True):
                    raise CheckpointError(f"config.json: {key}={value!r} is not supported by the moshi engine")
                continue
            if key in _IGNORED:
                continue
            if key not in _LM_DEFAULTS:
                raise CheckpointError(f"config.json: unknown LM option {key!r}")
            values[key] = value
        for key, expected in (
            ("gating", "silu"),
            ("depformer_gating", "silu"),
            ("positional_embedding", "rope"),
            ("depformer_pos_emb", "none"),
            ("layer_scale", None),
            ("depformer_layer_scale", None),
            ("depformer_weights_per_step", True),
        ):
            if values[key] != expected:
                raise CheckpointError(f"config.json: {key}={values[key]!r} is not supported (expected {expected!r})")
        if values["norm"] not in ("rms_norm_f32", "rms_norm"):
            raise CheckpointError(f"config.json: norm={values['norm']!r} is not supported")
        dep_q, n_q = int(values["dep_q"]), int(values["n_q"])
        delays = tuple(int(d) for d in values["delays"])
        if len(delays) != n_q + 1:
            raise CheckpointError(f"config.json: delays has {len(delays)} entries, expected n_q + 1 = {n_q + 1}")
        if not (dep_q == n_q or 2 * dep_q == n_q or dep_q == 0):
            raise CheckpointError(
                f"config.json: dep_q={dep_q} with n_q={n_q}: expected the Moshi layout "
                f"(dep_q = n_q / 2), the teacher-forced layout (dep_q = n_q) or a listener (dep_q = 0)"
            )
        schedule = values["depformer_weights_per_step_schedule"]
        schedule = tuple(range(dep_q)) if schedule is None else tuple(int(i) for i in schedule)
        if len(schedule) != dep_q:
            raise CheckpointError("config.json: depformer_weights_per_step_schedule must have dep_q entries")
        dim = int(values["dim"])
        return cls(
            dim=dim,
            text_card=int(values["text_card"]),
            text_padding_id=int(values["existing_text_padding_id"]),
            text_end_padding_id=int(values["existing_text_end_padding_id"]),
            n_q=n_q,
            dep_q=dep_q,
            card=int(values["card"]),
            num_heads=int(values["num_heads"]),
            num_layers=int(values["num_layers"]),
            dim_feedforward=int(float(values["hidden_scale"]) * dim),
            context=int(values["context"]),
            max_period=float(values["max_period"]),
            norm=str(values["norm"]),
            depformer_dim=int(values["depformer_dim"]),
            depformer_dim_feedforward=int(
                values["depformer_dim_feedforward"]
                if values["depformer_dim_feedforward"] is not None
                else float(values["hidden_scale"]) * int(values["depformer_dim"])
            ),
            depformer_num_heads=int(values["depformer_num_heads"]),
            depformer_num_layers=int(values["depformer_num_layers"]),
            depformer_multi_linear=bool(values["depformer_multi_linear"]),
            depformer_context=None if values["depformer_context"] is None else int(values["depformer_context"]),
            depformer_schedule=schedule,
            delays=delays,
            extra_heads=int(values["extra_heads_num_heads"] or 0),
            extra_heads_dim=int(values["extra_heads_dim"]),
            raw=dict(raw),
        )


_MIMI_DEFAULTS: dict[str, Any] = {
    "sample_rate": 24000,
    "channels": 1,
    "frame_rate": 12.5,
    "seanet": {
        "channels": 1,
        "dimension": 512,
        "causal": True,
        "n_filters": 64,
        "n_residual_layers": 1,
        "activation": "ELU",
        "compress": 2,
        "dilation_base": 2,
        "disable_norm_outer_blocks": 0,
        "kernel_size": 7,
        "residual_kernel_size": 3,
        "last_kernel_size": 3,
        "norm": "none",
        "pad_mode": "constant",
        "ratios": [8, 6, 5, 4],
        "true_skip": True,
    },
    "quantizer": {"dimension": 256, "n_q": 32, "bins": 2048, "input_dimension": 512, "output_dimension": 512},
    "transformer": {
        "d_model": 512,
        "num_heads": 8,
        "num_layers": 8,
        "causal": True,
        "layer_scale": 0.01,
        "context": 250,
        "conv_layout": True,
        "max_period": 10000,
        "gating": "none",
        "norm": "layer_norm",
        "positional_embedding": "rope",
        "dim_feedforward": 2048,
        "input_dimension": 512,
        "output_dimensions": [512],
    },
}


@dataclass(frozen=True)
class MimiConfig:
    sample_rate: int
    frame_rate: float
    dimension: int
    n_filters: int
    n_residual_layers: int
    ratios: tuple[int, ...]
    kernel_size: int
    last_kernel_size: int
    residual_kernel_size: int
    dilation_base: int
    compress: int
    true_skip: bool
    quantizer_dim: int
    quantizer_n_q: int
    bins: int
    tr_dim: int
    tr_heads: int
    tr_layers: int
    tr_ff: int
    tr_context: int
    tr_max_period: float
    tr_layer_scale: bool

    @property
    def hop_length(self) -> int:
        hop = 1
        for ratio in self.ratios:
            hop *= ratio
        return hop

    @property
    def frame_size(self) -> int:
        return int(self.sample_rate / self.frame_rate)

    @property
    def downsample_stride(self) -> int:
        return int(self.sample_rate / self.hop_length / self.frame_rate)

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> MimiConfig:
        merged: dict[str, Any] = {k: (dict(v) if isinstance(v, dict) else v) for k, v in _MIMI_DEFAULTS.items()}
        for key, value in (raw or {}).items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key].update(value)
            else:
                merged[key] = value
        seanet, quant, tr = merged["seanet"], merged["quantizer"], merged["transformer"]
        for section, key, expected in (
            ("seanet", "activation", "ELU"),
            ("seanet", "norm", "none"),
            ("seanet", "pad_mode", "constant"),
            ("seanet", "causal", True),
            ("seanet", "channels", 1),
            ("transformer", "gating", "none"),
            ("transformer", "norm", "layer_norm"),
            ("transformer", "positional_embedding", "rope"),
        ):
            if merged[section][key] != expected:
                raise CheckpointError(
                    f"mimi config: {section}.{key}={merged[section][key]!r} is not supported (expected {expected!r})"
                )
        if tr["d_model"] != seanet["dimension"] or quant["input_dimension"] != seanet["dimension"]:
            raise CheckpointError(
                "mimi config: transformer.d_model and quantizer.input_dimension must equal seanet.dimension"
            )
        config = cls(
            sample_rate=int(merged["sample_rate"]),
            frame_rate=float(merged["frame_rate"]),
            dimension=int(seanet["dimension"]),
            n_filters=int(seanet["n_filters"]),
            n_residual_layers=int(seanet["n_residual_layers"]),
            ratios=tuple(int(r) for r in seanet["ratios"]),
            kernel_size=int(seanet["kernel_size"]),
            last_kernel_size=int(seanet["last_kernel_size"]),
            residual_kernel_size=int(seanet["residual_kernel_size"]),
            dilation_base=int(seanet["dilation_base"]),
            compress=int(seanet["compress"]),
            true_skip=bool(seanet["true_skip"]),
            quantizer_dim=int(quant["dimension"]),
            quantizer_n_q=int(quant["n_q"]),
            bins=int(quant["bins"]),
            tr_dim=int(tr["d_model"]),
            tr_heads=int(tr["num_heads"]),
            tr_layers=int(tr["num_layers"]),
            tr_ff=int(tr["dim_feedforward"]),
            tr_context=int(tr["context"]),
            tr_max_period=float(tr["max_period"]),
            tr_layer_scale=tr.get("layer_scale") is not None,
        )
        if config.sample_rate % config.hop_length or config.downsample_stride < 1:
            raise CheckpointError("mimi config: sample_rate / prod(ratios) / frame_rate must be a whole stride")
        return config
