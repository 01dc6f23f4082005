"""Merging several processes' metrics into one exposition (what /metrics serves with workers)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rtserve.process_metrics import merge_expositions


def _exposition(requests: int, *, with_histogram: bool) -> bytes:
    registry = CollectorRegistry()
    Counter("app_requests", "Requests", ["route"], registry=registry).labels("/a b{c}").inc(requests)
    if with_histogram:
        Histogram("app_wait_seconds", "Waits", buckets=(0.1, 1.0), registry=registry).observe(0.5)
    return generate_latest(registry)


def test_merged_metrics_parse_and_carry_each_workers_samples_labelled() -> None:
    merged = merge_expositions(
        _exposition(1, with_histogram=False),
        {"0": _exposition(2, with_histogram=True), "1": _exposition(3, with_histogram=False)},
    )
    families = {f.name: f for f in text_string_to_metric_families(merged.decode())}
    requests = {
        (s.labels.get("worker"), s.labels["route"]): s.value
        for s in families["app_requests"].samples
        if s.name == "app_requests_total"
    }
    assert requests == {(None, "/a b{c}"): 1, ("0", "/a b{c}"): 2, ("1", "/a b{c}"): 3}
    # A family only one worker has is there once, labelled, with its HELP and TYPE.
    wait = families["app_wait_seconds"]
    assert wait.type == "histogram" and wait.documentation == "Waits"
    assert {s.labels["worker"] for s in wait.samples} == {"0"}
    assert merged.count(b"# HELP app_requests_total") == merged.count(b"# TYPE app_requests_total") == 1
