"""``WS /v1/realtime`` driven by the official ``openai`` SDK realtime client on the loopback
engine: session, audio in, the same audio back, cancel; GA and beta event names; G.711.

Every GA event the server sends is validated against the SDK's own pydantic types."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import numpy as np
import openai

from rtserve.codecs import g711
from rtserve.config import ServerConfig
from tests.web.realtime_support import (
    FRAME,
    HANG_GUARD_S,
    SDK_EVENT_TYPES,
    SDK_EVENTS,
    audio_of,
    loopback_config,
    pcm16_b64,
    running,
)


class SdkReader:
    """Reads the SDK connection's raw frames, validates each GA event with the SDK types,
    and keeps them all (typed events from the SDK's own parser alongside)."""

    def __init__(self, conn: Any, *, timeout_s: float = HANG_GUARD_S) -> None:
        self.conn = conn
        self.timeout_s = timeout_s  # per event: real models on a loaded CPU may be silent for long
        self.events: list[dict[str, Any]] = []

    async def next(self) -> dict[str, Any]:
        raw = await asyncio.wait_for(self.conn.recv_bytes(), self.timeout_s)
        event = json.loads(raw)
        if event["type"] in SDK_EVENT_TYPES:
            SDK_EVENTS.validate_json(raw)  # raises on any field the SDK types reject
            assert self.conn.parse_event(raw).type == event["type"]
        self.events.append(event)
        return event

    async def until(self, event_type: str, *, limit: int = 1000) -> dict[str, Any]:
        for _ in range(limit):
            event = await self.next()
            if event["type"] == event_type:
                return event
        raise AssertionError(f"no {event_type} in {limit} events")


def sdk(base: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", timeout=HANG_GUARD_S)


async def test_sdk_session_echoes_audio_and_cancels(config: ServerConfig) -> None:
    rng = np.random.default_rng(3)
    signal = rng.integers(-20000, 20000, 3 * FRAME).astype(np.int16)
    async with running(loopback_config(config)) as base, sdk(base).realtime.connect(model="loopback") as conn:
        reader = SdkReader(conn)
        created = await reader.next()
        assert created["type"] == "session.created"
        assert created["session"]["model"] == "loopback"
        assert "capabilities" not in created["session"]  # the turn-based route is not duplex
        assert (await reader.next())["type"] == "conversation.created"

        await conn.session.update(
            session={
                "type": "realtime",
                "output_modalities": ["audio"],
                "instructions": "echo me",
                "audio": {
                    "input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": None},
                    "output": {"format": {"type": "audio/pcm", "rate": 24000}},
                },
            }
        )
        updated = await reader.until("session.updated")
        assert updated["session"]["instructions"] == "echo me"
        assert updated["session"]["output_modalities"] == ["audio"]

        for start in range(0, len(signal), FRAME):
            await conn.input_audio_buffer.append(audio=pcm16_b64(signal[start : start + FRAME]))
        while True:
            audio = audio_of(reader.events)
            nonzero = np.flatnonzero(audio)
            if nonzero.size and len(audio) >= nonzero[0] + len(signal):
                break
            await reader.next()
        start = int(nonzero[0])
        np.testing.assert_array_equal(audio[start : start + len(signal)], signal)  # bit-exact round trip
        response = next(e for e in reader.events if e["type"] == "response.created")["response"]
        deltas = [e for e in reader.events if e["type"] == "response.output_audio.delta"]
        assert {d["response_id"] for d in deltas} == {response["id"]}

        await conn.response.cancel()
        cleared = await reader.until("output_audio_buffer.cleared")
        assert cleared["response_id"] == response["id"]
        after = await reader.until("response.output_audio.delta")  # a lockstep stream keeps flowing
        assert after["response_id"] == response["id"]
    assert not [e for e in reader.events if e["type"] == "error"]


async def test_sdk_conversation_items_create_retrieve_truncate_delete(config: ServerConfig) -> None:
    async with running(loopback_config(config)) as base, sdk(base).realtime.connect(model="loopback") as conn:
        reader = SdkReader(conn)
        await conn.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "id": "item_note",
                "content": [{"type": "input_text", "text": "remember me"}],
            }
        )
        added = await reader.until("conversation.item.added")
        while added["item"]["id"] != "item_note":  # the loopback's own answer item comes first
            added = await reader.until("conversation.item.added")
        assert added["item"]["content"][0] == {"type": "input_text", "text": "remember me"}
        await conn.conversation.item.retrieve(item_id="item_note")
        assert (await reader.until("conversation.item.retrieved"))["item"]["id"] == "item_note"
        await conn.conversation.item.delete(item_id="item_note")
        assert (await reader.until("conversation.item.deleted"))["item_id"] == "item_note"
        await conn.conversation.item.delete(item_id="item_note", event_id="again")
        error = (await reader.until("error"))["error"]
        assert (error["code"], error["event_id"]) == ("item_not_found", "again")

        answer = (await reader.until("response.output_audio.delta"))["item_id"]  # ~80 ms of audio so far
        await conn.conversation.item.truncate(item_id=answer, content_index=0, audio_end_ms=40)
        truncated = await reader.until("conversation.item.truncated")
        assert (truncated["item_id"], truncated["audio_end_ms"]) == (answer, 40)


