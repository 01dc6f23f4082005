"""Native Moshi-class full-duplex engine: temporal transformer + depformer + streaming Mimi,
loaded from local Kyutai / PersonaPlex weight folders and batched over lockstep slots.

Modules, one job each: ``layers`` (transformer blocks, ring KV attention), ``lm`` (the
RQ-Transformer), ``generator`` (per-frame token layout and delays), ``sampling``,
``mimi`` (streaming codec), ``checkpoint``/``loader`` (safetensors -> modules),
``prompts`` (voice/persona prefill), ``frame_model`` (the ``FrameModel``), ``engine``
(registry factory).
"""

from __future__ import annotations

from rtserve.engines.moshi.engine import build_frame_model, create_engine

__all__ = ["build_frame_model", "create_engine"]
