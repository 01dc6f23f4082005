"""Kyutai delayed-streams speech-to-text (``kyutai/stt-1b-en_fr``, ``kyutai/stt-2.6b-en``) on the
lockstep runtime (docs/engines.md#kyutai-stt-engine).

The Moshi temporal transformer and Mimi encoder (``engines/moshi``) with audio in and text
out after a fixed delay, no depformer, and extra heads giving end-of-turn probabilities.
``frame_model`` is the batched ``FrameModel``; ``words`` turns a slot's text tokens into
timed words; ``stream`` is a client's loop-side handle; ``engine`` builds it all from config.
"""
