"""The Python API: ``grpo_marl.fit`` trains like the CLI, ``grpo_marl.load`` acts on numpy."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

import grpo_marl
from grpo_marl.errors import UserInputError


def test_fit_writes_the_cli_run_dir_and_load_acts_on_numpy(tmp_path):
    result = grpo_marl.fit("cartpole", total_steps=3000, log={"progress": False}, run_dir=tmp_path / "run")
    assert result.run_dir == tmp_path / "run"
    assert json.loads((result.run_dir / "summary.json").read_text()) == json.loads(
        json.dumps(result.summary, default=float)
    )
    assert result.summary["status"] == "completed" and result.summary["env_steps"] >= 3000
    policy = grpo_marl.load(result.run_dir)
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    action = policy.act(obs)
    assert env.action_space.contains(int(action))
    batch = policy.act(np.stack([obs, obs, obs]))
    assert batch.shape == (3,) and (batch == action).all()  # greedy: same obs, same action


def test_fit_overrides_reach_the_config(tmp_path):
    result = grpo_marl.fit(
        "cartpole",
        total_steps=2000,
        algo={"group_size": 4, "num_groups": 2},
        log={"progress": False},
        run_dir=tmp_path / "r",
    )
    cfg = (result.run_dir / "config.yaml").read_text()
    assert "group_size: 4" in cfg and "num_groups: 2" in cfg


def test_fit_refuses_bad_config_before_building(tmp_path):
    with pytest.raises(UserInputError, match="algo.group_size"):
        grpo_marl.fit("cartpole", algo={"group_size": 1}, run_dir=tmp_path / "bad")
    assert not (tmp_path / "bad" / "metrics.jsonl").exists()


def test_load_multi_agent_policy_acts_per_agent(tmp_path):
    result = grpo_marl.fit("simple_spread", total_steps=1600, log={"progress": False}, run_dir=tmp_path / "ss")
    policy = grpo_marl.load(result.run_dir)
    from grpo_marl.marl.envs import make_parallel_env

    env = make_parallel_env("simple_spread")
    obs, _ = env.reset(seed=0)
    actions = policy.act(obs)
    assert set(actions) == set(env.agents)
    for agent, a in actions.items():
        assert env.action_space(agent).contains(int(a))
    env.step(actions)  # the env accepts them as they are
    with pytest.raises(UserInputError, match="dict agent -> observation"):
        policy.act(np.zeros(18, np.float32))
