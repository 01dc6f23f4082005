"""When one session's voice turns reach each stage: the per-route stage histograms
(``rtserve_cascade_turn_seconds{route,stage}``; docs/engines.md#cascade-turn-metrics).

End of speech is the moment the VAD last heard the user speak in the turn (when that audio
was analysed, so a VAD backlog makes it late, never early); a turn without server VAD ends
at its commit. From there: ``transcript`` (the final transcript is out) and ``first_audio``
(the reply to that turn has its first audio chunk out). ``barge_in_cut``: speech detected
over a running reply -> that reply fenced off (the session core's ``set_epoch``).
"""

from __future__ import annotations

import time

from prometheus_client import Histogram

_MAX_SEALED = 16  # ended turns remembered until their commit (a session keeps a few pending at most)


class TurnClock:
    def __init__(self, turn_seconds: Histogram, route: str) -> None:
        self._transcript = turn_seconds.labels(route, "transcript")
        self._first_audio = turn_seconds.labels(route, "first_audio")
        self._cut = turn_seconds.labels(route, "barge_in_cut")
        self._heard_at: float | None = None  # the user's latest speech in the current turn
        self._sealed_at: dict[int, float] = {}  # turn id -> end of speech, until committed
        self._answering: float | None = None  # end of speech of the turn the next reply answers
        self._barge_at: float | None = None

    def heard_speech(self) -> None:
        self._heard_at = time.perf_counter()

    def sealed(self, turn_id: int) -> None:
        """The VAD ended turn ``turn_id``; its speech ended when last heard."""
        self._sealed_at[turn_id] = self._heard_at or time.perf_counter()
        self._heard_at = None
        while len(self._sealed_at) > _MAX_SEALED:  # turns cleared or never committed: oldest first
            del self._sealed_at[next(iter(self._sealed_at))]

    def transcribed(self, turn_id: int | None) -> None:
        """The final transcript of ``turn_id`` (None: a turn committed without server VAD) is out."""
        now = time.perf_counter()
        ended = self._sealed_at.pop(turn_id, now) if turn_id is not None else now
        self._heard_at = None
        self._transcript.observe(now - ended)
        self._answering = ended

    def reply_started(self) -> float | None:
        """A reply starts: the end of speech it answers (None: not a voice turn's reply)."""
        ended, self._answering, self._barge_at = self._answering, None, None
        return ended

    def first_audio(self, ended: float | None) -> None:
        """The first audio of the reply that answers speech ended at ``ended`` is out."""
        if ended is not None:
            self._first_audio.observe(time.perf_counter() - ended)

    def speech_started(self, replying: bool) -> None:
        """The VAD heard the user start; over a running reply that is a barge-in."""
        self._barge_at = time.perf_counter() if replying else None

    def reply_cut(self) -> None:
        """``set_epoch`` cancelled the running reply: after speech started, a barge-in."""
        if self._barge_at is not None:
            self._cut.observe(time.perf_counter() - self._barge_at)
            self._barge_at = None
