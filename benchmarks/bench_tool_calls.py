"""What a constrained function call costs on the embedded SmolLM2-135M, on this CPU.

Per question, greedy, on the cascade LLM (one decode thread, ``models.cpu_threads``):

* ``free``: the question with no tools, ``max_tokens`` = the call's length in tokens, so
  both decode the same number of tokens;
* ``forced``: the same question with one tool and ``tool_choice`` naming it (prompt ends
  with the call marker; every token under the llguidance mask).

Reported: time to the first delta (the call's first delta carries its name, so it waits
for the ``{"name": ..., "arguments": `` head, which the grammar forces and the decoder feeds
in one forward pass), total time per generated token (prompts differ: the tool listing
makes the forced prompt longer), and the
mask's own time per token (llguidance fill + apply, timed alone on the real grammar). The
first forced request of a process also pays the one-off tokenizer trie build; it is
reported apart. Run: ``.venv/bin/python benchmarks/bench_tool_calls.py [--json PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from rtserve.config import load_config
from rtserve.engines.cascade import CascadeEngine
from rtserve.engines.cascade.llm import SmolLlm
from rtserve.engines.cascade.tool_calls import CallGuide
from rtserve.engines.values import ChatMessage, SamplingParams, ToolChoice, ToolSpec

WEATHER = ToolSpec(
    "get_weather",
    "Get the current weather in a city",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
    },
)
QUESTIONS = [
    "What is the weather in Paris?",
    "Is it raining in Tokyo?",
    "How warm is it in Cairo today?",
    "Tell me the weather in Oslo, in fahrenheit.",
    "Should I take an umbrella in London?",
]
FORCED = SamplingParams(
    temperature=0.0, max_tokens=64, tools=(WEATHER,), tool_choice=ToolChoice("required", "get_weather")
)
DEFAULT_RESULTS = Path(__file__).parent / "results" / "bench_tool_calls.json"


async def timed(engine: CascadeEngine, question: str, params: SamplingParams) -> dict[str, Any]:
    started = time.perf_counter()
    first = None
    last = None
    async for delta in engine.llm.generate((ChatMessage("user", question),), params):
        first = first if first is not None else time.perf_counter() - started
        last = delta
    total = time.perf_counter() - started
    assert last is not None and first is not None
    return {
        "first_delta_ms": 1000 * first,
        "total_ms": 1000 * total,
        "prompt_tokens": last.prompt_tokens,
        "tokens": last.completion_tokens,
        "ms_per_token": 1000 * total / last.completion_tokens,
        "finish": last.finish_reason,
    }


def mask_us(engine: CascadeEngine, repeats: int = 200) -> float:
    import torch

    assert isinstance(engine.llm, SmolLlm)
    loaded = engine.llm.loaded
    assert loaded is not None
    guide = CallGuide(loaded.tokenizer, loaded.model.config.vocab_size)
    decoding = guide.start(FORCED)
    assert decoding is not None
    logits = torch.zeros(loaded.model.config.vocab_size)
    decoding.mask(logits)  # warm
    started = time.perf_counter()
    for _ in range(repeats):
        decoding.mask(logits)
    return 1e6 * (time.perf_counter() - started) / repeats


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=DEFAULT_RESULTS, help="where the JSON results go")
    args = parser.parse_args()
    # Calls are always decoded by the transformers runtime (the CTranslate2 one hands them over).
    config = load_config(environ={}, overrides={"cascade": {"llm_runtime": "transformers"}})
    engine = CascadeEngine(config, CollectorRegistry())
    await engine.start()
    first_forced = await timed(engine, QUESTIONS[0], FORCED)
    forced: list[dict[str, Any]] = []
    free: list[dict[str, Any]] = []
    for question in QUESTIONS:
        call = await timed(engine, question, FORCED)
        forced.append(call)
        free.append(await timed(engine, question, SamplingParams(temperature=0.0, max_tokens=int(call["tokens"]))))
    per_token_mask_us = mask_us(engine)
    await engine.stop()

    def median(rows: list[dict[str, Any]], key: str) -> float:
        middle: float = statistics.median(row[key] for row in rows)
        return middle

    table = {
        name: {
            key: median(rows, key) for key in ("first_delta_ms", "total_ms", "prompt_tokens", "tokens", "ms_per_token")
        }
        for name, rows in (("free", free), ("forced", forced))
    }
    result: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_1m_at_end": os.getloadavg()[0],
        },
        "versions": {name: metadata.version(name) for name in ("llguidance", "torch", "transformers")},
        "config": {"cpu_threads": config.models.cpu_threads, "questions": len(QUESTIONS)},
        "first_forced_request": first_forced,
        "median": table,
        "mask_us_per_token": per_token_mask_us,
        "forced_runs": forced,
        "free_runs": free,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))
    print(
        f"{'median over ' + str(len(QUESTIONS)) + ' questions':<28} {'first delta ms':>15} {'total ms':>9} "
        f"{'prompt':>7} {'tokens':>7} {'ms/token':>9}"
    )
    for name, row in table.items():
        print(
            f"  {name:<26} {row['first_delta_ms']:15.0f} {row['total_ms']:9.0f} {row['prompt_tokens']:7.0f} "
            f"{row['tokens']:7.0f} {row['ms_per_token']:9.1f}"
        )
    print(
        f"first forced request of the process: {first_forced['total_ms']:.0f} ms; mask alone "
        f"{per_token_mask_us:.0f} us/token; load average {result['machine']['load_average_1m_at_end']:.1f}"
    )
    print(f"wrote {args.json}")


if __name__ == "__main__":
    asyncio.run(main())
