"""The lockstep stage-engine runtime: slot table, paced engine thread, session adapter."""

from rtserve.engines.lockstep.lease import SlotLease
from rtserve.engines.lockstep.pacing import SystemTickClock, TickClock, TickOutcome, TickPacer
from rtserve.engines.lockstep.scheduler import LockstepScheduler, TickReport
from rtserve.engines.lockstep.session import LockstepSession, LockstepSessionEngine
from rtserve.engines.lockstep.slots import SlotPhase

__all__ = [
    "LockstepScheduler",
    "LockstepSession",
    "LockstepSessionEngine",
    "SlotLease",
    "SlotPhase",
    "SystemTickClock",
    "TickClock",
    "TickOutcome",
    "TickPacer",
    "TickReport",
]
