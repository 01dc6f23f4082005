"""The CTranslate2 runtime of the cascade LLM (``cascade.llm_runtime: ctranslate2``, the default).

Why: transformers pays ~67 ms of Python per token on SmolLM2-135M and decodes concurrent
requests one forward pass each. CTranslate2 (already installed with faster-whisper) runs the
same weights quantized (``cascade.llm_compute_type``, int8 by default) in C++ and decodes a
batch of requests in one pass per token (``benchmarks/bench_http.py`` measures both).
Sampled tokens come from the ``cascade.llm_top_k`` most likely (then top_p): a full-vocabulary
top_p sorts 49k logits per row per step, which halved batched throughput. The runtime has its
own thread count (``cascade.llm_threads``, 1): on two cores, a second intra-op thread fights
TTS and the event loop for the CPU and measured slower.

Batching (step-level, with restarts, in lanes): each of ``cascade.llm_lanes`` decode threads
runs ``generate_batch`` over its active requests (up to its share of ``llm_max_active``) that
share sampling settings (CTranslate2 samples a whole batch alike), streaming every token
through the callback; CTranslate2 runs the lanes' batches at once, one core each (on two cores
two batches of 4 decode ~1.5x one batch of 8), and a request that finds a lane idle starts
there without restarting anyone. A request finishes (end token, ``max_tokens``,
context, stop string) or is cancelled by returning True for its row. When requests wait,
no lane is idle and the batch has room, every row stops at its next token and the loop starts again with
the newcomers: the running requests resume from their prompt plus what they generated so
far (one prefill more each), so a newcomer's first token never waits for others' whole
replies. Each request is restarted at most ``llm_max_active`` times that way. A burst that
reaches an idle loop is gathered for up to ``cascade.llm_gather_ms`` first, so that it starts
as one batch (restarts for 8 near-simultaneous chat requests cost up to a seventh of their
throughput). Requests with another temperature or top_p wait for the running group (oldest
request's group first).

Conversation openings (the template's start and the system prompt, ``Prompter.opening_length``)
are prefilled once: a batch whose requests share one passes it as CTranslate2's
``static_prompt``, whose computed state CTranslate2 keeps and copies into later batches (a voice
agent's every reply starts with the same instructions). CTranslate2 never evicts that state, so
at most ``cascade.llm_cached_openings`` distinct openings are kept; other batches prefill in full.

Later work steps aside (``step_aside``): a batch whose every reply is past its first spoken piece
pauses between tokens while some voice turn's final transcript or first piece waits for the ASR or
TTS lanes, up to a budget per reply (``first_audio``).

Two kinds of request are decoded by the transformers runtime (``llm.SmolLlm``) over the
same weights, loaded on the first such request: requests offering tools (function calls
need llguidance's mask on every step's logits, which ``generate_batch`` does not expose),
and sampled requests with a ``seed`` (CTranslate2 draws from one random stream per worker
thread that cannot be re-seeded per request, so a seed could not make a reply reproducible).
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rtserve.engines.cascade.first_audio import StepAside
from rtserve.engines.cascade.llm_handoff import HandsOffToTransformers
from rtserve.engines.cascade.llm_loading import LoadedCt2, load_ct2
from rtserve.engines.cascade.llm_stage import (
    GREEDY_BELOW,
    DecodeQueue,
    Finish,
    LlmRequest,
    Prompter,
    SamplingLimits,
    eos_ids,
    fail_request,
    text_delta,
)
from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.cascade.model_paths import ModelLocation
from rtserve.engines.errors import EngineError
from rtserve.errors import GENERATION_FAILED


@dataclass(eq=False)
class _Request(LlmRequest):
    prompt: list[int] | None = None  # prompt ids, once templated on the thread
    opening: tuple[int, ...] = ()  # the prompt's conversation opening (``Prompter.opening_length``)
    finished: bool = False
    steps: int = 0  # tokens the current batch gave this request
    paused_s: float = 0.0  # stepped aside for others' first audio (``StepAside.budget_s``)

    @property
    def group(self) -> tuple[float, float]:
        """Requests decoded in one batch share these (CTranslate2 samples a batch alike)."""
        p = self.params
        return (0.0, 1.0) if p.temperature < GREEDY_BELOW else (p.temperature, p.top_p)


class _Batches(DecodeQueue):
    """The LLM lanes: each admits, then runs one ``generate_batch`` per group of alike requests."""

    def __init__(
        self,
        llm: LoadedCt2,
        context_tokens: int,
        metrics: CascadeMetrics,
        max_active: int,
        max_waiting: int,
        top_k: int,
        cached_openings: int,
        gather_s: float,
        lanes: int,
        step_aside: StepAside | None,
    ) -> None:
        super().__init__(max_active, max_waiting, gather_s, lanes)
        self._step_aside = step_aside
        self._top_k = top_k  # 0: the whole vocabulary
        # The lanes share the tokenizer (its Rust side refuses concurrent mutable use) and the openings.
        self._shared = threading.Lock()
        self._openings: set[tuple[int, ...]] = set()  # kept by CTranslate2 (never evicted): at most this many
        self._max_openings = cached_openings
        self._llm: LoadedCt2 | None = llm
        self._tokenizer = llm.tokenizer
        context = min(context_tokens, llm.max_positions or context_tokens)
        self.prompter = Prompter(llm.tokenizer, context)
        self._context = context
        self._eos = eos_ids(llm.tokenizer, llm.eos)
        self._metrics = metrics

    def serve(self) -> None:
        active: list[_Request] = []
        while (admitted := self.admit(active)) is not None:
            for request in admitted:
                assert isinstance(request, _Request)
                if not request.cancelled and self._prepare(request):
                    active.append(request)
            active = [r for r in active if not (r.cancelled or r.finished)]
            if active:
                self._run(active)
                active = [r for r in active if not (r.cancelled or r.finished)]

    def release_model(self) -> None:
        self._llm = None  # the generator goes with the thread that used it

    def _prepare(self, request: _Request) -> bool:
        try:
            with self._shared:
                request.prompt = self.prompter.prompt_ids(
                    request.messages, request.params.max_tokens, request.fit_history, request.params
                )
                opening = self.prompter.opening_length(request.messages, request.params, request.prompt)
        except Exception as exc:  # noqa: BLE001 - the request fails, the batch goes on
            fail_request(request, exc)
            return False
        request.prompt_tokens = len(request.prompt)
        if 0 < opening < len(request.prompt):  # a start token must remain for the decoding loop
            request.opening = tuple(request.prompt[:opening])
        return True

    def _opening(self, batch: list[_Request]) -> tuple[int, ...]:
        """The opening every request of ``batch`` shares and CTranslate2 keeps the state of
        (computed once, then copied), or () when they differ or the kept set is full. Under
        ``_shared``."""
        opening = batch[0].opening
        if not opening or any(r.opening != opening for r in batch):
            return ()
        if opening in self._openings:
            self._metrics.llm_cached_prompt_tokens.inc(len(opening) * len(batch))
        elif len(self._openings) < self._max_openings:
            self._openings.add(opening)
        else:
            return ()
        return opening

    def _limit(self, request: _Request) -> int:
        return min(request.params.max_tokens, self._context - request.prompt_tokens)

    def _run(self, active: list[_Request]) -> None:
        assert self._llm is not None
        key = active[0].group  # the oldest request's group
        batch = [r for r in active if r.group == key]
        room = len(active) < self.lane_capacity
        temperature, top_p = key
        with self._shared:
            opening = self._opening(batch)
            tokens = [
                self._tokenizer.convert_ids_to_tokens([*(r.prompt or [])[len(opening) :], *r.generated]) for r in batch
            ]
            static_prompt = self._tokenizer.convert_ids_to_tokens(list(opening)) if opening else None
        for request in batch:
            request.steps = 0

        def on_token(step: Any) -> bool:
            request = batch[step.batch_id]
            if request.finished or request.cancelled:
                return True
            request.steps += 1
            try:
                self._take(request, step.token_id)
            except Exception as exc:  # noqa: BLE001 - the request fails, the batch goes on
                request.finished = True
                fail_request(request, exc)
            if request.finished or request.cancelled or self.stopping or (room and self.has_waiting):
                return True
            if self._step_aside is not None and self._step_aside.work.pending:
                self._pause(batch, self._step_aside)
            return False

        started = time.perf_counter()
        self._llm.generator.generate_batch(
            tokens,
            max_length=max(self._limit(r) - len(r.generated) for r in batch),
            include_prompt_in_result=False,
            end_token=sorted(self._eos),
            callback=on_token,
            static_prompt=static_prompt,
            sampling_topk=1 if temperature == 0.0 else self._top_k,
            sampling_topp=top_p,
            sampling_temperature=temperature or 1.0,
        )
        self._metrics.model_call_seconds.labels("llm_batch").observe(time.perf_counter() - started)
        for request in batch:
            if not (request.finished or request.cancelled or request.steps):
                request.finished = True  # CTranslate2 gave it nothing: never spin on it
                request.deliver(EngineError("text generation stopped without a reply", code=GENERATION_FAILED))

    def _pause(self, batch: list[_Request], step_aside: StepAside) -> None:
        """Wait while others' first audio is pending, if every reply of ``batch`` is past its
        first piece and has pause budget left (on the decode thread: its core is freed)."""
        rows = [r for r in batch if not (r.finished or r.cancelled)]
        if any(len(r.generated) < step_aside.first_piece_tokens for r in rows):
            return
        budget = min((step_aside.budget_s - r.paused_s for r in rows), default=0.0)
        if budget <= 0:
            return
        waited = step_aside.work.wait_clear(budget)
        for request in rows:
            request.paused_s += waited
        self._metrics.llm_stepped_aside_seconds.inc(waited)

    def _take(self, request: _Request, token: int) -> None:
        """One generated token of ``request``: its text delta delivered, finished when done."""
        finish: Finish | None = None
        if token in self._eos:
            finish = "stop"
        else:
            request.generated.append(token)
            self._metrics.llm_tokens.inc()
            if len(request.generated) >= self._limit(request):
                finish = "length"
        with self._shared:
            text = self._tokenizer.decode(request.generated, skip_special_tokens=True)
        delta = text_delta(request, text, finish)
        if delta is None:
            return
        request.deliver(delta)
        if delta.finish_reason is not None:
            request.finished = True


class Ct2Llm(HandsOffToTransformers):
    """The ``LLMEngine`` over CTranslate2, batching concurrent requests; tools and seeds go to transformers."""

    request_kind = _Request

    def __init__(
        self,
        location: ModelLocation,
        *,
        cache_dir: Path,
        cpu_threads: int,
        max_active: int,
        max_waiting: int,
        context_tokens: int,
        metrics: CascadeMetrics,
        sampling: SamplingLimits = SamplingLimits(),
        compute_type: str = "int8",
        threads: int = 1,
        cached_openings: int = 16,
        gather_s: float = 0.0,
        lanes: int = 1,
        step_aside: StepAside | None = None,
    ) -> None:
        super().__init__(
            location,
            cache_dir=cache_dir,
            cpu_threads=cpu_threads,
            max_active=max_active,
            max_waiting=max_waiting,
            context_tokens=context_tokens,
            metrics=metrics,
            sampling=sampling,
        )
        self._compute_type = compute_type
        self._threads = threads  # CTranslate2's own (cpu_threads stays the transformers fallback's)
        self._cached_openings = cached_openings
        self._gather_s = gather_s
        self._lanes = lanes
        self._step_aside = step_aside

    async def _open(self) -> DecodeQueue:
        assert self._path is not None
        started = time.perf_counter()
        loaded = await asyncio.to_thread(
            load_ct2, self._path, self._cache_dir, self._threads, self._compute_type, self._lanes
        )
        queue = _Batches(
            loaded,
            self._context_tokens,
            self._metrics,
            self._max_active,
            self._max_waiting,
            self._sampling.top_k,
            self._cached_openings,
            self._gather_s,
            self._lanes,
            self._step_aside,
        )
        queue.start()
        self._log_ready(f"CTranslate2 {self._compute_type}", started, loaded.folder, loaded.converted)
        return queue
