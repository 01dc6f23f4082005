"""Merging several processes' metrics into one exposition (what /metrics serves with workers), and
the GPU memory each process's torch holds."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rtserve.process_metrics import ProcessMetrics, merge_expositions


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


GPU_MEMORY = "rtserve_torch_cuda_memory_bytes"
# A fresh process with one process's metrics in ``registry``: what each script below starts from.
WITH_METRICS = """
import sys
import threading
from prometheus_client import CollectorRegistry, generate_latest
from rtserve.process_metrics import ProcessMetrics
registry = CollectorRegistry()
ProcessMetrics(registry)
"""
SCRAPE_WITHOUT_TORCH = (
    WITH_METRICS
    + f"""
print({GPU_MEMORY!r} in generate_latest(registry).decode(), "torch" in sys.modules)
"""
)


def test_a_process_without_cuda_exports_no_gpu_memory_and_a_scrape_does_not_import_torch() -> None:
    done = subprocess.run([sys.executable, "-c", SCRAPE_WITHOUT_TORCH], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]  # front-end workers stay free of torch


SCRAPE_WHILE_TORCH_IMPORTS = (
    WITH_METRICS
    + """
importing = threading.Thread(target=__import__, args=("torch",))
importing.start()
scrapes = 0
while importing.is_alive():
    generate_latest(registry)
    scrapes += 1
print(scrapes)
"""
)


def test_a_scrape_while_another_thread_imports_torch_answers() -> None:
    """/metrics answered 500 while the robot policy's thread was importing torch (half-imported)."""
    done = subprocess.run(
        [sys.executable, "-c", SCRAPE_WHILE_TORCH_IMPORTS], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout) > 10  # scraped many times during the import


def _gpu_memory(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    families = text_string_to_metric_families(generate_latest(registry).decode())
    return {
        (s.labels["device"], s.labels["kind"]): s.value for f in families if f.name == GPU_MEMORY for s in f.samples
    }


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_memory_counts_what_this_processs_tensors_hold() -> None:
    registry = CollectorRegistry()
    ProcessMetrics(registry)
    before = _gpu_memory(registry).get(("0", "allocated"), 0.0)
    block = torch.empty(64 << 20, dtype=torch.uint8, device="cuda:0")
    held = _gpu_memory(registry)
    assert held[("0", "allocated")] - before >= 64 << 20
    assert held[("0", "reserved")] >= held[("0", "allocated")]
    del block
