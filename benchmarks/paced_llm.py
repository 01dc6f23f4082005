"""A BENCHMARK STAND-IN for the voice agent's LLM: an OpenAI-compatible chat server (the part of
vLLM's HTTP API that ``cascade.llm_engine: vllm`` speaks: ``/v1/models``, ``/tokenize``,
streamed ``/v1/chat/completions``) that answers every request with random words at a fixed
pace: the first after ``--first-token-ms``, then ``--tokens-per-s``, each request on its own
clock, so any number of concurrent replies run side by side (as a continuously batching server's
would). It runs no model and uses no GPU: it stands for an LLM whose speed is given, so a
benchmark measures the rest of the cascade under that LLM. Not an engine; never configured by
rtserve itself.

    python benchmarks/paced_llm.py --port 8011 --first-token-ms 100 --tokens-per-s 50
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from typing import Any

from aiohttp import web
from bench_kyutai_served import WORDS  # benchmarks/ is on sys.path

MODEL = "paced-llm-stand-in"
CONTEXT_TOKENS = 4096


def chunk(content: str | None, finish: str | None = None, usage: dict[str, int] | None = None) -> bytes:
    choices = [] if usage else [{"index": 0, "delta": {"content": content} if content else {}, "finish_reason": finish}]
    body: dict[str, Any] = {"object": "chat.completion.chunk", "model": MODEL, "choices": choices}
    if usage:
        body["usage"] = usage
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def app(first_token_s: float, tokens_per_s: float, reply_words: tuple[int, int]) -> web.Application:
    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": MODEL, "max_model_len": CONTEXT_TOKENS}]})

    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()  # a word or so per token: an estimate is all fit_history needs
        return web.json_response({"count": sum(len(str(m.get("content", "")).split()) + 4 for m in body["messages"])})

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        started = time.monotonic()
        words = min(random.randint(*reply_words), int(body.get("max_tokens") or reply_words[1]))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for k in range(words):  # token k is due at first_token + k / rate, on the request's own clock
            await asyncio.sleep(max(0.0, started + first_token_s + k / tokens_per_s - time.monotonic()))
            text = (" " if k else "") + random.choice(WORDS) + ("." if k == words - 1 else "")
            await response.write(chunk(text))
        await response.write(chunk(None, "stop"))
        await response.write(chunk(None, usage={"prompt_tokens": 32, "completion_tokens": words}))
        await response.write(b"data: [DONE]\n\n")
        return response

    application = web.Application()
    application.router.add_get("/v1/models", models)
    application.router.add_post("/tokenize", tokenize)
    application.router.add_post("/v1/chat/completions", completions)
    return application


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--first-token-ms", type=float, default=100.0, help="request -> first token")
    parser.add_argument("--tokens-per-s", type=float, default=50.0, help="per request, after the first")
    parser.add_argument("--reply-words", type=int, nargs=2, default=(10, 20), help="reply length range (tokens)")
    args = parser.parse_args()
    web.run_app(
        app(args.first_token_ms / 1000, args.tokens_per_s, tuple(args.reply_words)),
        host="127.0.0.1",
        port=args.port,
        print=None,
    )


if __name__ == "__main__":
    main()
