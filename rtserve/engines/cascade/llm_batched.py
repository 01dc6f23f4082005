"""The continuously batched transformers runtime of the cascade LLM (``cascade.llm_runtime:
transformers_batched``): the in-process LLM for a GPU voice agent.

Why: the round-robin runtime (``llm.SmolLlm``) runs one forward pass per request per token, and
CTranslate2 (``llm_ct2``) is a CPU runtime here. transformers' continuous batching
(``ContinuousBatchingManager``) keeps every request's KV in one paged cache and runs one forward
pass per step for every active request's next token together with new prompts' chunks, on
``cascade.llm_device`` in ``llm_dtype``: a reply that arrives joins the next step instead of
waiting for a batch to end, and nothing restarts.

Threads: the manager runs its own generation thread. This runtime's one decode thread
(``DecodeQueue``, bounded like every runtime's: ``llm_max_active`` running, ``llm_max_waiting``
more) templates each admitted request's prompt, hands it to the manager with its sampling
settings (the manager's per-request temperature, top-p and top-k), turns the tokens it streams
back into text deltas and cancels what the caller closed. Its cache holds ``llm_kv_tokens``
(by default ``llm_max_active`` x ``llm_context_tokens``, so no admitted request waits for room).

Greedy requests are sampled at a temperature of ``GREEDY_BELOW``: argmax but for exact ties. If the
manager's thread dies, every request waiting or running fails with ``generation_failed`` and the
runtime stops (as any decode loop's failure does), rather than leave its callers waiting.
Function calls and seeded sampling go to the round-robin runtime over the same loaded model
(``llm_handoff``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from rtserve.engines.cascade.errors import ModelUnavailable
from rtserve.engines.cascade.llm_handoff import HandsOffToTransformers
from rtserve.engines.cascade.llm_loading import LoadedLlm, load_llm
from rtserve.engines.cascade.llm_stage import (
    GREEDY_BELOW,
    DecodeQueue,
    Finish,
    LlmRequest,
    Prompter,
    eos_ids,
    fail_request,
    text_delta,
)
from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.errors import EngineError
from rtserve.errors import GENERATION_FAILED

log = logging.getLogger(__name__)

_PAGE_TOKENS = 64  # a voice prompt is a few hundred tokens: small pages waste little of the cache
_POLL_S = 0.005  # how long the decode thread waits for tokens before it looks at its queue again


@dataclass(eq=False)
class _Request(LlmRequest):
    request_id: str = ""
    started: float = 0.0  # handed to the manager (perf_counter)


class _Continuous(DecodeQueue):
    """The decode thread between the bounded queue and the manager's generation thread."""

    def __init__(
        self,
        llm: LoadedLlm,
        manager: Any,
        context_tokens: int,
        metrics: CascadeMetrics,
        top_k: int,
        max_active: int,
        max_waiting: int,
    ) -> None:
        super().__init__(max_active, max_waiting)
        self._manager: Any = manager
        self._tokenizer = llm.tokenizer
        self.prompter = Prompter(llm.tokenizer, context_tokens)
        self._context = context_tokens
        self._eos = eos_ids(llm.tokenizer, llm.model.generation_config.eos_token_id)
        self._metrics = metrics
        self._top_k = top_k or llm.model.config.vocab_size  # 0 is the whole vocabulary (the manager keeps 1)
        self._next_id = 0

    def serve(self) -> None:
        active: dict[str, _Request] = {}
        while (admitted := self.admit(list(active.values()))) is not None:
            for request in admitted:
                assert isinstance(request, _Request)
                if not request.cancelled and self._add(request):
                    active[request.request_id] = request
            for request_id, request in list(active.items()):
                if request.cancelled:
                    self._manager.cancel_request(request_id)
                    del active[request_id]
            if active:
                self._collect(active)
            if not self._manager.is_running():  # its thread died: nothing would ever answer these requests
                log.error("the LLM's continuous batching thread stopped")
                self.stop(EngineError("the language model failed", code=GENERATION_FAILED))

    def release_model(self) -> None:
        manager, self._manager = self._manager, None
        if manager is not None:
            manager.stop(block=True)

    def _add(self, request: _Request) -> bool:
        params = request.params
        try:
            prompt = self.prompter.prompt_ids(request.messages, params.max_tokens, request.fit_history, params)
        except Exception as exc:  # noqa: BLE001 - the request fails, the others go on
            fail_request(request, exc)
            return False
        request.prompt_tokens = len(prompt)
        request.request_id = f"r{self._next_id}"
        self._next_id += 1
        request.started = time.perf_counter()
        accepted = self._manager.add_request(
            prompt,
            request_id=request.request_id,
            max_new_tokens=min(params.max_tokens, self._context - len(prompt)),
            streaming=True,
            eos_token_id=sorted(self._eos),
            temperature=max(params.temperature, GREEDY_BELOW),
            top_p=params.top_p,
            top_k=self._top_k,
        )
        if accepted is None:  # the manager stopped taking requests: this one fails with the rest
            request.deliver(EngineError("the language model failed", code=GENERATION_FAILED))
            return False
        return True

    def _collect(self, active: dict[str, _Request]) -> None:
        """Deliver what the manager streamed, waiting up to ``_POLL_S`` for the first of it."""
        output = self._manager.get_result(timeout=_POLL_S)
        while output is not None:
            request = active.get(output.request_id)
            if request is not None and self._deliver(request, output):
                del active[output.request_id]
            output = self._manager.get_result(timeout=0)

    def _deliver(self, request: _Request, output: Any) -> bool:
        """One streamed state of ``request``: its new text as a delta. True once it ended."""
        if output.error is not None:
            log.error("LLM generation failed: %s", output.error)
            request.deliver(EngineError("text generation failed", code=GENERATION_FAILED))
            return True
        tokens = list(output.generated_tokens)
        finish: Finish | None = None
        if tokens and tokens[-1] in self._eos:
            tokens.pop()
            finish = "stop"
        elif output.is_finished():
            finish = "length"
        if not request.generated and tokens:
            self._metrics.model_call_seconds.labels("llm_prefill").observe(time.perf_counter() - request.started)
        self._metrics.llm_tokens.inc(max(0, len(tokens) - len(request.generated)))
        request.generated = tokens
        text = self._tokenizer.decode(tokens, skip_special_tokens=True)
        delta = text_delta(request, text, finish)
        if delta is not None:
            request.deliver(delta)
        return finish is not None


