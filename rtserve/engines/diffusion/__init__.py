"""Diffusion engines on ``diffusers``: denoising-step batching across requests
(docs/engines.md#diffusion-step-batching). ``StepBatcher`` is generic over a ``StepModel``;
``UNetStepModel`` serves images, other models plug into the same batcher."""
