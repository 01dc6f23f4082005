"""``WS /api/tts_streaming`` spoken with ``msgpack`` + ``websockets`` over 127.0.0.1, as Kyutai's
clients speak it, against the tiny Kyutai TTS engine on CPU (docs/serving.md#tts-streaming)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgpack
import numpy as np
import pytest
import websockets

from rtserve.app import build_app
from rtserve.codecs.oggopus import OggOpusReader
from rtserve.config import ServerConfig
from tests.engines.kyutai_tts.tiny import TinyTTS, write_tts_checkpoint
from tests.support import serve_app

FRAME = 1920
KEY = "sekret"
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyTTS:
    return write_tts_checkpoint(tmp_path_factory.mktemp("tts_streaming") / "weights")


def _serving(config: ServerConfig, tiny: TinyTTS, **tts_engine: Any) -> ServerConfig:
    # Small buckets: a step computes slot 0 alone, or both, over 8, 16, ... ring slots
    # (docs/engines.md#row-buckets).
    tts_engine |= {"max_sessions": 2, "row_bucket": 1, "span_bucket": 8, "temperature": 0.0}
    tts_engine |= {"weights": str(tiny.folder), "voices": str(tiny.voices)}
    return config.model_copy(
        update={
            "engine": "loopback",
            "api_key": KEY,
            "tts_engine": config.tts_engine.model_copy(update=tts_engine),
            "tts_streaming": config.tts_streaming.model_copy(
                update={"max_message_bytes": 1024, "max_pending_words": 16, "idle_timeout_s": 1.0}
            ),
        }
    )


@pytest.fixture
async def url(config: ServerConfig, tiny: TinyTTS) -> AsyncIterator[str]:
    async with serve_app(build_app(_serving(config, tiny))) as base:
        yield base.replace("http://", "ws://") + "/api/tts_streaming"


def _pack(message: dict[str, Any]) -> bytes:
    packed: bytes = msgpack.packb(message)
    return packed


async def _connect(url: str, query: str = "voice=alice", **options: Any) -> websockets.ClientConnection:
    """``options``: the client's own (``websockets.connect``)."""
    for _ in range(200):  # the engine loads in the background: refused until it serves
        ws = await websockets.connect(f"{url}?{query}", additional_headers={"kyutai-api-key": KEY}, **options)
        first = msgpack.unpackb(await ws.recv())
        if first["type"] == "Ready":
            return ws
        assert first["type"] == "Error" and first["code"] == "engine_unavailable", first
        await ws.close()
        await asyncio.sleep(0.1)
    raise AssertionError("the engine never became ready")


@dataclass
class Spoken:
    audio: list[np.ndarray] = field(default_factory=list)
    words: list[dict[str, Any]] = field(default_factory=list)
    first_audio_at: float = float("nan")  # the loop's clock at the first Audio message

    @property
    def pcm(self) -> np.ndarray:
        return np.concatenate(self.audio) if self.audio else np.zeros(0, np.float32)


async def _speak(url: str, pieces: list[str], voice: str = "alice", *, raw: bool = False) -> Spoken:
    """``raw``: the text as WebSocket text messages and the end as ``b"\\0"``, as moshi-server takes them too."""
    ws = await _connect(url, f"voice={voice}")
    for piece in pieces:
        await ws.send(piece if raw else _pack({"type": "Text", "text": piece}))
    await ws.send(b"\0" if raw else _pack({"type": "Eos"}))
    return await _heard(ws)


async def _heard(ws: websockets.ClientConnection) -> Spoken:
    """Everything the server says on ``ws`` until it closes the stream."""
    spoken = Spoken()
    async for data in ws:
        assert isinstance(data, bytes)
        message = msgpack.unpackb(data)
        if message["type"] == "Audio":
            if not spoken.audio:
                spoken.first_audio_at = asyncio.get_running_loop().time()
            spoken.audio.append(np.asarray(message["pcm"], np.float32))
        else:
            assert message["type"] == "Text", message
            spoken.words.append(message)
    assert ws.close_code == 1000
    return spoken


