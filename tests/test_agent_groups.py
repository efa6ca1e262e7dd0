"""Agent -> group maps, per-group specs, and agent-group GRPO advantages vs hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from grpo_marl.advantages import agent_group_advantages
from grpo_marl.errors import ConfigError
from grpo_marl.groups import AgentGroups, arrange_groups, default_group_name, resolve_group_map, team_reward_fraction
from grpo_marl.marl.envs import make_parallel_env
from grpo_marl.vec import make_vec_env
from grpo_marl.vec.spaces import flatten_obs


def test_default_group_is_name_prefix() -> None:
    assert default_group_name("adversary_0") == "adversary"
    assert default_group_name("agent_12") == "agent"
    assert default_group_name("speaker_0") == "speaker"
    assert default_group_name("solo") == "solo"


def test_group_map_overrides() -> None:
    agents = ["adversary_0", "agent_0", "agent_1"]
    assert resolve_group_map(agents) == {"adversary_0": "adversary", "agent_0": "agent", "agent_1": "agent"}
    assert resolve_group_map(agents, {"agent_1": "lone"})["agent_1"] == "lone"
    m = resolve_group_map(agents, {"everyone": ["*"]})
    assert set(m.values()) == {"everyone"}
    with pytest.raises(ValueError, match="both"):
        resolve_group_map(agents, {"a": ["agent_*"], "b": ["agent_0"]})
    with pytest.raises(ConfigError, match="matches none"):
        resolve_group_map(agents, {"a": ["nobody_*"]})
    with pytest.raises(ConfigError, match="names agent"):
        resolve_group_map(agents, {"ghost_0": "x"})


def test_groups_from_envs() -> None:
    spread = AgentGroups.from_env(make_parallel_env("simple_spread"))
    assert spread.describe() == {"agent": ["agent_0", "agent_1", "agent_2"]}
    assert spread.specs["agent"].obs_dim == 18 and spread.specs["agent"].n_actions == 5
    assert spread.param_keys() == ["agent"]
    per_agent = AgentGroups.from_env(make_parallel_env("simple_spread"), share="agent", agent_id=True)
    assert per_agent.param_keys() == ["agent_0", "agent_1", "agent_2"]
    assert per_agent.input_dim("agent") == 18 + 3
    sl = AgentGroups.from_env(make_parallel_env("simple_speaker_listener"))
    assert sl.describe() == {"speaker": ["speaker_0"], "listener": ["listener_0"]}
    assert sl.specs["speaker"].n_actions == 3 and sl.specs["listener"].n_actions == 5
    assert sl.specs["speaker"].obs_dim == 3 and sl.specs["listener"].obs_dim == 11
    with pytest.raises(ValueError, match="different spaces"):
        AgentGroups.from_env(make_parallel_env("simple_speaker_listener"), override={"all": ["*"]})
    pursuit = AgentGroups.from_env(make_parallel_env("pursuit"))
    assert pursuit.describe() == {"pursuer": [f"pursuer_{i}" for i in range(4)]}
    assert pursuit.specs["pursuer"].obs_dim == 7 * 7 * 3


@pytest.mark.parametrize("env", ["simple_spread", "simple_speaker_listener", "simple_adversary"])
def test_groups_from_a_vector_env_layout_equal_groups_from_the_env(env: str) -> None:
    """What the Task builds (from the vector env's layout) is what the env itself describes."""
    from grpo_marl.registry import get_spec

    vec = make_vec_env(get_spec(env), 2, vectorization="sync")
    try:
        from_layout = AgentGroups.from_layout(vec.layout)
    finally:
        vec.close()
    from_env = AgentGroups.from_env(make_parallel_env(env))
    assert from_layout.describe() == from_env.describe()
    assert from_layout.specs.keys() == from_env.specs.keys()
    for g, spec in from_env.specs.items():
        other = from_layout.specs[g]
        assert (other.obs_dim, other.n_actions, other.action_shape) == (spec.obs_dim, spec.n_actions, spec.action_shape)


def test_one_agent_env_is_one_group() -> None:
    from grpo_marl.registry import get_spec

    vec = make_vec_env(get_spec("cartpole"), 2, vectorization="sync")
    try:
        groups = AgentGroups.from_layout(vec.layout)
    finally:
        vec.close()
    assert groups.describe() == {"agent": ["agent"]} and groups.param_keys() == ["agent"]
    assert groups.specs["agent"].obs_dim == 4 and groups.specs["agent"].n_actions == 2
    np.testing.assert_array_equal(arrange_groups("seed", 2, 3, groups), [[0, 1, 2], [3, 4, 5]])


def test_flatten_obs_one_hot_and_box() -> None:
    from gymnasium import spaces

    np.testing.assert_array_equal(flatten_obs(spaces.Discrete(3), 2), [0, 0, 1])
    np.testing.assert_array_equal(flatten_obs(spaces.MultiDiscrete([2, 3]), [1, 0]), [0, 1, 1, 0, 0])
    box = spaces.Box(0, 1, (2, 2))
    np.testing.assert_array_equal(flatten_obs(box, np.arange(4).reshape(2, 2)), [0, 1, 2, 3])
    d = spaces.Dict({"observation": spaces.Box(0, 1, (2,)), "action_mask": spaces.MultiBinary(3)})
    np.testing.assert_array_equal(flatten_obs(d, {"observation": np.ones(2), "action_mask": np.ones(3)}), [1, 1])


def _homogeneous() -> AgentGroups:
    return AgentGroups.from_env(make_parallel_env("simple_spread"))


def test_arrange_groups_layouts() -> None:
    g = _homogeneous()  # 3 agents, one group
    np.testing.assert_array_equal(arrange_groups("seed", 1, 2, g), [[0, 3], [1, 4], [2, 5]])
    np.testing.assert_array_equal(arrange_groups("agent", 1, 2, g), [[0, 1, 2], [3, 4, 5]])
    np.testing.assert_array_equal(arrange_groups("seed_agent", 1, 2, g), [[0, 1, 2, 3, 4, 5]])
    adv = AgentGroups.from_env(make_parallel_env("simple_adversary"))
    assert adv.describe() == {"adversary": ["adversary_0"], "agent": ["agent_0", "agent_1"]}
    # groups of different sizes are padded with -1 (invalid members)
    np.testing.assert_array_equal(arrange_groups("agent", 1, 2, adv), [[0, -1], [1, 2], [3, -1], [4, 5]])
    np.testing.assert_array_equal(arrange_groups("seed_agent", 1, 2, adv), [[0, 3, -1, -1], [1, 2, 4, 5]])
    with pytest.raises(ValueError, match="grouping"):
        arrange_groups("team", 1, 2, g)


# returns of rollouts e*A + a: env0 = [1, 2, 3], env1 = [3, 2, 7]
RETURNS = torch.tensor([1.0, 2.0, 3.0, 3.0, 2.0, 7.0])


def test_seed_grouping_mean_only_by_hand() -> None:
    adv = agent_group_advantages(RETURNS, "seed", 1, 2, _homogeneous(), scale="none")
    # agent0: [1,3] -> -1,+1 ; agent1: [2,2] -> 0,0 ; agent2: [3,7] -> -2,+2
    torch.testing.assert_close(adv, torch.tensor([-1.0, 0.0, -2.0, 1.0, 0.0, 2.0]))


def test_agent_grouping_by_hand() -> None:
    g = _homogeneous()
    adv = agent_group_advantages(RETURNS, "agent", 1, 2, g, scale="none")
    torch.testing.assert_close(adv, torch.tensor([-1.0, 0.0, 1.0, -1.0, -2.0, 3.0]))
    adv = agent_group_advantages(RETURNS, "agent", 1, 2, g, scale="group", eps=0.0)
    s7 = math.sqrt(7.0)  # env1: deviations -1,-2,3 -> unbiased var 14/2
    torch.testing.assert_close(adv, torch.tensor([-1.0, 0.0, 1.0, -1 / s7, -2 / s7, 3 / s7]))


def test_product_grouping_by_hand() -> None:
    adv = agent_group_advantages(RETURNS, "seed_agent", 1, 2, _homogeneous(), scale="none")
    torch.testing.assert_close(adv, torch.tensor([-2.0, -1.0, 0.0, 0.0, -1.0, 4.0]))


def test_padded_members_do_not_shift_the_baseline() -> None:
    adv_groups = AgentGroups.from_env(make_parallel_env("simple_adversary"))
    # env0: adversary 5, agents 1, 3 ; env1: adversary 9, agents 0, 0
    rets = torch.tensor([5.0, 1.0, 3.0, 9.0, 0.0, 0.0])
    adv = agent_group_advantages(rets, "agent", 1, 2, adv_groups, scale="none")
    # lone adversary: no comparison -> 0 ; agents: centered within the env
    torch.testing.assert_close(adv, torch.tensor([0.0, -1.0, 1.0, 0.0, 0.0, 0.0]))
    adv = agent_group_advantages(rets, "seed_agent", 1, 2, adv_groups, scale="none")
    torch.testing.assert_close(adv, torch.tensor([-2.0, 0.0, 2.0, 2.0, -1.0, -1.0]))


def test_team_reward_gives_no_signal_to_agent_grouping() -> None:
    team = torch.tensor([4.0, 4.0, 4.0, 1.0, 1.0, 1.0])  # every agent shares its env's reward
    g = _homogeneous()
    assert torch.all(agent_group_advantages(team, "agent", 1, 2, g) == 0)
    seed_adv = agent_group_advantages(team, "seed", 1, 2, g, scale="none")
    torch.testing.assert_close(seed_adv, torch.tensor([1.5, 1.5, 1.5, -1.5, -1.5, -1.5]))
    rewards = team.reshape(2, 3, 1).expand(2, 3, 4)
    assert team_reward_fraction(rewards, torch.ones(2, 3, 4, dtype=torch.bool)) == 1.0
    indiv = rewards.clone()
    indiv[0, 0, 0] += 1
    assert team_reward_fraction(indiv, torch.ones(2, 3, 4, dtype=torch.bool)) == pytest.approx(7 / 8)
