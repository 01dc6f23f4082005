"""``robot.policy``: demo, ``module:factory`` entry points and TorchScript files."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch

from rtserve.config import RobotConfig
from rtserve.engines.policy.demo import DemoDroidPolicy
from rtserve.engines.policy.errors import InvalidObservation, PolicyLoadError
from rtserve.engines.policy.loading import load_policy
from rtserve.engines.values import PolicyRequest


class EchoStatePolicy:
    """A user policy as a third party would write one: returns the state it was given."""

    def server_config(self) -> dict[str, Any]:
        return {"policy": "echo"}

    def validate(self, observation: dict[str, Any]) -> None:
        if "state" not in observation:
            raise InvalidObservation("missing observation key 'state'")

    def infer(self, batch):
        return [{"actions": np.asarray(r.observation["state"], np.float32)} for r in batch]

    def reset(self, session_id: str) -> None:
        pass


def make_echo_policy() -> EchoStatePolicy:
    return EchoStatePolicy()


def make_incomplete_policy() -> object:
    return object()


class StateDoubler(torch.nn.Module):
    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return obs["observation/state"] * 2.0


def _save_torchscript(path, metadata: dict[str, Any] | None) -> str:
    extra = {} if metadata is None else {"rtserve_policy.json": json.dumps(metadata)}
    torch.jit.save(torch.jit.script(StateDoubler()), str(path), _extra_files=extra)
    return str(path)


def test_demo_is_the_default():
    assert isinstance(load_policy(RobotConfig()), DemoDroidPolicy)


def test_entry_point_factory_is_called():
    policy = load_policy(RobotConfig(policy=f"{__name__}:make_echo_policy"))
    assert policy.server_config() == {"policy": "echo"}
    result = policy.infer([PolicyRequest("s", {"state": [1.0, 2.0]}, reset=True)])
    np.testing.assert_array_equal(result[0]["actions"], [1.0, 2.0])


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (f"{__name__}:make_incomplete_policy", "lacks PolicyEngine method(s): server_config, validate, infer, reset"),
        ("no_such_module_for_rtserve:factory", "cannot be imported"),
        (f"{__name__}:no_such_factory", "cannot be imported"),
        (f"{__name__}:__doc__", "is not callable"),
        ("not a policy", "neither 'demo', a TorchScript file, nor 'module:factory'"),
        ("/nonexistent/policy.pt", "does not exist"),
    ],
)
def test_bad_policy_specs_say_what_is_wrong(spec, message):
    with pytest.raises(PolicyLoadError) as info:
        load_policy(RobotConfig(policy=spec))
    assert message in str(info.value)
    assert "robot.policy" in str(info.value)


def test_torchscript_policy_runs_one_batched_forward(tmp_path):
    path = _save_torchscript(
        tmp_path / "doubler.pt",
        {
            "server_config": {"action_space": "joint_position"},
            "observation": {"observation/state": {"shape": [3]}},
            "action_key": "actions",
        },
    )
    policy = load_policy(RobotConfig(policy=path))
    assert policy.server_config()["action_space"] == "joint_position"
    assert policy.server_config()["observation_spec"]["observation/state"]["shape"] == [3]
    batch = [PolicyRequest(f"s{i}", {"observation/state": np.full(3, i, np.float64)}, reset=True) for i in range(4)]
    results = policy.infer(batch)
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result["actions"], np.full(3, 2.0 * i, np.float32))
    with pytest.raises(InvalidObservation, match="observation/state"):
        policy.validate({"observation/state": np.zeros(4)})


def test_torchscript_without_metadata_is_refused(tmp_path):
    path = _save_torchscript(tmp_path / "bare.pt", None)
    with pytest.raises(PolicyLoadError, match=r"rtserve_policy\.json"):
        load_policy(RobotConfig(policy=path))


def test_torchscript_with_broken_metadata_is_refused(tmp_path):
    path = _save_torchscript(tmp_path / "broken.pt", {"observation": {"x": {"no_shape": 1}}})
    with pytest.raises(PolicyLoadError, match="is invalid"):
        load_policy(RobotConfig(policy=path))


def test_a_file_that_is_not_torchscript_is_refused(tmp_path):
    path = tmp_path / "junk.pt"
    path.write_bytes(b"not a zip archive")
    with pytest.raises(PolicyLoadError, match="cannot load TorchScript file"):
        load_policy(RobotConfig(policy=str(path)))
