"""Envs for tests/test_signal_phases.py: CartPole that marks (by a file) when an evaluation is
under way and then steps slowly, so a test can send a signal in that phase without sleeping blindly.

The env runs in the trainer's process (``vec.vectorization=sync``) and reads its phase from
:mod:`grpo_marl.stopping` at each reset. ``SIGNAL_MARK_DIR`` names the
directory for the marks ``evaluate`` and ``final_evaluate``; ``SIGNAL_STEP_SLEEP`` the seconds
an evaluation step sleeps (0.05 by default).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

from grpo_marl import stopping


class MarkingCartPole(gym.Wrapper):
    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.slow = False

    def reset(self, *, seed: int | None = None, options: dict | None = None):  # type: ignore[override]
        self.slow = False
        phase = stopping.current()  # in-process (vec.vectorization=sync): the trainer's phase
        if phase in ("evaluate", "final_evaluate"):
            (Path(os.environ["SIGNAL_MARK_DIR"]) / phase).touch()
            self.slow = True
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any):  # type: ignore[override]
        if self.slow:
            time.sleep(float(os.environ.get("SIGNAL_STEP_SLEEP", "0.05")))
        return self.env.step(action)


def marking_cartpole() -> gym.Env:
    return MarkingCartPole(gym.make("CartPole-v1"))
