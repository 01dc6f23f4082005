"""/v1/audio/transcriptions over a real socket: uploads in common containers decoded and
resampled, every response format, SSE deltas, and the error paths; test-double ASR that
"hears" the dominant frequency of each second."""

from __future__ import annotations

import asyncio
import io
import json
import wave

import aiohttp
import av
import numpy as np
import openai
import pytest
from openai.types.audio import TranscriptionVerbose

from rtserve.engines.values import TranscriptPiece
from tests.web.http_support import ToneASRDouble, TurnEnginesSessionDouble, audio_file, sdk, serve_doubles, tone


@pytest.mark.parametrize(
    ("filename", "container", "codec", "rate"),
    [
        ("a.wav", "wav", "pcm_s16le", 44100),
        ("a.mp3", "mp3", "libmp3lame", 22050),
        ("a.ogg", "ogg", "libopus", 48000),
        ("a.flac", "flac", "flac", 16000),
        ("a.m4a", "mp4", "aac", 32000),
        ("a.webm", "webm", "libopus", 48000),
    ],
)
async def test_sdk_transcribes_common_containers(config, filename, container, codec, rate):
    # 1.9 s: codec priming/padding must not push a lossy file past 2 s (a third chunk).
    data = audio_file(container, codec, rate, channels=2 if container == "wav" else 1, seconds=1.9)
    async with serve_doubles(config) as (base, _):
        result = await asyncio.to_thread(
            sdk(base).audio.transcriptions.create, model="double-asr", file=(filename, data)
        )
    # Two one-second chunks at the engine's 16 kHz, each "heard" as the 500 Hz tone.
    assert result.text == "500hz 500hz"


async def test_language_and_prompt_reach_the_engine(config):
    async with serve_doubles(config) as (base, engine):
        await asyncio.to_thread(
            sdk(base).audio.transcriptions.create,
            model="double-asr",
            file=("a.wav", audio_file("wav", "pcm_s16le", 16000, seconds=0.5)),
            language="en",
            prompt="tones",
        )
    assert (engine.asr.languages, engine.asr.prompts) == (["en"], ["tones"])


async def test_text_verbose_json_srt_vtt(config):
    data = audio_file("wav", "pcm_s16le", 16000, seconds=1.5)
    results = {}
    async with serve_doubles(config) as (base, _):
        client = sdk(base)
        for fmt in ("text", "verbose_json", "srt", "vtt"):
            results[fmt] = await asyncio.to_thread(
                client.audio.transcriptions.create,
                model="double-asr",
                file=("a.wav", data),
                response_format=fmt,
                language="en",
            )
    assert results["text"] == "500hz 500hz\n"
    verbose = results["verbose_json"]
    assert isinstance(verbose, TranscriptionVerbose) and verbose.segments is not None
    assert (verbose.text, verbose.duration, verbose.language) == ("500hz 500hz", 1.5, "en")
    # The ASR protocol carries no word timing: one segment spans the file.
    assert [(s.start, s.end, s.text) for s in verbose.segments] == [(0.0, 1.5, "500hz 500hz")]
    assert results["srt"] == "1\n00:00:00,000 --> 00:00:01,500\n500hz 500hz\n"
    assert results["vtt"] == "WEBVTT\n\n00:00:00.000 --> 00:00:01.500\n500hz 500hz\n"


async def test_sdk_stream_sends_deltas_then_done(config):
    config.http.transcription_window_s = 2.0  # three engine calls for 5 s: deltas arrive per window

    def consume(base: str) -> list:
        return list(
            sdk(base).audio.transcriptions.create(
                model="double-asr", file=("a.flac", audio_file("flac", "flac", 16000, seconds=5)), stream=True
            )
        )

    async with serve_doubles(config) as (base, engine):
        events = await asyncio.to_thread(consume, base)
    deltas, done = events[:-1], events[-1]
    assert {e.type for e in deltas} == {"transcript.text.delta"} and done.type == "transcript.text.done"
    assert len(engine.asr.fed) == 3 and len(deltas) >= 3
    assert "".join(e.delta for e in deltas) == done.text
    assert set(done.text.split()) == {"500hz"}


