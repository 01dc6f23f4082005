"""Input backpressure in front of a session's mailbox (docs/sessions.md#input-backpressure).

An ``AppendAudio`` reserves its bytes and a ``Commit`` one pending turn when admitted;
the runner releases the reservation when it dequeues the command. Checks are inclusive:
``reserved + new <= limit`` is admitted.
"""

from __future__ import annotations

from rtserve.sessions.commands import AppendAudio, Command, Commit


class InputGate:
    def __init__(self, max_pending_bytes: int, max_pending_turns: int) -> None:
        self.max_pending_bytes = max_pending_bytes
        self.max_pending_turns = max_pending_turns
        self.pending_input_bytes = 0
        self.pending_input_turns = 0

    def admit(self, command: Command) -> bool:
        """Reserve what ``command`` needs; False (nothing reserved) when over a limit."""
        if isinstance(command, AppendAudio):
            size = command.input_bytes
            if self.pending_input_bytes + size > self.max_pending_bytes:
                return False
            self.pending_input_bytes += size
        elif isinstance(command, Commit):
            if self.pending_input_turns + 1 > self.max_pending_turns:
                return False
            self.pending_input_turns += 1
        return True

    def release(self, command: Command) -> None:
        """Give back what ``admit`` reserved for ``command`` (the runner dequeued it)."""
        if isinstance(command, AppendAudio):
            self.pending_input_bytes -= command.input_bytes
        elif isinstance(command, Commit):
            self.release_pending_turn()

    def release_pending_turn(self) -> None:
        self.pending_input_turns -= 1
