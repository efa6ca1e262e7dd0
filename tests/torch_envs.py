"""Test helpers for the tensor vector-env contract (tests/test_vec_tensor.py and the numpy-port tests).

* :class:`TorchCartPoleVec`: a batched CartPole that lives in torch on any device, the shape of
  an env family that already computes in torch (a GPU simulator such as VMAS). Its state is a
  few ``[E, ...]`` tensors; reset draws the initial state from a counter-based generator computed
  on the device (the same seed gives the same start on every device); snapshots and
  ``get_state`` are tensor clones. It refuses anything but tensors on its own device, so a run
  that trains on it proves the collectors hand its records through without a host round trip.
  :func:`register_torch_cartpole` registers it as ``torch_cartpole`` through
  ``register_env(vector_factory=...)`` (``env_kwargs={"device": "cuda"}`` puts it on a GPU).
* :func:`numpy_records`: a numpy env seen through numpy records (:meth:`Step.numpy`), for the
  tests that compare the ports step for step against Gymnasium/mpe2 in numpy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor

from grpo_marl.errors import EnvError, UserInputError
from grpo_marl.registry import register_env
from grpo_marl.vec.base import HostStep, Step, VecEnv, canonical_device, layout_of

_MODULUS = 2**31 - 1  # Park-Miller "minimal standard" generator: int64 products never overflow
_MULTIPLIER = 48271


class TorchCartPoleVec(VecEnv):
    """``num_envs`` CartPoles (Gymnasium's dynamics and limits) stepped by torch ops on ``device``.

    Discrete(2) actions as ``int64[E, 1]`` tensors on ``device``; observations ``float32[E, 1, 4]``.
    An episode ends when the pole falls or the cart leaves the track (terminated) or after
    ``max_episode_steps`` steps (truncated); every step of a running episode pays 1.
    """

    backend = "torch"
    supports_snapshot = True

    def __init__(
        self, num_envs: int, *, with_state: bool = False, device: str = "cpu", max_episode_steps: int = 200
    ) -> None:
        if int(num_envs) < 1:
            raise UserInputError(f"torch_cartpole: num_envs must be >= 1, got {num_envs}")
        self.num_envs = E = int(num_envs)
        self.device = canonical_device(device)
        self.name = "torch_cartpole"
        self.with_state = bool(with_state)
        self.max_episode_steps = int(max_episode_steps)
        self.layout = layout_of(("agent",), (spaces.Box(-np.inf, np.inf, (4,), np.float32),), (spaces.Discrete(2),))
        dev = self.device
        self._s = torch.zeros((E, 4), dtype=torch.float32, device=dev)
        self._t = torch.zeros(E, dtype=torch.long, device=dev)
        self._done = torch.ones(E, dtype=torch.bool, device=dev)
        self._seed = torch.full((E,), -1, dtype=torch.long, device=dev)
        #: every ``step`` call's action type and device (tests read it)
        self.received: list[tuple[type, torch.device]] = []

    # -- contract ------------------------------------------------------------------------------
    def reset(self, seeds: Sequence[int], indices: Sequence[int] | None = None) -> Step:
        idx = self._index(indices)
        if len(seeds) != len(idx):
            raise UserInputError(f"{self.name}: reset got {len(seeds)} seeds for {len(idx)} envs")
        seed = torch.as_tensor([int(s) for s in seeds], dtype=torch.long, device=self.device)
        x = seed % (_MODULUS - 1) + 1
        for _ in range(3):  # decorrelate neighbouring seeds
            x = x * _MULTIPLIER % _MODULUS
        draws = []
        for _ in range(4):
            x = x * _MULTIPLIER % _MODULUS
            draws.append(x)
        u = torch.stack(draws, 1).to(torch.float32) / _MODULUS
        self._s[idx] = u * 0.1 - 0.05  # Gymnasium's uniform(-0.05, 0.05)
        self._t[idx] = 0
        self._done[idx] = False
        self._seed[idx] = seed
        return Step.observed(self._s[idx][:, None].clone(), self._done[idx].clone(), self._state(len(idx)))

    def step(self, actions: Tensor) -> Step:
        self.received.append((type(actions), getattr(actions, "device", None)))  # type: ignore[arg-type]
        if not isinstance(actions, Tensor) or actions.device != self.device:
            where = getattr(actions, "device", "the host")
            raise EnvError(
                f"{self.name}: actions must be a tensor on {self.device}, got {type(actions).__name__} on {where}"
            )
        E = self.num_envs
        if actions.shape not in ((E, 1), (E,)):
            raise UserInputError(f"{self.name}: actions must have shape [E, 1] = {(E, 1)}, got {tuple(actions.shape)}")
        live = ~self._done
        a = torch.where(live, actions.reshape(E).long(), 0)
        x, x_dot, theta, theta_dot = self._s.unbind(1)
        force = torch.where(a == 1, 10.0, -10.0)
        cos, sin = torch.cos(theta), torch.sin(theta)
        total_mass, pole_ml, length = 1.1, 0.05, 0.5
        temp = (force + pole_ml * theta_dot**2 * sin) / total_mass
        theta_acc = (9.8 * sin - cos * temp) / (length * (4.0 / 3.0 - 0.1 * cos**2 / total_mass))
        x_acc = temp - pole_ml * theta_acc * cos / total_mass
        tau = 0.02
        new = torch.stack(
            [x + tau * x_dot, x_dot + tau * x_acc, theta + tau * theta_dot, theta_dot + tau * theta_acc], 1
        )
        self._s = torch.where(live[:, None], new, self._s)
        self._t = self._t + live.long()
        x, theta = self._s[:, 0], self._s[:, 2]
        terminated = live & ((x.abs() > 2.4) | (theta.abs() > 12 * 2 * math.pi / 360))
        truncated = live & (self._t >= self.max_episode_steps)
        self._done = self._done | terminated | truncated
        return Step(
            obs=self._s[:, None].clone(),
            rewards=live.to(torch.float32)[:, None],
            terminated=terminated[:, None],
            truncated=truncated[:, None],
            alive=~self._done[:, None],
            env_done=self._done.clone(),
            state=self._state(E),
        )

    def _index(self, indices: Sequence[int] | None) -> Tensor:
        if indices is None:
            return torch.arange(self.num_envs, device=self.device)
        return torch.as_tensor([int(i) for i in indices], dtype=torch.long, device=self.device)

    def _state(self, n: int) -> Tensor | None:
        return torch.zeros((n, 0), dtype=torch.float32, device=self.device) if self.with_state else None

    # -- snapshots: clones of each env's rows --------------------------------------------------
    def snapshot(self, indices: Sequence[int]) -> list[Any]:
        return [
            {
                "s": self._s[i].clone(),
                "t": self._t[i].clone(),
                "done": self._done[i].clone(),
                "seed": self._seed[i].clone(),
            }
            for i in (int(j) for j in indices)
        ]

    def restore(self, indices: Sequence[int], snaps: Sequence[Any]) -> None:
        if len(indices) != len(snaps):
            raise UserInputError(f"{self.name}: restore got {len(snaps)} snapshots for {len(indices)} envs")
        for i, snap in zip((int(j) for j in indices), snaps, strict=True):
            self._s[i] = snap["s"]
            self._t[i] = snap["t"]
            self._done[i] = snap["done"]
            self._seed[i] = snap["seed"]

    def get_state(self) -> Any:
        return {"s": self._s.clone(), "t": self._t.clone(), "done": self._done.clone(), "seed": self._seed.clone()}

    def set_state(self, state: Any) -> None:
        self._s = state["s"].to(self.device).clone()
        self._t = state["t"].to(self.device).clone()
        self._done = state["done"].to(self.device).clone()
        self._seed = state["seed"].to(self.device).clone()


#: a few seconds of training on the CPU
TORCH_CARTPOLE_DEFAULTS: dict[str, Any] = {
    "common": {"total_steps": 4_000, "eval": {"episodes": 8}},
    "grpo": {"algo": {"num_groups": 4, "group_size": 4}},
}


def register_torch_cartpole() -> None:
    """Register ``torch_cartpole`` (only a ``vector_factory``: there is no per-env object)."""
    register_env(
        "torch_cartpole",
        kind="gymnasium",
        vector_factory=TorchCartPoleVec,
        defaults=TORCH_CARTPOLE_DEFAULTS,
        threshold=195.0,
        description="CartPole batched in torch on any device (tests/torch_envs.py)",
        overwrite=True,
    )


class _NumpyRecords:
    """A vector env whose ``reset``/``step``/``observations`` records come back as numpy
    (:meth:`Step.numpy`); every other attribute is the env's own."""

    def __init__(self, vec: Any) -> None:
        self.vec = vec

    def __getattr__(self, name: str) -> Any:
        return getattr(self.vec, name)

    def reset(self, *args: Any, **kwargs: Any) -> HostStep:
        return self.vec.reset(*args, **kwargs).numpy()

    def step(self, actions: Any) -> HostStep:
        if isinstance(actions, np.ndarray):
            actions = torch.from_numpy(np.ascontiguousarray(actions))
        return self.vec.step(actions).numpy()

    def observations(self, *args: Any, **kwargs: Any) -> HostStep:
        return self.vec.observations(*args, **kwargs).numpy()


def numpy_records(vec: Any) -> Any:
    """``vec`` seen through numpy records and fed numpy actions (as tensors), for the tests that
    compare a port's trajectories with the original env's in numpy."""
    return _NumpyRecords(vec)
