"""A WebRTC call to the embedded cascade (Silero VAD, Whisper tiny.en, SmolLM2, Piper) placed by
an aiortc caller through the official ``openai`` SDK: a spoken request goes in on the
microphone track, the agent's spoken answer comes back on its track with its transcript on
the data channel, and speaking over the answer clears it at once (``output_audio_buffer.cleared``,
nothing of it afterwards)."""

from __future__ import annotations

import asyncio

import numpy as np
import openai
import pytest

from rtserve.codecs.resample import resample
from rtserve.config import ServerConfig
from tests.web.realtime.test_realtime_cascade import (
    CONVERSATION_TIMEOUT_S,
    EVENT_TIMEOUT_S,
    LOAD_TIMEOUT_S,
    QUESTION,
    STORY_REQUEST,
    STORYTELLER,
    heard_most_of,
    speech_pcm,
    words,
)
from tests.web.realtime_support import running
from tests.web.webrtc_support import RATE, Caller, webrtc_config

pytestmark = pytest.mark.models

PLAYOUT_MARGIN_S = 0.4  # audio already on the wire when the track was cleared: jitter buffers, Opus
ANSWER_TOKENS = 120  # ~90 words: ~35 s of speech


def at_48k(pcm24k: np.ndarray) -> np.ndarray:
    return np.clip(resample(pcm24k.astype(np.float32) / 32768, 24000, RATE) * 32768, -32768, 32767).astype(np.int16)


def rms(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(samples**2))) if samples.size else 0.0


async def test_spoken_answer_on_the_track_and_speaking_over_it_clears_it(config: ServerConfig) -> None:
    config.engine = "cascade"
    async with running(webrtc_config(config), ready_timeout_s=LOAD_TIMEOUT_S) as base:
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", timeout=EVENT_TIMEOUT_S)
        story, question = at_48k(await speech_pcm(client, STORY_REQUEST)), at_48k(await speech_pcm(client, QUESTION))
        caller = Caller()
        # The answers are stories (STORYTELLER) and the track plays them at real time: bounded, the
        # second one's playback ends well inside the conversation's timeout, and the first still
        # outlasts the interruption by tens of seconds.
        await caller.call(
            client, session={"type": "realtime", "instructions": STORYTELLER, "max_output_tokens": ANSWER_TOKENS}
        )
        created = await caller.until("session.created")
        assert created["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(CONVERSATION_TIMEOUT_S):
            caller.mic.say(np.concatenate([np.zeros(RATE // 5, np.int16), story]))
            started = await caller.until("output_audio_buffer.started", timeout_s=CONVERSATION_TIMEOUT_S)
            first = started["response_id"]
            while rms(caller.audio_since(loop.time() - 0.5)) < 0.01:  # the story is audible
                await asyncio.sleep(0.05)
            interrupted_at = len(caller.events)
            caller.mic.say(question)
            cleared = await caller.until(
                "output_audio_buffer.cleared", start=interrupted_at, timeout_s=CONVERSATION_TIMEOUT_S
            )
            cleared_at = loop.time()
            assert cleared["response_id"] == first
            second = await caller.until(
                "output_audio_buffer.started", start=caller.events.index(cleared), timeout_s=CONVERSATION_TIMEOUT_S
            )
            second_at = loop.time()
            stopped = await caller.until(
                "output_audio_buffer.stopped", start=caller.events.index(second), timeout_s=CONVERSATION_TIMEOUT_S
            )
        events, types = caller.events, caller.types()
        cut = events.index(cleared)
        assert types.index("input_audio_buffer.speech_started", interrupted_at) < cut
        assert types.count("output_audio_buffer.cleared") == 1  # the session's own cleared is not repeated
        # Nothing of the story after the cut: neither events nor sound until the next answer starts.
        assert not [
            e
            for e in events[cut + 1 :]
            if e.get("response_id") == first
            and e["type"] in ("response.output_audio.delta", "response.output_audio_transcript.delta")
        ]
        window = [f for t, f in caller.audio if cleared_at + PLAYOUT_MARGIN_S <= t < second_at]
        assert len(window) * 0.02 >= 0.2, "the next answer started too soon to observe the silence"
        assert rms(np.concatenate(window)) < 0.003
        # Transcripts on the data channel: both spoken requests, and the answers' words.
        heard = [
            e["transcript"] for e in events if e["type"] == "conversation.item.input_audio_transcription.completed"
        ]
        assert any(heard_most_of(t, QUESTION) for t in heard), heard
        assert any(heard_most_of(t, STORY_REQUEST) for t in heard), heard
        spoken = "".join(
            e["delta"]
            for e in events
            if e["type"] == "response.output_audio_transcript.delta" and e["response_id"] == first
        )
        assert words(spoken)
        done = next(e for e in events if e["type"] == "response.done" and e["response"]["id"] == first)
        assert done["response"]["status"] == "cancelled"
        assert stopped["response_id"] == second["response_id"] != first
        # The story keeps only what was played before the cut, as on OpenAI's WebRTC calls.
        truncated = next(e for e in events if e["type"] == "conversation.item.truncated")
        played_s = sum(len(f) for t, f in caller.audio if t < cleared_at and rms(f) > 0.003) / RATE
        assert truncated["item_id"] == done["response"]["output"][0]["id"]
        assert truncated["audio_end_ms"] > 0 and abs(truncated["audio_end_ms"] / 1000 - played_s) < 1.0
        await caller.close()


async def test_a_long_answer_plays_out_without_overflowing_the_sessions_output(config: ServerConfig) -> None:
    """The track plays at real time and the cascade makes speech faster: with an output buffer of
    ~1.5 s of audio, a longer answer made at once would overflow it and close the session
    (``output_backpressure``). The reply runs at most ``cascade.max_audio_ahead_s`` ahead of real
    time, so it plays to its end."""
    config.engine = "cascade"
    config.sessions.max_pending_output_events_per_session = 48  # ~1.5 s of 40 ms chunks, with the text
    config.cascade.max_audio_ahead_s = 0.5
    async with running(webrtc_config(config), ready_timeout_s=LOAD_TIMEOUT_S) as base:
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", timeout=EVENT_TIMEOUT_S)
        story = at_48k(await speech_pcm(client, STORY_REQUEST))
        caller = Caller()
        await caller.call(client, session={"type": "realtime", "instructions": STORYTELLER, "max_output_tokens": 50})
        await caller.until("session.created")
        async with asyncio.timeout(CONVERSATION_TIMEOUT_S):
            caller.mic.say(np.concatenate([np.zeros(RATE // 5, np.int16), story]))
            started = await caller.until("output_audio_buffer.started", timeout_s=CONVERSATION_TIMEOUT_S)
            stopped = await caller.until(
                "output_audio_buffer.stopped", start=caller.events.index(started), timeout_s=CONVERSATION_TIMEOUT_S
            )
        assert stopped["response_id"] == started["response_id"]
        assert "error" not in caller.types()
        done = next(e for e in caller.events if e["type"] == "response.done")
        assert done["response"]["status"] == "completed"
        played_s = sum(len(f) for _, f in caller.audio if rms(f) > 0.003) / RATE
        assert played_s > 3.0  # the answer outgrew the output buffer
        await caller.close()
