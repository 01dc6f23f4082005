"""The built-in DROID demo policy: format, validation, batch invariance, per-session memory."""

from __future__ import annotations

import numpy as np
import pytest

from rtserve.engines.policy.demo import (
    EXTERIOR_IMAGE,
    GRIPPER_POSITION,
    JOINT_POSITION,
    PROMPT,
    WRIST_IMAGE,
    DemoDroidPolicy,
    example_observation,
)
from rtserve.engines.policy.errors import InvalidObservation
from rtserve.engines.values import PolicyRequest


@pytest.fixture(scope="module")
def policy() -> DemoDroidPolicy:
    return DemoDroidPolicy()


def _alone(policy: DemoDroidPolicy, seed: int, prompt: str = "pick up the red cup") -> np.ndarray:
    return policy.infer([PolicyRequest(f"alone-{seed}", example_observation(seed, prompt), reset=True)])[0]["actions"]


def test_actions_have_droid_shape_and_range(policy):
    actions = _alone(policy, 0)
    assert actions.shape == (10, 8) and actions.dtype == np.float32
    assert np.all(np.abs(actions) <= 1.0) and np.isfinite(actions).all()


def test_server_config_describes_the_droid_format(policy):
    config = policy.server_config()
    assert config["action_horizon"] == 10 and config["action_dim"] == 8
    assert config["image_resolution"] == [224, 224]
    assert set(config["observation_spec"]) == {EXTERIOR_IMAGE, WRIST_IMAGE, JOINT_POSITION, GRIPPER_POSITION, PROMPT}


def test_batching_never_changes_a_robots_actions(policy):
    prompts = ["pick up the red cup", "open the drawer", "", "put the marker in the bowl and then wave"]
    singles = {seed: _alone(policy, seed, prompts[seed % 4]) for seed in range(12)}
    for seeds in ([0, 1], [5, 3, 7], list(range(12)), [11, 2, 9, 4, 4, 0]):
        batch = [
            PolicyRequest(f"batch-{i}", example_observation(seed, prompts[seed % 4]), reset=True)
            for i, seed in enumerate(seeds)
        ]
        for seed, result in zip(seeds, policy.infer(batch)):
            np.testing.assert_array_equal(result["actions"], singles[seed])


def test_weights_are_seeded(policy):
    obs = example_observation(3)
    again = DemoDroidPolicy().infer([PolicyRequest("s", obs, reset=True)])[0]["actions"]
    other = DemoDroidPolicy(seed=1).infer([PolicyRequest("s", obs, reset=True)])[0]["actions"]
    np.testing.assert_array_equal(again, _alone(policy, 3))
    assert not np.allclose(other, again)


def test_inputs_matter(policy):
    assert not np.allclose(_alone(policy, 1), _alone(policy, 2))
    assert not np.allclose(_alone(policy, 1, "open the drawer"), _alone(policy, 1, "close the drawer"))


def test_memory_is_per_session_and_cleared_by_reset(policy):
    obs = example_observation(4)
    first = policy.infer([PolicyRequest("mem-a", obs, reset=True)])[0]["actions"]
    second = policy.infer([PolicyRequest("mem-a", obs, reset=False)])[0]["actions"]
    assert not np.allclose(first, second), "the recurrent memory should carry the session's history"
    # Another session's first step is unaffected by session a's history.
    np.testing.assert_array_equal(policy.infer([PolicyRequest("mem-b", obs, reset=False)])[0]["actions"], first)
    np.testing.assert_array_equal(policy.infer([PolicyRequest("mem-a", obs, reset=True)])[0]["actions"], first)
    policy.infer([PolicyRequest("mem-a", obs, reset=False)])
    policy.reset("mem-a")
    np.testing.assert_array_equal(policy.infer([PolicyRequest("mem-a", obs, reset=False)])[0]["actions"], first)


def test_session_memory_is_bounded_least_recently_used_first():
    policy = DemoDroidPolicy(max_sessions=2)
    obs = example_observation(5)
    fresh = policy.infer([PolicyRequest("old", obs, reset=True)])[0]["actions"]
    policy.infer([PolicyRequest("mid", obs, reset=True)])
    policy.infer([PolicyRequest("new", obs, reset=True)])  # evicts "old"
    np.testing.assert_array_equal(policy.infer([PolicyRequest("old", obs, reset=False)])[0]["actions"], fresh)
    assert not np.allclose(policy.infer([PolicyRequest("new", obs, reset=False)])[0]["actions"], fresh)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        (JOINT_POSITION, None, f"missing observation key '{JOINT_POSITION}'"),
        (JOINT_POSITION, np.zeros(6), f"'{JOINT_POSITION}' must have shape [7], got [6]"),
        (GRIPPER_POSITION, 0.5, f"'{GRIPPER_POSITION}' must be a numpy array, got float"),
        (EXTERIOR_IMAGE, np.zeros((224, 224, 3), np.float32), f"'{EXTERIOR_IMAGE}' must have dtype uint8"),
        (WRIST_IMAGE, np.zeros((112, 112, 3), np.uint8), f"'{WRIST_IMAGE}' must have shape [224, 224, 3]"),
        (JOINT_POSITION, np.array(["a"] * 7), f"'{JOINT_POSITION}' must be numeric"),
        (PROMPT, b"bytes", f"'{PROMPT}' must be a string"),
    ],
)
def test_validation_names_the_offending_key(policy, key, value, expected):
    obs = example_observation(0)
    if value is None:
        del obs[key]
    else:
        obs[key] = value
    with pytest.raises(InvalidObservation) as info:
        policy.validate(obs)
    assert expected in str(info.value)
    assert info.value.code == "invalid_observation"


def test_valid_observation_with_extra_keys_passes(policy):
    policy.validate({**example_observation(0), "seed": 3, "observation/cartesian_position": np.zeros(6)})
