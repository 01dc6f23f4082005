"""The embedded default voice agent: VAD -> ASR -> LLM -> TTS on CPU, models from wheels.

Heavy runtimes (torch, transformers, faster-whisper, onnxruntime, piper) are imported
only when the models load, so selecting another engine never pays for them.
"""

from rtserve.engines.cascade.engine import CascadeEngine, create_engine

__all__ = ["CascadeEngine", "create_engine"]
