"""A long realtime conversation does not hold the one LLM thread (issue 17, item 2): 40 items
of 100 KB then ``response.create`` once took ~59 s of re-tokenizing (the whole history again
after each dropped turn), stalling every session's replies. The history is now fitted with
tokenizer work bounded by the prompt budget, so the answer starts as quickly as for a short
conversation, and a chat request sent meanwhile is not held up."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from rtserve.config import ServerConfig
from tests.web.realtime.test_realtime_session_bounds import add_item
from tests.web.realtime_support import read_until, receive_event, running, ws_url

pytestmark = pytest.mark.models

LOAD_TIMEOUT_S = 300
ITEMS, ITEM_CHARS = 40, 100_000
ANSWER_WITHIN_S = 30.0  # a 2-core CPU under other load; the quadratic fit took ~59 s: half of that still tells


async def test_forty_items_of_100_kb_then_a_response_answers_promptly(config: ServerConfig) -> None:
    config.engine = "cascade"
    words = ("dragon bread oven flour " * (ITEM_CHARS // 24 + 1))[:ITEM_CHARS]
    async with running(config, ready_timeout_s=LOAD_TIMEOUT_S) as base, aiohttp.ClientSession() as http:
        async with http.ws_connect(ws_url(base), max_msg_size=0) as ws:
            await receive_event(ws)
            for i in range(ITEMS):
                assert await add_item(ws, words, f"item_{i}") is None
            assert await add_item(ws, "What is the capital of France?", "question") is None
            started = time.monotonic()
            await ws.send_json(
                {"type": "response.create", "response": {"output_modalities": ["text"], "max_output_tokens": 4}}
            )

            async def chat() -> float:  # another client of the same LLM, meanwhile
                async with http.post(
                    f"{base}/v1/chat/completions",
                    json={
                        "model": "gpt-4o-mini",
                        "max_tokens": 2,
                        "messages": [{"role": "user", "content": "Say hi."}],
                    },
                ) as resp:
                    assert resp.status == 200, await resp.text()
                return time.monotonic() - started

            chatting = asyncio.create_task(chat())
            done = (await asyncio.wait_for(read_until(ws, "response.done", limit=5000), ANSWER_WITHIN_S * 2))[-1]
            answered_s = time.monotonic() - started
            chat_s = await asyncio.wait_for(chatting, ANSWER_WITHIN_S * 2)
    assert done["response"]["status"] == "completed", done["response"]
    assert done["response"]["usage"]["input_tokens"] <= config.cascade.llm_context_tokens
    assert answered_s < ANSWER_WITHIN_S and chat_s < ANSWER_WITHIN_S, (answered_s, chat_s)
