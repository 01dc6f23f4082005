"""The cascade's LLM stage on vLLM (``cascade.llm_engine: vllm``): a realtime session on the
embedded voice agent, its replies written by the real vLLM server (``conftest.vllm_server``),
through the official ``openai`` SDK. vLLM's own request counter proves where they came from."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from openai.types.realtime import RealtimeSessionCreateRequestParam

from rtserve.config import ServerConfig
from tests.vllm_lane.vllm_lane_support import VllmServer, vllm_requests
from tests.web.http.test_function_calling import QUESTION, REALTIME_TOOL, WEATHER_SCHEMA
from tests.web.realtime.test_realtime_sdk import SdkReader
from tests.web.realtime_support import running

pytestmark = [pytest.mark.models, pytest.mark.slow]

LOAD_TIMEOUT_S = 300  # VAD, ASR and TTS load here; vLLM is already up
EVENT_TIMEOUT_S = 120


async def test_realtime_text_turn_and_forced_call_are_answered_by_vllm(
    vllm_config: ServerConfig, vllm_server: VllmServer
) -> None:
    vllm_config.engine = "cascade"
    vllm_config.http.text_engine = "session"  # chat and voice both reach vLLM through the cascade's LLM stage
    vllm_config.cascade.llm_engine = "vllm"
    before = await vllm_requests(vllm_server)
    async with running(vllm_config, ready_timeout_s=LOAD_TIMEOUT_S) as base:
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-test", timeout=EVENT_TIMEOUT_S)
        async with client.realtime.connect(model="cascade") as conn:
            reader = SdkReader(conn, timeout_s=EVENT_TIMEOUT_S)
            await reader.until("session.created")
            session: RealtimeSessionCreateRequestParam = {
                "type": "realtime",
                "output_modalities": ["text"],
                "audio": {"input": {"turn_detection": None}},
                "max_output_tokens": 24,
                "temperature": 0,  # type: ignore[typeddict-unknown-key]  # rtserve's session temperature, not in the SDK's GA type
            }
            await conn.session.update(session=session)
            await reader.until("session.updated")
            await conn.conversation.item.create(
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "What is the capital of France?"}],
                }
            )
            await conn.response.create()
            answer = (await reader.until("response.done"))["response"]

            await conn.conversation.item.create(
                item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]}
            )
            await conn.response.create(
                response={"tools": [REALTIME_TOOL], "tool_choice": "required", "max_output_tokens": 200}
            )
            called = (await reader.until("response.done"))["response"]
    assert answer["status"] == "completed", answer
    text = "".join(part.get("text", "") for item in answer["output"] for part in item.get("content", []))
    assert text.strip()
    assert called["status"] == "completed", called
    call = next(item for item in called["output"] if item["type"] == "function_call")
    assert call["name"] == "get_weather"
    jsonschema.validate(json.loads(call["arguments"]), WEATHER_SCHEMA)
    assert await vllm_requests(vllm_server) == before + 2
