"""A vector env stepping its envs in this process, through one driver."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from grpo_marl.vec.base import Step, VecEnv, host_actions
from grpo_marl.vec.drivers import Driver


class LocalVec(VecEnv):
    """Every env in this process (``vec.vectorization=sync``; PettingZoo with no workers).

    The cheapest choice whenever the env step is cheap or there is no spare core: no pickling,
    no pipes, exact snapshots of every env kind. The driver computes in numpy; its records
    become tensors here, once per call, without a copy.
    """

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.num_envs = driver.n
        self.layout = driver.layout
        self.name = driver.name
        self.max_episode_steps = driver.max_episode_steps
        self.supports_snapshot = driver.supports_snapshot
        self.with_state = driver.with_state

    def reset(self, seeds: Sequence[int], indices: Sequence[int] | None = None) -> Step:
        return self.driver.reset(seeds, indices).to_step()

    def step(self, actions: Tensor) -> Step:
        return self.driver.step(host_actions(actions)).to_step()

    def snapshot(self, indices: Sequence[int]) -> list[Any]:
        return self.driver.snapshot(indices)

    def restore(self, indices: Sequence[int], snaps: Sequence[Any]) -> None:
        self.driver.restore(indices, snaps)

    def close(self) -> None:
        self.driver.close()
