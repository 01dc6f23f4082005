"""The scheduler's seam for models that take no audio (docs/engines.md#kyutai-tts-on-the-lockstep-runtime):
``between_steps`` calls run on the engine thread between steps, in order with the slot's open and
release, fenced by the lease; ``audio_input=False`` reads no backlog and counts no underrun."""

from __future__ import annotations

import functools

from prometheus_client import CollectorRegistry

from rtserve.config import LockstepConfig
from rtserve.engines.errors import EngineError
from rtserve.engines.events import EngineFailure
from rtserve.engines.lockstep.scheduler import LockstepScheduler
from rtserve.errors import INPUT_BACKPRESSURE
from tests.engines.lockstep.lockstep_fakes import RecordingModel, metric


def _scheduler() -> tuple[LockstepScheduler, RecordingModel, CollectorRegistry]:
    model, registry = RecordingModel(), CollectorRegistry()
    return LockstepScheduler(model, LockstepConfig(), registry, audio_input=False), model, registry


def test_calls_run_between_steps_after_the_open_and_in_order() -> None:
    scheduler, model, registry = _scheduler()
    lease = scheduler.acquire()
    for word in ("a", "b"):
        scheduler.between_steps(lease, functools.partial(model._record, "word", lease.slot, word))
    assert not [call for call in model.calls if call[0] == "word"]  # nothing runs on the loop's side
    for _ in range(3):
        assert scheduler.tick()
    names = [call for call in model.calls if call[0] in ("open", "word")]
    assert names == [("open", lease.slot), ("word", lease.slot, "a"), ("word", lease.slot, "b")]
    assert model.violations == []
    assert lease.underruns == 0 and metric(registry, "rtserve_lockstep_underruns_total") == 0


def test_a_call_for_a_released_lease_is_skipped_and_its_successor_unaffected() -> None:
    scheduler, model, _ = _scheduler()
    first = scheduler.acquire()
    scheduler.tick()
    scheduler.between_steps(first, lambda: model._record("stale"))
    first.release()
    scheduler.between_steps(first, lambda: model._record("after release"))
    scheduler.tick()  # the release is applied: the slot is free
    second = scheduler.acquire()
    assert second.slot == first.slot  # the same row, a new occupant
    scheduler.between_steps(second, lambda: model._record("fresh"))
    scheduler.tick()
    recorded = [call[0] for call in model.calls]
    assert "stale" not in recorded and "after release" not in recorded and "fresh" in recorded


def test_a_typed_refusal_ends_only_that_lease() -> None:
    scheduler, _model, _ = _scheduler()
    refused, other = scheduler.acquire(), scheduler.acquire()

    def refuse() -> None:
        raise EngineError("too many words", code=INPUT_BACKPRESSURE)

    scheduler.between_steps(refused, refuse)
    scheduler.tick()
    assert refused.output.closed and refused.output.failure == EngineFailure(INPUT_BACKPRESSURE, "too many words")
    assert not other.output.closed
    assert scheduler.tick()  # the other slot is still stepped
