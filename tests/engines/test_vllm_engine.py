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
import os
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
    """Installed as the ``vllm`` module: words of the prompt's last line, one per output."""

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
        double = self

        class Tokenizer:
            def apply_chat_template(self, messages, tokenize, add_generation_prompt):
                assert tokenize is False and add_generation_prompt is True
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


@pytest.fixture
def vllm_double(monkeypatch) -> VllmApiDouble:
    if VLLM_INSTALLED:
        pytest.skip("the real vllm is installed; it is tested instead")
    double = VllmApiDouble()
    monkeypatch.setitem(sys.modules, "vllm", double.module)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", double.submodule)
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
