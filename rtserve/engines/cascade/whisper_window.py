"""Whisper on a short utterance without paying for 30 seconds of audio (``cascade.asr_window_s``).

Whisper's encoder always reads a 30 s window; faster-whisper pads every utterance to it, so
a two-second question costs as much as thirty seconds of speech (on two cores ~400 ms of
Whisper tiny's ~430 ms decode is the encoder). The encoder's positions are absolute, so
a shorter window padded with silence mostly works: the utterance keeps the positions it was
trained on and only the silence after it is cut. It costs some accuracy: on the 20 questions
of ``bench_answer_quality.py`` spoken 4 times by Piper, word error rate 7.4% in 30 s, 11.1%
in 10 s (15 s: 10.3%), for a median decode of 64 ms instead of 374 ms on two cores; windows
of 5 s made the decoder loop ("What is ...? What is ...? ...").

A short window is trusted only when its decode ended by itself and reads like speech: no
end token within a budget set by the audio's length, a transcript that compresses like a
repetition (faster-whisper's own test, zlib ratio > 2.4), or a low average log-probability
(faster-whisper's fallback threshold) hands the utterance to the full 30 s decode.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rtserve.codecs.pcm import FloatArray

MAX_COMPRESSION_RATIO = 2.4  # faster-whisper's compression_ratio_threshold
MIN_AVG_LOGPROB = -1.0  # faster-whisper's log_prob_threshold
_TOKENS_PER_SECOND = 12  # budget: fast speech is ~5 tokens/s; a decode past this is looping
_MIN_TOKENS = 16


def fits(samples: int, sample_rate: int, window_s: float) -> bool:
    """Short enough for the window: at most half of it, so at least as much silence follows."""
    return window_s < 30 and samples <= sample_rate * window_s / 2


def decode_in_window(model: Any, audio: FloatArray, window_s: float, language: str, prompt: str | None) -> str | None:
    """``audio`` (16 kHz) transcribed in a ``window_s`` window; None when the decode is not to
    be trusted (the caller decodes in the full window). ``model``: a faster_whisper.WhisperModel."""
    # faster-whisper is the optional "models" extra: imported where a model is in use, so the
    # server (and a machine without it) can import the cascade modules.
    from faster_whisper.tokenizer import Tokenizer
    from faster_whisper.transcribe import get_suppressed_tokens

    features = model.feature_extractor(audio)
    window = int(window_s * model.frames_per_second)
    features = np.pad(features, ((0, 0), (0, max(window - features.shape[-1], 0))))[:, :window]
    tokenizer = Tokenizer(model.hf_tokenizer, model.model.is_multilingual, task="transcribe", language=language)
    previous = tokenizer.encode(" " + prompt.strip()) if prompt and prompt.strip() else []
    tokens = model.get_prompt(tokenizer, previous, without_timestamps=True)
    budget = min(
        _MIN_TOKENS + int(_TOKENS_PER_SECOND * len(audio) / model.feature_extractor.sampling_rate),
        model.max_length - len(tokens),
    )
    result = model.model.generate(
        model.encode(features),
        [tokens],
        beam_size=1,
        max_length=len(tokens) + budget,
        return_scores=True,
        suppress_blank=True,
        suppress_tokens=list(get_suppressed_tokens(tokenizer, [-1])),
    )[0]
    ids = result.sequences_ids[0]
    if len(ids) >= budget:
        return None  # no end token: looping
    text: str = tokenizer.decode(ids).strip()
    avg_logprob = result.scores[0] * len(ids) / (len(ids) + 1)  # length_penalty 1: score = cum / len
    return text if trusted(text, avg_logprob) else None


def trusted(text: str, avg_logprob: float) -> bool:
    """A decode that does not repeat itself and that the decoder was sure enough of."""
    from faster_whisper.transcribe import get_compression_ratio

    return get_compression_ratio(text) <= MAX_COMPRESSION_RATIO and avg_logprob >= MIN_AVG_LOGPROB