async def test_long_audio_goes_to_the_engine_in_windows_cut_at_quiet_moments(config):
    config.http.transcription_window_s = 5.0  # each cut is searched in the window's last 0.8 s
    audio = tone(500, 10.0, 16000)
    audio[73600:75200] = 0  # 4.6-4.7 s
    audio[145600:150400] = 0  # 9.1-9.4 s
    wav = io.BytesIO()
    with wave.open(wav, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((audio * 32767).astype("<i2").tobytes())
    async with serve_doubles(config) as (base, engine):
        result = await asyncio.to_thread(
            sdk(base).audio.transcriptions.create, model="double-asr", file=("long.wav", wav.getvalue())
        )
    # Cuts in the middle of the first quiet 100 ms frame of each search span: 4.65 s and 9.2 s.
    assert engine.asr.fed == [74400, 72800, 12800]
    assert result.text.split() == ["500hz"] * 11  # 5 + 5 + 1 words: nothing lost or repeated at the cuts


class RevisingASRDouble(ToneASRDouble):
    """Test double ASR whose second hypothesis rewrites the first, as a re-decode can."""

    async def transcribe(self, audio, *, language=None, prompt=None):
        async for _ in audio:
            pass
        for text, final in [
            ("the cat", False),
            ("the cat sat", False),
            ("a cat sat on", False),
            ("a cat sat on the mat", True),
        ]:
            yield TranscriptPiece(text=text, final=final)


async def test_stream_deltas_only_append_and_done_has_the_final_text(config):
    engine = TurnEnginesSessionDouble()
    engine.asr = RevisingASRDouble()

    def consume(base: str) -> list:
        return list(
            sdk(base).audio.transcriptions.create(
                model="double-asr", file=("a.wav", audio_file("wav", "pcm_s16le", 16000, seconds=0.5)), stream=True
            )
        )

    async with serve_doubles(config, engine) as (base, _):
        events = await asyncio.to_thread(consume, base)
    # "a cat ..." cannot be appended to "the cat sat": no delta for it; done is authoritative.
    assert [(e.type, getattr(e, "delta", None)) for e in events[:-1]] == [
        ("transcript.text.delta", "the cat"),
        ("transcript.text.delta", " sat"),
    ]
    assert events[-1].text == "a cat sat on the mat"


async def test_json_reports_duration_usage(config):
    async with serve_doubles(config) as (base, _), aiohttp.ClientSession() as http:
        form = aiohttp.FormData()
        form.add_field("file", audio_file("wav", "pcm_s16le", 8000, seconds=1.25), filename="a.wav")
        async with http.post(f"{base}/v1/audio/transcriptions", data=form) as resp:
            assert resp.status == 200
            body = await resp.json()
    assert body == {"text": "500hz 500hz", "usage": {"type": "duration", "seconds": 1.25}}


async def post_form(
    base: str, fields: dict[str, str], file: bytes | None = b"", filename: str = "a.wav"
) -> tuple[int, dict]:
    form = aiohttp.FormData(default_to_multipart=True)
    if file is not None:
        form.add_field("file", file, filename=filename)
    for key, value in fields.items():
        form.add_field(key, value)
    async with aiohttp.ClientSession() as http, http.post(f"{base}/v1/audio/transcriptions", data=form) as resp:
        return resp.status, (await resp.json())["error"]


async def test_undecodable_upload_is_400_invalid_audio(config):
    async with serve_doubles(config) as (base, engine):
        status, error = await post_form(base, {}, file=b"this is not audio " * 64, filename="a.mp3")
        with pytest.raises(openai.BadRequestError) as err:
            await asyncio.to_thread(
                sdk(base).audio.transcriptions.create, model="double-asr", file=("a.wav", b"RIFF\x00\x00")
            )
    assert (status, error["code"], error["param"]) == (400, "invalid_audio", "file")
    assert isinstance(err.value.body, dict)
    assert err.value.body["code"] == "invalid_audio"
    assert engine.asr.control.calls == 0


async def test_file_with_no_audio_stream_is_400(config):
    video = io.BytesIO()
    with av.open(video, mode="w", format="mp4") as c:
        stream = c.add_stream("mpeg4", rate=5)
        stream.width, stream.height = 32, 32
        for _ in range(3):
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.zeros((32, 32, 3), np.uint8), format="rgb24")):
                c.mux(packet)
        for packet in stream.encode(None):
            c.mux(packet)
    async with serve_doubles(config) as (base, _):
        status, error = await post_form(base, {}, file=video.getvalue(), filename="v.mp4")
    assert (status, error["code"]) == (400, "invalid_audio")
    assert "no audio stream" in error["message"]