def _check_words(spoken: Spoken, words: list[str]) -> None:
    assert [w["text"] for w in spoken.words] == words
    previous = 0.0
    for word in spoken.words:
        assert previous <= word["start_s"] <= word["stop_s"]
        previous = word["start_s"]


async def test_text_in_pieces_comes_back_as_audio_and_every_word_with_its_times(url: str) -> None:
    spoken = await _speak(url, ["the quick ", "brown fox", " jumps"])
    assert spoken.audio and all(frame.shape == (FRAME,) for frame in spoken.audio)
    assert np.isfinite(spoken.pcm).all() and np.abs(spoken.pcm).max() > 0
    _check_words(spoken, ["the", "quick", "brown", "fox", "jumps"])


async def test_text_messages_and_a_raw_end_of_stream_are_understood(url: str) -> None:
    spoken = await _speak(url, ["the quick", "brown fox"], raw=True)
    assert spoken.audio
    _check_words(spoken, ["the", "quick", "brown", "fox"])


async def test_more_text_is_more_audio(url: str) -> None:
    short = await _speak(url, ["the quick"])
    long = await _speak(url, [" ".join(WORDS)])
    _check_words(long, WORDS)
    assert long.pcm.size > short.pcm.size + 4 * FRAME


async def test_two_streams_at_once_sound_as_each_alone(url: str) -> None:
    alice_text, bob_text = ["the quick brown fox"], ["jumps over", " the lazy dog"]
    alice_alone = await _speak(url, alice_text, "alice")
    bob_alone = await _speak(url, bob_text, "bob")
    alice, bob = await asyncio.gather(_speak(url, alice_text, "alice"), _speak(url, bob_text, "bob"))
    assert alice.words == alice_alone.words and bob.words == bob_alone.words
    # The same tokens; the audio but for float rounding: alone, slot 0 steps in a one-row batch.
    np.testing.assert_allclose(alice.pcm, alice_alone.pcm, atol=1e-5)
    np.testing.assert_allclose(bob.pcm, bob_alone.pcm, atol=1e-5)
    assert alice.pcm.size != bob.pcm.size or not np.array_equal(alice.pcm, bob.pcm)


async def test_a_reply_through_the_young_batch_sounds_and_is_timed_as_in_the_main_batch(
    url: str, config: ServerConfig, tiny: TinyTTS
) -> None:
    """New replies first step in the young batch, several steps a call (docs/engines.md#young-batch):
    the client hears and is told the same as when they step with the others."""
    text = [" ".join(WORDS)]
    main_batch = await _speak(url, text)
    young = _serving(config, tiny, young_batch=2, young_burst_ms=20.0, young_row_bucket=1)
    async with serve_app(build_app(young)) as base:
        through_young = await _speak(base.replace("http://", "ws://") + "/api/tts_streaming", text)
    assert through_young.words == main_batch.words
    np.testing.assert_allclose(through_young.pcm, main_batch.pcm, atol=1e-5)


async def test_a_reply_that_waits_for_the_young_row_speaks_its_text_sent_meanwhile(
    url: str, config: ServerConfig, tiny: TinyTTS
) -> None:
    """One young row (docs/engines.md#young-batch): a reply that finds it taken waits for it, its
    text queued, and is heard and timed as in the main batch once the row frees."""
    bob_text = ["jumps over", " the lazy dog"]
    alice_alone, bob_alone = await _speak(url, ["the quick brown fox"], "alice"), await _speak(url, bob_text, "bob")
    waiting = _serving(config, tiny, young_batch=1, young_wait_ms=2000.0)
    async with serve_app(build_app(waiting)) as base:
        ws_url = base.replace("http://", "ws://") + "/api/tts_streaming"
        alice = await _connect(ws_url, "voice=alice")
        await alice.send(_pack({"type": "Text", "text": "the"}))  # short of its lookahead: holds the row
        bob = asyncio.ensure_future(_speak(ws_url, bob_text, "bob"))
        await asyncio.sleep(0.5)
        assert not bob.done()
        alice_rest_at = asyncio.get_running_loop().time()
        await alice.send(_pack({"type": "Text", "text": "quick brown fox"}))
        await alice.send(_pack({"type": "Eos"}))
        alice_spoken = await _heard(alice)
        bob_spoken = await bob
    assert bob_spoken.first_audio_at > alice_rest_at  # it stepped only once alice's row was free
    for ours, theirs in ((alice_spoken, alice_alone), (bob_spoken, bob_alone)):
        assert ours.words == theirs.words
        np.testing.assert_allclose(ours.pcm, theirs.pcm, atol=1e-5)


