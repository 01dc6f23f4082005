"""``/v1/chat/completions`` with audio, through the official ``openai`` SDK (issue 16):
``input_audio`` content parts are transcribed into the conversation, and
``modalities: ["text", "audio"]`` returns ``message.audio`` as OpenAI does. The turn
engines are the HTTP doubles (a tone "recognizer", an echo LLM, a tone synthesizer), so
what the route does with the audio shows in the text."""

from __future__ import annotations

import asyncio
import base64
import functools
import io
import time
import wave
from typing import Any

import openai
import pytest

from rtserve.config import ServerConfig
from tests.web.http_support import audio_file, sdk, serve_doubles


def wav_b64(hz: float, seconds: float) -> str:
    return base64.b64encode(audio_file("wav", "pcm_s16le", 24000, seconds=seconds, hz=hz)).decode()


async def test_input_audio_is_transcribed_and_the_reply_comes_back_spoken(config: ServerConfig) -> None:
    async with serve_doubles(config) as (base, engine):
        client = sdk(base)
        completion = await asyncio.to_thread(
            functools.partial(
                client.chat.completions.create,
                model="gpt-4o-audio-preview",
                modalities=["text", "audio"],
                audio={"voice": "high", "format": "wav"},
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "What do you hear?"},
                            {"type": "input_audio", "input_audio": {"data": wav_b64(500, 2.0), "format": "wav"}},
                        ],
                    }
                ],
            )
        )
    message = completion.choices[0].message
    user = engine.llm.seen[0][0][-1]
    assert (user.role, user.content) == ("user", "What do you hear? 500hz 500hz")
    assert message.content is None and message.audio is not None
    assert message.audio.transcript == "echo: What do you hear? 500hz 500hz"
    assert message.audio.id.startswith("audio_") and message.audio.expires_at > time.time()
    with wave.open(io.BytesIO(base64.b64decode(message.audio.data))) as spoken:
        assert (spoken.getframerate(), spoken.getnchannels()) == (24000, 1)
        # the tone double speaks 0.1 s per word: the seven words of the reply
        frames = spoken.readframes(-1)
    assert abs(len(frames) / 2 / 24000 - 0.7) < 0.05


async def test_text_only_completion_is_unchanged_and_bad_audio_requests_are_typed_errors(config: ServerConfig) -> None:
    async with serve_doubles(config) as (base, _):
        client = sdk(base)
        plain = await asyncio.to_thread(
            functools.partial(
                client.chat.completions.create,
                model="gpt-4o-mini",
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_audio", "input_audio": {"data": wav_b64(1000, 1.0), "format": "wav"}}
                        ],
                    }
                ],
            )
        )

        def create(request: dict[str, Any]) -> list[Any]:
            return list(client.chat.completions.create(**request))

        failures = []
        for kwargs in (
            {"modalities": ["text", "audio"]},
            {"modalities": ["text", "audio"], "audio": {"voice": "high", "format": "wav"}, "stream": True},
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "input_audio", "input_audio": {"data": "%%%", "format": "wav"}}],
                    }
                ]
            },
        ):
            request: dict[str, Any] = {
                "model": "gpt-4o-mini",
                "messages": [{"role": "user", "content": "hi"}],
                **kwargs,
            }
            with pytest.raises(openai.BadRequestError) as caught:
                await asyncio.to_thread(create, request)
            failures.append((caught.value.code, caught.value.param))
    assert plain.choices[0].message.content == "echo: 1000hz" and plain.choices[0].message.audio is None
    assert failures == [
        ("invalid_value", "audio"),
        ("invalid_value", "audio.format"),
        ("invalid_base64", "messages[0].content"),
    ]


async def test_streamed_audio_reply_sends_transcript_then_pcm16(config: ServerConfig) -> None:
    async with serve_doubles(config) as (base, _):
        client = sdk(base)

        def run() -> list:
            stream = client.chat.completions.create(
                model="gpt-4o-audio-preview",
                modalities=["text", "audio"],
                audio={"voice": "low", "format": "pcm16"},
                stream=True,
                stream_options={"include_usage": True},
                messages=[{"role": "user", "content": "say two words"}],
            )
            return list(stream)

        chunks = await asyncio.to_thread(run)
    audio = [c.choices[0].delta.audio for c in chunks if c.choices and c.choices[0].delta.audio is not None]
    transcript = "".join(a.transcript or "" for a in audio)
    pcm = b"".join(base64.b64decode(a.data) for a in audio if a.data)
    ids = {a.id for a in audio if a.id}
    assert transcript == "echo: say two words"
    assert abs(len(pcm) / 2 / 24000 - 0.4) < 0.05  # four words, 0.1 s each, at 24 kHz PCM16
    assert len(ids) == 1 and audio[-1].expires_at is not None and audio[-1].id is None
    assert chunks[-2].choices[0].finish_reason == "stop" and chunks[-1].usage.completion_tokens == 4


@pytest.mark.models
async def test_spoken_question_gets_a_spoken_answer_on_the_cascade(config: ServerConfig) -> None:
    from tests.web.realtime.test_realtime_cascade import LOAD_TIMEOUT_S, QUESTION
    from tests.web.realtime_support import running

    config.engine = "cascade"
    async with running(config, ready_timeout_s=LOAD_TIMEOUT_S) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=240)
        question = await asyncio.to_thread(
            client.audio.speech.create, model="tts-1", voice="alloy", input=QUESTION, response_format="wav"
        )
        completion = await asyncio.to_thread(
            functools.partial(
                client.chat.completions.create,
                model="gpt-4o-audio-preview",
                modalities=["text", "audio"],
                audio={"voice": "alloy", "format": "mp3"},
                max_tokens=40,
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "input_audio",
                                "input_audio": {"data": base64.b64encode(question.content).decode(), "format": "wav"},
                            }
                        ],
                    }
                ],
            )
        )
    audio = completion.choices[0].message.audio
    assert audio is not None and audio.transcript.strip()
    assert base64.b64decode(audio.data)[:3] in (b"ID3", b"\xff\xfb", b"\xff\xf3")  # an MP3 stream
    assert completion.usage is not None
    assert completion.usage.prompt_tokens > 10  # the transcribed question reached the model
