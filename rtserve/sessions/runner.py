"""The per-session runner: the single writer of one session (duplex.md §3.2).

Everything that changes a session goes through one mailbox and is applied by one task,
in order: client commands (admitted by the manager), engine events (pumped from
``EngineSession.events()``), and internal items (commit completions, timers, stop
requests). The behaviour lives in the layers below, one concern each:
``runner_state`` (state, emission, overflow policy) -> ``responses`` -> ``turns`` ->
``command_handlers``; this module adds the task lifecycle and the teardown that ends
every session with exactly one terminal event, queued after engine cleanup.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from rtserve.engines.protocols import EngineError, EngineFailure
from rtserve.sessions import commands as cmd
from rtserve.sessions import errors
from rtserve.sessions import events as ev
from rtserve.sessions.command_handlers import CommandHandlers
from rtserve.sessions.runner_state import StopRequest
from rtserve.sessions.turns import ENGINE_EVENTS

log = logging.getLogger(__name__)


_STOP = object()
_PUMP_ENDED = object()
_FAIR_BATCH = 16  # mailbox items applied before the runner yields to other tasks
_QUIET_TURNS = 5  # loop turns without engine output before a close-time drain is done


class SessionRunner(CommandHandlers):
    def start(self, created: ev.SessionCreated) -> None:
        self._emit(created)
        loop = asyncio.get_running_loop()
        self._main = loop.create_task(self._run(), name=f"session-runner:{self.session_id}")
        self._pump = loop.create_task(self._pump_engine(), name=f"session-pump:{self.session_id}")

    def offer(self, command: cmd.Command) -> bool:
        """Queue an admitted command; False when the mailbox is full."""
        return self.mailbox.offer(command)

    def request_stop(self, kind: str, reason: str, details: dict[str, Any] | None = None) -> asyncio.Future[bool]:
        """Close or expire the session; only the first request counts. The future
        resolves (with whether engine cleanup succeeded) after the terminal event is queued."""
        if self.stop_request is None:
            self.stop_request = StopRequest(kind, reason, details or {})
            self.mailbox.post(_STOP)
        return self.finished

    def cancel_tasks(self) -> list[asyncio.Task[Any]]:
        """Hard stop (shutdown past its deadline); returns the tasks to await."""
        tasks = [t for t in (self._main, self._pump, *self._side_tasks) if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        return tasks

    async def _run(self) -> None:
        applied = 0
        try:
            while self._stop is None:
                applied += 1
                if applied % _FAIR_BATCH == 0:
                    await asyncio.sleep(0)  # a long backlog must not starve other sessions or consumers
                item = await self.mailbox.get()
                if item is _STOP:
                    self._stop = self.stop_request
                elif isinstance(item, cmd.Command):
                    self.gate.release(item)
                    self._guarded(self._on_command, item)
                elif item is _PUMP_ENDED:
                    self._stop = StopRequest("closed", "engine_closed")
                else:
                    self._guarded(self._on_internal, item)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug here must end this session only, cleanly
            log.exception("session runner failed")
            self._stop = StopRequest("closed", "internal_error")
        try:
            await self._teardown()
        except Exception:
            # Still end the stream; the slot stays held (cleanup did not verifiably happen).
            log.exception("session teardown failed")
            self._finish(False)

    def _guarded(self, handler: Callable[[Any], None], item: Any) -> None:
        related = getattr(item, "event_id", None)
        try:
            handler(item)
        except EngineError as exc:
            self._error(exc.code, str(exc), error_type=errors.SERVER_ERROR, related=related)
        except Exception:
            log.exception("failed to apply %s", type(item).__name__)
            self._error("internal_error", "The server failed to apply this event", error_type=errors.SERVER_ERROR,
                        related=related)

    async def _pump_engine(self) -> None:
        try:
            async for item in self.engine.events():
                await self.mailbox.put(item)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("engine event stream failed")
            self.mailbox.post(EngineFailure(errors.ENGINE_ERROR, "The engine stopped serving this session"))
        self.mailbox.post(_PUMP_ENDED)

    async def _teardown(self) -> None:
        stop = self.terminal = self._stop or StopRequest("closed", "internal_error")
        self.closing = True
        self._on_closing(self, stop)
        for item in self.mailbox.drain():
            if isinstance(item, cmd.Command):
                self.gate.release(item)
        for task in list(self._side_tasks):
            task.cancel()
        if not self.continuous and self.active is not None:
            # The answer being cut off: drop its queued and held audio before the engine is
            # released (no audio-cleared notice at close). Finished answers keep theirs.
            self.outlet.buffer.invalidate(self.active.id, self.epoch)
            if not self.output_failed:
                self._end_response("cancelled", {"type": "cancelled", "reason": stop.reason})
        if self.continuous and self.active is not None and not self.output_failed:
            await self._flush_lockstep_tail()
        cleanup_ok = await self.close_engine()
        if self.continuous:
            await self._drain_engine_output()
            if self.active is not None and not self.output_failed:
                self._end_response("completed")
        await self._stop_pump()
        if self._side_tasks:
            await asyncio.gather(*self._side_tasks, return_exceptions=True)
        self._finish(cleanup_ok)

    def _finish(self, cleanup_ok: bool) -> None:
        """Queue the one terminal event. The slot is released first (when cleanup
        succeeded): a client that reopens right after session.closed must be admitted."""
        if self.finished.done():
            return
        stop = self.terminal or StopRequest("closed", "internal_error")
        self._on_finished(self, cleanup_ok)
        terminal_cls = ev.SessionExpired if stop.kind == "expired" else ev.SessionClosed
        self.outlet.buffer.close(terminal_cls(session_id=self.session_id, epoch=self.epoch, reason=stop.reason,
                                              details=stop.details))
        self.finished.set_result(cleanup_ok)

    async def close_engine(self) -> bool:
        """One bounded cleanup attempt; a hung ``close()`` keeps running in the background
        and is awaited again by the reaper's retries."""
        if self.close_task is None or (self.close_task.done() and not _succeeded(self.close_task)):
            self.close_task = asyncio.get_running_loop().create_task(self.engine.close())
        if not self.close_task.done():
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(self.close_task), self.limits.engine_close_timeout_s)
        ok = _succeeded(self.close_task)
        if not ok and self.close_task.done():
            log.warning("engine session cleanup failed: %r", self.close_task.exception())
        return ok

    async def _flush_lockstep_tail(self) -> None:
        """Lockstep close never drops input: ``commit_input`` zero-pads the partial frame and
        returns once every pushed frame was stepped; its output is then delivered."""
        try:
            await asyncio.wait_for(self.engine.commit_input(), self.limits.engine_close_timeout_s)
        except (asyncio.TimeoutError, Exception):
            log.warning("lockstep tail flush did not finish; closing without it", exc_info=True)
            return
        await self._drain_engine_output()

    async def _drain_engine_output(self) -> None:
        """Apply engine output already produced: the pump forwards whatever the engine has
        queued without suspending, so a few quiet loop turns mean nothing more is pending."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.engine_close_timeout_s
        quiet_turns = 0
        while quiet_turns < _QUIET_TURNS and loop.time() < deadline:
            if not len(self.mailbox):
                if self._pump is None or self._pump.done():
                    return
                quiet_turns += 1
                await asyncio.sleep(0)
                continue
            quiet_turns = 0
            item = await self.mailbox.get()
            if item is _PUMP_ENDED:
                return
            if isinstance(item, ENGINE_EVENTS):
                self._guarded(self._on_engine_event, item)
            elif isinstance(item, cmd.Command):
                self.gate.release(item)

    async def _stop_pump(self) -> None:
        if self._pump is not None and not self._pump.done():
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
        for item in self.mailbox.drain():
            if isinstance(item, cmd.Command):
                self.gate.release(item)


def _succeeded(task: asyncio.Task[None]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is None
