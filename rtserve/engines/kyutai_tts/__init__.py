"""Kyutai's delayed-streams TTS on the lockstep runtime (docs/engines.md#kyutai-tts): text
streamed in, 24 kHz audio and word timings out, B sessions per batched 80 ms step."""
