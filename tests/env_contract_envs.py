"""Custom env factories for tests/test_env_failures.py (reached as ``env=tests.env_contract_envs:<name>``)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.wrappers import TimeLimit


class Drift(gym.Env):
    """A 1-D env with no time limit of its own: it never terminates."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, bad_shape: bool = False) -> None:
        self.bad_shape = bad_shape
        self.x = 0.0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.x = float(self.np_random.uniform(-1, 1))
        if self.bad_shape:
            return np.zeros(3, np.float32), {}
        return np.array([self.x, 0.0], np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.x += 0.1 if int(action) else -0.1
        return np.array([self.x, 1.0], np.float32), -abs(self.x), False, False, {}


def capped(limit: int = 60) -> gym.Env:
    """The standard way to cap episodes: a TimeLimit wrapper around an env without a spec."""
    return TimeLimit(Drift(), max_episode_steps=limit)


def uncapped() -> gym.Env:
    return Drift()


def bad_shape() -> gym.Env:
    return TimeLimit(Drift(bad_shape=True), max_episode_steps=20)
