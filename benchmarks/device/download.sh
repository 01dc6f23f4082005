# Sourced by wheels.sh and cpu_kit.sh: run from the repository root, D the wheels' parent folder,
# PIP a `pip download` of binary wheels for the H200 host's CPython 3.12 on x86-64 Linux.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
D=benchmarks/results/device
PIP="python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp
     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
     --platform manylinux_2_31_x86_64"
