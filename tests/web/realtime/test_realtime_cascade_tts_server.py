"""A realtime session on the cascade speaking through a TTS server (``cascade.tts: tts_server``;
docs/engines.md#a-tts-server-in-the-cascade), through the official ``openai`` SDK: another rtserve
on 127.0.0.1 serves ``/api/tts_streaming`` with the tiny Kyutai TTS engine (two channels); the
reply comes back as audio, ``response.cancel`` stops it and frees the server's channel: three
replies in a row speak. Piper is never loaded, nor listed, nor a sleep stage."""

from __future__ import annotations

import openai
import pytest
from prometheus_client import CollectorRegistry

from rtserve.app import build_app
from rtserve.config import ServerConfig
from rtserve.engines.cascade.engine import CascadeEngine
from tests.engines.kyutai_tts.tiny import TinyTTS, write_tts_checkpoint
from tests.support import serve_app
from tests.web.realtime.test_realtime_cascade import LOAD_TIMEOUT_S, STORY_REQUEST, STORYTELLER
from tests.web.realtime.test_realtime_cascade_kyutai_tts import _ask
from tests.web.realtime.test_realtime_sdk import SdkReader
from tests.web.realtime_support import running

pytestmark = pytest.mark.models


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyTTS:
    return write_tts_checkpoint(tmp_path_factory.mktemp("cascade_tts_server") / "weights")


async def test_the_reply_is_spoken_by_the_tts_server_and_cancel_frees_its_channel(
    config: ServerConfig, tiny: TinyTTS
) -> None:
    tts_server = config.model_copy(
        update={
            "engine": "loopback",
            "tts_engine": config.tts_engine.model_copy(
                update={"weights": str(tiny.folder), "voices": str(tiny.voices), "default_voice": "alice"}
                | {"max_sessions": 2}
            ),
        }
    )
    async with serve_app(build_app(tts_server)) as tts_base:
        # Its engine loads in the background: the voice agent is ready only once it serves.
        tts_url = tts_base.replace("http://", "ws://") + "/api/tts_streaming"
        config.engine = "cascade"
        config.enable_sleep_mode = True
        config.cascade = config.cascade.model_copy(
            update={
                "tts": "tts_server",
                "tts_server": config.cascade.tts_server.model_copy(update={"url": tts_url}),
            }
        )
        cascade = CascadeEngine(config, CollectorRegistry())
        assert [stage.stage for stage in cascade.sleep_stages()] == ["vad", "asr", "llm"]
        async with running(config, ready_timeout_s=LOAD_TIMEOUT_S, engine=cascade) as base:
            client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", timeout=120)
            assert "piper-joe" not in [model.id async for model in client.models.list()]
            async with client.realtime.connect(model="cascade") as conn:
                reader = SdkReader(conn, timeout_s=120)
                await reader.until("session.created")
                await conn.session.update(
                    session={
                        "type": "realtime",
                        "instructions": STORYTELLER,
                        "audio": {"input": {"turn_detection": None}, "output": {"voice": "alice"}},
                    }
                )
                await reader.until("session.updated")
                await conn.conversation.item.create(
                    item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": STORY_REQUEST}]}
                )
                for _ in range(3):  # two channels: the third reply speaks on one a cancel freed
                    response_id = await _ask(conn, reader)
                    await conn.response.cancel()
                    done = await reader.until("response.done", limit=20000)
                    assert done["response"]["id"] == response_id and done["response"]["status"] == "cancelled"
            assert cascade.tts is None  # it spoke through the server only: no Piper voice was built