async def test_empty_audio_is_422(config):
    empty = io.BytesIO()
    with wave.open(empty, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
    async with serve_doubles(config) as (base, _):
        status, error = await post_form(base, {}, file=empty.getvalue())
    assert (status, error["code"]) == (422, "empty_audio")


async def test_audio_longer_than_the_limit_is_413(config):
    config.http.max_transcription_audio_s = 1.0
    async with serve_doubles(config) as (base, engine):
        status, error = await post_form(base, {}, file=audio_file("wav", "pcm_s16le", 16000, seconds=1.5))
    assert (status, error["code"]) == (413, "audio_too_long")
    assert engine.asr.control.calls == 0


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": "docx"}, "response_format"),
        ({"temperature": "1.5"}, "temperature"),
        ({"stream": "perhaps"}, "stream"),
        ({"language": "e"}, "language"),
    ],
)
async def test_invalid_fields_are_400_naming_the_param(config, fields, param):
    async with serve_doubles(config) as (base, _):
        status, error = await post_form(base, fields, file=audio_file("wav", "pcm_s16le", 16000, seconds=0.5))
    assert (status, error["param"]) == (400, param)


async def test_missing_file_and_non_multipart_bodies_are_400(config):
    async with serve_doubles(config) as (base, _), aiohttp.ClientSession() as http:
        status, error = await post_form(base, {"model": "double-asr"}, file=None)
        assert (status, error["param"], error["code"]) == (400, "file", "missing_required_parameter")
        async with http.post(f"{base}/v1/audio/transcriptions", json={"file": "a.wav"}) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["code"] == "invalid_content_type"


async def test_unknown_model_is_404(config):
    async with serve_doubles(config) as (base, _):
        status, error = await post_form(base, {"model": "whisper-9"}, file=b"x")
    assert (status, error["code"], error["param"]) == (404, "model_not_found", "model")


async def test_engine_failure_mid_stream_is_an_sse_error(config):
    async with serve_doubles(config) as (base, engine), aiohttp.ClientSession() as http:
        engine.asr.control.fail_after = 1
        form = aiohttp.FormData()
        form.add_field("file", audio_file("wav", "pcm_s16le", 16000, seconds=3), filename="a.wav")
        form.add_field("stream", "true")
        async with http.post(f"{base}/v1/audio/transcriptions", data=form) as resp:
            assert resp.status == 200
            events = [json.loads(e[6:]) for e in (await resp.read()).decode().split("\n\n") if e]
    assert [e["type"] for e in events] == ["transcript.text.delta", "error"]
    assert events[-1]["error"]["code"] == "engine_error"


async def test_a_tag_that_is_not_utf8_does_not_stop_valid_audio(config):
    # Found by the socket fuzz suite: PyAV decoded container tags strictly, so one stray byte
    # in a WAV's INFO chunk (or an Ogg comment) made a valid upload a 500 with a traceback.
    wav = bytearray(audio_file("wav", "pcm_s16le", 16000, seconds=1.9))
    at = wav.index(b"Lavf")  # FFmpeg's encoder tag
    wav[at + 4] = 0xA5
    async with serve_doubles(config) as (base, _):
        result = await asyncio.to_thread(
            sdk(base).audio.transcriptions.create, model="double-asr", file=("a.wav", bytes(wav))
        )
    assert result.text == "500hz 500hz"
