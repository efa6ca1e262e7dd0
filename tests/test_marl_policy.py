"""Per-group actors and critics: log-probs consistent with sampling (ratio 1 at the start of an
update), masks honoured, heterogeneous inputs kept apart, IPPO/MAPPO critics and value norm."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from grpo_marl.marl.envs import make_parallel_env
from grpo_marl.marl.groups import AgentGroups
from grpo_marl.marl.policy import MultiAgentCritic, MultiAgentPolicy
from grpo_marl.marl.ppo import ValueNorm


@pytest.mark.parametrize(
    ("env", "share", "agent_id"),
    [("simple_speaker_listener", "group", False), ("simple_spread", "agent", False), ("simple_spread", "group", True)],
)
def test_act_and_log_prob_agree(env: str, share: str, agent_id: bool) -> None:
    groups = AgentGroups.from_env(make_parallel_env(env), share=share, agent_id=agent_id)
    torch.manual_seed(0)
    pol = MultiAgentPolicy(groups)
    assert set(pol.actors) == set(groups.param_keys())
    n_agents = len(groups.agents)
    obs = torch.randn(5, n_agents, max(s.obs_dim for s in groups.specs.values()))
    mask = torch.zeros(5, n_agents, max(s.n_actions for s in groups.specs.values()), dtype=torch.bool)
    for i, a in enumerate(groups.agents):
        mask[:, i, : groups.specs[groups.group_of[a]].n_actions] = True
    actions, logp = pol.act(obs, mask)
    agent = torch.arange(n_agents).repeat(5)
    lp, ent = pol.log_prob(obs.reshape(5 * n_agents, -1), agent, actions.reshape(-1), mask.reshape(5 * n_agents, -1))
    torch.testing.assert_close(lp, logp.reshape(-1))
    assert torch.all(ent > 0)
    for i, a in enumerate(groups.agents):  # speaker (3 actions) never picks a listener-only action
        assert int(actions[:, i].max()) < groups.specs[groups.group_of[a]].n_actions


def test_padding_does_not_leak_between_groups() -> None:
    groups = AgentGroups.from_env(make_parallel_env("simple_speaker_listener"))
    pol = MultiAgentPolicy(groups)
    obs = torch.randn(4, 2, 11)
    a1, l1 = pol.act(obs, deterministic=True)
    obs2 = obs.clone()
    obs2[:, 0, 3:] = 99.0  # garbage in the speaker's padding
    a2, l2 = pol.act(obs2, deterministic=True)
    torch.testing.assert_close(l1, l2)
    assert torch.equal(a1, a2)


def test_action_masks_are_respected() -> None:
    groups = AgentGroups.from_env(make_parallel_env("simple_spread"))
    pol = MultiAgentPolicy(groups)
    obs = torch.randn(200, 3, 18)
    mask = torch.zeros(200, 3, 5, dtype=torch.bool)
    mask[..., 2] = True
    mask[..., 4] = True
    actions, logp = pol.act(obs, mask)
    assert set(actions.unique().tolist()) <= {2, 4}
    lp, _ = pol.log_prob(obs.reshape(600, 18), torch.arange(3).repeat(200), actions.reshape(-1), mask.reshape(600, 5))
    torch.testing.assert_close(lp, logp.reshape(-1))
    assert float(lp.detach().exp().max()) <= 1.0


def test_critics_ippo_and_mappo() -> None:
    groups = AgentGroups.from_env(make_parallel_env("simple_speaker_listener"))
    ippo = MultiAgentCritic(groups)
    mappo = MultiAgentCritic(groups, state_dim=14, centralized=True)
    obs, agent, state = torch.randn(6, 11), torch.tensor([0, 1, 0, 1, 0, 1]), torch.randn(6, 14)
    assert ippo(obs, agent).shape == (6,)
    v = mappo(obs, agent, state)
    assert v.shape == (6,)
    v2 = mappo(obs, agent, state + 1.0)
    assert not torch.allclose(v, v2)  # the centralized critic reads the global state
    with pytest.raises(ValueError, match="state"):
        MultiAgentCritic(groups, centralized=True)


def test_value_norm_roundtrip() -> None:
    norm = ValueNorm()
    x = torch.tensor(np.random.default_rng(0).normal(-20.0, 5.0, 1000), dtype=torch.float32)
    norm.update(x)
    z = norm.normalize(x)
    assert abs(float(z.mean())) < 1e-3 and abs(float(z.std()) - 1.0) < 1e-2
    torch.testing.assert_close(norm.denormalize(z), x, atol=1e-3, rtol=1e-4)
