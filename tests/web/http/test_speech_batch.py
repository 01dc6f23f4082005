"""``POST /v1/audio/speech/batch`` over a real socket: results in input order, per-item
errors that never fail the other items, and the request bounds; test-double TTS."""

from __future__ import annotations

import base64

import aiohttp
import pytest

from tests.web.http.test_http_speech import decode, dominant_hz
from tests.web.http_support import ToneTTSDouble, serve_doubles


async def test_items_are_spoken_in_order_with_per_item_errors(config):
    config.http.max_speech_input_chars = 40
    items = [
        {"input": "one two three", "voice": "high"},
        {"input": "four", "voice": "nobody"},
        {"input": "five six"},
        {"voice": "high"},
        {"input": "x " * 30},
        {"input": "seven", "response_format": "flac", "speed": 2.0},
    ]
    async with (
        serve_doubles(config) as (base, _),
        aiohttp.ClientSession() as http,
        http.post(
            f"{base}/v1/audio/speech/batch", json={"items": items, "voice": "low", "response_format": "wav"}
        ) as resp,
    ):
        assert resp.status == 200
        body = await resp.json()
    assert body["id"].startswith("speechbatch-")
    assert (body["total"], body["succeeded"], body["failed"]) == (6, 3, 3)
    results = body["results"]
    assert [r["index"] for r in results] == list(range(6))
    assert [r["status"] for r in results] == ["success", "error", "success", "error", "error", "success"]
    assert results[1]["error"]["code"] == "invalid_voice" and results[1]["error"]["param"] == "items[1].voice"
    assert results[3]["error"]["code"] == "missing_required_parameter"
    assert results[3]["error"]["param"] == "items[3].input"
    assert results[4]["error"]["param"] == "items[4].input"
    first, rate = decode(base64.b64decode(results[0]["audio_data"]), "wav")
    assert results[0]["media_type"] == "audio/wav" and rate == 24000
    assert abs(first.size / rate - 3 * ToneTTSDouble.WORD_SECONDS) < 0.01
    assert abs(dominant_hz(first, rate) - 1200) < 15  # its own voice
    third, _ = decode(base64.b64decode(results[2]["audio_data"]), "wav")
    assert abs(dominant_hz(third, rate) - 300) < 15  # the batch's default voice
    assert results[2]["usage"] == {"input_characters": 8, "output_samples": third.size}
    last, _ = decode(base64.b64decode(results[5]["audio_data"]), "flac")
    assert results[5]["media_type"] == "audio/flac"
    assert abs(last.size / 24000 - ToneTTSDouble.WORD_SECONDS / 2) < 0.01


async def test_the_request_as_a_whole_is_bounded(config):
    config.http.max_speech_batch_items = 2
    async with serve_doubles(config) as (base, engine), aiohttp.ClientSession() as http:
        for body, param in [
            ({"items": [{"input": "a"}] * 3}, "items"),
            ({"items": []}, "items"),
            ({"input": "a"}, "items"),
            ({"items": [{"input": "a"}], "speed": 9}, "speed"),
        ]:
            async with http.post(f"{base}/v1/audio/speech/batch", json=body) as resp:
                assert resp.status == 400
                assert (await resp.json())["error"]["param"] == param
        unknown_model = {"items": [{"input": "a"}], "model": "nope"}
        async with http.post(f"{base}/v1/audio/speech/batch", json=unknown_model) as resp:
            assert resp.status == 404
    assert engine.tts.control.calls == 0


async def test_an_engine_failure_fails_only_its_item(config):
    async with serve_doubles(config) as (base, engine), aiohttp.ClientSession() as http:
        engine.tts.control.fail_after = 2
        items = [{"input": "one"}, {"input": "two three four"}, {"input": "five"}]
        async with http.post(f"{base}/v1/audio/speech/batch", json={"items": items}) as resp:
            body = await resp.json()
    assert [r["status"] for r in body["results"]] == ["success", "error", "success"]
    assert body["results"][1]["error"]["code"] == "engine_error"
    assert body["results"][1]["error"]["type"] == "server_error"


async def test_the_batch_audio_is_bounded_in_total_as_it_is_produced(config):
    config.http.max_speech_batch_s = 1.0  # the double speaks 0.1 s per word
    items = [{"input": "one two three four"}, {"input": "five six seven eight"}, {"input": "w " * 40}, {"input": "x"}]
    async with serve_doubles(config) as (base, engine), aiohttp.ClientSession() as http:
        async with http.post(f"{base}/v1/audio/speech/batch", json={"items": items, "response_format": "pcm"}) as resp:
            assert resp.status == 200
            body = await resp.json()
        calls = engine.tts.control.calls
    results = body["results"]
    assert [r["status"] for r in results] == ["success", "success", "error", "error"]
    assert {r["error"]["code"] for r in results[2:]} == {"speech_too_long"}
    assert results[2]["error"]["param"] == "items[2].input"
    spoken_s = sum(len(base64.b64decode(r["audio_data"])) for r in results[:2]) / 2 / 24000
    assert spoken_s == pytest.approx(0.8, abs=0.01)
    assert calls == 3  # the item past the bound was cut off, and the last one never reached the synthesizer
