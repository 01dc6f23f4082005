"""``/v1/audio/voices`` request handling over a real socket (test-double TTS): listing, what
an upload must look like (multipart parts, a safe name, bounded sizes) and the errors, with
the official SDK where it has the call. Registering real Piper voices: ``test_voices_piper``."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest

from tests.web.http_support import sdk, serve_doubles


def upload(name: str | None = "mine", model: bytes | None = b"onnx", config: bytes | None = b"{}") -> aiohttp.FormData:
    form = aiohttp.FormData()
    if name is not None:
        form.add_field("name", name)
    if model is not None:
        form.add_field("model", model, filename="mine.onnx", content_type="application/octet-stream")
    if config is not None:
        form.add_field("config", config, filename="mine.onnx.json", content_type="application/json")
    return form


async def test_the_list_names_every_voice(config):
    async with serve_doubles(config) as (base, _), aiohttp.ClientSession() as http:
        async with http.get(f"{base}/v1/audio/voices") as resp:
            body = await resp.json()
    assert body["voices"] == ["low", "high"] and body["uploaded_voices"] == []
    assert body["data"][0]["object"] == "audio.voice" and body["data"][0]["builtin"] is True


@pytest.mark.parametrize("name", ["../escape", "a/b", ".hidden", "..", "x" * 65, "bad name", "voice.onnx", ""])
async def test_unsafe_names_are_refused_before_the_model_is_read(config, name):
    config.voices.max_model_bytes = 1024  # a model part past this would be 413: the name is judged first
    async with serve_doubles(config) as (base, _), aiohttp.ClientSession() as http:
        async with http.post(f"{base}/v1/audio/voices", data=upload(name, model=b"x" * 4096)) as resp:
            assert resp.status == 400
            error = (await resp.json())["error"]
    assert error["code"] == "invalid_value" and error["param"] == "name"


async def test_upload_shape_and_size_errors(config):
    config.voices.max_model_bytes = 1024
    config.voices.max_config_bytes = 256
    async with serve_doubles(config) as (base, _), aiohttp.ClientSession() as http:
        cases = [
            (upload(config=None), 400, "missing_required_parameter", "config"),
            (upload(model=None), 400, "missing_required_parameter", "model"),
            (upload(name=None), 400, "missing_required_parameter", "name"),
            (upload(model=b"x" * 2048), 413, "request_too_large", None),
            (upload(config=b" " * 300), 413, "request_too_large", None),
        ]
        for form, status, code, param in cases:
            async with http.post(f"{base}/v1/audio/voices", data=form) as resp:
                assert resp.status == status
                error = (await resp.json())["error"]
                assert (error["code"], error["param"]) == (code, param)
        async with http.post(f"{base}/v1/audio/voices", json={"name": "mine"}) as resp:
            assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_request"
        # A well-formed upload reaches the engine, which says it cannot register voices.
        async with http.post(f"{base}/v1/audio/voices", data=upload()) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["code"] == "voice_registration_unsupported"


async def test_sdk_delete_of_a_built_in_voice_is_refused(config):
    async with serve_doubles(config) as (base, _):
        with pytest.raises(openai.BadRequestError) as refused:
            await asyncio.to_thread(sdk(base).audio.voices.delete, "low")
    assert refused.value.code == "voice_not_deletable"
