"""``POST /v1/chat/completions`` (JSON or SSE) and ``POST /v1/chat/completions/batch``.

OpenAI Chat Completions shapes (function calls: ``chat_tools``), one choice. Streaming sends a
role chunk, one chunk per engine delta (text or a piece of a call), a chunk with
``finish_reason``, the usage chunk when ``stream_options.include_usage`` asks for it, then
``data: [DONE]``. The batch route takes
a list of conversations in ``messages`` and answers one choice per conversation, in input
order (docs/serving.md#chat-completions); its conversations go to the engine together (the engine batches
them) and the request holds one concurrency slot, its size bounded by
``http.max_batch_conversations``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Annotated, Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from rtserve.config import HttpGenerationConfig, ServerConfig, SessionLimits
from rtserve.engines.errors import EngineError
from rtserve.engines.protocols import LLMEngine
from rtserve.engines.values import ChatMessage, SamplingParams, TokenDelta
from rtserve.errors import CONTEXT_LENGTH_EXCEEDED, INVALID_VALUE
from rtserve.web.context import CTX, AppContext
from rtserve.web.error_mapping import api_error
from rtserve.web.errors import ApiError
from rtserve.web.http.chat_audio import (
    AudioOutput,
    InputAudioPart,
    check_stream_format,
    engine_messages,
    spoken_message,
    stream_spoken,
    wants_audio,
)
from rtserve.web.http.chat_tools import CallsSoFar, ToolCallIn, ToolChoiceIn, ToolIn, engine_tools, stream_delta
from rtserve.web.http.common import (
    SseStream,
    engine_errors,
    first_item,
    generation_route,
    read_json,
    require_llm,
    run_generation,
)

log = logging.getLogger(__name__)

MAX_STOP_SEQUENCES = 4


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: str


class MessageIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    # None: an assistant message that only calls tools
    content: str | list[Annotated[TextPart | InputAudioPart, Field(discriminator="type")]] | None
    tool_calls: list[ToolCallIn] | None = None  # assistant
    tool_call_id: str | None = None  # tool

    @model_validator(mode="before")
    @classmethod
    def _calls_need_no_content(cls, data: Any) -> Any:
        # OpenAI lets an assistant message that calls tools leave out its content; others must have it.
        if isinstance(data, dict) and data.get("role") == "assistant" and "content" not in data:
            return {**data, "content": None}
        return data

    def to_engine(self, text: str | None = None) -> ChatMessage:
        """``text``: the content with its audio parts transcribed (``chat_audio``)."""
        content = self.content or ""
        if text is None and isinstance(content, str):
            text = content
        elif text is None:
            text_parts = [p for p in content if isinstance(p, TextPart)]
            if len(text_parts) < len(content):
                raise ApiError(
                    "Invalid value for 'messages': input_audio parts are taken by /v1/chat/completions only.",
                    param="messages",
                    code=INVALID_VALUE,
                )
            text = "".join(p.text for p in text_parts)
        # "developer" is OpenAI's newer name for the system role.
        return ChatMessage(
            role="system" if self.role == "developer" else self.role,
            content=text,
            tool_calls=tuple(c.to_engine() for c in self.tool_calls or ()),
            tool_call_id=self.tool_call_id,
        )


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class _GenerationFields(BaseModel):
    """Fields shared by the single and the batch route."""

    model_config = ConfigDict(extra="ignore")  # vendor extensions (top_k, ...) are accepted and unused

    model: str | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int = 1
    seed: Annotated[StrictInt, Field(ge=0, lt=2**63)] | None = None  # what a torch generator takes
    stop: str | list[str] | None = None
    tools: list[ToolIn] | None = None
    tool_choice: ToolChoiceIn | None = None

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported")
        return n

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences are allowed")
        return stop

    def sampling(self, limits: HttpGenerationConfig, tool_limits: SessionLimits) -> SamplingParams:
        max_tokens = self.max_completion_tokens or self.max_tokens or limits.default_max_tokens
        if max_tokens > limits.max_completion_tokens:
            param = "max_completion_tokens" if self.max_completion_tokens else "max_tokens"
            raise ApiError(
                f"Invalid value for '{param}': Input should be less than or equal to {limits.max_completion_tokens}.",
                param=param,
                code=INVALID_VALUE,
            )
        defaults = SamplingParams()
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        tools, tool_choice = engine_tools(self.tools, self.tool_choice, tool_limits)
        return SamplingParams(
            temperature=defaults.temperature if self.temperature is None else self.temperature,
            top_p=defaults.top_p if self.top_p is None else self.top_p,
            max_tokens=max_tokens,
            seed=self.seed,
            stop=stop,
            tools=tools,
            tool_choice=tool_choice,
        )


class ChatCompletionRequest(_GenerationFields):
    messages: list[MessageIn] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    modalities: list[Literal["text", "audio"]] | None = None  # audio output: ``chat_audio``
    audio: AudioOutput | None = None


class BatchChatCompletionRequest(_GenerationFields):
    messages: list[Annotated[list[MessageIn], Field(min_length=1)]] = Field(min_length=1)
    stream: Literal[False] = False  # "Input should be False": the batch route never streams


# No tokenizer yields a token per more than a few characters on real text; this bound only
# has to stop a prompt far past the context before the tokenizer sees it.
CHARS_PER_TOKEN_BOUND = 8
VLLM_CONTEXT_BOUND_TOKENS = 131072  # vLLM checks its own context; this only bounds what rtserve forwards


def prompt_char_limit(config: ServerConfig) -> int:
    """``http.max_prompt_chars``, or 8 characters per token of the text engine's context."""
    if config.http.max_prompt_chars is not None:
        return config.http.max_prompt_chars
    if "vllm" in (config.http.text_engine, config.cascade.llm_engine):
        return VLLM_CONTEXT_BOUND_TOKENS * CHARS_PER_TOKEN_BOUND
    return config.cascade.llm_context_tokens * CHARS_PER_TOKEN_BOUND


