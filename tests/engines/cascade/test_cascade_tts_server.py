"""Replies spoken through a TTS server (``cascade.tts: tts_server``;
docs/engines.md#a-tts-server-in-the-cascade): another rtserve's ``/api/tts_streaming`` on
127.0.0.1 with the tiny Kyutai TTS engine speaks what the LLM writes, words split across tokens
included; its refusals (an unknown voice, every channel busy, a wrong key) and an unreachable
server fail the reply with typed errors; closing a reply mid-speech frees the server's channel."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import msgpack
import pytest
from aiohttp import web

from rtserve.app import build_app
from rtserve.config import ServerConfig, TTSServerConfig
from rtserve.engines.cascade.streamed_speech import speak_streamed
from rtserve.engines.cascade.tts_server import TTSServerRefused, TTSServerStream, TTSServerStreams
from rtserve.engines.errors import CapacityExhausted, EngineError
from rtserve.engines.values import TokenDelta
from rtserve.errors import ENGINE_ERROR, ENGINE_UNAVAILABLE, VOICE_NOT_FOUND
from tests.engines.cascade.test_cascade_streamed_speech import SPLIT_WORDS, split_words_llm
from tests.engines.kyutai_tts.tiny import TinyTTS, write_tts_checkpoint
from tests.support import serve_app, serve_plain

KEY = "sekret"
CHUNK = 960


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyTTS:
    return write_tts_checkpoint(tmp_path_factory.mktemp("tts_server") / "weights")


@pytest.fixture
async def url(config: ServerConfig, tiny: TinyTTS) -> AsyncIterator[str]:
    """A TTS server: an rtserve with the tiny Kyutai TTS engine (two channels) behind its key."""
    serving = config.model_copy(
        update={
            "engine": "loopback",
            "api_key": KEY,
            "tts_engine": config.tts_engine.model_copy(
                update={"weights": str(tiny.folder), "voices": str(tiny.voices), "max_sessions": 2, "temperature": 0}
            ),
        }
    )
    async with serve_app(build_app(serving)) as base:
        yield base.replace("http://", "ws://") + "/api/tts_streaming"


async def until_served(url: str) -> None:
    """Until the TTS server at ``url`` serves a stream (its engine loads in the background)."""
    streams = TTSServerStreams(TTSServerConfig(url=url, api_key=KEY))
    try:
        await (await _open(streams)).close()
    finally:
        await streams.close()


async def _open(streams: TTSServerStreams, voice: str | None = "alice") -> TTSServerStream:
    """A stream once the server's engine has loaded (it answers engine_unavailable until then)."""
    for _ in range(600):
        try:
            return await streams.open_stream("s", voice)
        except EngineError as exc:
            if exc.code != ENGINE_UNAVAILABLE or isinstance(exc, CapacityExhausted):
                raise
        await asyncio.sleep(0.1)
    raise AssertionError("the TTS server never served")


async def test_a_reply_is_spoken_through_the_server_word_by_word(url: str) -> None:
    streams = TTSServerStreams(TTSServerConfig(url=url, api_key=KEY))
    try:
        await (await _open(streams)).close()  # served; the other channel is free while this one is freed
        reply = split_words_llm()
        spoken = speak_streamed(streams, reply, "alice", stream_id="s", chunk_samples=CHUNK, max_queued=4)
        async with contextlib.aclosing(spoken):
            out = [item async for item in spoken]
    finally:
        await streams.close()
    deltas = [item.text for item in out if isinstance(item, TokenDelta)]
    assert "".join(deltas) == "".join(SPLIT_WORDS)  # passed on as written
    audio = [item for item in out if not isinstance(item, TokenDelta)]
    assert all(pcm.size <= CHUNK for pcm, _ in audio) and sum(pcm.size for pcm, _ in audio) > 10 * CHUNK
    assert "".join(words or "" for _, words in audio) == "".join(SPLIT_WORDS)


async def test_refusals_are_typed_and_closing_frees_the_channel(url: str) -> None:
    streams = TTSServerStreams(TTSServerConfig(url=url, api_key=KEY))
    try:
        held, other = await _open(streams), await _open(streams)
        with pytest.raises(CapacityExhausted):  # the server's two channels are taken
            await streams.open_stream("t", "alice")
        await other.close()
        held.send_text("the quick brown fox jumps over the lazy dog")
        async for _ in held.events():
            break  # mid-speech, as a barge-in cancels a reply
        await held.close()
        reopened: list[TTSServerStream] = []
        for _ in range(400):  # the server frees both channels once it sees the closes (bounded: 20 s)
            with contextlib.suppress(CapacityExhausted):
                reopened.append(await streams.open_stream("u", "alice"))
            if len(reopened) == 2:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the channels were never freed")
        for stream in reopened:
            await stream.close()
        with pytest.raises(EngineError) as unknown:
            await streams.open_stream("v", "nobody")
        assert unknown.value.code == VOICE_NOT_FOUND
    finally:
        await streams.close()
    wrong_key = TTSServerStreams(TTSServerConfig(url=url, api_key="wrong"))
    try:
        with pytest.raises(EngineError) as refused:
            await wrong_key.open_stream("w", "alice")
        assert refused.value.code == ENGINE_UNAVAILABLE and "before Ready" in refused.value.message
    finally:
        await wrong_key.close()


