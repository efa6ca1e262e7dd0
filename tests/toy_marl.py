"""Small PettingZoo Parallel envs for the multi-agent tests: agents that leave mid-episode, env
action masks, and failures on purpose (an exception, a NaN reward).

Not a test module (no ``test_`` prefix); reached as ``tests.toy_marl`` (the conftest puts the
repository root on ``sys.path``).
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class ToyLeaveEnv(ParallelEnv):
    """Two agents; ``quitter_0`` leaves after 2 steps, ``stayer_0`` after 4. Action 0 of stayer is
    masked out (Dict obs with action_mask); reward = action index."""

    metadata = {"name": "toy_leave_v0", "is_parallelizable": True}

    def __init__(self) -> None:
        self.possible_agents = ["stayer_0", "quitter_0"]
        self.agents: list[str] = []
        self._obs = spaces.Dict(
            {"observation": spaces.Box(-10, 10, (2,), np.float32), "action_mask": spaces.MultiBinary(3)}
        )
        self._act = spaces.Discrete(3)
        self.t = 0

    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs

    def action_space(self, agent: str) -> spaces.Space:
        return self._act

    def _ob(self, agent: str) -> dict:
        mask = np.array([agent != "stayer_0", 1, 1], dtype=np.int8)
        return {"observation": np.array([self.t, len(agent)], np.float32), "action_mask": mask}

    def reset(self, seed=None, options=None):
        self.t = 0
        self.agents = list(self.possible_agents)
        return {a: self._ob(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        live = list(self.agents)
        rew = {a: float(actions[a]) for a in live}
        term = {a: (a == "quitter_0" and self.t >= 2) or self.t >= 4 for a in live}
        trunc = {a: False for a in live}
        obs = {a: self._ob(a) for a in live}
        self.agents = [a for a in live if not term[a]]
        return obs, rew, term, trunc, {a: {} for a in live}


class ToyCrash(ToyLeaveEnv):
    """Raises inside ``step`` at the third step of every episode."""

    def step(self, actions):
        if self.t == 2:
            raise RuntimeError("toy env crashed on purpose")
        return super().step(actions)


class ToyNaN(ToyLeaveEnv):
    """Hands out NaN rewards at the third step of every episode."""

    def step(self, actions):
        obs, rew, term, trunc, infos = super().step(actions)
        if self.t == 3:
            rew = {a: float("nan") for a in rew}
        return obs, rew, term, trunc, infos