def check_prompt_size(messages: Sequence[ChatMessage], limit: int, param: str) -> None:
    """Refuse a conversation over ``limit`` characters before any model work (tokenizing it
    whole would hold the model thread for everyone)."""
    if sum(len(m.content) + sum(len(c.arguments) for c in m.tool_calls) for m in messages) > limit:
        raise ApiError(
            f"The messages in '{param}' hold more than {limit} characters, more than this model's "
            "context can take; shorten the conversation.",
            param=param,
            code=CONTEXT_LENGTH_EXCEEDED,
        )


def _usage(last: TokenDelta | None) -> dict[str, int]:
    prompt = last.prompt_tokens if last else 0
    completion = last.completion_tokens if last else 0
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class _Completion:
    """One finished generation: its text and the final delta (finish reason, usage)."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.last: TokenDelta | None = None
        self.calls = CallsSoFar()

    def add(self, delta: TokenDelta) -> None:
        self.text.append(delta.text)
        if delta.tool_call is not None:
            self.calls.add(delta.tool_call)
        self.last = delta

    def choice(self, index: int) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.text)}
        if self.calls:
            message["content"] = message["content"] or None  # OpenAI: null content beside calls
            message["tool_calls"] = self.calls.message_field()
        return {
            "index": index,
            "message": message,
            "logprobs": None,
            "finish_reason": (self.last and self.last.finish_reason) or "stop",
        }


async def _complete(llm: LLMEngine, messages: Sequence[ChatMessage], params: SamplingParams) -> _Completion:
    done = _Completion()
    with engine_errors():
        async with contextlib.aclosing(llm.generate(messages, params)) as deltas:
            async for delta in deltas:
                done.add(delta)
    return done


def _envelope(completion_id: str, model: str, obj: str) -> dict[str, Any]:
    return {"id": completion_id, "object": obj, "created": int(time.time()), "model": model}


async def _sampling(ctx: AppContext, body: _GenerationFields) -> SamplingParams:
    """``body``'s sampling parameters; with tools on the codec executor, since their schemas
    compile (up to ``sessions.max_tool_schema_bytes``, ~0.4 us a byte), off the event loop."""
    if body.tools:
        return await ctx.codecs.run(body.sampling, ctx.config.http, ctx.config.sessions)
    return body.sampling(ctx.config.http, ctx.config.sessions)


@generation_route
async def chat_completions(request: web.Request) -> web.StreamResponse:
    ctx = request.app[CTX]
    body = await read_json(request, ChatCompletionRequest)
    llm = require_llm(ctx, body.model)
    params = await _sampling(ctx, body)
    spoken = wants_audio(body.modalities, body.audio)
    if spoken is not None and body.stream:
        check_stream_format(spoken)
    messages = await engine_messages(ctx, body.messages)
    check_prompt_size(messages, prompt_char_limit(ctx.config), "messages")
    completion_id = f"chatcmpl-{uuid.uuid4().hex}"
    work: Callable[[], Coroutine[Any, Any, web.StreamResponse]]
    if spoken is not None and body.stream:
        work = functools.partial(
            stream_spoken,
            request,
            ctx,
            llm,
            messages,
            params,
            _envelope(completion_id, llm.model_name, "chat.completion.chunk"),
            spoken,
            bool(body.stream_options and body.stream_options.include_usage),
        )
    elif spoken is not None:
        work = functools.partial(
            _respond, llm, messages, params, completion_id, speak=functools.partial(spoken_message, ctx, audio=spoken)
        )
    elif body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        work = functools.partial(_stream, request, llm, messages, params, completion_id, include_usage)
    else:
        work = functools.partial(_respond, llm, messages, params, completion_id)
    return await run_generation(request, completion_id, work)


async def _respond(
    llm: LLMEngine,
    messages: list[ChatMessage],
    params: SamplingParams,
    completion_id: str,
    speak: Callable[[str], Awaitable[dict[str, Any]]] | None = None,
) -> web.Response:
    done = await _complete(llm, messages, params)
    choice = done.choice(0)
    if speak is not None:  # audio output: the reply spoken, as ``message.audio``
        choice["message"] = await speak("".join(done.text))
    return web.json_response(
        {**_envelope(completion_id, llm.model_name, "chat.completion"), "choices": [choice], "usage": _usage(done.last)}
    )


async def _stream(
    request: web.Request,
    llm: LLMEngine,
    messages: list[ChatMessage],
    params: SamplingParams,
    completion_id: str,
    include_usage: bool,
) -> web.StreamResponse:
    envelope = _envelope(completion_id, llm.model_name, "chat.completion.chunk")
    usage_field = {"usage": None} if include_usage else {}

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {
            **envelope,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
            **usage_field,
        }

    async with contextlib.aclosing(llm.generate(messages, params)) as deltas:
        last = await first_item(deltas)
        sse = SseStream(request)
        await sse.start()
        await sse.send(chunk({"role": "assistant", "content": ""}))
        try:
            while last is not None:
                if last.text:
                    await sse.send(chunk({"content": last.text}))
                if last.tool_call is not None:
                    await sse.send(chunk(stream_delta(last.tool_call)))
                if last.finish_reason is not None:
                    break
                last = await anext(deltas, None)
        except EngineError as exc:
            log.warning("generation failed mid-stream: %s", exc)
            await sse.send(api_error(exc).body())
            await sse.send_done_marker()
            return await sse.finish()
    await sse.send(chunk({}, (last and last.finish_reason) or "stop"))
    if include_usage:
        await sse.send({**envelope, "choices": [], "usage": _usage(last)})
    await sse.send_done_marker()
    return await sse.finish()


@generation_route
async def chat_completions_batch(request: web.Request) -> web.StreamResponse:
    ctx = request.app[CTX]
    body = await read_json(request, BatchChatCompletionRequest)
    limit = ctx.config.http.max_batch_conversations
    if len(body.messages) > limit:
        raise ApiError(
            f"Invalid value for 'messages': a batch holds at most {limit} conversations.",
            param="messages",
            code=INVALID_VALUE,
        )
    llm = require_llm(ctx, body.model)
    params = await _sampling(ctx, body)
    conversations = [[m.to_engine() for m in conversation] for conversation in body.messages]
    char_limit = prompt_char_limit(ctx.config)
    for i, conversation in enumerate(conversations):
        check_prompt_size(conversation, char_limit, f"messages[{i}]")
    completion_id = f"chatcmpl-batch-{uuid.uuid4().hex}"
    work = functools.partial(_respond_batch, llm, conversations, params, completion_id)
    return await run_generation(request, completion_id, work)


async def _respond_batch(
    llm: LLMEngine, conversations: list[list[ChatMessage]], params: SamplingParams, completion_id: str
) -> web.Response:
    # All conversations go to the engine at once so it can batch them; one failure stops the rest.
    tasks = [asyncio.ensure_future(_complete(llm, conversation, params)) for conversation in conversations]
    try:
        results = await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    for done in results:
        for key, value in _usage(done.last).items():
            usage[key] += value
    return web.json_response(
        {
            **_envelope(completion_id, llm.model_name, "chat.completion"),
            "choices": [done.choice(i) for i, done in enumerate(results)],
            "usage": usage,
        }
    )


def setup(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/chat/completions/batch", chat_completions_batch)
