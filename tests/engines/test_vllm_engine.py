"""The optional vLLM text engine: a clear startup error without vLLM; the adapter and its
wiring into the chat route against a test double of vLLM's public async API (so the code
runs here, where vLLM is not installed); and, where vLLM and a local model exist,
streaming, usage and cancellation through the real engine."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import importlib.machinery
import importlib.util
import json
import os
import re
import sys
import types
from dataclasses import dataclass, field

import aiohttp
import openai
import pytest

from rtserve.app import build_app
from rtserve.config import ConfigError
from rtserve.engines.protocols import ChatMessage, SamplingParams
from tests.support import serve_app
from tests.web.http_support import TurnEnginesSessionDouble, sdk

VLLM_INSTALLED = importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(VLLM_INSTALLED, reason="vllm is installed here")
def test_selecting_vllm_without_the_package_fails_at_startup_naming_the_fix(config):
    config.http.text_engine = "vllm"
    config.http.vllm.model = "/models/any"
    with pytest.raises(ConfigError, match=r"'vllm' is selected but the vllm package is not installed.*rtserve\[vllm\]"):
        build_app(config, engine=TurnEnginesSessionDouble())


@pytest.mark.slow
@pytest.mark.skipif(not VLLM_INSTALLED, reason="vllm is not installed")
@pytest.mark.skipif("RTSERVE_TEST_VLLM_MODEL" not in os.environ,
                    reason="set RTSERVE_TEST_VLLM_MODEL to a local chat model folder")
async def test_vllm_streams_counts_usage_and_cancels(config):
    from rtserve.engines.vllm_engine import VllmTextEngine

    config.http.vllm.model = os.environ["RTSERVE_TEST_VLLM_MODEL"]
    config.http.vllm.gpu_memory_utilization = 0.3
    engine = VllmTextEngine(config.http.vllm)
    await engine.start()
    try:
        messages = [ChatMessage(role="user", content="Count from one to ten.")]
        deltas = [d async for d in engine.generate(messages, SamplingParams(temperature=0.0, max_tokens=8))]
        assert "".join(d.text for d in deltas)
        assert deltas[-1].finish_reason == "length"
        assert deltas[-1].completion_tokens == 8 and deltas[-1].prompt_tokens > 0

        # Closing the stream after one delta aborts the request; the engine keeps serving.
        async with contextlib.aclosing(engine.generate(messages, SamplingParams(max_tokens=64))) as stream:
            await anext(stream)
        again = [d async for d in engine.generate(messages, SamplingParams(temperature=0.0, max_tokens=8))]
        assert "".join(d.text for d in again) == "".join(d.text for d in deltas)
    finally:
        await engine.stop()


# ---------------------------------------------------------------------------
# A test double of the part of vLLM's API the adapter uses (vllm.AsyncEngineArgs,
# vllm.AsyncLLMEngine.from_engine_args / get_tokenizer / generate / shutdown,
# vllm.SamplingParams, vllm.sampling_params.RequestOutputKind), with DELTA outputs.
# ---------------------------------------------------------------------------


@dataclass
class _Completion:
    text: str
    token_ids: list[int]
    finish_reason: str | None


@dataclass
class _RequestOutput:
    outputs: list[_Completion]
    finished: bool
    prompt_token_ids: list[int] = field(default_factory=list)


class VllmApiDouble:
    """Installed as the ``vllm`` module: words of the prompt's last line, one per output.

    Tool calling as vLLM does it: the chat template takes ``tools``; structured outputs
    (``StructuredOutputsParams(json=schema)``) make the output an instance of the schema;
    the ``hermes`` tool parser reads ``<tool_call>{...}</tool_call>`` (which the double writes
    when the last message says CALL).
    """

    class RequestOutputKind(enum.Enum):
        CUMULATIVE = 0
        DELTA = 1
        FINAL_ONLY = 2

    def __init__(self) -> None:
        self.engine_args: dict = {}
        self.sampling: list[dict] = []
        self.aborted: list[str] = []
        self.hold: asyncio.Event | None = None
        self.shut_down = False
        self.template_tools: list = []
        self.parsers: list[str] = []
        double = self

        class Tokenizer:
            def apply_chat_template(self, messages, tools=None, *, tokenize, add_generation_prompt):
                assert tokenize is False and add_generation_prompt is True
                double.template_tools.append(tools)
                return "\n".join(f"<{m['role']}> {m['content']}" for m in messages)

        class Engine:
            @classmethod
            def from_engine_args(cls, args):
                return cls()

            def get_tokenizer(self):
                return Tokenizer()

            async def generate(self, prompt, sampling, request_id):
                assert sampling["output_kind"] is double.RequestOutputKind.DELTA
                words = prompt.splitlines()[-1].split()[1:][:sampling["max_tokens"]]
                if "structured_outputs" in sampling:
                    text = json.dumps(_instance(sampling["structured_outputs"].json, words[-1]))
                    words = [text[:len(text) // 2], text[len(text) // 2:]]
                elif "CALL" in words:
                    words = ['<tool_call>{"name": "get_weather",', '"arguments": {"city": "Paris"}}</tool_call>']
                try:
                    for i, word in enumerate(words):
                        last = i == len(words) - 1
                        reason = ("length" if len(words) == sampling["max_tokens"] else "stop") if last else None
                        yield _RequestOutput([_Completion(f" {word}" if i else word, [i], reason)], last,
                                             list(range(len(prompt.split()))) if i == 0 else [])
                        if i == 0 and double.hold is not None:
                            await double.hold.wait()
                except (asyncio.CancelledError, GeneratorExit):
                    double.aborted.append(request_id)  # what vLLM does when cancelled or closed: abort
                    raise

            def shutdown(self):
                double.shut_down = True

        def engine_args(**kwargs):
            double.engine_args = kwargs
            return kwargs

        def sampling_params(**kwargs):
            double.sampling.append(kwargs)
            return kwargs

        self.module = types.ModuleType("vllm")
        self.module.__spec__ = importlib.machinery.ModuleSpec("vllm", loader=None)
        self.module.AsyncEngineArgs = engine_args
        self.module.AsyncLLMEngine = Engine
        self.module.SamplingParams = sampling_params
        self.submodule = types.ModuleType("vllm.sampling_params")
        self.submodule.RequestOutputKind = self.RequestOutputKind
        self.submodule.StructuredOutputsParams = lambda json: types.SimpleNamespace(json=json)

        class HermesParser:
            def __init__(self, tokenizer):
                assert isinstance(tokenizer, Tokenizer)

            def extract_tool_calls(self, text, request):
                assert request.tool_choice == "auto" and request.tools
                calls = [json.loads(m) for m in re.findall(r"<tool_call>(.*?)</tool_call>", text, re.S)]
                return types.SimpleNamespace(
                    tools_called=bool(calls), content=text.split("<tool_call>")[0] or None,
                    tool_calls=[types.SimpleNamespace(id=f"chatcmpl-tool-{i}", function=types.SimpleNamespace(
                        name=c["name"], arguments=json.dumps(c["arguments"]))) for i, c in enumerate(calls)])

        class ToolParserManager:
            @staticmethod
            def get_tool_parser(name):
                double.parsers.append(name)
                return HermesParser

        self.parsers_module = types.ModuleType("vllm.entrypoints.openai.tool_parsers")
        self.parsers_module.ToolParserManager = ToolParserManager
        self.protocol_module = types.ModuleType("vllm.entrypoints.openai.protocol")
        self.protocol_module.ChatCompletionRequest = lambda **kwargs: types.SimpleNamespace(**kwargs)


def _instance(schema: dict, word: str):
    """A value following ``schema`` (objects, enums, strings; the first of an anyOf)."""
    if "anyOf" in schema:
        return _instance(schema["anyOf"][0], word)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    if schema.get("type") == "object":
        return {key: _instance(sub, word) for key, sub in schema.get("properties", {}).items()
                if key in schema.get("required", ())}
    return word


@pytest.fixture
def vllm_double(monkeypatch) -> VllmApiDouble:
    if VLLM_INSTALLED:
        pytest.skip("the real vllm is installed; it is tested instead")
    double = VllmApiDouble()
    monkeypatch.setitem(sys.modules, "vllm", double.module)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", double.submodule)
    monkeypatch.setitem(sys.modules, "vllm.entrypoints.openai.tool_parsers", double.parsers_module)
    monkeypatch.setitem(sys.modules, "vllm.entrypoints.openai.protocol", double.protocol_module)
    return double


async def test_chat_route_through_the_vllm_adapter(config, vllm_double):
    config.http.text_engine = "vllm"
    config.http.vllm.model = "/models/Tiny-Chat"
    app = build_app(config, engine=TurnEnginesSessionDouble())
    async with serve_app(app) as base:
        for _ in range(200):  # the adapter starts in the background with the app
            models = await asyncio.to_thread(lambda: [m.id for m in sdk(base).models.list()])
            try:
                completion = await asyncio.to_thread(
                    sdk(base).chat.completions.create, model="Tiny-Chat", max_tokens=3, temperature=0.5, seed=3,
                    messages=[{"role": "user", "content": "alpha beta gamma delta"}])
                break
            except openai.APIStatusError as exc:
                assert exc.body["code"] == "model_not_ready"
                await asyncio.sleep(0.01)
        assert "Tiny-Chat" in models
        assert completion.choices[0].message.content == "alpha beta gamma"
        assert completion.choices[0].finish_reason == "length"
        assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (5, 3)
        assert vllm_double.engine_args["model"] == "/models/Tiny-Chat"
        assert vllm_double.engine_args["served_model_name"] == "Tiny-Chat"
        assert {k: vllm_double.sampling[-1][k] for k in ("temperature", "max_tokens", "seed", "stop")} == {
            "temperature": 0.5, "max_tokens": 3, "seed": 3, "stop": None}

        # A client that goes away mid-stream aborts the request inside vLLM.
        vllm_double.hold = asyncio.Event()
        async with aiohttp.ClientSession() as http:
            resp = await http.post(f"{base}/v1/chat/completions", json={
                "stream": True, "messages": [{"role": "user", "content": "one two three"}]})
            await resp.content.readuntil(b"\n\n")
            resp.close()
        for _ in range(200):
            if vllm_double.aborted:
                break
            await asyncio.sleep(0.01)
        assert len(vllm_double.aborted) == 1
    assert vllm_double.shut_down


def test_selecting_vllm_without_a_model_path_fails_at_startup(config, vllm_double):
    config.http.text_engine = "vllm"
    with pytest.raises(ConfigError, match=r"'http.vllm.model': a local model folder is required"):
        build_app(config, engine=TurnEnginesSessionDouble())


WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}


async def _ready_sdk(base: str):
    client = sdk(base)
    for _ in range(200):  # the adapter starts in the background with the app
        if "Tiny-Chat" in await asyncio.to_thread(lambda: [m.id for m in client.models.list()]):
            try:
                await asyncio.to_thread(client.chat.completions.create, model="Tiny-Chat", max_tokens=1,
                                        messages=[{"role": "user", "content": "warm"}])
                return client
            except openai.APIStatusError as exc:
                assert exc.body["code"] == "model_not_ready"
        await asyncio.sleep(0.01)
    raise AssertionError("the vLLM adapter never became ready")


async def test_tools_through_the_vllm_adapter(config, vllm_double):
    config.http.text_engine = "vllm"
    config.http.vllm.model = "/models/Tiny-Chat"
    config.http.vllm.tool_call_parser = "hermes"
    async with serve_app(build_app(config, engine=TurnEnginesSessionDouble())) as base:
        client = await _ready_sdk(base)
        ask = [{"role": "user", "content": "weather in Paris"}]

        # A named function: structured outputs make the text the arguments, streamed as one call.
        chunks = await asyncio.to_thread(lambda: list(client.chat.completions.create(
            model="Tiny-Chat", messages=ask, tools=[WEATHER_TOOL], stream=True,
            tool_choice={"type": "function", "function": {"name": "get_weather"}})))
        pieces = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices and c.choices[0].delta.tool_calls]
        assert pieces[0].function.name == "get_weather" and pieces[0].id.startswith("call_")
        assert json.loads("".join(p.function.arguments for p in pieces)) == {"city": "Paris", "unit": "celsius"}
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
        assert vllm_double.sampling[-1]["structured_outputs"].json == {**WEATHER, "additionalProperties": False}
        assert vllm_double.template_tools[-1] == [{"type": "function", "function": {
            "name": "get_weather", "description": "", "parameters": WEATHER}}]

        # "required": the name is chosen under the schema too.
        done = await asyncio.to_thread(client.chat.completions.create, model="Tiny-Chat", messages=ask,
                                       tools=[WEATHER_TOOL], tool_choice="required")
        [call] = done.choices[0].message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == (
            "get_weather", {"city": "Paris", "unit": "celsius"})
        assert done.choices[0].finish_reason == "tool_calls"

        # "auto": vLLM's tool parser finds the call in the text; the result goes back as a tool message.
        done = await asyncio.to_thread(client.chat.completions.create, model="Tiny-Chat", tools=[WEATHER_TOOL],
                                       messages=[{"role": "user", "content": "please CALL"}])
        [call] = done.choices[0].message.tool_calls
        assert (call.id, call.function.name, call.function.arguments) == (
            "chatcmpl-tool-0", "get_weather", '{"city": "Paris"}')
        assert done.choices[0].message.content is None and done.choices[0].finish_reason == "tool_calls"
        assert vllm_double.parsers == ["hermes"]
        done = await asyncio.to_thread(client.chat.completions.create, model="Tiny-Chat", tools=[WEATHER_TOOL],
                                       messages=[{"role": "user", "content": "please CALL"},
                                                 done.choices[0].message.model_dump(exclude_none=True),
                                                 {"role": "tool", "tool_call_id": call.id, "content": "sunny"}])
        assert done.choices[0].message.content == "sunny" and done.choices[0].message.tool_calls is None


async def test_vllm_auto_tool_choice_without_a_parser_is_refused_with_the_fix(config, vllm_double):
    config.http.text_engine = "vllm"
    config.http.vllm.model = "/models/Tiny-Chat"
    async with serve_app(build_app(config, engine=TurnEnginesSessionDouble())) as base:
        client = await _ready_sdk(base)
        with pytest.raises(openai.BadRequestError) as err:
            await asyncio.to_thread(client.chat.completions.create, model="Tiny-Chat", tools=[WEATHER_TOOL],
                                    messages=[{"role": "user", "content": "hi"}])
    assert (err.value.body["code"], err.value.body["param"]) == ("invalid_value", "tool_choice")
    assert "http.vllm.tool_call_parser" in err.value.body["message"]
