"""``response.speak`` on ``WS /v1/realtime?duplex=1`` (issue 16), over raw aiohttp
WebSockets: the cascade says the given text through its TTS stage (a response announced
by ``response.speak`` before its first audio, whose audio Whisper hears as that text); a
lockstep model, whose speech is its own, refuses with ``response_speak_unsupported`` and
advertises it; malformed requests are typed errors."""

from __future__ import annotations

import asyncio
import io
import re
import wave

import aiohttp
import numpy as np
import openai
import pytest

from rtserve.config import ServerConfig
from tests.web.realtime_support import audio_of, loopback_config, read_until, receive_event, running, types, ws_url

SAID = "The quick brown fox jumps over the lazy dog."
LOAD_TIMEOUT_S = 300
EVENT_LIMIT = 20000


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def wav_of(pcm: np.ndarray, rate: int) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.astype("<i2").tobytes())
    return out.getvalue()


async def test_lockstep_model_refuses_response_speak_and_bad_requests_are_typed(config: ServerConfig) -> None:
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base, duplex="1")) as ws:
            created = await receive_event(ws)
            answers = []
            for event in (
                {"type": "response.speak", "text": "hello", "event_id": "s1"},
                {"type": "response.speak", "event_id": "s2"},
                {"type": "response.speak", "text": "  ", "event_id": "s3"},
                {"type": "response.speak", "text": 7, "event_id": "s4"},
            ):
                await ws.send_json(event)
                answers.append((await read_until(ws, "error"))[-1]["error"])
        async with http.ws_connect(ws_url(base)) as plain:  # an OpenAI (turn-based) connection
            await receive_event(plain)
            await plain.send_json({"type": "response.speak", "text": "hello"})
            not_openai = (await read_until(plain, "error"))[-1]["error"]
    assert created is not None and created["session"]["capabilities"]["supports_response_speak"] is False
    assert [(a["code"], a["param"], a["event_id"]) for a in answers] == [
        ("response_speak_unsupported", None, "s1"),
        ("invalid_event", "text", "s2"),
        ("invalid_value", "text", "s3"),
        ("invalid_event", "text", "s4"),
    ]
    assert answers[0]["type"] == "invalid_request_error"
    assert (not_openai["code"], not_openai["param"]) == ("invalid_event", "type")


@pytest.mark.models
async def test_cascade_says_the_given_text(config: ServerConfig) -> None:
    config.engine = "cascade"
    config.sessions.max_speak_chars = 120
    async with running(config, ready_timeout_s=LOAD_TIMEOUT_S) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base, duplex="1")) as ws:
            created = await receive_event(ws)
            await ws.send_json({"type": "response.speak", "text": "x" * 121, "event_id": "long"})
            too_long = (await read_until(ws, "error"))[-1]["error"]
            await ws.send_json({"type": "response.speak", "text": SAID, "event_id": "say"})
            events = await asyncio.wait_for(read_until(ws, "response.done", limit=EVENT_LIMIT), LOAD_TIMEOUT_S)
            await ws.send_json({"type": "response.speak", "text": "Second."})
            second = await asyncio.wait_for(read_until(ws, "response.done", limit=EVENT_LIMIT), LOAD_TIMEOUT_S)
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", timeout=120)
        pcm = audio_of(events)
        heard = await client.audio.transcriptions.create(model="whisper-1", file=("said.wav", wav_of(pcm, 24000)))
    assert created is not None and created["session"]["capabilities"]["supports_response_speak"] is True
    assert (too_long["code"], too_long["param"], too_long["event_id"]) == ("invalid_value", "text", "long")
    kinds = types(events)
    speak = next(e for e in events if e["type"] == "response.speak")
    first_audio = kinds.index("response.output_audio.delta")
    assert kinds.index("response.created") < kinds.index("response.speak") < first_audio
    assert kinds.count("response.speak") == 1
    done = events[-1]["response"]
    assert speak["response_id"] == done["id"] and speak["text"] == SAID
    transcript = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
    assert transcript == SAID
    assert done["status"] == "completed"
    assert done["output"][0]["role"] == "assistant" and done["output"][0]["content"][0]["transcript"] == SAID
    assert len(pcm) > 24000  # over a second of speech
    assert 2 * len(words(heard.text) & words(SAID)) >= len(words(SAID)), heard.text  # Whisper hears most of it
    assert types(second).count("response.speak") == 1 and second[-1]["response"]["status"] == "completed"
