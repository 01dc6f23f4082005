"""Prometheus families of the session core, registered on the app's registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class SessionMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.slots = Gauge(
            "rtserve_sessions_slots_in_use",
            "Admission slots held: opening, live, and closing sessions",
            registry=registry,
        )
        self.opened = Counter("rtserve_sessions_opened", "Sessions admitted", registry=registry)
        self.refused = Counter("rtserve_sessions_refused", "Session opens refused", ["code"], registry=registry)
        self.ended = Counter(
            "rtserve_sessions_ended", "Terminal events by kind and reason", ["kind", "reason"], registry=registry
        )
        self.output_overflows = Counter(
            "rtserve_session_output_overflows",
            "Sessions closed because their output buffer overflowed",
            registry=registry,
        )
        self.input_backpressure = Counter(
            "rtserve_session_input_backpressure", "Commands refused by input backpressure", registry=registry
        )
        self.stale_outputs = Counter(
            "rtserve_session_stale_outputs", "Engine outputs dropped for a stale epoch or response", registry=registry
        )
        self.cleanup_failures = Counter(
            "rtserve_session_cleanup_failures",
            "Engine-session cleanup attempts that failed or timed out",
            registry=registry,
        )
