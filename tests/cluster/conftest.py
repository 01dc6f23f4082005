"""The cluster tests build their front-ends with explicit engines (every engine behind the TCP
link), so ``--engine-client`` does not change them; the Ray ones are skipped on the link pass
rather than run twice (a local Ray cluster costs ~20 s on a small machine)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--engine-client") == "local":
        return
    skip = pytest.mark.skip(reason="cluster front-ends always reach engines over the link; run once")
    for item in items:
        if "ray" in item.keywords:
            item.add_marker(skip)
