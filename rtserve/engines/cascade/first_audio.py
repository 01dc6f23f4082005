"""The work voice turns' first audio waits for, so that later work steps aside on a busy CPU.

Why: on two cores, when several turns end together, their final transcripts and first spoken
pieces queue on the ASR and TTS lanes while the LLM lanes decode the rest of the replies that
are already speaking; those decodes took about half a core from every first piece's render
(benchmarks/notes/voice_agent_quality.md, "Later work steps aside"). The rest of a reply is
not late yet: its first piece plays for a second or more.

``FirstAudioWork`` counts such jobs from the moment they are queued until they end: the
high-priority jobs of the ASR and TTS lanes (``ModelWorker(first_audio=...)``: finals and pause
transcripts, first spoken pieces). The CTranslate2 LLM pauses a batch whose every reply is past
its first piece (``cascade.llm_first_piece_tokens``) while any is pending, at most
``cascade.llm_step_aside_ms`` in all per reply (docs/engines.md#cascade-cores).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


class FirstAudioWork:
    def __init__(self) -> None:
        self._pending = 0
        self._changed = threading.Condition()

    @property
    def pending(self) -> int:
        """Jobs queued or running that some turn's first audio waits for (a hint: read unlocked)."""
        return self._pending

    def begin(self) -> None:
        with self._changed:
            self._pending += 1

    def end(self) -> None:
        with self._changed:
            self._pending -= 1
            if self._pending == 0:
                self._changed.notify_all()

    def wait_clear(self, timeout_s: float) -> float:
        """Block until nothing is pending or ``timeout_s`` passed; the seconds waited."""
        started = time.monotonic()
        with self._changed:
            self._changed.wait_for(lambda: self._pending == 0, timeout_s)
        return time.monotonic() - started


@dataclass(frozen=True)
class StepAside:
    """When an LLM's decoding steps aside for ``work``: a batch whose every reply has
    ``first_piece_tokens`` tokens pauses while work is pending, up to ``budget_s`` in all per reply."""

    work: FirstAudioWork
    first_piece_tokens: int
    budget_s: float
