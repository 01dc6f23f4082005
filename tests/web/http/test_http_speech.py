"""/v1/audio/speech over a real socket: every response format decoded back, streaming
while the engine still speaks, SSE deltas, and the error paths; test-double TTS."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import struct

import aiohttp
import av
import numpy as np
import openai
import pytest

from tests.web.http_support import ToneTTSDouble, sdk, serve_doubles

THREE_WORDS = "one two three"


def decode(data: bytes, response_format: str) -> tuple[np.ndarray, int]:
    """Mono float32 and its rate, whatever the container."""
    if response_format == "pcm":
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768, 24000
    with av.open(io.BytesIO(data), mode="r") as container:
        frames = [f.to_ndarray().reshape(-1) for f in container.decode(audio=0)]
        rate = container.streams.audio[0].rate
    return np.concatenate(frames), rate


def dominant_hz(pcm: np.ndarray, rate: int) -> float:
    return float(np.argmax(np.abs(np.fft.rfft(pcm)))) * rate / pcm.size


@pytest.mark.parametrize("response_format", ["wav", "pcm", "mp3", "opus", "flac", "aac"])
async def test_sdk_speech_in_every_format_decodes_to_the_spoken_audio(config, response_format):
    async with serve_doubles(config) as (base, _):
        response = await asyncio.to_thread(
            sdk(base).audio.speech.create,
            model="double-tts",
            voice="high",
            input=THREE_WORDS,
            response_format=response_format,
        )
    pcm, rate = decode(response.content, response_format)
    expected_s = 3 * ToneTTSDouble.WORD_SECONDS
    # Lossy codecs add encoder priming and frame padding (ADTS AAC: up to two 1024-sample
    # frames, which it cannot signal); the length still says "three words", not two or four.
    assert abs(pcm.size / rate - expected_s) < 0.09
    assert abs(dominant_hz(pcm, rate) - 1200) < 15


async def test_wav_streams_with_an_unknown_length_header_and_chunked_body(config):
    async with (
        serve_doubles(config) as (base, _),
        aiohttp.ClientSession() as http,
        http.post(
            f"{base}/v1/audio/speech", json={"input": THREE_WORDS, "voice": "low", "response_format": "wav"}
        ) as resp,
    ):
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "audio/wav"
        assert resp.headers["Transfer-Encoding"] == "chunked"
        assert "Content-Length" not in resp.headers
        body = await resp.read()
    assert body[:4] == b"RIFF" and body[8:16] == b"WAVEfmt "
    assert struct.unpack("<I", body[4:8])[0] == 0xFFFFFFFF
    assert body[36:40] == b"data" and struct.unpack("<I", body[40:44])[0] == 0xFFFFFFFF
    assert struct.unpack("<I", body[24:28])[0] == 24000
    assert len(body) - 44 == 2 * round(3 * ToneTTSDouble.WORD_SECONDS * 24000)


async def test_first_audio_arrives_while_the_engine_is_still_speaking(config):
    async with serve_doubles(config) as (base, engine), aiohttp.ClientSession() as http:
        engine.tts.control.hold = asyncio.Event()
        async with http.post(
            f"{base}/v1/audio/speech", json={"input": THREE_WORDS, "voice": "low", "response_format": "pcm"}
        ) as resp:
            first = await asyncio.wait_for(resp.content.readany(), timeout=10)
            assert first  # audio of word one, sent while word two is held back in the engine
            assert not engine.tts.control.closed.is_set()
            engine.tts.control.hold.set()
            rest = await resp.read()
    assert len(first) + len(rest) == 2 * round(3 * ToneTTSDouble.WORD_SECONDS * 24000)


async def test_speed_shortens_the_audio(config):
    async with serve_doubles(config) as (base, _):
        response = await asyncio.to_thread(
            sdk(base).audio.speech.create,
            model="double-tts",
            voice="low",
            input=THREE_WORDS,
            response_format="pcm",
            speed=2.0,
        )
    assert len(response.content) == 2 * round(3 * ToneTTSDouble.WORD_SECONDS / 2 * 24000)


async def test_sse_stream_carries_base64_deltas_then_done(config):
    def consume(base: str) -> list[dict]:
        with sdk(base).audio.speech.with_streaming_response.create(
            model="double-tts", voice="high", input=THREE_WORDS, response_format="wav", stream_format="sse"
        ) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]

    async with serve_doubles(config) as (base, _):
        events = await asyncio.to_thread(consume, base)
    assert {e["type"] for e in events[:-1]} == {"speech.audio.delta"}
    assert events[-1]["type"] == "speech.audio.done"
    assert events[-1]["usage"]["input_tokens"] == len(THREE_WORDS)
    pcm, rate = decode(b"".join(base64.b64decode(e["audio"]) for e in events[:-1]), "wav")
    assert pcm.size == round(3 * ToneTTSDouble.WORD_SECONDS * rate)
    assert abs(dominant_hz(pcm, rate) - 1200) < 15


async def test_custom_voice_object_form_is_accepted(config):
    async with (
        serve_doubles(config) as (base, _),
        aiohttp.ClientSession() as http,
        http.post(
            f"{base}/v1/audio/speech", json={"input": "hi", "voice": {"id": "high"}, "response_format": "pcm"}
        ) as resp,
    ):
        assert resp.status == 200
        pcm = np.frombuffer(await resp.read(), dtype="<i2").astype(np.float32)
    assert abs(dominant_hz(pcm, 24000) - 1200) < 15


async def test_a_voice_the_engine_does_not_have_is_400(config):
    async with serve_doubles(config) as (base, _):
        with pytest.raises(openai.BadRequestError) as err:
            await asyncio.to_thread(sdk(base).audio.speech.create, model="double-tts", voice="alloy", input="hi")
    body = err.value.body
    assert isinstance(body, dict)
    assert (body["param"], body["code"]) == ("voice", "invalid_voice")
    assert "low, high" in body["message"]


@pytest.mark.parametrize(
    ("patch", "param", "fragment"),
    [
        ({"speed": 4.5}, "speed", "less than or equal to 4"),
        ({"speed": 0.1}, "speed", "greater than or equal to 0.25"),
        ({"input": ""}, "input", "at least 1 character"),
        ({"input": "   "}, "input", "text to speak"),
        ({"input": "x" * 4097}, "input", "at most 4096"),
        ({"response_format": "ogg"}, "response_format", "'mp3'"),
        ({"stream_format": "chunks"}, "stream_format", "'audio' or 'sse'"),
    ],
)
async def test_invalid_parameters_are_400_naming_the_param(config, patch, param, fragment):
    async with serve_doubles(config) as (base, engine), aiohttp.ClientSession() as http:
        async with http.post(f"{base}/v1/audio/speech", json={"input": "hi", "voice": "low", **patch}) as resp:
            assert resp.status == 400
            error = (await resp.json())["error"]
    assert error["param"] == param
    assert fragment in error["message"]
    assert engine.tts.control.calls == 0


async def test_unknown_model_is_404_through_the_sdk(config):
    async with serve_doubles(config) as (base, _):
        with pytest.raises(openai.NotFoundError) as err:
            await asyncio.to_thread(sdk(base).audio.speech.create, model="tts-9", voice="low", input="hi")
    assert isinstance(err.value.body, dict) and err.value.body["code"] == "model_not_found"


async def test_failure_after_audio_cuts_a_raw_stream_short(config):
    async with serve_doubles(config) as (base, engine), aiohttp.ClientSession() as http:
        engine.tts.control.fail_after = 2
        async with http.post(
            f"{base}/v1/audio/speech", json={"input": THREE_WORDS, "voice": "low", "response_format": "pcm"}
        ) as resp:
            assert resp.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await resp.read()


async def test_failure_after_audio_in_sse_is_an_error_event(config):
    async with serve_doubles(config) as (base, engine), aiohttp.ClientSession() as http:
        engine.tts.control.fail_after = 2
        async with http.post(
            f"{base}/v1/audio/speech", json={"input": THREE_WORDS, "voice": "low", "stream_format": "sse"}
        ) as resp:
            events = [json.loads(e[6:]) for e in (await resp.read()).decode().split("\n\n") if e]
    assert [e["type"] for e in events] == ["speech.audio.delta", "speech.audio.delta", "speech.audio.error"]
    assert events[-1]["error"]["message"] == "the double failed on purpose"


async def test_failure_before_audio_is_an_http_error(config):
    async with serve_doubles(config) as (base, engine), aiohttp.ClientSession() as http:
        engine.tts.control.fail_after = 0
        async with http.post(f"{base}/v1/audio/speech", json={"input": "hi", "voice": "low"}) as resp:
            assert resp.status == 500
            error = (await resp.json())["error"]
    assert (error["type"], error["code"]) == ("server_error", "engine_error")
