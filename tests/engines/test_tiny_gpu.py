"""The ``tiny`` frame model on ``lockstep.device``: on CUDA it computes the CPU's function,
and asking for CUDA where there is none stops startup with a one-line config error.

Slot isolation on CUDA is the device-parametrized test_lockstep_isolation.py.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from rtserve.config import ConfigError, load_config
from rtserve.engines.tiny_torch import PROMPT_BYTES_PER_STEP, TinyRecurrentFrameModel
from rtserve.engines.values import FrameOutput, SlotPrompt
from tests.engines.lockstep.test_lockstep_isolation import on_cuda, sine_frame

BATCH = 4
TICKS = 40
IDLE = 2  # a slot that is not live for the first half: its state must stay put
PERSONA = "You are a calm robot. " * 2


def run_model(device: str) -> list[list[FrameOutput | None]]:
    """Slot 1 prefilled with a persona, slot 2 joins halfway, every live slot hears its own sine."""
    model = TinyRecurrentFrameModel(BATCH, seed=7, device=device)
    for slot in range(BATCH):
        assert model.open_slot(slot, SlotPrompt(text=PERSONA if slot == 1 else None)) >= 0
    prefill_steps = 1
    while not model.prefill_step(1):
        prefill_steps += 1
    assert prefill_steps == -(-len(PERSONA.encode()) // PROMPT_BYTES_PER_STEP)
    outputs = []
    for tick in range(TICKS):
        live = np.array([slot != IDLE or tick >= TICKS // 2 for slot in range(BATCH)])
        frames = np.stack(
            [sine_frame(slot, tick) if live[slot] else np.zeros_like(sine_frame(0, 0)) for slot in range(BATCH)]
        )
        outputs.append(model.step(frames, live))
    return outputs


@pytest.mark.gpu
@on_cuda
@pytest.mark.usefixtures("strict_fp32")
def test_cuda_step_computes_the_same_function_as_the_cpu() -> None:
    # Strict float32 so the result does not hang on the process's precision settings: what is
    # left between the devices is summation order.
    model = TinyRecurrentFrameModel(BATCH, device="cuda")
    assert model.state.device.type == "cuda"
    assert all(p.device.type == "cuda" for p in model.gru.parameters())

    on_cpu, on_gpu = run_model("cpu"), run_model("cuda")
    for tick, (cpu_row, gpu_row) in enumerate(zip(on_cpu, on_gpu, strict=True)):
        for slot, (expected, got) in enumerate(zip(cpu_row, gpu_row, strict=True)):
            if expected is None:
                assert got is None, f"idle slot {slot} produced output at tick {tick}"
                continue
            assert got is not None and got.audio.dtype == np.float32 and got.audio.shape == expected.audio.shape
            np.testing.assert_allclose(
                got.audio, expected.audio, rtol=0, atol=1e-4, err_msg=f"slot {slot}, tick {tick}"
            )
            assert got.text == expected.text, f"slot {slot}, tick {tick}"
    # The comparison is not vacuous: the model speaks, and its text head emits letters, not "no text".
    assert on_cpu[5][0] is not None and np.abs(on_cpu[5][0].audio).max() > 1e-3
    assert all(frame.text for row in on_cpu for frame in row if frame is not None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the startup error where CUDA is missing")
def test_cuda_requested_without_cuda_stops_startup_with_a_config_error() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTSERVE_")}
    env["RTSERVE_LOCKSTEP__DEVICE"] = "cuda"
    out = subprocess.run(
        [sys.executable, "-m", "rtserve.cli", "serve", "--engine", "tiny", "--port", "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr
    assert "'lockstep.device'" in lines[0] and "torch.cuda.is_available() is False" in lines[0]


@pytest.mark.parametrize("name", ["gpu", "cuda0", "cuda:", "mps"])
def test_device_names_other_than_cpu_or_cuda_are_rejected_by_the_config(name: str) -> None:
    with pytest.raises(ConfigError, match=r"'lockstep\.device'"):
        load_config(environ={"RTSERVE_LOCKSTEP__DEVICE": name})
