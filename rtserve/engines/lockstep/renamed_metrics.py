"""A lockstep scheduler's metrics shown under another engine's name.

A scheduler's metric families are named ``rtserve_lockstep_*``, once per registry. An
engine that runs a scheduler beside the session engine's (the Kyutai STT) keeps its
scheduler's families in a registry of its own and shows them in the server's under its own
prefix, so ``/metrics`` tells the two apart (docs/engines.md#kyutai-stt-engine).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

LOCKSTEP_PREFIX = "rtserve_lockstep_"


class RenamedMetrics(Collector):
    """Every family of ``source`` with ``LOCKSTEP_PREFIX`` replaced by ``prefix``."""

    def __init__(self, source: CollectorRegistry, prefix: str) -> None:
        self._source = source
        self._prefix = prefix

    def follow(self, source: CollectorRegistry) -> None:
        """Show ``source``'s families from now on: the engine built a new scheduler (a wake from
        sleep mode), whose families cannot register twice in the old registry."""
        self._source = source

    def collect(self) -> Iterable[Metric]:
        for family in self._source.collect():
            renamed = Metric(self._renamed(family.name), family.documentation, family.type, family.unit)
            renamed.samples = [sample._replace(name=self._renamed(sample.name)) for sample in family.samples]
            yield renamed

    def _renamed(self, name: str) -> str:
        return self._prefix + name.removeprefix(LOCKSTEP_PREFIX)
