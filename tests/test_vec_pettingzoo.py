"""The multi-process lock-step vector env: layout, seeding, workers == in-process, masking of
agents that leave, action masks, snapshots moved between workers, and the reference policies."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from gymnasium import spaces
from pettingzoo import ParallelEnv
from pettingzoo.test import parallel_api_test

from grpo_marl.marl.envs import make_parallel_env
from grpo_marl.marl.references import GreedyLandmarkPolicy, RandomPolicy, evaluate_policy
from grpo_marl.marl.vector import MarlVecEnv


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


def test_toy_env_is_api_compliant() -> None:
    parallel_api_test(ToyLeaveEnv(), num_cycles=10)


def test_layout_pads_heterogeneous_agents() -> None:
    vec = MarlVecEnv(functools.partial(make_parallel_env, "simple_speaker_listener"), 4)
    step = vec.reset([0, 0, 1, 1], with_state=True)
    assert vec.agents == ("speaker_0", "listener_0")
    assert step.obs.shape == (4, 2, 11) and step.action_mask.shape == (4, 2, 5)
    assert np.all(step.obs[:, 0, 3:] == 0)  # speaker obs is 3 long
    assert step.action_mask[0, 0].tolist() == [True, True, True, False, False]
    np.testing.assert_array_equal(step.obs[0], step.obs[1])  # equal seeds, equal states
    assert not np.array_equal(step.obs[0], step.obs[2])
    assert step.state is not None and step.state.shape == (4, 14)
    vec.close()


def test_agents_leaving_and_action_masks() -> None:
    vec = MarlVecEnv(ToyLeaveEnv, 2)
    step = vec.reset([None, None])
    assert step.alive.all()
    assert step.action_mask[:, 0].tolist() == [[False, True, True]] * 2
    alive, rewards = [step.alive.copy()], []
    while not step.env_done.all():
        step = vec.step(np.full((2, 2), 2))
        alive.append(step.alive.copy())
        rewards.append(step.rewards.copy())
    # quitter alive for steps 0,1 only; stayer for 0..3; after the last step nobody
    assert [a[0].tolist() for a in alive] == [[True, True], [True, True], [True, False], [True, False], [False, False]]
    assert [r[0].tolist() for r in rewards] == [[2, 2], [2, 2], [2, 0], [2, 0]]
    # a finished env idles: stepping again changes nothing
    idle = vec.step(np.full((2, 2), 1))
    assert not idle.alive.any() and not idle.rewards.any()
    vec.close()


def test_workers_match_in_process_and_move_snapshots() -> None:
    fn = functools.partial(make_parallel_env, "simple_spread")
    local, remote = MarlVecEnv(fn, 4), MarlVecEnv(fn, 4, num_workers=2)
    rng = np.random.default_rng(0)
    s1, s2 = local.reset([0, 1, 2, 3]), remote.reset([0, 1, 2, 3])
    np.testing.assert_array_equal(s1.obs, s2.obs)
    for _ in range(5):
        act = rng.integers(0, 5, (4, 3))
        s1, s2 = local.step(act), remote.step(act)
        np.testing.assert_array_equal(s1.obs, s2.obs)
        np.testing.assert_array_equal(s1.rewards, s2.rewards)
    # branch env 0 (worker 0) into env 3 (worker 1): both then follow the same trajectory
    remote.set_snapshots([3], remote.get_snapshots([0]))
    act = rng.integers(0, 5, (4, 3))
    act[3] = act[0]
    s2 = remote.step(act)
    np.testing.assert_array_equal(s2.obs[0], s2.obs[3])
    np.testing.assert_array_equal(remote.state()[0], remote.state()[3])
    while not s2.env_done.all():
        s2 = remote.step(rng.integers(0, 5, (4, 3)))
    assert s2.truncated.all()
    local.close()
    remote.close()


def test_reference_policies_order() -> None:
    vec = MarlVecEnv(functools.partial(make_parallel_env, "simple_spread"), 20)
    rnd = evaluate_policy(vec, RandomPolicy(0), 40, seed=100, group_of={a: "agent" for a in vec.agents})
    greedy = evaluate_policy(vec, GreedyLandmarkPolicy(3), 40, seed=100)
    optimal = evaluate_policy(vec, GreedyLandmarkPolicy(3, assignment="optimal"), 40, seed=100)
    assert rnd["episodes"] == 40 and set(rnd["per_group"]) == {"agent"}
    assert rnd["return_mean"] < -18  # about -26 on 1,000 episodes
    assert -12 < greedy["return_mean"] < -7  # about -8.8 on 1,000 episodes
    assert optimal["return_mean"] > greedy["return_mean"] - 0.5
    vec.close()


def test_random_policy_respects_masks() -> None:
    vec = MarlVecEnv(ToyLeaveEnv, 3)
    step = vec.reset([None] * 3)
    acts = np.stack([RandomPolicy(i)(step) for i in range(30)])
    assert not np.any(acts[:, :, 0] == 0)  # stayer's action 0 is masked
    vec.close()


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="num_envs"):
        MarlVecEnv(ToyLeaveEnv, 0)
    vec = MarlVecEnv(ToyLeaveEnv, 2)
    with pytest.raises(ValueError, match="seeds"):
        vec.reset([0])
