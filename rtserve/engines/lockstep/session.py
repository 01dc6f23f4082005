"""``SessionEngine`` over a ``LockstepScheduler``: each session holds one slot.

Lockstep lifecycle (docs/sessions.md#lockstep-sessions): one output frame per input frame, continuous,
no turn control. Audio is pushed as samples of any length; the slot frames it at each
tick (``InputBacklog``). ``respond`` is a no-op; ``set_epoch`` fences output only (the
model keeps hearing the user); ``commit_input`` waits until every sample pushed so far
went through a step (a partial tail is stepped zero-padded, never dropped), i.e. until
its output frame sits in ``events()``; ``drain`` also waits until the model's answer
to it was produced and read. ``close`` releases the slot at once and discards output
not yet read, so a closing caller drains first.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable
from dataclasses import replace

from prometheus_client import CollectorRegistry

from rtserve.config import ServerConfig
from rtserve.engines.errors import CapacityExhausted, EngineError
from rtserve.engines.events import EngineEvent, EngineFailure, OutputAudio
from rtserve.engines.lockstep.framing import check_audio
from rtserve.engines.lockstep.lease import NOTHING_YET, SlotLease
from rtserve.engines.lockstep.pacing import TickClock
from rtserve.engines.lockstep.scheduler import LockstepScheduler, TickReport
from rtserve.engines.lockstep.slots import SlotPhase
from rtserve.engines.protocols import FrameModel, TurnEngines
from rtserve.engines.turn_detection import TurnDetection
from rtserve.engines.values import EngineCapabilities, FrameOutput, Pcm, ResponseRequest, SessionOptions
from rtserve.errors import ENGINE_UNAVAILABLE, TURN_CONTROL_UNSUPPORTED

log = logging.getLogger(__name__)


class LockstepSession:
    """One conversation on one slot. Every method is called from the event loop."""

    def __init__(self, lease: SlotLease, capabilities: EngineCapabilities, release_timeout_s: float) -> None:
        self.capabilities = capabilities
        self._lease = lease
        self._release_timeout_s = release_timeout_s
        self._closed = False

    @property
    def lease(self) -> SlotLease:
        return self._lease

    def push_audio(self, pcm: Pcm) -> None:
        """Queue samples for the slot; raises ``InvalidAudio`` on bad samples."""
        if self._closed:
            return
        self._lease.push_samples(check_audio(pcm))

    async def commit_input(self) -> None:
        if self._closed:
            return
        await self._lease.wait_input_consumed()

    async def drain(self) -> None:
        if self._closed:
            return
        await self._lease.wait_drained()

    def clear_input(self) -> None:
        self._lease.clear_input()

    def respond(self, request: ResponseRequest) -> None:
        """Lockstep engines talk continuously; there is no response to start."""

    def set_epoch(self, epoch: int) -> None:
        self._lease.set_epoch(epoch)

    def configure_turn_detection(self, settings: TurnDetection | None) -> None:
        """Lockstep models hear everything continuously; they have no server VAD to set."""
        raise EngineError("this engine has no server VAD", code=TURN_CONTROL_UNSUPPORTED)

    async def events(self) -> AsyncGenerator[EngineEvent, None]:
        while True:
            item = await self._lease.next_output()
            if item is None:
                return
            if isinstance(item, EngineFailure):
                yield item
                return
            output, epoch = item
            if output.audio.base is not None:
                # A row of its tick's batch (``MoshiFrameModel``): the reader here may keep it (a
                # realtime session's resume journal), which must not pin the whole batch's block.
                # ``forward_events`` needs no copy: it feeds the engine link, which pickles the row.
                output = replace(output, audio=output.audio.copy())
            yield self._audio_event(output, epoch)

    def forward_events(self, sink: Callable[[EngineEvent | None], None]) -> None:
        """``events()`` pushed instead of pulled: from now on each event goes to ``sink`` on the
        loop as soon as the engine thread hands it over, ``None`` after the last. Every slot of a
        tick is handed over in one wake-up, so a consumer of many sessions (the engine process's
        worker links) forwards a whole tick in one callback instead of waking a task per session."""
        lease = self._lease

        def deliver() -> None:
            while (item := lease.poll_output()) is not NOTHING_YET:
                if isinstance(item, tuple):
                    sink(self._audio_event(*item))
                    continue
                lease.on_wake(None)
                if item is not None:  # the failure that ended the session
                    sink(item)
                sink(None)
                return

        lease.on_wake(deliver)
        deliver()

    def _audio_event(self, output: FrameOutput, epoch: int) -> OutputAudio:
        return OutputAudio(
            pcm=output.audio,
            epoch=epoch,
            text=output.text,
            tick_due=self._lease.scheduler.last_tick_due(),
            input_samples=output.input_samples,
        )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._lease.release()
        if not await self._lease.wait_released(self._release_timeout_s):
            # Capacity stays honest: the slot remains DRAINING until the thread frees it.
            log.warning(
                "engine slot %d not freed within %.1fs; it stays reserved until the engine thread frees it",
                self._lease.slot,
                self._release_timeout_s,
            )


def lockstep_capabilities(
    name: str,
    frame_size: int,
    sample_rate: int,
    batch_size: int,
    *,
    supports_text_output: bool,
    supports_barge_in: bool = False,
) -> EngineCapabilities:
    """What a lockstep engine over a model of this framing offers (also declared before its model loads)."""
    period_ms = frame_size * 1000 / sample_rate
    if period_ms != int(period_ms):
        raise ValueError(f"frame of {frame_size} samples at {sample_rate} Hz is not a whole ms")
    return EngineCapabilities(
        name=name,
        mode="lockstep",
        input_sample_rate=sample_rate,
        output_sample_rate=sample_rate,
        chunk_period_ms=int(period_ms),
        max_sessions=batch_size,
        supports_barge_in=supports_barge_in,
        supports_text_output=supports_text_output,
        modalities=("audio", "text") if supports_text_output else ("audio",),
    )


class LockstepSessionEngine:
    """A lockstep ``SessionEngine``: capacity = the model's batch size."""

    def __init__(
        self,
        name: str,
        model: FrameModel,
        config: ServerConfig,
        registry: CollectorRegistry,
        *,
        supports_text_output: bool,
        supports_barge_in: bool = False,
        clock: TickClock | None = None,
        on_tick: Callable[[TickReport], None] | None = None,
    ) -> None:
        self.name = name
        self.capabilities = lockstep_capabilities(
            name,
            model.frame_size,
            model.sample_rate,
            model.batch_size,
            supports_text_output=supports_text_output,
            supports_barge_in=supports_barge_in,
        )
        self.scheduler = LockstepScheduler(model, config.lockstep, registry, name=name, clock=clock, on_tick=on_tick)
        self._release_timeout_s = config.lockstep.release_timeout_s

    @property
    def ready(self) -> bool:
        return self.scheduler.running

    async def start(self) -> None:
        self.scheduler.start()

    async def open_session(self, session_id: str, options: SessionOptions) -> LockstepSession:
        if not self.scheduler.running:
            raise EngineError(f"engine {self.name} is not running", code=ENGINE_UNAVAILABLE)
        lease = self.scheduler.acquire(options.prompt, session_id=session_id)
        session = LockstepSession(lease, self.capabilities, self._release_timeout_s)
        try:
            # Callers announce readiness (Moshi's 0x00, session.created) once this returns,
            # so the persona/voice prefill must be done by then.
            await lease.wait_live()
        except BaseException:
            await session.close()
            raise
        refused = lease.output.failure if lease.phase is not SlotPhase.LIVE else None
        if refused is not None:  # the model refused the slot (open_slot raised): say why, typed
            await session.close()
            error = CapacityExhausted if refused.code == CapacityExhausted.code else EngineError
            raise error(refused.message, code=refused.code)
        return session

    async def stop(self) -> None:
        await asyncio.to_thread(self.scheduler.stop, self._release_timeout_s)

    def model_ids(self) -> list[str]:
        return [self.name]

    def turn_engines(self) -> TurnEngines:
        return TurnEngines()  # a lockstep model is one frame model, not separate turn engines

    def sleep_stages(self) -> tuple[()]:
        return ()  # the engine thread steps its model every tick: there is no idle model to unload
