"""The user side of one session: audio pushed since the last commit, the item server VAD
is building, the turn count, and committed turns still waiting for their final transcript.

Plain bookkeeping, kept apart so responses can ask "is a transcript still pending?"
without knowing how turns are committed (docs/sessions.md#responses-and-epochs).
"""

from __future__ import annotations

from collections import deque

from rtserve.sessions.ids import new_item_id


class InputLedger:
    def __init__(self) -> None:
        self.turn_id = 0
        self.uncommitted_ms = 0.0
        self.received_ms = 0.0  # all input audio so far: the end of the session's input timeline
        self.speech_item_id: str | None = None
        self.awaiting_transcripts: deque[str] = deque()

    def speech_item(self) -> str:
        """The item id of the speech being heard, named on first use."""
        if self.speech_item_id is None:
            self.speech_item_id = new_item_id()
        return self.speech_item_id

    def clear_uncommitted(self) -> None:
        self.uncommitted_ms = 0.0
        self.speech_item_id = None

    def commit(self) -> tuple[str, float]:
        """Start the next turn from the uncommitted audio: its item id and duration. The turn
        then waits for its final transcript."""
        item_id, audio_ms = self.speech_item_id or new_item_id(), self.uncommitted_ms
        self.clear_uncommitted()
        self.turn_id += 1
        self.awaiting_transcripts.append(item_id)
        return item_id, audio_ms
