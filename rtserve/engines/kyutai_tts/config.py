"""What a Kyutai TTS ``config.json`` says beyond a Moshi LM's shape (docs/engines.md#kyutai-tts).

A delayed-streams TTS checkpoint is a Moshi-class LM plus:

* ``tts_config``: ``audio_delay`` (seconds the audio lags its text) and ``second_stream_ahead``
  (a second text stream that shows the word that many words ahead, muxed into the text token);
* ``demux_second_stream``: the text embeddings take that muxed token;
* ``depformer_low_rank_embeddings``: the depformer's token embeddings are low rank;
* ``cross_attention`` + ``conditioners`` + ``fuser``: the voice (``speaker_wavs``, a tensor
  conditioner) reaches the temporal transformer by cross-attention, ``control`` and ``cfg``
  (lookup tables) are summed into its input;
* ``model_id`` (``sig``, ``epoch``): the suffix of the voice files made for this checkpoint.

These keys are taken out here and the rest is an ordinary ``LMConfig``; anything this engine
does not implement is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rtserve.engines.moshi.lm_config import CheckpointError, LMConfig

_TTS_KEYS = (
    "tts_config",
    "demux_second_stream",
    "demux_second_text_stream",
    "depformer_low_rank_embeddings",
    "cross_attention",
    "conditioners",
    "fuser",
)
_CONDITIONER_OPTIONS = {"dim", "output_dim", "force_linear", "pad_empty", "output_bias", "learn_padding", "device"}


@dataclass(frozen=True)
class ConditionerSpec:
    """One conditioner: ``lut`` (a text value -> one embedding) or ``tensor`` (a given sequence)."""

    name: str
    kind: str  # "lut" | "tensor"
    dim: int  # the conditioner's own width (its LUT embedding or its input tensor)
    force_linear: bool
    learn_padding: bool
    n_bins: int = 0  # lut only
    possible_values: tuple[str, ...] | None = None  # lut only: None hashes the value


@dataclass(frozen=True)
class FuserSpec:
    sum: tuple[str, ...]
    cross: tuple[str, ...]
    cross_pos_emb: bool
    cross_pos_emb_scale: float


@dataclass(frozen=True)
class TTSArch:
    lm: LMConfig
    audio_delay_s: float
    second_stream_ahead: int
    multistream: bool
    demux_text: bool
    depformer_low_rank: int | None
    cross_attention: bool
    conditioners: tuple[ConditionerSpec, ...]
    fuser: FuserSpec | None
    voice_suffix: str  # ".{sig}@{epoch}.safetensors", "" without a model_id

    def conditioner(self, name: str) -> ConditionerSpec | None:
        return next((c for c in self.conditioners if c.name == name), None)

    @property
    def multi_speaker(self) -> bool:
        return self.conditioner("speaker_wavs") is not None

    @property
    def cfg_values(self) -> tuple[float, ...]:
        """The CFG strengths a CFG-distilled checkpoint was trained with (empty: direct CFG)."""
        spec = self.conditioner("cfg")
        return () if spec is None or spec.possible_values is None else tuple(float(v) for v in spec.possible_values)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TTSArch:
        tts = raw.get("tts_config")
        if not isinstance(tts, dict) or "audio_delay" not in tts:
            raise CheckpointError("config.json: a TTS checkpoint needs tts_config.audio_delay")
        multistream = bool(tts.get("multistream", False))
        if multistream:
            raise CheckpointError("config.json: tts_config.multistream is not supported by the kyutai TTS engine")
        lm = LMConfig.from_dict({k: v for k, v in raw.items() if k not in _TTS_KEYS})
        if lm.dep_q != lm.n_q:
            raise CheckpointError(
                f"config.json: a TTS checkpoint generates every codebook (dep_q={lm.dep_q}, n_q={lm.n_q})"
            )
        low_rank = raw.get("depformer_low_rank_embeddings")
        conditioners = tuple(_conditioner(name, spec) for name, spec in (raw.get("conditioners") or {}).items())
        fuser = _fuser(raw.get("fuser"), {c.name for c in conditioners})
        cross = bool(raw.get("cross_attention", False))
        if cross and (fuser is None or not fuser.cross):
            raise CheckpointError("config.json: cross_attention needs a fuser with a cross condition")
        model_id = raw.get("model_id") or {}
        suffix = f".{model_id['sig']}@{model_id['epoch']}.safetensors" if "sig" in model_id else ""
        return cls(
            lm=lm,
            audio_delay_s=float(tts["audio_delay"]),
            second_stream_ahead=int(tts.get("second_stream_ahead", 0)),
            multistream=multistream,
            demux_text=bool(raw.get("demux_second_stream", raw.get("demux_second_text_stream", False))),
            depformer_low_rank=None if low_rank is None else int(low_rank),
            cross_attention=cross,
            conditioners=conditioners,
            fuser=fuser,
            voice_suffix=suffix,
        )


def _conditioner(name: str, raw: Any) -> ConditionerSpec:
    if not isinstance(raw, dict) or raw.get("type") not in ("lut", "tensor"):
        raise CheckpointError(f"config.json: conditioner {name!r} must be of type 'lut' or 'tensor'")
    kind = str(raw["type"])
    options = dict(raw.get(kind) or {})
    if options.get("output_bias"):
        raise CheckpointError(f"config.json: conditioner {name!r}: output_bias is not supported")
    known = _CONDITIONER_OPTIONS | (
        {"n_bins", "tokenizer", "possible_values", "init_scale"} if kind == "lut" else set()
    )
    unknown = set(options) - known
    if unknown:
        raise CheckpointError(f"config.json: conditioner {name!r}: unknown option {sorted(unknown)[0]!r}")
    if kind == "lut" and options.get("tokenizer", "noop") != "noop":
        raise CheckpointError(f"config.json: conditioner {name!r}: tokenizer {options['tokenizer']!r} is not supported")
    values = options.get("possible_values")
    return ConditionerSpec(
        name=name,
        kind=kind,
        dim=int(options["dim"]),
        force_linear=bool(options.get("force_linear", True)),
        learn_padding=bool(options.get("learn_padding", True)),
        n_bins=int(options.get("n_bins", 0)),
        possible_values=None if values is None else tuple(str(v) for v in values),
    )


def _fuser(raw: Any, names: set[str]) -> FuserSpec | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise CheckpointError("config.json: fuser must be an object")
    if raw.get("prepend"):
        raise CheckpointError("config.json: fuser.prepend is not supported")
    spec = FuserSpec(
        sum=tuple(raw.get("sum") or ()),
        cross=tuple(raw.get("cross") or ()),
        cross_pos_emb=bool(raw.get("cross_attention_pos_emb", False)),
        cross_pos_emb_scale=float(raw.get("cross_attention_pos_emb_scale", 1.0)),
    )
    for name in spec.sum + spec.cross:
        if name not in names:
            raise CheckpointError(f"config.json: fuser names {name!r}, which is not a conditioner")
    return spec
