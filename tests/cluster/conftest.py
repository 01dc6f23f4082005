"""The cluster tests build their front-ends with explicit engines (every engine behind the TCP
link), so ``--engine-client`` does not change them; the Ray ones are skipped on the link pass
rather than run twice (a local Ray cluster costs ~20 s on a small machine), and share one
cluster (``ray_cluster``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

# Two raylets; each holds one engine actor of each engine set (the loopback engines of
# test_ray_cluster, the cascade engines of test_ray_http), one per raylet by STRICT_SPREAD.
_NODE: dict[str, Any] = {"num_cpus": 2, "resources": {"rtserve_engine": 2}, "object_store_memory": 80 * 1024 * 1024}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--engine-client") == "local":
        return
    skip = pytest.mark.skip(reason="cluster front-ends always reach engines over the link; run once")
    for item in items:
        if "ray" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="package")
def ray_cluster() -> Iterator[Any]:
    """A local Ray cluster of two raylets, joined as a driver in the tests' namespace."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    from tests.cluster.ray_support import NAMESPACE

    cluster = Cluster(initialize_head=True, head_node_args={**_NODE, "include_dashboard": False})
    try:
        cluster.add_node(**_NODE)
        ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False)
        yield cluster
    finally:
        if ray.is_initialized():
            for name in ray.util.list_named_actors():  # detached: they would outlive the cluster's driver
                with contextlib.suppress(ValueError):
                    ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
            ray.shutdown()
        cluster.shutdown()
