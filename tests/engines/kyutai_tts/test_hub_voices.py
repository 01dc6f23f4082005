"""Voices from a hub repo (``tts_engine.voices: kyutai/tts-voices``) on a hub served from
127.0.0.1 (``HF_ENDPOINT``): listed from the repo, fetched into the hub cache when a stream
first names one, then spoken; a name the repo lacks or that leaves it, and a repo the hub
refuses, are typed errors before any slot is taken (issue 33)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import huggingface_hub
import pytest

from rtserve.config import ServerConfig
from rtserve.engines.errors import EngineError
from rtserve.engines.kyutai_tts.engine import KyutaiTTSEngine
from rtserve.engines.kyutai_tts.stream import SpeechAudio
from rtserve.errors import MODEL_UNAVAILABLE, VOICE_NOT_FOUND
from tests.engines.kyutai_tts.tiny import SUFFIX, TinyTTS
from tests.weights.hub_support import FakeHub, FakeRepo, folder_files, serve_hub

REPO = "kyutai/tts-voices"


async def _engine(tiny: TinyTTS, voices: str) -> KyutaiTTSEngine:
    base = ServerConfig()
    settings = {"weights": str(tiny.folder), "voices": voices, "max_sessions": 1, "temperature": 0.0}
    engine = KyutaiTTSEngine(base.model_copy(update={"tts_engine": base.tts_engine.model_copy(update=settings)}))
    await engine.start()
    assert engine.ready, engine.failure
    return engine


@pytest.fixture
async def hub(tiny_tts: TinyTTS, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeHub]:
    fake = FakeHub({REPO: FakeRepo(folder_files(tiny_tts.voices))})
    async with serve_hub(fake) as endpoint:
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", endpoint)  # what HF_ENDPOINT sets at import
        template = endpoint + "/{repo_id}/resolve/{revision}/{filename}"
        monkeypatch.setattr(huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
        yield fake


async def test_a_hub_voice_is_listed_fetched_once_and_spoken(tiny_tts: TinyTTS, hub: FakeHub) -> None:
    engine = await _engine(tiny_tts, REPO)
    try:
        assert await asyncio.to_thread(engine.voice_names) == ["alice", "bob"]  # blocking: the hub is on this loop
        assert not [r for r in hub.requests if r[0] == "GET"]  # listing fetches no voice
        for _ in range(2):
            stream = await engine.open_stream("s", "alice")
            stream.send_text("hello there")
            stream.end()
            audio = [event async for event in stream.events() if isinstance(event, SpeechAudio)]
            await stream.close()
            assert sum(event.pcm.size for event in audio) > 0
        assert [r[1] for r in hub.requests if r[0] == "GET"] == [f"{REPO}/alice{SUFFIX}"]  # then from the cache
    finally:
        await engine.stop()


async def test_unknown_or_escaping_hub_voices_are_typed_errors(tiny_tts: TinyTTS, hub: FakeHub) -> None:
    engine = await _engine(tiny_tts, REPO)
    refused = await _engine(tiny_tts, "kyutai/no-such-voices")
    try:
        for name in ("carol", "../weights/config"):
            with pytest.raises(EngineError) as caught:
                await engine.open_stream("s", name)
            assert (caught.value.code, caught.value.param) == (VOICE_NOT_FOUND, "voice")
        with pytest.raises(EngineError) as caught:
            await refused.open_stream("s", "alice")
        assert caught.value.code == MODEL_UNAVAILABLE and "no such repo" in str(caught.value)
        stream = await engine.open_stream("s", "bob")  # the slot the refusals never took
        await stream.close()
    finally:
        await engine.stop()
        await refused.stop()
