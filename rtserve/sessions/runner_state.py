"""The state of one session runner and how it emits events (duplex.md §3.2, §3.5).

The runner is the single writer of this state: everything here is mutated only by the
runner task, in mailbox order (see ``runner.py``). Every emitted event is stamped with
the current epoch. An output overflow applies the per-session policy of §3.5: the active
response fails and leaves history, its queued audio is dropped, ordinary events are
suppressed from then on, the error and the failed ``response.done`` use the reserve,
and the session is marked to close with ``output_backpressure``.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rtserve.clock import Clock
from rtserve.codecs.resample import StreamResampler
from rtserve.config import SessionLimits
from rtserve.engines.protocols import ChatMessage, EngineSession
from rtserve.sessions import commands as cmd
from rtserve.sessions import errors
from rtserve.sessions import events as ev
from rtserve.sessions.attachment import SessionOutlet
from rtserve.sessions.backpressure import InputGate
from rtserve.sessions.conversation import Conversation, ConversationItem
from rtserve.sessions.errors import OutputOverflowError
from rtserve.sessions.mailbox import Mailbox
from rtserve.sessions.metrics import SessionMetrics
from rtserve.sessions.session_config import SessionConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StopRequest:
    kind: str  # "closed" | "expired"
    reason: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class ActiveResponse:
    id: str
    item: ConversationItem
    modalities: tuple[str, ...]
    overrides: cmd.ResponseCreate | None
    continuous: bool
    resampler: StreamResampler | None
    engine_started: bool = False
    announced: bool = False  # response.created was queued: the client knows this response
    ending_queued: bool = False

    @property
    def audio(self) -> bool:
        return self.item.kind == "audio"


class RunnerState:
    """What one session is: config, epoch, turns, the active response, the conversation,
    the mailbox with its input gate, and the outlet its events leave through."""

    def __init__(self, *, session_id: str, engine: EngineSession, config: SessionConfig, limits: SessionLimits,
                 outlet: SessionOutlet, clock: Clock, metrics: SessionMetrics, resumable: bool,
                 on_closing: Callable[[RunnerState, StopRequest], None],
                 on_finished: Callable[[RunnerState, bool], None]) -> None:
        self.session_id = session_id
        self.engine = engine
        self.capabilities = engine.capabilities
        self.config = config
        self.limits = limits
        self.outlet = outlet
        self.clock = clock
        self.metrics = metrics
        self.resumable = resumable
        self._on_closing = on_closing
        self._on_finished = on_finished
        self.continuous = self.capabilities.mode == "lockstep"
        self.mailbox = Mailbox(limits.mailbox_size)
        self.gate = InputGate(limits.max_pending_input_bytes_per_session, limits.max_pending_turns_per_session)
        self.conversation = Conversation()
        self.epoch = 0
        self.turn_id = 0
        self.active: ActiveResponse | None = None
        self.closing = False
        self.output_failed = False
        self.stop_request: StopRequest | None = None  # the first close/expiry asked for from outside
        self._stop: StopRequest | None = None  # why the mailbox loop ends (a request, overflow, engine end)
        self.terminal: StopRequest | None = None  # what the terminal event says, once decided
        self._audible: deque[str] = deque(maxlen=8)  # responses whose audio may still be queued
        self._awaiting_transcripts: deque[str] = deque()
        self._speech_item_id: str | None = None
        self._uncommitted_ms = 0.0
        self._deferred_response = False
        self._side_tasks: set[asyncio.Task[None]] = set()
        self._transcript_timers: dict[str, asyncio.Task[None]] = {}
        self._public_capabilities = self.capabilities.public()
        self._main: asyncio.Task[None] | None = None
        self._pump: asyncio.Task[None] | None = None
        self.close_task: asyncio.Task[None] | None = None
        self.finished: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    def snapshot(self) -> ev.SessionSnapshot:
        return ev.SessionSnapshot(id=self.session_id, config=self.config, capabilities=self._public_capabilities,
                                  epoch=self.epoch, turn_id=self.turn_id, resumable=self.resumable)

    @property
    def history(self) -> tuple[ChatMessage, ...]:
        return self.conversation.history()

    @property
    def active_response_id(self) -> str | None:
        return None if self.active is None else self.active.id

    def _emit(self, event: ev.SessionEvent) -> bool:
        """Stamp and queue; an overflow applies the overflow policy. False when not queued."""
        event.epoch = self.epoch
        if self.output_failed:
            return False
        try:
            return self.outlet.buffer.put(event)
        except OutputOverflowError:
            self._on_output_overflow()
            return False

    def _emit_reserve(self, event: ev.SessionEvent) -> bool:
        """Queue a notification of the overflow policy; omitted when even the reserve is full."""
        event.epoch = self.epoch
        try:
            return self.outlet.buffer.put(event)
        except OutputOverflowError:
            return False

    def _error(self, code: str, message: str, *, error_type: str = errors.INVALID_REQUEST,
               related: str | None = None, param: str | None = None) -> None:
        self._emit(ev.ErrorEvent(session_id=self.session_id, code=code, message=message, error_type=error_type,
                                 related_event_id=related, param=param,
                                 uses_reserve=error_type == errors.SERVER_ERROR))

    def _on_output_overflow(self) -> None:
        self.output_failed = True
        self.metrics.output_overflows.inc()
        log.warning("output buffer overflow: closing the session")
        response = self.active
        if response is not None:
            self.active = None
            self.outlet.buffer.invalidate(response.id, self.epoch)
            self.conversation.remove(response.item.id)  # a failed response never enters history
            response.item.status = "incomplete"
        self._emit_reserve(ev.ErrorEvent(
            session_id=self.session_id, code=errors.OUTPUT_BACKPRESSURE, error_type=errors.RATE_LIMIT,
            message="The client is not reading output fast enough; the session is closed"))
        if response is not None and response.announced and not response.ending_queued:
            self._emit_reserve(ev.ResponseDone(
                session_id=self.session_id, response_id=response.id, status="failed",
                status_details={"type": "failed", "reason": errors.OUTPUT_BACKPRESSURE},
                output=(response.item.snapshot(),), committed=False))
        if self._stop is None:
            self._stop = StopRequest("closed", errors.OUTPUT_BACKPRESSURE)

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)
        return task
