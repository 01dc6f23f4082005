"""Metric families of the openpi route (label ``endpoint`` / ``code``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class OpenPIMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "rtserve_robot_requests", "openpi requests by endpoint", ["endpoint"], registry=registry
        )
        self.errors = Counter(
            "rtserve_robot_errors", "openpi error frames and forced closes by code", ["code"], registry=registry
        )
        self.connections = Gauge("rtserve_robot_connections", "Open openpi connections", registry=registry)
        self.request_seconds = Histogram(
            "rtserve_robot_request_seconds",
            "Inference request receipt to response sent",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
