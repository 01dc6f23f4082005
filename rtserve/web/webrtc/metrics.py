"""Prometheus metrics of the WebRTC calls (``/metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class WebRtcMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Gauge("rtserve_webrtc_calls", "Live WebRTC calls", registry=registry)
        self.ended = Counter(
            "rtserve_webrtc_calls_ended", "WebRTC calls ended, by reason", ["reason"], registry=registry
        )
        self.inbound_dropped_frames = Counter(
            "rtserve_webrtc_inbound_dropped_frames",
            "Microphone frames dropped (reader behind or session input full)",
            registry=registry,
        )
        self.late_frames = Counter(
            "rtserve_webrtc_outbound_late_frames",
            "Agent track frames sent over one frame period late (a busy event loop)",
            registry=registry,
        )
        self.dropped_events = Counter(
            "rtserve_webrtc_dropped_client_events",
            "Data channel client events dropped over webrtc.max_pending_events",
            registry=registry,
        )
