"""What a batched LLM runtime hands to the transformers round-robin runtime (``llm.SmolLlm``).

Function calls need llguidance's mask on every step's logits, and a seeded sampled request needs
a random stream of its own; a batch samples every request inside one library call with one
stream, so neither fits it. Such requests go to a ``SmolLlm``, started on the first of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from rtserve.engines.cascade.llm import SmolLlm
from rtserve.engines.cascade.llm_loading import LoadedLlm
from rtserve.engines.cascade.llm_stage import GREEDY_BELOW, LlmRequest, LlmStage
from rtserve.engines.cascade.tool_calls import uses_tools
from rtserve.engines.errors import EngineError
from rtserve.engines.values import ChatMessage, SamplingParams, TokenDelta


def needs_transformers(params: SamplingParams) -> bool:
    """Requests a batched runtime hands to transformers: tools offered, or seeded sampling."""
    return uses_tools(params) or (params.seed is not None and params.temperature >= GREEDY_BELOW)


class HandsOffToTransformers(LlmStage):
    """An ``LlmStage`` whose ``needs_transformers`` requests are decoded by a ``SmolLlm``;
    ``request_kind``: the runtime's own request class, for the others."""

    request_kind: type[LlmRequest]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._constrained: SmolLlm | None = None
        self._constrained_lock = asyncio.Lock()

    def _shared_model(self) -> LoadedLlm | None:
        """A transformers model this runtime loaded already, for the handed-off requests (None: they load one)."""
        return None

    async def constrained(self) -> SmolLlm:
        """The transformers runtime for ``needs_transformers`` requests (started on first use)."""
        async with self._constrained_lock:
            if self._constrained is None:
                stage = SmolLlm(
                    self._location,
                    cache_dir=self._cache_dir,
                    cpu_threads=self._cpu_threads,
                    max_active=self._max_active,
                    max_waiting=self._max_waiting,
                    context_tokens=self._context_tokens,
                    metrics=self._metrics,
                    sampling=self._sampling,
                    shared=self._shared_model(),
                )
                await stage.start()
                self._constrained = stage
            return self._constrained

    async def _submit(self, request: LlmRequest) -> None:
        if needs_transformers(request.params):
            stage = await self.constrained()
            await stage._submit(request)
            return
        await super()._submit(request)

    def stop(self) -> None:
        super().stop()
        if self._constrained is not None:
            self._constrained.stop()

    async def release(self) -> None:
        await super().release()
        constrained, self._constrained = self._constrained, None
        if constrained is not None:
            await constrained.release()

    def new_request(
        self,
        messages: tuple[ChatMessage, ...],
        params: SamplingParams,
        fit_history: bool,
        deliver: Callable[[TokenDelta | EngineError], None],
    ) -> LlmRequest:
        if needs_transformers(params):  # decoded by the transformers runtime: its request kind
            return SmolLlm.new_request(messages, params, fit_history, deliver)
        return self.request_kind(messages, params, fit_history, deliver)
