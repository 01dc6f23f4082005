"""Without ``--ray-address`` nothing imports Ray; with it, a missing cluster secret is a config error."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.test_cli import CLEAN_ENV, CLI

_BUILD_WITHOUT_RAY = """
import sys
from rtserve.app import build_app
from rtserve.cli import main, _parser
from rtserve.config import load_config
build_app(load_config(environ={}, overrides={"engine": "loopback"}))
_parser().parse_args(["serve", "--engine", "loopback"])
print("ray" in sys.modules)
"""


def test_serving_without_a_ray_address_never_imports_ray() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _BUILD_WITHOUT_RAY],
        capture_output=True,
        text=True,
        env=CLEAN_ENV,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_a_ray_address_without_the_cluster_secret_is_refused_before_joining() -> None:
    pytest.importorskip("ray")
    out = subprocess.run(
        [*CLI, "serve", "--engine", "loopback", "--workers", "1", "--ray-address", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        env=CLEAN_ENV,
        timeout=120,
    )
    assert out.returncode == 2
    assert "cluster.secret" in out.stderr and "Traceback" not in out.stderr
