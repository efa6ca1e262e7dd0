"""Tiny environment factories the tests reach the way users do: ``env=tests.custom_envs:NAME``,
``register_env(..., factory)`` or an installed ``grpo_marl.envs`` entry point.

Not a test module (no ``test_`` prefix); importable as ``tests.custom_envs`` from the repository
root, which is where the CLI subprocesses run.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from grpo_marl.registry import register_env


def make_toy(**kwargs: Any) -> gym.Env:
    """A ``package.module:factory`` env: CartPole with factory-level tuned defaults."""
    return gym.make("CartPole-v1", **kwargs)


# Picked up by the registry for ``env=tests.custom_envs:make_toy``.
make_toy.grpo_marl_defaults = {"grpo": {"algo": {"group_size": 4, "num_groups": 3}}}  # type: ignore[attr-defined]
make_toy.grpo_marl_threshold = 123.0  # type: ignore[attr-defined]


def register_hook() -> None:
    """An entry point that registers envs when loaded (instead of being a factory itself)."""
    register_env("ep_hook_env", make_toy, kind="gymnasium", threshold=7.0, description="from a hook")


class NonFiniteCartPole(gym.Wrapper):
    """CartPole that emits NaN (``where`` = obs or reward) or overflowing rewards (``huge``) once
    this instance has taken ``after`` steps.

    The counter survives resets, so the first few updates of a run are healthy (and checkpointed)
    before the env breaks, like a simulator that diverges mid-run.
    """

    def __init__(self, env: gym.Env, after: int, where: str) -> None:
        super().__init__(env)
        self.after = after
        self.where = where
        self.count = 0

    def step(self, action: Any):  # type: ignore[override]
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.count += 1
        if self.count > self.after:
            if self.where == "obs":
                obs = np.full_like(obs, np.nan)
            elif self.where == "reward":
                reward = float("nan")
            else:  # "huge": finite rewards whose returns overflow float32, so the loss turns NaN
                reward = 1e38
        return obs, reward, terminated, truncated, info


def nan_cartpole(after: int = 60, where: str = "obs") -> gym.Env:
    return NonFiniteCartPole(gym.make("CartPole-v1"), after=after, where=where)


class Bandit(gym.Env):
    """One-step two-armed bandit: reward = action. A group of 2 has zero reward variance whenever
    both members pick the same arm, so zero-std groups are common and easy to reason about."""

    observation_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None):  # type: ignore[override]
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: Any):  # type: ignore[override]
        return np.zeros(1, np.float32), float(action), True, False, {}


def bandit() -> gym.Env:
    return Bandit()


#: the keyword arguments :func:`sized_bandit` was built with, in this process
SEEN_KWARGS: list[dict[str, Any]] = []


def sized_bandit(size: int = 2, labels: dict[str, float] | None = None) -> gym.Env:
    """A ``size``-armed bandit (reward = arm index) built from keyword arguments, recording them:
    ``fit(env_kwargs={...})`` and the CLI's ``+env_kwargs.size=3`` must reach the factory."""
    SEEN_KWARGS.append({"size": size, "labels": labels})
    env = Bandit()
    env.action_space = spaces.Discrete(size)
    return env


class ConstantReward(Bandit):
    """Every rollout returns exactly 1: every group has zero variance."""

    def step(self, action: Any):  # type: ignore[override]
        return np.zeros(1, np.float32), 1.0, True, False, {}


def constant_reward() -> gym.Env:
    return ConstantReward()


class MultiBinaryEnv(Bandit):
    """An action space the MLP policy cannot represent."""

    action_space = spaces.MultiBinary(3)


def multibinary() -> gym.Env:
    return MultiBinaryEnv()


class MatrixAction(Bandit):
    """A one-step env whose Box action is 2-D (2 x 2): it checks that the action arrives in that
    shape and pays ``action[0, 1] - action[1, 0]`` (order-sensitive, so a transposed or flattened
    action is caught)."""

    action_space = spaces.Box(-1.0, 1.0, (2, 2), np.float32)

    def step(self, action: Any):  # type: ignore[override]
        action = np.asarray(action)
        if action.shape != (2, 2):
            raise ValueError(f"expected a (2, 2) action, got shape {action.shape}")
        return np.zeros(1, np.float32), float(action[0, 1] - action[1, 0]), True, False, {}


def matrix_action() -> gym.Env:
    return MatrixAction()


class FloatImage(gym.Env):
    """Declares a uint8 image space but returns float images in [0, 1] (a common slip): the
    vector env would cast them to 0s and 1s, so the first reset refuses them."""

    observation_space = spaces.Box(0, 255, (36, 36, 3), np.uint8)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None):  # type: ignore[override]
        super().reset(seed=seed)
        return self.np_random.random((36, 36, 3)).astype(np.float32), {}

    def step(self, action: Any):  # type: ignore[override]
        return self.np_random.random((36, 36, 3)).astype(np.float32), float(action), True, False, {}


def float_image() -> gym.Env:
    return FloatImage()


def spread_without_kind() -> Any:
    """A PettingZoo ParallelEnv factory that does not say so (no ``grpo_marl_kind``): refused,
    naming the attribute, instead of being stepped as a Gymnasium env."""
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(max_cycles=5)
