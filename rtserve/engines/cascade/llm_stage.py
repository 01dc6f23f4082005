"""What every LLM runtime of the cascade shares: requests, admission, prompts, text deltas, the async API.

A runtime (``llm.SmolLlm``: transformers; ``llm_ct2.Ct2Llm``: CTranslate2) owns ONE decode
thread that serves a bounded queue (``DecodeQueue``): up to ``config.cascade.llm_max_active``
requests are decoded together, up to ``llm_max_waiting`` more wait, beyond that a request
fails at once with ``resource_exhausted``. The runtime only says how a request is loaded,
prefilled and advanced; the chat template and history fitting (``Prompter``), the cut at
stop strings and the hold-back of partial characters (``text_delta``), and the streamed,
cancellable ``generate`` (``LlmStage``) are the same for all of them, so the runtimes
answer the same request with the same deltas.

Cancellation: closing the ``generate`` iterator (or cancelling the task iterating it)
flags the request; the thread drops it before its next token.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from rtserve.engines.cascade.errors import EngineSleeping, ModelNotReady
from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.cascade.model_paths import ModelLocation
from rtserve.engines.cascade.prompt_fit import fit_prompt, max_token_chars, turn_overhead
from rtserve.engines.cascade.tool_calls import CALL_OPEN, forced, render, template_knows_tools
from rtserve.engines.errors import CapacityExhausted, EngineError
from rtserve.engines.tools import check_tools
from rtserve.engines.values import ChatMessage, SamplingParams, TokenDelta
from rtserve.errors import GENERATION_FAILED, INVALID_VALUE

log = logging.getLogger(__name__)

Finish = Literal["stop", "length", "tool_calls"]
GREEDY_BELOW = 1e-5  # temperatures this small mean argmax


def check_params(params: SamplingParams) -> None:
    problems = []
    if not 0.0 <= params.temperature <= 2.0:
        problems.append(f"temperature must be in [0, 2], got {params.temperature}")
    if not 0.0 < params.top_p <= 1.0:
        problems.append(f"top_p must be in (0, 1], got {params.top_p}")
    if params.max_tokens < 1:
        problems.append(f"max_tokens must be at least 1, got {params.max_tokens}")
    if problems:
        raise EngineError("; ".join(problems), code=INVALID_VALUE)


@dataclass(frozen=True)
class SamplingLimits:
    """The embedded model's sensible sampling range (``config.cascade.llm_max_temperature``,
    ``llm_max_top_p``): a request asking for more is decoded at the bound. Small models
    (135M parameters) drift into nonsense at the temperatures chat clients default to.
    ``top_k`` (``llm_top_k``, 0 = off) limits every sampled token to the k most likely
    before ``top_p`` applies: the tail of a 49k vocabulary holds next to no probability,
    and sorting all of it every step costs batched CTranslate2 a third of its throughput."""

    max_temperature: float = 2.0
    max_top_p: float = 1.0
    top_k: int = 0

    def apply(self, params: SamplingParams) -> SamplingParams:
        if params.temperature <= self.max_temperature and params.top_p <= self.max_top_p:
            return params
        return replace(
            params, temperature=min(params.temperature, self.max_temperature), top_p=min(params.top_p, self.max_top_p)
        )


@dataclass(eq=False)
class LlmRequest:
    messages: tuple[ChatMessage, ...]
    params: SamplingParams
    fit_history: bool
    deliver: Callable[[TokenDelta | EngineError], None]  # thread-safe hand-off to the event loop
    cancelled: bool = False
    # Decode state, touched only on the LLM thread:
    prompt_tokens: int = 0
    generated: list[int] = field(default_factory=list)
    emitted_chars: int = 0


def text_delta(
    request: LlmRequest, text: str, finish: Finish | None, *, visible: int | None = None, call: Any = None
) -> TokenDelta | None:
    """The part of ``text`` (all generated text so far) not yet delivered, cut at a stop
    string; while unfinished, a tail that could still become a stop string (or, before
    ``visible``, a call marker) and an incomplete multi-byte character are held back."""
    params = request.params
    for stop in params.stop:
        at = text.find(stop, max(0, request.emitted_chars - len(stop)))
        if stop and at >= 0:
            text, finish = text[:at], "stop"
    end = len(text)
    if finish is None:
        if text.endswith("\ufffd") and call is None:  # a multi-byte character is still incomplete
            return None
        end = min(end - max((len(s) - 1 for s in params.stop), default=0), end if visible is None else visible)
    delta = text[request.emitted_chars : end] if end > request.emitted_chars else ""
    request.emitted_chars = max(request.emitted_chars, end)
    if not delta and finish is None and call is None:
        return None
    return TokenDelta(
        delta,
        finish_reason=finish,
        prompt_tokens=request.prompt_tokens,
        completion_tokens=len(request.generated),
        tool_call=call,
    )


def eos_ids(tokenizer: Any, generation_eos: int | list[int] | None) -> frozenset[int]:
    """The ids that end a reply: the generation config's and the tokenizer's."""
    ids = set(
        generation_eos if isinstance(generation_eos, list) else [generation_eos] if generation_eos is not None else []
    )
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


class Prompter:
    """Chat-templated prompt ids within the context budget (tokenizer work only)."""

    def __init__(self, tokenizer: Any, context_tokens: int) -> None:
        self.tokenizer = tokenizer
        self.context_tokens = context_tokens
        self.native_tools = template_knows_tools(tokenizer)
        self._token_chars = max_token_chars(tokenizer.get_vocab())
        self._turn_overhead = turn_overhead(self._render, self._count)

    def prompt_ids(
        self,
        messages: Sequence[ChatMessage],
        max_tokens: int,
        fit_history: bool,
        params: SamplingParams = SamplingParams(),
    ) -> list[int]:
        """The chat-templated prompt; with ``fit_history`` the oldest turns go until it fits
        (``prompt_fit``: tokenizer work bounded by the budget). Tools, calls and results are
        rendered by ``tool_calls.render``; a forced call's marker ends the prompt."""
        turns, tools = render(messages, params, self.native_tools)
        suffix = self._suffix(params)
        return fit_prompt(
            turns,
            context=self.context_tokens,
            max_tokens=max_tokens,
            fit_history=fit_history,
            render=lambda kept: self._render(kept, tools, suffix),
            count=self._count,
            token_chars=self._token_chars,
            overhead=self._turn_overhead,
        )

    def whole_prompt_ids(self, messages: Sequence[ChatMessage], params: SamplingParams) -> list[int]:
        """The chat-templated prompt of every turn, however long (what ``/tokenize`` counts)."""
        turns, tools = render(messages, params, self.native_tools)
        return self._render(turns, tools, self._suffix(params))

    def text_ids(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def _suffix(self, params: SamplingParams) -> list[int]:
        """A forced call's marker, which ends its prompt."""
        return self.tokenizer.encode(CALL_OPEN + "\n", add_special_tokens=False) if forced(params) else []

    def opening_length(self, messages: Sequence[ChatMessage], params: SamplingParams, prompt: Sequence[int]) -> int:
        """How many leading ids of ``prompt`` every conversation with the same system message
        (or, without one, every conversation) starts with: the template's opening and the system
        turn, up to the first user turn's text. Found as the common prefix with a probe
        conversation (that system message, then an empty user turn), so it holds for any template."""
        system = messages[:1] if messages and messages[0].role == "system" else ()
        turns, tools = render(system, params, self.native_tools)
        probe = self._render([*turns, {"role": "user", "content": ""}], tools)
        shared = 0
        for ours, theirs in zip(prompt, probe):
            if ours != theirs:
                break
            shared += 1
        return shared

    def _count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def _render(
        self, turns: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, suffix: Sequence[int] = ()
    ) -> list[int]:
        """Token ids of ``turns`` with the generation prompt (``tools`` for a template that takes
        them), then ``suffix``."""
        return list(
            self.tokenizer.apply_chat_template(
                turns, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        ) + list(suffix)


class DecodeQueue(ABC):
    """The dedicated LLM threads' bounded intake; ``serve`` is the runtime's decode loop, run by
    each of ``lanes`` threads at once (each decodes up to ``lane_capacity`` requests, its share
    of ``max_active``); ``prompter``: its model's prompts (set by each runtime)."""

    prompter: Prompter

    def __init__(self, max_active: int, max_waiting: int, gather_s: float = 0.0, lanes: int = 1) -> None:
        self.max_active = max_active
        self.lane_capacity = -(-max_active // lanes)
        self._max_waiting = max_waiting
        self._gather_s = gather_s  # an idle loop waits this long after a first request for others
        self._waiting: deque[LlmRequest] = deque()
        self._active_counts: dict[int, int] = {}  # per lane thread, written by it under the lock
        self._cond = threading.Condition()
        self._stopping = False
        self._stop_reason: EngineError = ModelNotReady("the language model stopped")
        self._threads = [
            threading.Thread(target=self._thread_main, name=f"rtserve-llm-{lane}", daemon=True) for lane in range(lanes)
        ]
        self._lanes_running = 0
        self._idle_lanes = 0  # lanes blocked in ``admit`` with nothing to decode

    def start(self) -> None:
        self._lanes_running = len(self._threads)
        for thread in self._threads:
            thread.start()

    def submit(self, request: LlmRequest) -> None:
        with self._cond:
            if self._stopping:
                raise ModelNotReady("the language model is shutting down")
            running = sum(self._active_counts.values())
            if len(self._waiting) + running >= self._max_waiting + self.max_active:
                raise CapacityExhausted(
                    f"the language model is busy ({running} requests running, "
                    f"{len(self._waiting)} waiting); retry shortly"
                )
            self._waiting.append(request)
            self._cond.notify()

    def stop(self, reason: EngineError | None = None) -> None:
        """End the thread; requests still waiting or running get ``reason``."""
        with self._cond:
            self._stopping = True
            self._stop_reason = reason or ModelNotReady("the language model stopped")
            self._cond.notify_all()

    def join(self, timeout: float | None = None) -> None:
        for thread in self._threads:
            if thread.ident is not None:
                thread.join(timeout)

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def has_waiting(self) -> bool:
        """Requests wait for admission that no idle lane is about to take (a lock-free read, for
        a decode loop deciding to yield)."""
        return bool(self._waiting) and not self._stopping and not self._idle_lanes

    def admit(self, active: Sequence[LlmRequest]) -> list[LlmRequest] | None:
        """Block until there is work; the newly admitted requests (up to ``lane_capacity`` in
        the calling lane), or None once stopping (then every waiting and ``active`` request gets
        the stop reason). With ``gather_s``, work that arrives at an idle lane waits up to that
        long for more (until ``lane_capacity`` wait), so that a burst starts as one batch per lane."""
        lane = threading.get_ident()
        with self._cond:
            self._active_counts[lane] = len(active)
            if not active:
                self._idle_lanes += 1
                while not self._stopping and not self._waiting:
                    self._cond.wait()
                if self._gather_s > 0:  # idle until now: let a burst of requests start as one batch
                    deadline = time.monotonic() + self._gather_s
                    while (
                        not self._stopping
                        and 0 < len(self._waiting) < self.lane_capacity
                        and (left := deadline - time.monotonic()) > 0
                    ):
                        self._cond.wait(left)
                self._idle_lanes -= 1
            if self._stopping:
                pending = list(self._waiting) + list(active)
                self._waiting.clear()
                for request in pending:
                    request.deliver(self._stop_reason)
                return None
            admitted: list[LlmRequest] = []
            while self._waiting and len(active) + len(admitted) < self.lane_capacity:
                admitted.append(self._waiting.popleft())
            self._active_counts[lane] = len(active) + len(admitted)
            if self._waiting:
                self._cond.notify()  # another lane may be idle
            return admitted

    def _thread_main(self) -> None:
        try:
            self.serve()
        except Exception:  # a bug in the loop: nobody may wait forever on it
            log.exception("the LLM decode loop failed")
            self.stop(EngineError("the language model failed", code=GENERATION_FAILED))
            self.admit(())
        finally:
            with self._cond:
                self._lanes_running -= 1
                last = self._lanes_running == 0
            if last:  # the other lanes may still be inside a model call until they see the stop
                self.release_model()

    @abstractmethod
    def serve(self) -> None:
        """The decode loop: ``admit`` until it returns None."""

    @abstractmethod
    def release_model(self) -> None:
        """Drop the model with the last lane (sleep mode frees it)."""


def fail_request(request: LlmRequest, exc: Exception) -> None:
    """Deliver a prefill/step failure to its request (typed errors as they are)."""
    if isinstance(exc, EngineError):
        request.deliver(exc)
        return
    log.error("LLM generation failed", exc_info=exc)
    request.deliver(EngineError("text generation failed", code=GENERATION_FAILED))


class LlmStage(ABC):
    """The ``LLMEngine`` of the cascade: streamed, cancellable chat generation over one runtime."""

    stage = "llm"  # sleep mode (``SleepStage``): release frees the model, restore loads it again
    supports_vision = False  # user messages may carry images (``llm_vision``)

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
    ) -> None:
        self.model_name = location.model_id
        self._location = location
        self._path = location.path
        self._cache_dir = cache_dir
        self._cpu_threads = cpu_threads
        self._context_tokens = context_tokens
        self._metrics = metrics
        self._max_active, self._max_waiting = max_active, max_waiting
        self._sampling = sampling
        self._queue: DecodeQueue | None = None
        self._ready = False
        self._asleep = False

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def asleep(self) -> bool:
        return self._asleep

    def _log_ready(self, runtime: str, started: float, folder: Path, converted: bool) -> None:
        """One line per start: the runtime, its load time since ``started`` and the folder it loaded."""
        log.info(
            "LLM %s (%s) ready in %.1f s (from %s%s)",
            self.model_name,
            runtime,
            time.perf_counter() - started,
            folder,
            ", converted now" if converted else "",
        )

    @abstractmethod
    async def _open(self) -> DecodeQueue:
        """Load the model (converting and caching it on first use); a started queue over it."""

    async def start(self) -> None:
        self._queue = await self._open()
        self._ready = True

    def stop(self) -> None:
        """Stop decoding and wait for the thread to let go of the model (it ends at its next
        token): a native runtime torn down by the interpreter's exit instead aborts the process."""
        self._ready = False
        if self._queue is not None:
            self._queue.stop()
            self._queue.join()

    async def release(self) -> None:
        """The decode thread ends (its requests get engine_sleeping) and takes the model with it."""
        self._asleep = True
        self._ready = False
        queue, self._queue = self._queue, None
        if queue is not None:
            queue.stop(EngineSleeping())
            await asyncio.to_thread(queue.join)

    async def restore(self) -> None:
        await self.start()
        self._asleep = False

    def _queue_for(self, params: SamplingParams) -> DecodeQueue:
        """The queue that decodes ``params`` (a runtime may hand some requests to another)."""
        assert self._queue is not None
        return self._queue

    async def generate(
        self, messages: Sequence[ChatMessage], params: SamplingParams, *, fit_history: bool = False
    ) -> AsyncGenerator[TokenDelta, None]:
        """Token deltas; the last carries ``finish_reason`` and usage counts.

        ``fit_history`` (used by voice sessions) drops the oldest non-system messages when
        the conversation outgrows the context; without it that is ``context_length_exceeded``.
        """
        self._check_ready()
        check_params(params)
        check_tools(params.tools, params.tool_choice)  # transports checked already; a direct caller may not have
        if not messages:
            raise EngineError("messages must not be empty", code=INVALID_VALUE)
        params = self._sampling.apply(params)
        loop = asyncio.get_running_loop()
        deltas: asyncio.Queue[TokenDelta | EngineError] = asyncio.Queue()  # <= max_tokens + 1 items

        def deliver(item: TokenDelta | EngineError) -> None:
            try:
                loop.call_soon_threadsafe(deltas.put_nowait, item)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                request.cancelled = True

        request = self.new_request(tuple(messages), params, fit_history, deliver)
        await self._submit(request)
        try:
            while True:
                item = await deltas.get()
                if isinstance(item, EngineError):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            request.cancelled = True

    def _check_ready(self) -> DecodeQueue:
        """The running queue, or why there is none (asleep, or still loading)."""
        if not self._ready or self._queue is None:
            raise EngineSleeping() if self._asleep else ModelNotReady("the language model is still loading")
        return self._queue

    async def _submit(self, request: LlmRequest) -> None:
        self._queue_for(request.params).submit(request)

    async def tokenize(
        self, prompt: Sequence[ChatMessage] | str, params: SamplingParams, *, add_special_tokens: bool = False
    ) -> list[int]:
        """``CountsTokens``: tokenizer work only, on a thread (a long conversation's template
        takes milliseconds), beside the decode threads."""
        prompter = self._check_ready().prompter
        if isinstance(prompt, str):
            return await asyncio.to_thread(prompter.text_ids, prompt, add_special_tokens)
        check_tools(params.tools, params.tool_choice)
        return await asyncio.to_thread(prompter.whole_prompt_ids, prompt, params)

    async def context_tokens(self) -> int | None:
        return self._queue.prompter.context_tokens if self._ready and self._queue is not None else None

    @abstractmethod
    def new_request(
        self,
        messages: tuple[ChatMessage, ...],
        params: SamplingParams,
        fit_history: bool,
        deliver: Callable[[TokenDelta | EngineError], None],
    ) -> LlmRequest:
        """A request of this runtime's kind."""
