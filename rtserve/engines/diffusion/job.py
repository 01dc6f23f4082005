"""The handle of one request given to a ``StepBatcher``: its result, its progress, its cancel.

Written by the engine thread, read from the event loop: the progress counters are plain ints
(a read sees the last step's value), the result crosses with ``call_soon_threadsafe``, and
``cancel`` only sets a flag the engine thread reads at the next step boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from rtserve.engines.errors import EngineError
from rtserve.errors import CANCELLED, RtserveError

O = TypeVar("O")  # noqa: E741  # the model's output type


class DiffusionJob(Generic[O]):
    def __init__(
        self, loop: asyncio.AbstractEventLoop, on_progress: Callable[[DiffusionJob[O]], None] | None = None
    ) -> None:
        self._loop = loop
        self._future: asyncio.Future[O] = loop.create_future()
        self._cancelled = threading.Event()
        self.on_progress = on_progress  # called on the engine thread after each of this job's steps
        self.steps_done = 0
        self.steps_total: int | None = None  # known once the engine prepared the request

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Leave the queue, or the batch at the next step boundary; ``result`` raises ``CANCELLED``."""
        self._cancelled.set()
        self._settle(None, EngineError("the request was cancelled", code=CANCELLED))

    async def result(self) -> O:
        return await asyncio.shield(self._future)  # a cancelled waiter does not cancel the job's outcome

    # -- engine thread ------------------------------------------------------------------

    def progressed(self, steps_done: int, steps_total: int) -> None:
        self.steps_done, self.steps_total = steps_done, steps_total
        if self.on_progress is not None:
            self.on_progress(self)

    def succeed(self, output: O) -> None:
        self._settle(output, None)

    def fail(self, error: RtserveError) -> None:
        self._settle(None, error)

    def _settle(self, output: O | None, error: RtserveError | None) -> None:
        def settle() -> None:
            if self._future.done():
                return
            if error is not None:
                self._future.set_exception(error)
                self._future.exception()  # retrieved: a caller that stopped waiting logs nothing
            else:
                self._future.set_result(output)  # type: ignore[arg-type]  # output is set when error is None

        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            self._loop.call_soon_threadsafe(settle)
