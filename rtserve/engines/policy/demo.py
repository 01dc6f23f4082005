"""The built-in ``demo`` policy: a small seeded torch network speaking openpi's DROID format.

It exists so the robot route works out of the box and so batching can be measured on a
real network. Weights are random but seeded, so every server computes the same actions.

Observation (openpi DROID example): ``observation/exterior_image_1_left`` and
``observation/wrist_image_left`` (uint8 224x224x3), ``observation/joint_position`` (7),
``observation/gripper_position`` (1), ``prompt`` (str). Response: ``{"actions": float32
(10, 8)}``: 10 steps of 7 joint velocities plus a gripper command, in [-1, 1].

The network keeps a recurrent memory per session (reset on ``PolicyRequest.reset``), so
a session's actions depend on its own history and on nothing else in the batch: every
layer works row by row (no batch statistics), which keeps results independent of how
requests were grouped.

A request's ``seed`` samples the chunk the way a diffusion or flow policy does: seeded
Gaussian noise joins the action logits, so the same seed gives the same actions and
another seed other ones. Without a seed the noise-free (mean) chunk comes back.
"""

from __future__ import annotations

import math
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from rtserve.engines.policy.observation_spec import (
    ArraySpec,
    ObservationSpec,
    TextSpec,
    describe_spec,
    validate_observation,
)
from rtserve.engines.values import PolicyRequest

IMAGE_SIZE = 224
EXTERIOR_IMAGE = "observation/exterior_image_1_left"
WRIST_IMAGE = "observation/wrist_image_left"
JOINT_POSITION = "observation/joint_position"
GRIPPER_POSITION = "observation/gripper_position"
PROMPT = "prompt"
ACTION_HORIZON = 10
ACTION_DIM = 8  # 7 joint velocities + gripper

DROID_OBSERVATION: ObservationSpec = {
    EXTERIOR_IMAGE: ArraySpec((IMAGE_SIZE, IMAGE_SIZE, 3), dtype="uint8"),
    WRIST_IMAGE: ArraySpec((IMAGE_SIZE, IMAGE_SIZE, 3), dtype="uint8"),
    JOINT_POSITION: ArraySpec((7,)),
    GRIPPER_POSITION: ArraySpec((1,)),
    PROMPT: TextSpec(max_chars=1024),
}

_POOL = 8  # 224x224 -> 28x28 before the image projection
_PROMPT_BUCKETS = 512
_HIDDEN = 128
_SAMPLE_NOISE = 0.5  # std of the seeded noise on the action logits


def _prompt_buckets(prompt: str) -> list[int]:
    """Hash words to embedding rows (crc32: stable across processes, unlike ``hash``)."""
    words = prompt.lower().split() or [""]
    return [zlib.crc32(word.encode()) % _PROMPT_BUCKETS for word in words]


class RowwiseLinear(nn.Linear):
    """``nn.Linear`` computed as one small matmul per row (a batched ``baddbmm``).

    A plain ``addmm`` lets the BLAS pick its blocking from the batch size, which changes
    float rounding with the batch; one fixed-shape product per row gives every robot
    bit-identical actions whether it was served alone or in a batch of 32.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        bias = self.bias.expand(rows, 1, -1)
        weight = self.weight.t().expand(rows, -1, -1)
        return torch.baddbmm(bias, x.unsqueeze(1), weight).squeeze(1)


class RowwiseGRUCell(nn.Module):
    """A GRU cell (same equations as ``nn.GRUCell``) built on ``RowwiseLinear``."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.input = RowwiseLinear(size, 3 * size)
        self.hidden = RowwiseLinear(size, 3 * size)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        xr, xz, xn = self.input(x).chunk(3, dim=1)
        hr, hz, hn = self.hidden(h).chunk(3, dim=1)
        reset = torch.sigmoid(xr + hr)
        update = torch.sigmoid(xz + hz)
        candidate = torch.tanh(xn + reset * hn)
        return (1 - update) * candidate + update * h