async def test_sdk_beta_header_selects_beta_event_names(config: ServerConfig) -> None:
    async with running(loopback_config(config)) as base:
        async with sdk(base).realtime.connect(model="loopback", extra_headers={"OpenAI-Beta": "realtime=v1"}) as conn:
            seen: list[dict[str, Any]] = []
            while not any(e["type"] == "response.audio.delta" for e in seen):
                seen.append(json.loads(await conn.recv_bytes()))
    names = {e["type"] for e in seen}
    assert {"session.created", "conversation.item.created", "response.audio.delta"} <= names
    assert not names & {"conversation.item.added", "response.output_audio.delta"}
    assert seen[0]["session"]["input_audio_format"] == "pcm16"


def dominant_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.argmax(spectrum) * rate / len(samples))


async def test_sdk_g711_ulaw_in_and_out_is_resampled_around_the_engine(config: ServerConfig) -> None:
    t = np.arange(2560) / 8000
    tone = (0.4 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)  # 320 ms at 8 kHz: within the engine backlog
    async with running(loopback_config(config)) as base, sdk(base).realtime.connect(model="loopback") as conn:
        reader = SdkReader(conn)
        before = await reader.until("response.output_audio.delta")  # the stream is already flowing...
        assert before["sample_rate_hz"] == 24000
        await conn.session.update(
            session={
                "type": "realtime",
                "audio": {  # ...and switches format mid-way
                    "input": {"format": {"type": "audio/pcmu"}, "turn_detection": None},
                    "output": {"format": {"type": "audio/pcmu"}},
                },
            }
        )
        updated = await reader.until("session.updated")
        assert updated["session"]["audio"]["output"]["format"] == {"type": "audio/pcmu"}
        chunk = 640  # 80 ms at 8 kHz
        for start in range(0, len(tone), chunk):
            await conn.input_audio_buffer.append(audio=g711_b64(tone[start : start + chunk]))
        received = np.zeros(0, np.float32)
        while not (loud := np.flatnonzero(np.abs(received) > 0.1)).size or len(received) < loud[0] + 2000:
            event = await reader.until("response.output_audio.delta")
            assert event["sample_rate_hz"] == 8000
            received = np.concatenate([received, g711.decode("ulaw", base64.b64decode(event["delta"]))])
    heard = received[loud[0] :][:2000]
    assert abs(dominant_hz(heard, 8000) - 440) < 8
    assert 0.3 < np.sqrt(np.mean(heard**2)) * np.sqrt(2) < 0.5  # the tone's level survived both resamplers


def g711_b64(samples: np.ndarray) -> str:
    return base64.b64encode(g711.encode("ulaw", samples)).decode()
