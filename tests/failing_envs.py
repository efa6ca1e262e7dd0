"""Env factories that fail on purpose, for the rollout-worker and torchrun failure tests.

Reached the way users reach their own envs: ``env=tests.failing_envs:crash_after``. Not a test
module (no ``test_`` prefix).
"""

from __future__ import annotations

import os
from typing import Any

import gymnasium as gym


class EnvCrash(RuntimeError):
    """The deliberate failure (a distinct type, so tests can tell it from a real bug)."""


class CrashAfter(gym.Wrapper):
    """CartPole that raises :class:`EnvCrash` once this instance has taken ``after`` steps.

    The counter survives resets, so the first updates of a run are healthy (and checkpointed)
    before the env breaks, like a simulator that crashes mid-run. ``rank``: crash only in the
    torchrun process of that rank (``RANK``), to test that one rank's failure stops them all.
    """

    def __init__(self, env: gym.Env, after: int, rank: int | None) -> None:
        super().__init__(env)
        self.after = after
        self.armed = rank is None or int(os.environ.get("RANK", "0")) == int(rank)
        self.count = 0

    def step(self, action: Any):  # type: ignore[override]
        self.count += 1
        if self.armed and self.count > self.after:
            raise EnvCrash(f"simulated simulator crash after {self.after} steps")
        return self.env.step(action)


def crash_after(after: int = 150, rank: int | None = None) -> gym.Env:
    return CrashAfter(gym.make("CartPole-v1"), after=after, rank=rank)


class TwoWalkers:
    """A tiny PettingZoo Parallel env (two agents on a line, 10-step episodes) that breaks on
    purpose once this instance has taken ``after`` steps: ``fault="crash"`` raises
    :class:`EnvCrash` (``rank``: only in that torchrun rank), ``fault="nan"`` returns a NaN reward
    for ``walker_1``. The counter survives resets, like :class:`CrashAfter`.

    Written against the Parallel API directly (no mpe2) so the failure is the only moving part.
    """

    metadata = {"name": "two_walkers_v0", "is_parallelizable": True}
    possible_agents = ["walker_0", "walker_1"]

    def __init__(self, after: int = 30, fault: str = "crash", rank: int | None = None, max_cycles: int = 10) -> None:
        import numpy as np
        from gymnasium import spaces

        self.after = after
        self.fault = fault
        self.armed = rank is None or int(os.environ.get("RANK", "0")) == int(rank)
        self.max_cycles = max_cycles
        self.count = 0
        self.agents: list[str] = []
        self._obs_space = spaces.Box(-10.0, 10.0, (2,), np.float32)
        self._act_space = spaces.Discrete(3)
        self._pos = np.zeros(2, np.float32)
        self._t = 0

    @property
    def unwrapped(self) -> TwoWalkers:
        return self

    def observation_space(self, agent: str) -> Any:
        return self._obs_space

    def action_space(self, agent: str) -> Any:
        return self._act_space

    def _obs(self) -> dict[str, Any]:
        import numpy as np

        return {a: np.array([self._pos[i], self._t / self.max_cycles], np.float32) for i, a in enumerate(self.agents)}

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        import numpy as np

        self._pos = np.random.default_rng(seed).uniform(-1.0, 1.0, 2).astype(np.float32)
        self._t = 0
        self.agents = list(self.possible_agents)
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions: dict[str, int]) -> tuple[dict, dict, dict, dict, dict]:
        self.count += 1
        if self.armed and self.count > self.after and self.fault == "crash":
            raise EnvCrash(f"simulated multi-agent simulator crash after {self.after} steps")
        for i, a in enumerate(self.possible_agents):
            if a in actions:
                self._pos[i] += 0.1 * (int(actions[a]) - 1)
        self._t += 1
        rewards = {a: -abs(float(self._pos[i])) for i, a in enumerate(self.agents)}
        if self.armed and self.count > self.after and self.fault == "nan":
            rewards["walker_1"] = float("nan")
        done = self._t >= self.max_cycles
        obs = self._obs()
        terms = {a: False for a in self.agents}
        truncs = {a: done for a in self.agents}
        infos: dict[str, dict] = {a: {} for a in self.agents}
        if done:
            self.agents = []
        return obs, rewards, terms, truncs, infos

    def close(self) -> None:
        pass


def crash_marl(after: int = 30, rank: int | None = None) -> TwoWalkers:
    """``env=tests.failing_envs:crash_marl``: a multi-agent env that raises after ``after`` steps."""
    return TwoWalkers(after=after, fault="crash", rank=rank)


def nan_marl(after: int = 30) -> TwoWalkers:
    """``env=tests.failing_envs:nan_marl``: a multi-agent env whose reward turns NaN after ``after`` steps."""
    return TwoWalkers(after=after, fault="nan")


def two_walkers(max_cycles: int = 10) -> TwoWalkers:
    """``env=tests.failing_envs:two_walkers``: the same env, healthy (a plain PettingZoo env with no
    snapshot hooks of its own, so snapshots take the generic pickling path)."""
    return TwoWalkers(after=2**62, fault="none", max_cycles=max_cycles)


crash_marl.grpo_marl_kind = "pettingzoo"  # type: ignore[attr-defined]
two_walkers.grpo_marl_kind = "pettingzoo"  # type: ignore[attr-defined]
nan_marl.grpo_marl_kind = "pettingzoo"  # type: ignore[attr-defined]


class SetupFailure(RuntimeError):
    """What :func:`fails_to_build` raises: an env constructor failing on one rank."""


def fails_to_build(rank: int = 1) -> gym.Env:
    """CartPole everywhere except in torchrun rank ``rank``, whose constructor raises (a missing
    asset, a licence server down): one rank failing in setup must stop them all, named."""
    if int(os.environ.get("RANK", "0")) == int(rank):
        raise SetupFailure(f"simulator assets not found on rank {rank}")
    return gym.make("CartPole-v1")
