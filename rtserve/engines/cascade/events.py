"""The one-reader channel from a cascade session to the session core.

Two lanes, read control-first:

* input events (speech started/stopped, transcripts): never wait, so a barge-in's
  ``SpeechStarted`` is never stuck behind queued reply audio. A newer re-decoded partial
  transcript replaces an unread older one (a partial that ``extends`` the others never does);
  past ``max_control`` unread events the oldest is dropped.
* reply output (text, audio, response end): bounded by queued audio samples; a producer
  over the bound waits (backpressure reaches the TTS, then the LLM).

``fence(epoch)`` drops queued reply output of older epochs at once, and every later put of
an older epoch is discarded, so nothing of a cancelled reply is read after it returns.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from rtserve.engines.events import (
    EngineEvent,
    InputTranscript,
    OutputAudio,
    OutputText,
    OutputToolCall,
    ResponseFinished,
)

log = logging.getLogger(__name__)

ReplyEvent = OutputAudio | OutputText | ResponseFinished | OutputToolCall


class EventChannel:
    def __init__(self, max_output_samples: int, max_control: int = 64) -> None:
        self._max_samples = max_output_samples
        self._max_control = max_control
        self._control: deque[EngineEvent] = deque()
        self._output: deque[ReplyEvent] = deque()
        self._samples = 0
        self._fence = 0
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._closed = False

    @property
    def queued_samples(self) -> int:
        return self._samples

    def put_control(self, event: EngineEvent) -> None:
        if self._closed:
            return
        last = self._control[-1] if self._control else None
        if isinstance(event, InputTranscript) and isinstance(last, InputTranscript) and not (event.final or last.final):
            self._control.pop()  # unread growth merges into one partial: it adds the same text
            event = InputTranscript(last.text + event.text, final=False)
        if len(self._control) >= self._max_control:
            log.warning("session core is not reading engine events; dropped %s", type(self._control[0]).__name__)
            self._control.popleft()
        self._control.append(event)
        self._readable.set()

    async def put_output(self, event: ReplyEvent) -> None:
        while self._samples >= self._max_samples and not self._closed and event.epoch >= self._fence:
            self._writable.clear()
            await self._writable.wait()
        if self._closed or event.epoch < self._fence:
            return
        self._output.append(event)
        self._samples += _samples(event)
        self._readable.set()

    def put_finished(self, event: ResponseFinished) -> None:
        """A response end for a reply cancelled by a newer one: carries no audio, so never waits."""
        if not self._closed and event.epoch >= self._fence:
            self._output.append(event)
            self._readable.set()

    def fence(self, epoch: int) -> None:
        """Drop queued reply output older than ``epoch``; refuse it from now on."""
        self._fence = max(self._fence, epoch)
        kept = [e for e in self._output if e.epoch >= self._fence]
        self._output = deque(kept)
        self._samples = sum(_samples(e) for e in kept)
        self._writable.set()

    async def get(self) -> EngineEvent | None:
        """The next event, control first; ``None`` once closed."""
        while True:
            if self._control:
                return self._control.popleft()
            if self._output:
                event = self._output.popleft()
                self._samples -= _samples(event)
                if self._samples < self._max_samples:
                    self._writable.set()
                return event
            if self._closed:
                return None
            self._readable.clear()
            await self._readable.wait()

    def close(self) -> None:
        self._closed = True
        self._readable.set()
        self._writable.set()


def _samples(event: ReplyEvent) -> int:
    return len(event.pcm) if isinstance(event, OutputAudio) else 0
