"""Native Moshi-class full-duplex engine: temporal transformer + depformer + streaming Mimi,
loaded from local Kyutai / PersonaPlex weight folders and batched over lockstep slots.

Modules, one job each: ``layers`` (transformer blocks, ring KV attention), ``lm`` (the
RQ-Transformer), ``generator`` (per-frame token layout and delays), ``sampling``,
``mimi`` (streaming codec), ``checkpoint``/``loader`` (safetensors -> modules),
``prompts`` (voice/persona prefill), ``frame_model`` (the ``FrameModel``), ``engine``
(registry factory).

Nothing is imported here, so the model modules load without the server's config stack.
"""