async def test_a_client_that_reads_at_its_own_pace_keeps_the_stream(config: ServerConfig, tiny: TinyTTS) -> None:
    """A client that takes the audio no faster than it plays and sends nothing after its end of
    stream (the voice agent's reply, paced to real time) is not taken for dead: this route sends
    no pings, which such a reader answers only once it has read the audio queued before them
    (docs/serving.md#tts-streaming). Here pings would be due every 0.2 s."""
    quick_pings = _serving(config, tiny).model_copy(
        update={"transport": config.transport.model_copy(update={"ws_heartbeat_s": 0.2})}
    )
    async with serve_app(build_app(quick_pings)) as base:
        # max_queue=1: the client library stops reading the socket while a message waits.
        ws = await _connect(base.replace("http://", "ws://") + "/api/tts_streaming", max_queue=1)
        await ws.send(_pack({"type": "Text", "text": " ".join(WORDS)}))
        await ws.send(_pack({"type": "Eos"}))
        words: list[str] = []
        async for data in ws:
            message = msgpack.unpackb(data)
            if message["type"] == "Text":
                words.append(message["text"])
            await asyncio.sleep(0.05)  # its playback
    assert ws.close_code == 1000 and words == WORDS


async def test_eos_before_any_text_ends_the_stream_silently(url: str) -> None:
    spoken = await _speak(url, [])
    assert spoken.audio == [] and spoken.words == []


async def test_ogg_opus_format_streams_pages_of_the_speech(url: str) -> None:
    for _ in range(200):
        ws = await websockets.connect(f"{url}?voice=bob&format=OggOpus", additional_headers={"kyutai-api-key": KEY})
        try:
            header = await ws.recv()
            break
        except websockets.ConnectionClosed:  # the engine is still loading: closed with 1013, no message
            assert ws.close_code == 1013
            await asyncio.sleep(0.1)
    assert isinstance(header, bytes) and header.startswith(b"OggS")
    await ws.send(_pack({"type": "Text", "text": "the quick brown fox"}))
    await ws.send(b"\0")  # moshi-server's raw end of stream
    reader = OggOpusReader(24000)
    pcm = [reader.feed(header)]
    async for data in ws:
        assert isinstance(data, bytes)
        pcm.append(reader.feed(data))
    pcm.append(reader.flush())
    assert ws.close_code == 1000
    assert np.concatenate(pcm).size >= 4 * FRAME


@pytest.mark.parametrize(
    ("send", "code"),
    [
        ([b"\xc1not msgpack"], "invalid_msgpack"),
        ([_pack({"type": "Shout"})], "unknown_type"),
        ([_pack({"type": "Text", "text": 7})], "invalid_message"),
        ([_pack({"type": "Text", "text": "x" * 2000})], "request_too_large"),
        (
            [_pack({"type": "Text", "text": "the quick"}), _pack({"type": "Eos"}), _pack({"type": "Eos"})],
            "stream_already_ended",
        ),
        ([_pack({"type": "Text", "text": " ".join(WORDS * 2)})], "input_backpressure"),
        ([], "session_idle_timeout"),
    ],
)
async def test_bad_input_gets_a_typed_error_then_the_close(url: str, send: list[bytes], code: str) -> None:
    ws = await _connect(url)
    for data in send:
        await ws.send(data)
    while True:
        message = msgpack.unpackb(await asyncio.wait_for(ws.recv(), 10))
        if message["type"] == "Error":
            break
        assert message["type"] in ("Audio", "Text")
    assert message["code"] == code and message["message"]
    with pytest.raises(websockets.ConnectionClosed):
        while True:
            await asyncio.wait_for(ws.recv(), 10)
    # The slot is free again and others are served.
    spoken = await _speak(url, ["the quick"])
    _check_words(spoken, ["the", "quick"])


