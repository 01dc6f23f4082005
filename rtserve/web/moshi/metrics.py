"""Metric families shared by ``/api/chat`` and ``/v1/audio/duplex`` (label ``route``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Egress latency is judged against the 80 ms frame budget.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
# Server path: a wait for the tick (up to a frame) plus the tick: 5 ms steps where its targets
# sit (80 ms + a step's p99 + 15 ms is 140-180 ms for a 7B step at 45-65 ms).
_PATH_BUCKETS = (
    *(0.01, 0.02, 0.04, 0.06, 0.07, 0.08, 0.09),
    *(round(0.1 + 0.005 * k, 3) for k in range(21)),
    *(0.24, 0.32, 0.64, 1.28),
)
# The server path's two parts, each within a frame or two: 5 ms steps up to 120 ms.
_PATH_PART_BUCKETS = (*(round(0.005 * k, 3) for k in range(1, 25)), 0.16, 0.24, 0.32, 0.64, 1.28)


class MoshiMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.connections = Gauge(
            "rtserve_moshi_open_connections", "Open Moshi-protocol conversations", ["route"], registry=registry
        )
        self.connections_total = Counter(
            "rtserve_moshi_connections",
            "Moshi-protocol connection attempts by outcome",
            ["route", "outcome"],
            registry=registry,
        )
        self.frames_in = Counter(
            "rtserve_moshi_frames_in",
            "User audio handed to the engine, in engine frames' worth of samples",
            ["route"],
            registry=registry,
        )
        self.frames_out = Counter(
            "rtserve_moshi_frames_out", "Agent frames written to the socket", ["route"], registry=registry
        )
        self.egress_latency = Histogram(
            "rtserve_moshi_egress_latency_seconds",
            "Engine frame read from the engine's hand-off -> its bytes written to the socket (encoding + send)",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.server_path = Histogram(
            "rtserve_moshi_server_path_seconds",
            "Lockstep engines: the newest user sample a tick stepped, decoded and handed to the engine session "
            "-> that tick's agent frame written to the socket",
            ["route"],
            buckets=_PATH_BUCKETS,
            registry=registry,
        )
        self.server_path_part = Histogram(
            "rtserve_moshi_server_path_part_seconds",
            "Lockstep engines, the server path in two parts: 'wait' (the newest user sample a tick stepped, "
            "handed to the engine session -> that tick due) and 'back' (tick due -> its agent frame read "
            "from the engine's hand-off: the tick and the way back); the egress histogram is the rest",
            ["route", "part"],
            buckets=_PATH_PART_BUCKETS,
            registry=registry,
        )
