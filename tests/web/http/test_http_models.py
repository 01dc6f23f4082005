"""The HTTP generation routes on the real embedded models (cascade engine: Whisper tiny.en,
SmolLM2-135M, Piper), called with the official OpenAI SDK over a real socket."""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from openai.types import CompletionUsage

from rtserve.config import load_config
from tests.web.http_support import sdk
from tests.web.realtime_support import running

pytestmark = [pytest.mark.models, pytest.mark.asyncio(loop_scope="module")]

SENTENCE = "The quick brown fox jumps over the lazy dog."
LOAD_TIMEOUT_S = 300


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def heard_most_of(heard: str, said: str) -> bool:
    """At least half the words said: Whisper tiny mishears a word now and then, more so on a loaded machine."""
    return 2 * len(words(heard) & words(said)) >= len(words(said))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def base() -> AsyncIterator[str]:
    """One server with the models loaded for the whole module (loading takes seconds)."""
    async with running(load_config(environ={}), ready_timeout_s=LOAD_TIMEOUT_S) as url:
        yield url


async def test_models_lists_the_three_cascade_models(base):
    models = await asyncio.to_thread(lambda: [m.id for m in sdk(base).models.list()])
    assert {"whisper-tiny.en", "smollm2-135m-instruct", "piper-joe"} <= set(models)


@pytest.mark.parametrize("response_format", ["wav", "opus"])
async def test_speech_to_transcription_round_trip_recovers_most_of_the_words(base, response_format):
    client = sdk(base)
    speech = await asyncio.to_thread(
        client.audio.speech.create, model="piper-joe", voice="alloy", input=SENTENCE, response_format=response_format
    )
    transcript = await asyncio.to_thread(
        client.audio.transcriptions.create,
        model="whisper-tiny.en",
        file=(f"speech.{'ogg' if response_format == 'opus' else response_format}", speech.content),
    )
    assert heard_most_of(transcript.text, SENTENCE), transcript.text


async def test_streamed_transcription_of_synthesized_speech(base):
    client = sdk(base)

    def run() -> list:
        speech = client.audio.speech.create(model="piper-joe", voice="joe", input=SENTENCE, response_format="flac")
        return list(
            client.audio.transcriptions.create(model="whisper-tiny.en", file=("s.flac", speech.content), stream=True)
        )

    events = await asyncio.to_thread(run)
    assert events[-1].type == "transcript.text.done"
    assert heard_most_of(events[-1].text, SENTENCE), events[-1].text
    assert "".join(e.delta for e in events[:-1]) == events[-1].text


async def test_chat_streaming_and_not_give_the_same_greedy_reply(base):
    client = sdk(base)
    # With a system prompt, as chat apps send one (SmolLM2-135M's int8 greedy answer to the bare
    # question starts "L'Étoile, la Marseillaise": the model's knowledge, not the route, is tested there).
    request: dict[str, Any] = {
        "model": "smollm2-135m-instruct",
        "temperature": 0,
        "max_tokens": 12,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
            {"role": "user", "content": "What is the capital of France?"},
        ],
    }

    def streamed() -> tuple[str, CompletionUsage | None]:
        chunks = list(client.chat.completions.create(**request, stream=True, stream_options={"include_usage": True}))
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks[-1].usage

    completion = await asyncio.to_thread(functools.partial(client.chat.completions.create, **request))
    text, usage = await asyncio.to_thread(streamed)
    assert completion.choices[0].message.content is not None
    assert completion.choices[0].message.content.strip()
    assert text == completion.choices[0].message.content
    assert usage is not None and completion.usage is not None
    assert usage.completion_tokens == completion.usage.completion_tokens <= 12
    assert usage.prompt_tokens == completion.usage.prompt_tokens > 0


async def test_batch_matches_single_requests_in_input_order(base):
    questions = ["What is the capital of France?", "Name a primary color."]
    request = {"temperature": 0, "max_tokens": 8}
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{base}/v1/chat/completions/batch",
            json={**request, "messages": [[{"role": "user", "content": q}] for q in questions]},
        ) as resp:
            assert resp.status == 200
            batch = await resp.json()
        singles = []
        for q in questions:
            async with http.post(
                f"{base}/v1/chat/completions", json={**request, "messages": [{"role": "user", "content": q}]}
            ) as resp:
                singles.append((await resp.json())["choices"][0]["message"]["content"])
    assert [c["message"]["content"] for c in batch["choices"]] == singles