async def test_unknown_voice_and_no_free_channel_are_refused_before_ready(url: str) -> None:
    ws = await websockets.connect(f"{url}?voice=nobody", additional_headers={"kyutai-api-key": KEY})
    for _ in range(200):
        message = msgpack.unpackb(await ws.recv())
        if message["code"] != "engine_unavailable":
            break
        await asyncio.sleep(0.1)
        ws = await websockets.connect(f"{url}?voice=nobody", additional_headers={"kyutai-api-key": KEY})
    assert message["type"] == "Error" and message["code"] == "voice_not_found"
    holders = [await _connect(url), await _connect(url)]
    third = await websockets.connect(f"{url}?voice=alice", additional_headers={"kyutai-api-key": KEY})
    assert msgpack.unpackb(await third.recv()) == {
        "type": "Error",
        "message": "no free channels",
        "code": "resource_exhausted",
    }
    with pytest.raises(websockets.ConnectionClosed):
        await asyncio.wait_for(third.recv(), 10)
    for holder in holders:
        await holder.close()


async def test_without_a_tts_engine_the_route_says_so(config: ServerConfig) -> None:
    async with serve_app(build_app(config.model_copy(update={"engine": "loopback"}))) as base:
        with pytest.raises(websockets.InvalidStatus) as refused:
            await websockets.connect(base.replace("http://", "ws://") + "/api/tts_streaming")
    assert refused.value.response.status_code == 404
    assert b"tts_streaming_unavailable" in refused.value.response.body


async def test_each_streams_first_audio_is_timed_on_metrics(url: str) -> None:
    """``rtserve_kyutai_tts_first_audio_seconds``: the engine's share of a reply's first audio; its
    steps by kind (``_first_audio_steps``), the model's steps by kind (``_model_steps``) and the
    slots each computed (``_step_rows``: one reply at a time, each on slot 0, so one)."""
    await _speak(url, ["the quick brown fox"])
    await _speak(url, ["jumps over the lazy dog"])
    metrics_url = url.replace("ws://", "http://").replace("/api/tts_streaming", "/metrics")
    async with aiohttp.ClientSession() as http, http.get(metrics_url, headers={"Authorization": f"Bearer {KEY}"}) as r:
        text = await r.text()
    samples = {
        line.split(" ")[0]: float(line.split(" ")[1])
        for line in text.splitlines()
        if line.startswith(
            tuple(f"rtserve_kyutai_tts_{name}" for name in ("first_audio_", "model_steps_total", "step_"))
        )
    }
    assert samples["rtserve_kyutai_tts_first_audio_seconds_count"] == 2
    assert 0 < samples["rtserve_kyutai_tts_first_audio_seconds_sum"] < 60
    full, pre = (
        samples[f'rtserve_kyutai_tts_first_audio_steps_sum{{kind="{kind}"}}'] for kind in ("full", "pre_audio")
    )
    assert samples['rtserve_kyutai_tts_first_audio_steps_count{kind="full"}'] == 2
    assert full + pre >= 2 * 5  # each reply stepped through the tiny model's audio delay (5 frames) first
    steps = sum(value for name, value in samples.items() if name.startswith("rtserve_kyutai_tts_model_steps_total"))
    assert steps >= (full + pre) / 2  # a step may serve both replies at once
    assert samples["rtserve_kyutai_tts_step_rows_count"] == steps == samples["rtserve_kyutai_tts_step_rows_sum"]
    assert samples["rtserve_kyutai_tts_step_span_count"] == steps
