"""OpenAI ``server_vad`` ``idle_timeout_ms``: a response the user's silence triggers.

OpenAI starts the timer when the last response's audio has finished playing (its
``response.done`` plus the playback still ahead of the client) and, when no speech starts
before it runs out, sends ``input_audio_buffer.timeout_triggered``, commits the input
buffer and answers (the model "prompts the user to continue"). Playback is estimated
from the audio sent: it began with the response's first audio and lasts as long as that
audio. Speech, a commit or a new response disarm the timer; a generation counter voids
a timer that fires after it was disarmed (the fire comes back through the runner's
mailbox, so it is applied in order with everything else).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from rtserve.clock import Clock


@dataclass(frozen=True)
class IdleTimeoutFired:
    generation: int


class IdleTimer:
    def __init__(
        self,
        *,
        clock: Clock,
        post: Callable[[object], None],
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]],
    ) -> None:
        self._clock = clock
        self._post = post
        self._spawn = spawn
        self._generation = 0
        self._task: asyncio.Task[None] | None = None
        self._first_audio_at: float | None = None  # of the response now being answered

    def on_agent_audio(self) -> None:
        """Agent audio went out: the client's playback of this response starts now (at the latest)."""
        if self._first_audio_at is None:
            self._first_audio_at = self._clock.monotonic()

    def arm(self, timeout_ms: int, audio_ms: float) -> None:
        """A response finished with ``audio_ms`` of audio: fire ``timeout_ms`` after its playback ends."""
        now = self._clock.monotonic()
        started = self._first_audio_at if self._first_audio_at is not None else now
        playback_left_s = max(0.0, started + audio_ms / 1000.0 - now)
        self.disarm()
        generation = self._generation
        self._task = self._spawn(self._wait(generation, playback_left_s + timeout_ms / 1000.0))

    def disarm(self) -> None:
        self._generation += 1
        self._first_audio_at = None
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def is_current(self, fired: IdleTimeoutFired) -> bool:
        return fired.generation == self._generation

    async def _wait(self, generation: int, delay_s: float) -> None:
        await self._clock.sleep(delay_s)
        self._post(IdleTimeoutFired(generation))
