"""A realtime session on the cascade speaking with the tiny Kyutai TTS engine (``cascade.tts:
tts_engine``; docs/engines.md#kyutai-tts-in-the-cascade), through the official ``openai`` SDK: the
LLM's reply comes back as audio, ``response.cancel`` stops it at once (nothing of it after its
``response.done``), and the engine's slot is free for the next reply. Piper is never built meanwhile,
nor listed among the served models, nor by sleep mode, whose stage 3 is the Kyutai TTS engine
(docs/serving.md#sleep-mode)."""

from __future__ import annotations

import aiohttp
import openai
import pytest
from prometheus_client import CollectorRegistry

from rtserve.config import ServerConfig
from rtserve.engines.cascade.engine import CascadeEngine
from rtserve.errors import ENGINE_SLEEPING
from tests.engines.kyutai_tts.tiny import TinyTTS, write_tts_checkpoint
from tests.web.realtime.test_realtime_cascade import LOAD_TIMEOUT_S, STORY_REQUEST, STORYTELLER
from tests.web.realtime.test_realtime_sdk import SdkReader
from tests.web.realtime_support import b64_pcm16, running

pytestmark = pytest.mark.models


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyTTS:
    return write_tts_checkpoint(tmp_path_factory.mktemp("cascade_kyutai_tts") / "weights")


async def _ask(conn: openai.resources.realtime.realtime.AsyncRealtimeConnection, reader: SdkReader) -> str:
    """A spoken reply to the story request: its id once its first audio arrived."""
    await conn.response.create()
    response_id = (await reader.until("response.created"))["response"]["id"]
    delta = await reader.until("response.output_audio.delta", limit=20000)
    assert delta["response_id"] == response_id and b64_pcm16(delta["delta"]).size > 0
    return response_id


async def test_the_reply_is_spoken_by_the_tts_engine_and_cancel_stops_it(config: ServerConfig, tiny: TinyTTS) -> None:
    config.engine = "cascade"
    config.enable_sleep_mode = True
    config.cascade = config.cascade.model_copy(update={"tts": "tts_engine"})
    config.tts_engine = config.tts_engine.model_copy(
        update={"weights": str(tiny.folder), "voices": str(tiny.voices), "default_voice": "alice", "max_sessions": 1}
    )
    cascade = CascadeEngine(config, CollectorRegistry())
    async with running(config, ready_timeout_s=LOAD_TIMEOUT_S, engine=cascade) as base:
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", timeout=120)
        served = [model.id async for model in client.models.list()]
        assert "kyutai-tts" in served and "piper-joe" not in served
        async with client.realtime.connect(model="cascade") as conn:
            reader = SdkReader(conn, timeout_s=120)
            await reader.until("session.created")
            await conn.session.update(
                session={"type": "realtime", "instructions": STORYTELLER, "audio": {"input": {"turn_detection": None}}}
            )
            await reader.until("session.updated")
            await conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": STORY_REQUEST}]}
            )
            first = await _ask(conn, reader)
            await conn.response.cancel()
            done = await reader.until("response.done", limit=20000)
            assert done["response"]["id"] == first and done["response"]["status"] == "cancelled"
            cut = len(reader.events)
            # The slot (max_sessions 1) was freed: the next reply speaks too, then is cancelled the same way.
            second = await _ask(conn, reader)
            await conn.response.cancel()
            assert (await reader.until("response.done", limit=20000))["response"]["id"] == second
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{base}/v1/omni/sleep", json={"stage_ids": [3]}) as resp:
                assert resp.status == 200 and (await resp.json())["acks"][0]["stage"] == "tts_engine"
            async with http.ws_connect(base.replace("http://", "ws://") + "/v1/realtime") as ws:
                event = await ws.receive_json(timeout=30)
            assert event["type"] == "error" and event["error"]["code"] == ENGINE_SLEEPING, event
            async with http.post(f"{base}/v1/omni/wakeup", json={"stage_ids": [3]}) as resp:
                assert resp.status == 200 and (await resp.json())["sleeping_stages"] == []
        assert cascade.tts is None  # it spoke with the Kyutai TTS only: no Piper voice was built
    late = [e for e in reader.events[cut:] if e.get("response_id") == first]
    assert late == []
