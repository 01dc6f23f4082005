"""The inactivity timeout: a session nobody uses gives its slot back (docs/sessions.md#close-and-expiry).

Not OpenAI's ``idle_timeout_ms`` (``idle_timer.py``), which answers a user's silence with a
response; this one ends the session. A session is inactive while no client event arrives,
no response is in progress (the eternal response of a lockstep session does not count),
no committed turn waits for its transcript, and its output buffer holds nothing for the
client. Each client event restarts the wait, and so does the end of a response; at the
deadline, work still in progress or output still unsent holds it (the wait starts over),
so a session ends only after a whole ``sessions.inactivity_timeout_s`` with none of them.

One sleeping task per session: a client event only moves a timestamp (audio appends
arrive every 20 ms and must not create tasks). The check comes back through the runner's
mailbox, so it is applied in order with everything else.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from rtserve.clock import Clock


@dataclass(frozen=True)
class InactivityCheck:
    """The inactivity deadline came: the runner asks ``InactivityTimeout.expired``."""


class InactivityTimeout:
    def __init__(
        self,
        *,
        timeout_s: float | None,
        clock: Clock,
        busy: Callable[[], bool],
        post: Callable[[object], None],
        spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[None]],
    ) -> None:
        """``busy``: the session has work in progress or output unsent (the wait is held)."""
        self.timeout_s = timeout_s
        self._clock = clock
        self._busy = busy
        self._post = post
        self._spawn = spawn
        self._last_activity = clock.monotonic()

    def start(self) -> None:
        if self.timeout_s is not None:
            self._arm(self.timeout_s)

    def on_activity(self) -> None:
        """A client event arrived, or a response ended: the wait starts over."""
        self._last_activity = self._clock.monotonic()

    def expired(self) -> bool:
        """At a check: True when the session was inactive for the whole timeout (it must end);
        otherwise the next check is armed."""
        assert self.timeout_s is not None
        now = self._clock.monotonic()
        if self._busy():
            self._last_activity = now
        left = self._last_activity + self.timeout_s - now
        if left <= 0:
            return True
        self._arm(left)
        return False

    def _arm(self, delay_s: float) -> None:
        self._spawn(self._wait(delay_s))

    async def _wait(self, delay_s: float) -> None:
        await self._clock.sleep(delay_s)
        self._post(InactivityCheck())