def _unanswered_url() -> str:
    """The endpoint URL of a port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"ws://127.0.0.1:{port}/api/tts_streaming"


async def test_an_unreachable_server_fails_the_reply_typed() -> None:
    streams = TTSServerStreams(TTSServerConfig(url=_unanswered_url(), connect_timeout_s=2))
    try:
        with pytest.raises(EngineError) as unreachable:
            await streams.open_stream("s", None)
        assert unreachable.value.code == ENGINE_UNAVAILABLE and "cannot be reached" in unreachable.value.message
    finally:
        await streams.close()


async def test_the_startup_wait_ends_once_the_server_serves_and_gives_up_typed(url: str) -> None:
    """The voice agent waits at startup for its TTS server (``wait_served``): until the server's
    engine has loaded (it answers engine_unavailable meanwhile), then a reply opens at once; a
    server that refuses the connection fails the wait at once, and one nothing answers for fails
    it once ``startup_timeout_s`` is up."""
    streams = TTSServerStreams(TTSServerConfig(url=url, api_key=KEY))
    try:
        await streams.wait_served()
        await (await streams.open_stream("s", "alice")).close()
    finally:
        await streams.close()
    wrong_key = TTSServerStreams(TTSServerConfig(url=url, api_key="wrong", startup_timeout_s=600))
    try:
        with pytest.raises(TTSServerRefused):
            await asyncio.wait_for(wrong_key.wait_served(), 60)
    finally:
        await wrong_key.close()
    nobody = TTSServerStreams(TTSServerConfig(url=_unanswered_url(), startup_timeout_s=1.5))
    try:
        with pytest.raises(EngineError) as late:
            await nobody.wait_served()
        assert late.value.code == ENGINE_UNAVAILABLE and "startup_timeout_s=1.5" in late.value.message
        assert "cannot be reached" in late.value.message
    finally:
        await nobody.close()


@contextlib.asynccontextmanager
async def _plain_server(asked: list[dict[str, str]]) -> AsyncIterator[str]:
    """A server that says ``Ready`` and then nothing, or (voice ``garbled``) a malformed frame;
    ``asked`` gets each connection's query."""

    async def socket(request: web.Request) -> web.WebSocketResponse:
        asked.append(dict(request.query))
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_bytes(msgpack.packb({"type": "Ready"}))
        if request.query.get("voice") == "garbled":
            await ws.send_bytes(msgpack.packb({"type": "Audio", "pcm": "not samples"}))
        async for _ in ws:  # reads what the client sends, answers nothing, until the client goes
            pass
        return ws

    app = web.Application()
    app.router.add_get("/api/tts_streaming", socket)
    async with serve_plain(app) as base:
        yield base.replace("http://", "ws://") + "/api/tts_streaming"


async def test_a_server_outside_the_protocol_or_silent_fails_the_reply_typed() -> None:
    async with _plain_server([]) as url:
        # The garbled frame comes at once (a long read timeout: only the frame can fail it); the
        # quiet server is given half a second.
        for voice, read_timeout_s, code, says in (
            ("garbled", 30.0, ENGINE_ERROR, "malformed"),
            ("quiet", 0.5, ENGINE_UNAVAILABLE, "sent nothing"),
        ):
            streams = TTSServerStreams(TTSServerConfig(url=url, read_timeout_s=read_timeout_s))
            try:
                stream = await streams.open_stream("s", voice)
                stream.send_text("hello")
                with pytest.raises(EngineError) as failed:
                    async for _ in stream.events():
                        pass
                assert failed.value.code == code and says in failed.value.message
                await stream.close()
            finally:
                await streams.close()


async def test_openai_voice_names_ask_for_the_servers_default_voice() -> None:
    """Clients send "alloy" by default; a moshi-server knows no such voice."""
    asked: list[dict[str, str]] = []
    async with _plain_server(asked) as url:
        streams = TTSServerStreams(TTSServerConfig(url=url, api_key=KEY))
        try:
            for voice in ("alloy", "bob", None):
                await (await streams.open_stream("s", voice, seed=7)).close()
        finally:
            await streams.close()
    assert [query.get("voice") for query in asked] == [None, "bob", None]
    assert all(query["format"] == "PcmMessagePack" and query["seed"] == "7" for query in asked)


async def test_more_replies_at_once_than_aiohttps_default_connection_cap() -> None:
    """Hundreds of sessions speak at once through one client: the server's channels bound them, not
    a cap of the client's own (aiohttp's connector holds 100 connections by default)."""
    async with _plain_server([]) as url:
        streams = TTSServerStreams(TTSServerConfig(url=url, connect_timeout_s=10))
        try:
            opened = await asyncio.gather(*(streams.open_stream(f"s{i}", None) for i in range(110)))
            await asyncio.gather(*(stream.close() for stream in opened))
        finally:
            await streams.close()


async def test_a_reply_read_after_the_server_left_is_whole() -> None:
    """A reader at playback pace reaches the server's close frame long after it was sent; a server
    that did not wait that long for the reply to its close has gone (aiohttp then reports 1006 for
    the reply it could not send). The reply is whole all the same: the server said 1000."""
    frames = 40

    async def speaks_then_leaves(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(timeout=0.05)  # waits 50 ms for the client's answer to its close
        await ws.prepare(request)
        await ws.send_bytes(msgpack.packb({"type": "Ready"}))
        await ws.receive()  # the text
        for _ in range(frames):
            await ws.send_bytes(msgpack.packb({"type": "Audio", "pcm": [0.0] * 1920}))
        await ws.close()
        return ws

    app = web.Application()
    app.router.add_get("/api/tts_streaming", speaks_then_leaves)
    async with serve_plain(app) as base:
        streams = TTSServerStreams(TTSServerConfig(url=base.replace("http://", "ws://") + "/api/tts_streaming"))
        try:
            stream = await streams.open_stream("s", None)
            stream.send_text("hello")
            stream.end()
            heard = 0
            async for _ in stream.events():
                heard += 1
                await asyncio.sleep(0.01)  # its playback: the server is gone before the close frame is read
            await stream.close()
        finally:
            await streams.close()
    assert heard == frames
