"""The socket writer of ``WS /api/asr-streaming`` stops when its stream ends, even when the end
(a cancel) comes just as a send completes: on Python 3.11 ``asyncio.wait_for`` returned the send's
result then, and the writer went on waiting for messages, so a refused stream never got its
``Error`` (seen about once in 15 runs of the paged-KV refusal test on a loaded machine)."""

from __future__ import annotations

import asyncio

import pytest

from rtserve.web.asr_streaming.routes import _Outbox, _write


class _SocketSendingWhenTold:
    def __init__(self, sent: asyncio.Future[None]) -> None:
        self._sent = sent

    async def send_bytes(self, data: bytes) -> None:
        await self._sent


async def test_a_writer_cancelled_as_its_send_completes_stops() -> None:
    sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    outbox = _Outbox(4)
    outbox.put(b"Ready")
    writer = asyncio.create_task(_write(_SocketSendingWhenTold(sent), outbox, 5.0))  # type: ignore[arg-type]
    for _ in range(3):  # the writer is inside its send
        await asyncio.sleep(0)
    sent.set_result(None)  # the send completes and the stream ends in the same loop turn
    writer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(writer, 2.0)
