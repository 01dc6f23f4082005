"""The app's one codec executor: a bounded thread pool for codec work that would stall the loop.

docs/design.md#nothing-blocks-the-event-loop: nothing blocking runs on the event loop; codec work over ~1 ms goes to the
worker's one codec executor. Every route sends such work here (Ogg-Opus pages, speech
encoding, upload decoding, parsing of large frames), so ``transport.codec_threads`` bounds
the CPU codecs take, whatever the mix of protocols.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class CodecExecutor:
    def __init__(self, threads: int) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="codec")

    async def run(self, work: Callable[..., T], *args: object) -> T:
        """``work(*args)`` on a codec thread, with the caller's context (its session id in log
        records). A caller that awaits each call before the next keeps its own calls in order."""
        call = functools.partial(contextvars.copy_context().run, work, *args)
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