def _start_manager(llm: LoadedLlm, kv_tokens: int, top_k: int, cuda_graphs: bool) -> Any:
    """transformers' continuous batching over ``llm``, started (blocks: model-side setup)."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    # Per-request temperature, top-p and top-k exist only for processors the generation config
    # creates, so it names values that create all three.
    generation = GenerationConfig(do_sample=True, temperature=0.5, top_p=0.9, top_k=max(top_k, 1))  # type: ignore[no-untyped-call]
    generation.eos_token_id = llm.model.generation_config.eos_token_id
    batching = ContinuousBatchingConfig(
        page_size=_PAGE_TOKENS,
        num_blocks=-(-kv_tokens // _PAGE_TOKENS),
        max_batch_tokens=1024,
        per_request_processors=True,
        # The round-robin runtime of the handed-off requests runs the same modules with its own caches.
        auto_switch_to_flash=False,
        # Unset, transformers leaves graphs off for attention that needs a mask (SDPA, ours).
        use_cuda_graph=cuda_graphs,
    )
    manager = llm.model.init_continuous_batching(generation_config=generation, continuous_batching_config=batching)
    # The KV cache is allocated here, not in the generation thread ``start`` begins: there a cache that
    # does not fit (the STT and TTS loaded first on the GPU) is only logged and the server would say it
    # is ready with an LLM that never answers. With graphs, they are captured here too, not on a request.
    try:
        manager.warmup()
    except MemoryError as exc:
        raise ModelUnavailable(
            f"cascade.llm_kv_tokens: a KV cache of {kv_tokens} tokens does not fit beside what is loaded ({exc}); "
            "lower cascade.llm_kv_tokens, or llm_max_active or llm_context_tokens, which set it when unset"
        ) from None
    manager.start()
    return manager


class BatchedLlm(HandsOffToTransformers):
    """The ``LLMEngine`` over transformers' continuous batching on ``device``."""

    request_kind = _Request

    def __init__(
        self, *args: Any, device: str, dtype: str, kv_tokens: int | None, cuda_graphs: bool, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._device, self._dtype, self._cuda_graphs = device, dtype, cuda_graphs
        self._kv_tokens = kv_tokens or self._max_active * self._context_tokens
        self.loaded: LoadedLlm | None = None

    async def _open(self) -> DecodeQueue:
        assert self._path is not None
        started = time.perf_counter()
        loaded = await asyncio.to_thread(
            load_llm, self._path, self._cache_dir, self._cpu_threads, self._device, self._dtype
        )
        manager = await asyncio.to_thread(
            _start_manager, loaded, self._kv_tokens, self._sampling.top_k, self._cuda_graphs
        )
        self.loaded = loaded
        queue = _Continuous(
            loaded,
            manager,
            loaded.context(self._context_tokens),
            self._metrics,
            self._sampling.top_k,
            self._max_active,
            self._max_waiting,
        )
        queue.start()
        graphs = ", CUDA graphs" if self._cuda_graphs else ""
        runtime = f"transformers, continuous batching on {self._device}, {self._dtype}{graphs}"
        self._log_ready(runtime, started, loaded.folder, loaded.converted)
        return queue

    async def release(self) -> None:
        await super().release()
        self.loaded = None

    def _shared_model(self) -> LoadedLlm | None:
        return self.loaded
