"""CartPole through Gymnasium's own numpy-batched ``CartPoleVectorEnv``, under our contract.

Gymnasium's vector CartPole takes one int seed and autoresets on the next step; here every env
draws its initial state from its own seed exactly as ``gym.make("CartPole-v1").reset(seed=s)``
does (``np.random.default_rng(s).uniform(-0.05, 0.05, 4)``), finished envs are frozen until the
collector resets them, and a column of the ``(4, N)`` state array plus the step counter is an
exact snapshot (the dynamics are deterministic).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from grpo_marl.vec.base import Step, VecEnv, layout_of


class NativeCartPoleVec(VecEnv):
    supports_snapshot = True

    def __init__(
        self, num_envs: int, *, max_episode_steps: int = 500, name: str = "CartPole-v1", **kwargs: Any
    ) -> None:
        from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv

        self.env = CartPoleVectorEnv(num_envs=num_envs, max_episode_steps=max_episode_steps, **kwargs)
        self.env.reset(seed=0)
        self.num_envs = num_envs
        self.name = name
        self.max_episode_steps = int(max_episode_steps)
        self.layout = layout_of(("agent",), (self.env.single_observation_space,), (self.env.single_action_space,))
        self.done = np.ones(num_envs, dtype=bool)
        self._obs = np.zeros((num_envs, 1, 4), np.float32)

    def reset(self, seeds: Sequence[int], indices: Sequence[int] | None = None) -> Step:
        env = self.env
        idx = np.arange(self.num_envs) if indices is None else np.asarray(indices, dtype=np.int64)
        for i, seed in zip(idx, seeds, strict=True):
            env.state[:, i] = np.random.default_rng(int(seed)).uniform(low=-0.05, high=0.05, size=4)
        env.steps[idx] = 0
        self.done[idx] = False
        self._obs[idx, 0] = env.state[:, idx].T.astype(np.float32)
        n = len(idx)
        return Step(
            obs=self._obs[idx].copy(),
            rewards=np.zeros((n, 1), np.float32),
            terminated=np.zeros((n, 1), bool),
            truncated=np.zeros((n, 1), bool),
            alive=np.ones((n, 1), bool),
            env_done=np.zeros(n, bool),
        )

    def step(self, actions: np.ndarray) -> Step:
        env = self.env
        frozen = self.done.copy()
        kept_state = env.state[:, frozen].copy()
        kept_steps = env.steps[frozen].copy()
        env.prev_done[:] = False  # the collector resets envs itself
        act = np.asarray(actions, dtype=np.int64).reshape(self.num_envs)
        act[frozen] = 0
        obs, reward, terminated, truncated, _ = env.step(act)
        env.state[:, frozen] = kept_state
        env.steps[frozen] = kept_steps
        live = ~frozen
        terminated = terminated & live
        truncated = truncated & live
        reward = np.where(live, reward, 0.0).astype(np.float32)
        self._obs[live, 0] = obs[live]
        done = terminated | truncated
        self.done |= done
        return Step(
            obs=self._obs.copy(),
            rewards=reward[:, None],
            terminated=terminated[:, None],
            truncated=truncated[:, None],
            alive=~self.done[:, None],
            env_done=self.done.copy(),
        )

    def snapshot(self, indices: Sequence[int]) -> list[Any]:
        return [
            (self.env.state[:, i].copy(), int(self.env.steps[i]), bool(self.done[i]), self._obs[i].copy())
            for i in indices
        ]

    def restore(self, indices: Sequence[int], snaps: Sequence[Any]) -> None:
        for i, (state, steps, done, obs) in zip(indices, snaps, strict=True):
            self.env.state[:, i] = state
            self.env.steps[i] = steps
            self.done[i] = done
            self._obs[i] = obs
