"""OpenAI model names (``tts-1``, ``whisper-1``, ``gpt-4o-mini``, ...) reach the served model
of their task through the official SDK; ``http.model_aliases`` configures them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.web.http_support import audio_file, sdk, serve_doubles

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello there"}]


def _speech(client: openai.OpenAI, model: str) -> bytes:
    return client.audio.speech.create(model=model, voice="low", input="one two", response_format="wav").content


def _transcription(client: openai.OpenAI, model: str) -> str:
    wav = audio_file("wav", "pcm_s16le", 16000, seconds=1.0)
    return client.audio.transcriptions.create(model=model, file=("a.wav", wav)).text


def _chat(client: openai.OpenAI, model: str) -> str:
    content = client.chat.completions.create(model=model, messages=HELLO).choices[0].message.content
    assert content is not None
    return content


CALLS = {"speech": _speech, "transcription": _transcription, "chat": _chat}


@pytest.mark.parametrize(
    ("task", "alias"),
    [
        ("speech", "tts-1"),
        ("speech", "tts-1-hd"),
        ("speech", "gpt-4o-mini-tts"),
        ("transcription", "whisper-1"),
        ("transcription", "gpt-4o-transcribe"),
        ("transcription", "gpt-4o-mini-transcribe"),
        ("chat", "gpt-4o-mini"),
        ("chat", "gpt-4o"),
    ],
)
async def test_openai_model_names_reach_the_served_model(config, task, alias):
    async with serve_doubles(config) as (base, _):
        served = await asyncio.to_thread(CALLS[task], sdk(base), alias)
    checks: dict[str, Callable[..., object]] = {
        "speech": bytes.startswith,
        "transcription": str.__eq__,
        "chat": str.__eq__,
    }
    expected = checks[task]
    assert expected(served, {"speech": b"RIFF", "transcription": "500hz", "chat": "echo: hello there"}[task])


@pytest.mark.parametrize(
    ("task", "alias"), [("speech", "whisper-1"), ("transcription", "tts-1"), ("chat", "gpt-4o-mini-tts")]
)
async def test_an_alias_of_another_task_is_still_404(config, task, alias):
    async with serve_doubles(config) as (base, _):
        with pytest.raises(openai.NotFoundError) as err:
            await asyncio.to_thread(CALLS[task], sdk(base), alias)
    assert isinstance(err.value.body, dict)
    assert (err.value.body["code"], err.value.body["param"]) == ("model_not_found", "model")


async def test_aliases_can_be_turned_off(config):
    config = config.model_copy(update={"http": config.http.model_copy(update={"model_aliases": {}})})
    async with serve_doubles(config) as (base, _):
        with pytest.raises(openai.NotFoundError):
            await asyncio.to_thread(_speech, sdk(base), "tts-1")
