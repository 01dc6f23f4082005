"""``WS /api/tts_streaming`` spoken by Piper (the default engine's TTS, no ``tts_engine.weights``)
with ``msgpack`` + ``websockets`` over 127.0.0.1, the audio checked by the default Whisper
(docs/serving.md#tts-streaming)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgpack
import numpy as np
import pytest
import pytest_asyncio
import websockets
from aiohttp import web

from rtserve.app import build_app
from rtserve.codecs.pcm import FloatArray
from rtserve.config import load_config
from rtserve.engines.cascade.audio import resample
from rtserve.web.context import CTX
from tests.engines.cascade.cascade_support import heard_most_of
from tests.support import serve_app
from tests.web.realtime_support import until_ready

pytestmark = [pytest.mark.models, pytest.mark.asyncio(loop_scope="module")]

RATE = 24_000
LOAD_TIMEOUT_S = 300
SHORT = "The quick brown fox."
LONG = "The quick brown fox jumps over the lazy dog. Then it runs far away into the green forest."


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served() -> AsyncIterator[tuple[web.Application, str]]:
    """One default server (Whisper, SmolLM2, Piper) for the module, once its models are loaded."""
    app = build_app(load_config(environ={}))
    async with serve_app(app) as base, aiohttp.ClientSession() as http:
        await until_ready(http, base, LOAD_TIMEOUT_S)
        yield app, base.replace("http://", "ws://") + "/api/tts_streaming"


def _pack(message: dict[str, Any]) -> bytes:
    packed: bytes = msgpack.packb(message)
    return packed


async def _speak(url: str, pieces: list[str]) -> tuple[FloatArray, list[dict[str, Any]]]:
    """Sends ``pieces`` as ``Text`` messages then ``Eos``; the audio and ``Text`` words until the close."""
    async with websockets.connect(url) as ws:
        assert msgpack.unpackb(await ws.recv()) == {"type": "Ready"}
        for piece in pieces:
            await ws.send(_pack({"type": "Text", "text": piece}))
        await ws.send(_pack({"type": "Eos"}))
        audio: list[FloatArray] = []
        words: list[dict[str, Any]] = []
        async with asyncio.timeout(120):
            async for data in ws:
                message = msgpack.unpackb(data)
                assert message["type"] in ("Audio", "Text"), message
                if message["type"] == "Audio":
                    audio.append(np.asarray(message["pcm"], np.float32))
                else:
                    words.append(message)
        assert ws.close_code == 1000
    return (np.concatenate(audio) if audio else np.zeros(0, np.float32)), words


async def _heard(app: web.Application, pcm: FloatArray) -> str:
    asr = app[CTX].turn_engines.asr
    assert asr is not None

    async def audio() -> AsyncIterator[FloatArray]:
        yield resample(pcm, RATE, asr.sample_rate)

    pieces = [piece async for piece in asr.transcribe(audio())]
    return pieces[-1].text


async def test_piper_speaks_streamed_text_with_word_timings(served: tuple[web.Application, str]) -> None:
    app, url = served
    short_pcm, short_words = await _speak(url, [SHORT])
    # Sent a few words at a time, a sentence's end in the middle of a message; the tail comes with the Eos.
    pieces = [" ".join(LONG.split()[i : i + 3]) for i in range(0, len(LONG.split()), 3)]
    long_pcm, long_words = await _speak(url, pieces)
    assert 0 < short_pcm.size < long_pcm.size
    for said, words, pcm in ((SHORT, short_words, short_pcm), (LONG, long_words, long_pcm)):
        assert [w["text"] for w in words] == said.split()
        times = [t for w in words for t in (w["start_s"], w["stop_s"])]
        assert times == sorted(times) and times[0] == 0.0
        assert times[-1] == pytest.approx(pcm.size / RATE, abs=1e-3)
        heard = await _heard(app, pcm)
        assert heard_most_of(heard, said), heard


async def test_an_unknown_voice_is_refused_before_anything_is_spoken(served: tuple[web.Application, str]) -> None:
    _, url = served
    async with websockets.connect(f"{url}?voice=nobody") as ws:
        message = msgpack.unpackb(await ws.recv())
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 10)
    assert message["type"] == "Error" and message["code"] == "voice_not_found", message
    assert "joe" in message["message"]
    _, words = await _speak(f"{url}?voice=joe", ["Hello there."])  # Piper's own voice by name
    assert [w["text"] for w in words] == ["Hello", "there."]