class DemoDroidNet(nn.Module):
    """Two camera encoders + state + prompt -> GRU memory -> action chunk."""

    def __init__(self) -> None:
        super().__init__()
        pooled = 3 * (IMAGE_SIZE // _POOL) ** 2
        self.exterior = RowwiseLinear(pooled, 64)
        self.wrist = RowwiseLinear(pooled, 64)
        self.state = RowwiseLinear(8, 32)
        self.prompt = nn.EmbeddingBag(_PROMPT_BUCKETS, 32, mode="mean")
        self.fuse = RowwiseLinear(64 + 64 + 32 + 32, _HIDDEN)
        self.memory = RowwiseGRUCell(_HIDDEN)
        self.head = RowwiseLinear(_HIDDEN, ACTION_HORIZON * ACTION_DIM)

    @staticmethod
    def _pool(images: torch.Tensor) -> torch.Tensor:
        # [B, H, W, 3] uint8 -> [B, 3 * 28 * 28] in [0, 1]; pooling the channels-last
        # view directly avoids a layout copy of the full-size images.
        pooled = nn.functional.avg_pool2d(images.float().permute(0, 3, 1, 2), _POOL)
        return pooled.flatten(1) / 255.0

    def forward(
        self,
        exterior: torch.Tensor,
        wrist: torch.Tensor,
        state: torch.Tensor,
        prompt_ids: torch.Tensor,
        prompt_offsets: torch.Tensor,
        hidden: torch.Tensor,
        noise: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        features = torch.cat(
            [
                self.exterior(self._pool(exterior)),
                self.wrist(self._pool(wrist)),
                self.state(state),
                self.prompt(prompt_ids, prompt_offsets),
            ],
            dim=1,
        )
        new_hidden = self.memory(nn.functional.gelu(self.fuse(features)), hidden)
        actions = torch.tanh(self.head(new_hidden) + noise).view(-1, ACTION_HORIZON, ACTION_DIM)
        return actions, new_hidden


def _sample_noise(seed: int | None) -> torch.Tensor:
    """One request's logit noise, from its own generator (independent of the batch)."""
    if seed is None:
        return torch.zeros(ACTION_HORIZON * ACTION_DIM)
    noise = np.random.default_rng(seed).standard_normal(ACTION_HORIZON * ACTION_DIM, dtype=np.float32)
    return torch.from_numpy(noise * _SAMPLE_NOISE)


def _seeded_init(net: nn.Module, seed: int) -> None:
    """Fill every parameter from a private generator: the process-wide RNG may be drawn
    from concurrently by other engines loading, which would make the weights vary."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in net.parameters():
            bound = 1.0 / math.sqrt(param.shape[-1])
            param.uniform_(-bound, bound, generator=generator)


class DemoDroidPolicy:
    """``PolicyEngine`` around ``DemoDroidNet`` with per-session memory (LRU-bounded)."""

    def __init__(self, *, seed: int = 0, max_sessions: int = 1024) -> None:
        self._net = DemoDroidNet().eval()
        _seeded_init(self._net, seed)
        self._max_sessions = max_sessions
        self._memory: OrderedDict[str, torch.Tensor] = OrderedDict()

    def server_config(self) -> dict[str, Any]:
        return {
            "policy": "rtserve-demo-droid",
            "image_resolution": [IMAGE_SIZE, IMAGE_SIZE],
            "n_external_cameras": 1,
            "needs_wrist_camera": True,
            "needs_stereo_camera": False,
            "needs_session_id": False,
            "action_space": "joint_velocity",
            "action_horizon": ACTION_HORIZON,
            "action_dim": ACTION_DIM,
            "action_keys": ["actions"],
            "observation_spec": describe_spec(DROID_OBSERVATION),
        }

    def validate(self, observation: dict[str, Any]) -> None:
        validate_observation(DROID_OBSERVATION, observation)

    def infer(self, batch: Sequence[PolicyRequest]) -> list[dict[str, Any]]:
        observations = [request.observation for request in batch]
        buckets = [_prompt_buckets(obs[PROMPT]) for obs in observations]
        offsets = np.cumsum([0] + [len(b) for b in buckets[:-1]])
        hidden = torch.stack([self._initial_hidden(request) for request in batch])
        state = np.stack([np.concatenate([obs[JOINT_POSITION], obs[GRIPPER_POSITION]]) for obs in observations])
        with torch.inference_mode():
            actions, new_hidden = self._net(
                torch.from_numpy(np.stack([obs[EXTERIOR_IMAGE] for obs in observations])),
                torch.from_numpy(np.stack([obs[WRIST_IMAGE] for obs in observations])),
                torch.from_numpy(state.astype(np.float32)),
                torch.tensor([i for b in buckets for i in b], dtype=torch.long),
                torch.from_numpy(offsets.astype(np.int64)),
                hidden,
                torch.stack([_sample_noise(request.seed) for request in batch]),
            )
        for request, row in zip(batch, new_hidden):
            self._remember(request.session_id, row.clone())
        return [{"actions": row.numpy().copy()} for row in actions]

    def reset(self, session_id: str) -> None:
        self._memory.pop(session_id, None)

    def _initial_hidden(self, request: PolicyRequest) -> torch.Tensor:
        if request.reset:
            return torch.zeros(_HIDDEN)
        return self._memory.get(request.session_id, torch.zeros(_HIDDEN))

    def _remember(self, session_id: str, hidden: torch.Tensor) -> None:
        self._memory[session_id] = hidden
        self._memory.move_to_end(session_id)
        while len(self._memory) > self._max_sessions:
            self._memory.popitem(last=False)  # forget the least recently served robot


def example_observation(seed: int = 0, prompt: str = "pick up the red cup") -> dict[str, Any]:
    """A valid DROID observation with seeded random content (benchmarks, tests, docs)."""
    rng = np.random.default_rng(seed)
    return {
        EXTERIOR_IMAGE: rng.integers(0, 256, (IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8),
        WRIST_IMAGE: rng.integers(0, 256, (IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8),
        JOINT_POSITION: rng.uniform(-1.0, 1.0, 7),
        GRIPPER_POSITION: rng.uniform(0.0, 1.0, 1),
        PROMPT: prompt,
    }
