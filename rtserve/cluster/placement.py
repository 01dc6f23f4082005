"""Creating (or finding) the engine actors: named, detached, placed with a placement group.

The first front-end creates them; every other finds them by name (``get_if_exists``). One
placement-group bundle per engine reserves its CPUs/GPUs/custom resources; the strategy
(``cluster.placement_strategy``) spreads them over nodes or packs them. Detached: they
outlive the front-end that created them, so front-ends come and go without touching engines.
"""

from __future__ import annotations

import logging
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, get_placement_group, placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rtserve.cluster.actor import EngineActor
from rtserve.config import ClusterConfig, ConfigError, ServerConfig

log = logging.getLogger(__name__)


def engine_names(cluster: ClusterConfig) -> list[str]:
    return [f"{cluster.engine_prefix}-{i}" for i in range(cluster.engines)]


def _bundle(cluster: ClusterConfig) -> dict[str, float]:
    bundle = {"CPU": cluster.engine_num_cpus, "GPU": cluster.engine_num_gpus, **cluster.engine_resources}
    bundle = {key: amount for key, amount in bundle.items() if amount > 0}
    if not bundle:
        raise ConfigError(
            "invalid config field 'cluster': an engine actor must reserve some resource "
            "(engine_num_cpus, engine_num_gpus or engine_resources)"
        )
    return bundle


def _placement_group(cluster: ClusterConfig) -> PlacementGroup:
    name = f"{cluster.engine_prefix}-placement"
    group: PlacementGroup
    try:
        group = get_placement_group(name)
    except ValueError:  # the first front-end: reserve room for every engine
        group = placement_group(
            [_bundle(cluster)] * cluster.engines, strategy=cluster.placement_strategy, name=name, lifetime="detached"
        )
    return group


def start_engines(config: ServerConfig) -> list[tuple[str, Any]]:
    """(name, actor handle) of every engine actor, created where missing. Needs ``ray.init``."""
    cluster = config.cluster
    assert cluster.secret is not None
    group = _placement_group(cluster)
    try:
        ray.get(group.ready(), timeout=cluster.placement_timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise ConfigError(
            f"the Ray cluster has no room for {cluster.engines} engine actors of "
            f"{_bundle(cluster)} each (waited {cluster.placement_timeout_s:g} s)"
        ) from None
    remote_class = ray.remote(EngineActor)
    bundle = _bundle(cluster)
    settings = config.model_dump(mode="json")
    handles: list[tuple[str, Any]] = []
    for index, name in enumerate(engine_names(cluster)):
        try:  # the usual case after the first front-end: nothing to create
            handles.append((name, ray.get_actor(name, namespace=cluster.namespace)))
            continue
        except ValueError:
            pass
        handle = remote_class.options(
            name=name,
            namespace=cluster.namespace,
            lifetime="detached",
            get_if_exists=True,
            max_restarts=cluster.max_restarts,
            max_concurrency=64,
            num_cpus=bundle.get("CPU", 0),
            num_gpus=bundle.get("GPU", 0),
            resources={k: v for k, v in bundle.items() if k not in ("CPU", "GPU")},
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index),
        ).remote(settings, name, cluster.secret)
        handles.append((name, handle))
    return handles
