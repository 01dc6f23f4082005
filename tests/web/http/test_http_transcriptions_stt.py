"""``POST /v1/audio/transcriptions`` served by the streaming STT (``stt_engine.weights``: a tiny
random Kyutai checkpoint; docs/engines.md#cascade-streaming-asr), through the official ``openai``
SDK: ``stream=True`` gives a ``transcript.text.delta`` per word, then ``transcript.text.done``
with their sum; the plain request gives the same text. The words are gibberish (random
weights): the events and their sums are asserted, not the words."""

from __future__ import annotations

import io
import wave
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import openai
import pytest

from rtserve.app import build_app
from rtserve.config import ServerConfig
from tests.engines.kyutai_stt.stt_tiny import write_stt_checkpoint
from tests.support import serve_app
from tests.web.realtime_support import HANG_GUARD_S

REQUEST_TIMEOUT_S = 120  # the model steps in real time; a loaded 2-core machine runs late


@pytest.fixture(scope="module")
def stt_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_stt_checkpoint(tmp_path_factory.mktemp("transcriptions_stt") / "weights").folder


@pytest.fixture
async def client(config: ServerConfig, stt_weights: Path) -> AsyncIterator[openai.AsyncOpenAI]:
    config.engine = "loopback"  # no ASR of its own: only the STT can answer
    config.stt_engine = config.stt_engine.model_copy(update={"weights": str(stt_weights), "batch_size": 2})
    async with serve_app(build_app(config)) as base:
        yield openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", timeout=REQUEST_TIMEOUT_S)


def _noise_wav(seconds: float) -> bytes:
    """Loud noise at 16 kHz (resampled to the model's 24 kHz): the tiny model says words on it."""
    samples = (0.3 * np.random.default_rng(0).standard_normal(int(16000 * seconds)) * 32767).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(samples.tobytes())
    return out.getvalue()


async def _ready(client: openai.AsyncOpenAI, audio: bytes) -> str:
    """The plain transcript, once the engine (loading in the background) serves."""
    for _ in range(int(HANG_GUARD_S * 10)):
        try:
            result = await client.audio.transcriptions.create(model="whisper-1", file=("a.wav", audio))
            return result.text
        except openai.APIStatusError as exc:
            assert exc.status_code == 503, exc
    raise AssertionError("the engine never became ready")


async def test_streamed_transcription_is_a_delta_per_word_then_done(client: openai.AsyncOpenAI) -> None:
    audio = _noise_wav(2.0)
    plain = await _ready(client, audio)
    stream = await client.audio.transcriptions.create(model="whisper-1", file=("a.wav", audio), stream=True)
    events = [event async for event in stream]
    kinds = [event.type for event in events]
    assert kinds[-1] == "transcript.text.done" and kinds.count("transcript.text.done") == 1
    deltas = [event.delta for event in events if event.type == "transcript.text.delta"]
    assert len(deltas) >= 2, "the tiny model said fewer than two words"
    assert all(delta.strip() for delta in deltas)
    assert all(delta.startswith(" ") for delta in deltas[1:])  # each delta one more word
    done = events[-1]
    assert done.type == "transcript.text.done"
    assert "".join(deltas) == done.text
    assert done.text == plain  # greedy: the same audio, the same words
