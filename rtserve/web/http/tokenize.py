"""``POST /tokenize``: the served LLM's token ids of a conversation or a text, in vLLM's shapes
(docs/serving.md#tokenize).

A conversation (``messages``, with ``tools``) is counted chat-templated with the generation
prompt, as a chat completion sends it; a text (``prompt``) with the tokenizer's special tokens
unless ``add_special_tokens`` is false. The answer: ``{"count", "max_model_len", "tokens",
"token_strs": null}``. With ``max_model_len`` in ``/v1/models`` (``base_routes``) this is what
``cascade.llm_engine: vllm`` needs of its server, so one rtserve can be another's LLM (the LLM
in a process, GPU or host of its own). vLLM options that would change the count and are not
this server's (another chat template, no generation prompt, a continued final message) are
refused, not ignored.
"""

from __future__ import annotations

from typing import Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from rtserve.engines.protocols import token_counter
from rtserve.engines.values import SamplingParams
from rtserve.errors import CONTEXT_LENGTH_EXCEEDED
from rtserve.web.context import CTX
from rtserve.web.errors import ApiError
from rtserve.web.http.chat import MessageIn, check_prompt_size, prompt_char_limit
from rtserve.web.http.chat_tools import ToolIn, engine_tools
from rtserve.web.http.common import (
    engine_errors,
    generation_route,
    read_json_object,
    require_llm,
    validate,
)

ROUTE = "/tokenize"


class _TokenizeFields(BaseModel):
    model_config = ConfigDict(extra="ignore")  # vLLM's other fields (mm_processor_kwargs, ...) change no count

    model: str | None = None
    return_token_strs: Literal[False] | None = None  # the ids' strings are not offered


class TokenizeChat(_TokenizeFields):
    messages: list[MessageIn] = Field(min_length=1)
    tools: list[ToolIn] | None = None
    add_generation_prompt: Literal[True] = True  # counted as a chat completion sends it
    continue_final_message: Literal[False] = False
    add_special_tokens: Literal[False] = False  # the chat template places them
    chat_template: None = None  # the model's own template only
    chat_template_kwargs: None = None


class TokenizeText(_TokenizeFields):
    prompt: str
    add_special_tokens: bool = True


@generation_route  # tokenizer work on the LLM's host: bounded as a generation is
async def tokenize(request: web.Request) -> web.Response:
    ctx = request.app[CTX]
    data = await read_json_object(request)
    body = validate(TokenizeChat, data) if "messages" in data else validate(TokenizeText, data)
    llm = require_llm(ctx, body.model)
    with engine_errors():
        counter = token_counter(llm)
        if isinstance(body, TokenizeChat):
            messages = [m.to_engine() for m in body.messages]
            check_prompt_size(messages, prompt_char_limit(ctx.config), "messages")
            params = SamplingParams()
            if body.tools:  # their schemas compile: off the event loop, as chat's
                tools, _ = await ctx.codecs.run(engine_tools, body.tools, None, ctx.config.sessions)
                params = SamplingParams(tools=tools)
            ids = await counter.tokenize(messages, params)
        else:
            if len(body.prompt) > prompt_char_limit(ctx.config):
                raise ApiError(
                    f"'prompt' holds more than {prompt_char_limit(ctx.config)} characters, more than this "
                    "model's context can take.",
                    param="prompt",
                    code=CONTEXT_LENGTH_EXCEEDED,
                )
            ids = await counter.tokenize(body.prompt, SamplingParams(), add_special_tokens=body.add_special_tokens)
        context = await counter.context_tokens()
    return web.json_response({"count": len(ids), "max_model_len": context, "tokens": ids, "token_strs": None})


def setup(app: web.Application) -> None:
    app.router.add_post(ROUTE, tokenize)
