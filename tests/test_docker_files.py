"""``docker/compose.yml``, ``prometheus.yml`` and the Grafana files parse, point at each other
and at rtserve's defaults, and every metric the Grafana dashboard queries is one a running
server exports (so a renamed metric breaks this test, not an operator's dashboard)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import aiohttp
import pytest
import torch
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from rtserve.config import ServerConfig
from rtserve.engines.cascade.metrics import CascadeMetrics
from rtserve.engines.kyutai_tts.engine import KyutaiTTSEngine
from rtserve.process_metrics import TorchCudaMemory
from tests.web.realtime_support import loopback_config, running

DOCKER = Path(__file__).resolve().parents[1] / "docker"
SAMPLE_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}
METRIC = re.compile(r"\b(?:rtserve|process)_[a-z0-9_]+\b")


def load(name: str):
    text = (DOCKER / name).read_text()
    return json.loads(text) if name.endswith(".json") else yaml.safe_load(text)


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in load("grafana-dashboard.json")["panels"] for t in p["targets"]]


def test_compose_runs_rtserve_prometheus_and_grafana_from_files_that_exist() -> None:
    compose = load("compose.yml")
    services = compose["services"]
    assert set(services) == {"rtserve", "prometheus", "grafana"}
    assert services["rtserve"]["build"]["dockerfile"] == "docker/Dockerfile"
    assert (DOCKER.parent / services["rtserve"]["build"]["context"].replace("..", ".") / "docker/Dockerfile").is_file()
    for name, service in services.items():
        image = service.get("image")
        assert image is None or (":" in image and not image.endswith(":latest")), name  # pinned
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (DOCKER / source).is_file(), (name, source)
            else:
                assert source in compose["volumes"], (name, source)
    mounted = {v.split(":")[1] for v in services["grafana"]["volumes"]}
    assert "/var/lib/grafana/dashboards/rtserve.json" in mounted
    assert load("grafana-dashboards.yml")["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def test_prometheus_scrapes_rtserve_where_it_listens_by_default() -> None:
    jobs = {job["job_name"]: job for job in load("prometheus.yml")["scrape_configs"]}
    job = jobs["rtserve"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == [f"127.0.0.1:{ServerConfig().port}"]
    prometheus_flags = load("compose.yml")["services"]["prometheus"]["command"]
    listen = next(f for f in prometheus_flags if f.startswith("--web.listen-address="))
    datasource = load("grafana-datasource.yml")["datasources"][0]
    assert datasource["url"] == "http://" + listen.split("=", 1)[1]


def test_the_grafana_dashboard_uses_the_provisioned_datasource() -> None:
    dashboard = load("grafana-dashboard.json")
    uid = load("grafana-datasource.yml")["datasources"][0]["uid"]
    assert dashboard["uid"] and dashboard["panels"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == uid
        assert panel["targets"] and all(t["datasource"]["uid"] == uid for t in panel["targets"])
    titles = " ".join(p["title"] for p in dashboard["panels"])
    for topic in ("tick time", "sessions", "Underruns", "Drops", "CPU per process", "GPU memory"):
        assert topic in titles


async def test_every_metric_the_dashboard_queries_is_exported(
    config: ServerConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running(loopback_config(config)) as base, aiohttp.ClientSession() as http:
        async with http.get(base + "/metrics") as resp:
            exposition = await resp.text()
    # Labelled families with no child yet have no sample line: their names come from # TYPE. The
    # default engine's (the cascade's) families are exported where it runs, the Kyutai TTS
    # engine's where it is configured; this server runs the loopback engine, so they are taken
    # from their own registrations.
    engines = CollectorRegistry()
    CascadeMetrics(engines)
    KyutaiTTSEngine(config, registry=engines)
    # The GPU memory gauge is exported by a process that has used CUDA: taken from its collector
    # as a process with one GPU would see it.
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 0)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 0)
    gpu = list(TorchCudaMemory().collect())
    families = [*text_string_to_metric_families(exposition), *engines.collect(), *gpu]
    exported = {f"{family.name}{suffix}" for family in families for suffix in SAMPLE_SUFFIXES.get(family.type, ("",))}
    queried = {name for expr in dashboard_exprs() for name in METRIC.findall(expr)}
    assert queried and queried <= exported, sorted(queried - exported)
