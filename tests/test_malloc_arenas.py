"""``bound_malloc_arenas``: the server's processes use two glibc arenas unless the operator says.

In a child interpreter, since the bound is process-wide and reaches child processes through the
environment (issue 30: RSS stepped up round after round of identical streamed speech)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = (
    "import os, subprocess, sys\n"
    "from rtserve.heap import bound_malloc_arenas\n"
    "bound_malloc_arenas()\n"
    "child = [sys.executable, '-c', 'import os; print(os.environ.get(\"MALLOC_ARENA_MAX\"))']\n"
    "print(os.environ.get('MALLOC_ARENA_MAX'), subprocess.run(child, capture_output=True, text=True).stdout.strip())\n"
)


@pytest.mark.parametrize(("given", "expected"), [(None, "2 2"), ("4", "4 4")])
def test_arenas_are_bounded_for_the_server_and_its_children_unless_configured(given: str | None, expected: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    if given is not None:
        env["MALLOC_ARENA_MAX"] = given
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == expected
