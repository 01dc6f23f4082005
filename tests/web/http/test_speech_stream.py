"""``WS /v1/audio/speech/stream`` over a real socket with the ``websockets`` client: text
deltas in, audio out sentence by sentence, flush, per-connection voice and format, cancel,
discard errors, bounds; test-double TTS (one 0.1 s tone per word, 300 Hz "low", 1200 Hz "high")."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import numpy as np
import pytest
import websockets

from rtserve.app import build_app
from rtserve.web.http.speech_stream import STREAMS
from tests.support import serve_app
from tests.web.http_support import ToneTTSDouble, TurnEnginesSessionDouble, serve_doubles

WORD_BYTES = 2 * round(ToneTTSDouble.WORD_SECONDS * 24000)  # one word of pcm16 at 24 kHz


def ws_url(base: str) -> str:
    return base.replace("http://", "ws://") + "/v1/audio/speech/stream"


async def send(ws: Any, kind: str, **fields: Any) -> None:
    await ws.send(json.dumps({"type": kind, **fields}))


async def next_event(ws: Any, *, skip_audio: bool = False) -> dict[str, Any]:
    while True:
        message = await asyncio.wait_for(ws.recv(), timeout=10)
        if isinstance(message, str):
            return json.loads(message)
        if not skip_audio:
            raise AssertionError(f"expected an event, got {len(message)} audio bytes")


async def utterance(ws: Any) -> tuple[list[dict[str, Any]], dict[int, bytes]]:
    """Events up to ``session.done`` and the audio bytes of each sentence."""
    events: list[dict[str, Any]] = []
    audio: dict[int, bytes] = {}
    current = -1
    while True:
        message = await asyncio.wait_for(ws.recv(), timeout=10)
        if isinstance(message, bytes):
            audio[current] = audio.get(current, b"") + message
            continue
        event = json.loads(message)
        events.append(event)
        if event["type"] == "audio.start":
            current = event["sentence_index"]
        if event["type"] == "session.done":
            return events, audio


def dominant_hz(pcm16: bytes) -> float:
    pcm = np.frombuffer(pcm16, "<i2").astype(np.float32)
    return float(np.argmax(np.abs(np.fft.rfft(pcm)))) * 24000 / pcm.size


async def test_text_deltas_are_spoken_sentence_by_sentence_as_they_complete(config):
    async with serve_doubles(config) as (base, _), websockets.connect(ws_url(base)) as ws:
        await send(ws, "session.config", voice="high")
        assert (await next_event(ws))["config"]["voice"] == "high"
        await send(ws, "input.text", text="One two")
        await send(ws, "input.text", text=" three. Four")
        # The first sentence is spoken before the client has said anything more.
        start = await next_event(ws)
        assert start == {
            "type": "audio.start",
            "utterance_index": 0,
            "sentence_index": 0,
            "sentence_text": "One two three.",
            "format": "pcm",
            "sample_rate": 24000,
        }
        await send(ws, "input.text", text=" five!")
        await send(ws, "input.done")
        events, audio = await utterance(ws)
    kinds = [e["type"] for e in events]
    assert kinds == ["audio.done", "audio.start", "audio.done", "session.done"]
    assert events[1]["sentence_text"] == "Four five!"
    assert events[0]["total_bytes"] == 3 * WORD_BYTES and events[2]["total_bytes"] == 2 * WORD_BYTES
    assert events[-1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 2}
    assert len(audio[-1]) == 3 * WORD_BYTES and len(audio[1]) == 2 * WORD_BYTES
    assert abs(dominant_hz(audio[1]) - 1200) < 15


async def test_an_unfinished_tail_waits_for_the_flush_and_the_connection_serves_another_utterance(config):
    async with serve_doubles(config) as (base, engine), websockets.connect(ws_url(base)) as ws:
        await send(ws, "input.text", text="no full stop yet")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(ws.recv(), timeout=0.3)
        assert engine.tts.control.calls == 0
        await send(ws, "input.done")
        events, audio = await utterance(ws)
        assert events[0]["sentence_text"] == "no full stop yet"
        assert len(audio[0]) == 4 * WORD_BYTES
        await send(ws, "input.text", text="again.")
        await send(ws, "input.done")
        events, _ = await utterance(ws)
    assert events[0]["utterance_index"] == 1 and events[-1]["utterance_index"] == 1


@pytest.mark.parametrize("response_format, magic", [("wav", b"RIFF"), ("flac", b"fLaC"), ("mp3", None)])
async def test_each_sentence_is_one_file_in_the_connection_format(config, response_format, magic):
    async with serve_doubles(config) as (base, _), websockets.connect(ws_url(base)) as ws:
        await send(ws, "session.config", response_format=response_format, voice="low")
        await next_event(ws)
        await send(ws, "input.text", text="One. Two three.")
        await send(ws, "input.done")
        events, audio = await utterance(ws)
    assert [e["format"] for e in events if e["type"] == "audio.start"] == [response_format] * 2
    assert set(audio) == {0, 1}
    for data in audio.values():
        if magic is not None:
            assert data.startswith(magic)
        else:  # mp3: an ID3 tag or a frame sync
            assert data[:3] == b"ID3" or data[0] == 0xFF


async def test_cancel_drops_queued_and_running_speech_at_once(config):
    async with serve_doubles(config) as (base, engine), websockets.connect(ws_url(base)) as ws:
        engine.tts.control.hold = asyncio.Event()  # the first sentence stops after its first word
        await send(ws, "input.text", text="one two three. four five. six seven. eight")
        assert (await next_event(ws))["type"] == "audio.start"
        assert len(await asyncio.wait_for(ws.recv(), timeout=10)) > 0  # the first word, less resampler delay
        await send(ws, "cancel")
        cancelled = await next_event(ws)
        assert cancelled == {"type": "cancelled", "utterance_index": 0, "dropped_sentences": 3}
        assert engine.tts.control.closed.is_set()  # the engine stream was closed, not left running
        engine.tts.control.hold.set()
        # Nothing of the cancelled utterance follows: the next thing heard is the new one.
        await send(ws, "input.text", text="nine.")
        await send(ws, "input.done")
        events, audio = await utterance(ws)
    assert events[0]["utterance_index"] == 1 and events[0]["sentence_text"] == "nine."
    assert [e["type"] for e in events] == ["audio.start", "audio.done", "session.done"]
    assert len(audio[0]) == WORD_BYTES


async def test_a_synthesis_failure_tells_the_client_to_discard_that_audio(config):
    async with serve_doubles(config) as (base, engine), websockets.connect(ws_url(base)) as ws:
        engine.tts.control.fail_after = 1
        await send(ws, "input.text", text="one two. ")
        await send(ws, "input.done")
        assert (await next_event(ws))["type"] == "audio.start"
        sent = len(await asyncio.wait_for(ws.recv(), timeout=10))
        error = await next_event(ws)
        assert error["type"] == "error" and error["action"] == "discard"
        assert error["code"] == "engine_error" and error["sentence_index"] == 0
        done = await next_event(ws)
        assert done["type"] == "audio.done" and done["error"] and done["total_bytes"] == sent
        assert (await next_event(ws))["type"] == "session.done"


async def test_bad_events_get_typed_errors_and_the_connection_stays_usable(config):
    async with serve_doubles(config) as (base, _), websockets.connect(ws_url(base)) as ws:
        await ws.send("{not json")
        assert (await next_event(ws))["code"] == "invalid_json"
        await send(ws, "nonsense")
        assert (await next_event(ws))["code"] == "invalid_event"
        await ws.send(b"\x00\x01")
        assert (await next_event(ws))["code"] == "invalid_event"
        await send(ws, "input.text", text=5)
        error = await next_event(ws)
        assert error["code"] == "invalid_value" and error["param"] == "text"
        await send(ws, "session.config", voice="nobody")
        error = await next_event(ws)
        assert error["code"] == "invalid_voice" and error["param"] == "voice"
        await send(ws, "session.config", speed=9)
        assert (await next_event(ws))["param"] == "speed"
        assert "action" not in error
        await send(ws, "input.text", text="still here.")
        await send(ws, "input.done")
        events, _ = await utterance(ws)
    assert events[0]["sentence_text"] == "still here."


async def test_config_is_refused_while_text_waits_to_be_spoken(config):
    async with serve_doubles(config) as (base, _), websockets.connect(ws_url(base)) as ws:
        await send(ws, "input.text", text="pending words")
        await send(ws, "session.config", voice="high")
        assert (await next_event(ws))["code"] == "session_busy"


async def test_text_beyond_the_buffer_bound_is_refused_and_dropped(config):
    config.speech_stream.max_buffered_chars = 64
    config.speech_stream.max_queued_sentences = 2
    async with serve_doubles(config) as (base, engine), websockets.connect(ws_url(base)) as ws:
        engine.tts.control.hold = asyncio.Event()
        await send(ws, "input.text", text="x " * 40)
        error = await next_event(ws)
        assert error["code"] == "input_backpressure"
        await send(ws, "input.text", text="a. b. c. d. ")
        error = await next_event(ws)
        assert error["code"] == "input_backpressure" and "sentences" in error["message"]
        engine.tts.control.hold.set()
        await send(ws, "input.text", text="kept.")
        await send(ws, "input.done")
        events, _ = await utterance(ws)
    assert [e["sentence_text"] for e in events if e["type"] == "audio.start"] == ["kept."]


async def test_an_oversized_event_closes_with_1009(config):
    config.speech_stream.max_event_bytes = 1024
    async with serve_doubles(config) as (base, _), websockets.connect(ws_url(base)) as ws:
        await send(ws, "input.text", text="x" * 2000)
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


async def test_an_idle_connection_is_closed(config):
    config.speech_stream.idle_timeout_s = 0.3
    async with serve_doubles(config) as (base, _), websockets.connect(ws_url(base)) as ws:
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), timeout=10)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1000 and closed.value.rcvd.reason == "idle timeout"


async def test_a_client_that_reads_at_its_own_pace_keeps_the_connection(config):
    """A client that takes the audio as it plays and says nothing meanwhile is not taken for dead:
    the route sends no pings, which such a reader answers only after the audio queued before them
    (docs/serving.md#streaming-speech). Here pings would be due every 0.2 s."""
    config.transport.ws_heartbeat_s = 0.2
    config.speech_stream.max_audio_ahead_s = 60.0  # all of it in the buffers at once
    async with serve_doubles(config) as (base, _), websockets.connect(ws_url(base), max_queue=1) as ws:
        await send(ws, "input.text", text="word " * 200)  # 0.96 MB: past what one read of the socket takes
        await send(ws, "input.done")
        heard = 0
        while not isinstance(message := await asyncio.wait_for(ws.recv(), timeout=10), str) or (
            json.loads(message)["type"] != "session.done"
        ):
            heard += len(message) if isinstance(message, bytes) else 0
            await asyncio.sleep(0.005)  # its playback
        await send(ws, "input.text", text="again.")  # the connection serves the next utterance
        await send(ws, "input.done")
        events, _ = await utterance(ws)
    assert events[-1]["type"] == "session.done" and events[-1]["utterance_index"] == 1
    assert heard == 200 * WORD_BYTES


async def test_an_utterances_audio_goes_out_no_further_ahead_of_real_time_than_the_bound(config):
    """The double synthesizes 2 s of speech at once; it goes out at most 0.3 s ahead of real time
    (docs/serving.md#streaming-speech), all of it."""
    config.speech_stream.max_audio_ahead_s = 0.3
    async with serve_doubles(config) as (base, _), websockets.connect(ws_url(base)) as ws:
        await send(ws, "input.text", text="word " * 20)
        await send(ws, "input.done")
        first_audio = None
        heard = 0
        while not isinstance(message := await asyncio.wait_for(ws.recv(), timeout=10), str) or (
            json.loads(message)["type"] != "session.done"
        ):
            if isinstance(message, bytes):
                first_audio = first_audio or asyncio.get_running_loop().time()
                heard += len(message)
        assert first_audio is not None
        took = asyncio.get_running_loop().time() - first_audio
    assert heard == 20 * WORD_BYTES
    assert took >= 2.0 - 0.3 - ToneTTSDouble.WORD_SECONDS - 0.05


async def test_connections_beyond_the_bound_are_refused_with_1013(config):
    config.speech_stream.max_connections = 1
    async with serve_doubles(config) as (base, _), websockets.connect(ws_url(base)) as first:
        async with websockets.connect(ws_url(base)) as second:
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(second.recv(), timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1013
        await send(first, "input.text", text="first still works.")
        await send(first, "input.done")
        await utterance(first)


async def test_session_close_finishes_the_queue_then_closes(config):
    async with serve_doubles(config) as (base, _), websockets.connect(ws_url(base)) as ws:
        await send(ws, "input.text", text="one two. three")
        await send(ws, "session.close")
        texts, audio_bytes = [], 0
        with pytest.raises(websockets.ConnectionClosedOK):
            while True:
                message = await asyncio.wait_for(ws.recv(), timeout=10)
                if isinstance(message, bytes):
                    audio_bytes += len(message)
                elif (event := json.loads(message))["type"] == "audio.start":
                    texts.append(event["sentence_text"])
    assert texts == ["one two.", "three"] and audio_bytes == 3 * WORD_BYTES


def _masked_text_frame(text: str) -> bytes:
    payload = text.encode()
    size = len(payload)
    header = bytes([0x81]) + (
        bytes([0x80 | size])
        if size < 126
        else bytes([0x80 | 126]) + size.to_bytes(2, "big")
        if size < 65536
        else bytes([0x80 | 127]) + size.to_bytes(8, "big")
    )
    return header + b"\0\0\0\0" + payload  # an all-zero mask key leaves the payload as is


def _stalled_client(port: int, events: list[str]) -> socket.socket:
    """A WebSocket client (plain socket, small receive buffer) that sends ``events`` and then
    reads nothing."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    sock.connect(("127.0.0.1", port))
    sock.sendall(
        b"GET /v1/audio/speech/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        b"Sec-WebSocket-Version: 13\r\n\r\n"
    )
    for event in events:
        sock.sendall(_masked_text_frame(event))
    return sock


async def test_a_reader_that_stops_reading_is_dropped(config):
    config.speech_stream.send_timeout_s = 0.5
    config.speech_stream.max_audio_ahead_s = 600.0  # the socket's buffers fill at once, not at playback pace
    engine = TurnEnginesSessionDouble()
    await engine.start()
    app = build_app(config, engine=engine)
    async with serve_app(app) as base:
        port = int(base.rsplit(":", 1)[1])
        events = [json.dumps({"type": "input.text", "text": "word " * 3000}), json.dumps({"type": "input.done"})]
        sock = await asyncio.to_thread(_stalled_client, port, events)  # 14.4 MB of audio due, never read
        try:
            async with asyncio.timeout(20):
                while app[STREAMS].count == 0:  # the handler starts
                    await asyncio.sleep(0.05)
                while app[STREAMS].count:  # ... and ends, dropped, while the client still holds its socket
                    await asyncio.sleep(0.05)
        finally:
            sock.close()
    # It stopped speaking: of the ~63 sentences (240 characters each) only what the buffers held was synthesized.
    assert engine.tts.control.calls < 40
