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
