"""Audio held to at most a few seconds ahead of real time: a cascade reply's
(``cascade.max_audio_ahead_s``) and a ``/api/tts_streaming`` stream's (``tts_streaming.max_audio_ahead_s``).

Speech is made faster than it plays, and everything made ahead of the listener waits somewhere
downstream. In the cascade: in the session's bounded output buffer (docs/sessions.md#output-buffer)
behind a WebRTC call's real-time track, or a page that plays as it receives; a long answer made
all at once would overflow that buffer and close a session whose client is doing nothing wrong.
Behind a TTS server's socket: in the kernel's buffers, megabytes on a local link, which a client
reading at playback pace drains tens of seconds later, so the server's close, an ``Error`` and
the kernel's room for the next send reach it that late (docs/serving.md#tts-streaming). So the
audio waits, between two chunks, while what was handed on is more than ``max_ahead_s`` ahead of
the time since its first chunk went out; the wait reaches back to the model through bounded
queues (a cascade session's input events, a barge-in's speech start, go on meanwhile on their
own lane).
"""

from __future__ import annotations

import asyncio


class AudioPace:
    def __init__(self, max_ahead_s: float, sample_rate: int) -> None:
        self._max_ahead_s = max_ahead_s
        self._rate = sample_rate
        self._clock = asyncio.get_running_loop().time
        self._started: float | None = None  # when the first chunk went out
        self._made_s = 0.0  # audio handed on so far

    async def hold(self, samples: int) -> None:
        """Before handing on a chunk of ``samples``: wait while the audio handed on so far is more
        than the bound ahead of real time."""
        now = self._clock()
        if self._started is None:
            self._started = now
        ahead_s = self._made_s - (now - self._started)
        if ahead_s > self._max_ahead_s:
            await asyncio.sleep(ahead_s - self._max_ahead_s)
        self._made_s += samples / self._rate
