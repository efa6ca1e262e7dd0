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


def _ppo_on_collected(algo: str, **over):
    """A MarlPPO and one small collected batch of simple_spread (2 envs, 25-step episodes)."""
    import functools
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from grpo_marl.marl.ppo import IPPO, MAPPO
    from grpo_marl.marl.rollout import MarlEpisodeCollector
    from grpo_marl.marl.vector import MarlVecEnv

    fn = functools.partial(make_parallel_env, "simple_spread")
    groups = AgentGroups.from_env(fn())
    col = MarlEpisodeCollector(MarlVecEnv(fn, 2), groups, 2, 1, seed=3, with_state=algo == "mappo", bootstrap=True)
    torch.manual_seed(0)
    batch = col.collect(MultiAgentPolicy(groups))
    cfg = OmegaConf.create({
        "gamma": 0.9, "gae_lambda": 1.0, "clip_eps": 0.2, "clip_vf": None, "vf_coef": 1.0, "entropy_coef": 0.0,
        "value_norm": False, "bootstrap_truncation": True, "critic_time": False, **over,
    })
    task = SimpleNamespace(
        groups=groups, state_dim=54, input_keys=("obs", "actions", "agent"),
        cfg=OmegaConf.create({"policy": {"hidden": [8], "activation": "tanh"}}),
    )
    return (MAPPO if algo == "mappo" else IPPO)(cfg, task, torch.device("cpu")), batch


@pytest.mark.parametrize("algo", ["ippo", "mappo"])
def test_time_limit_truncation_bootstraps(algo: str) -> None:
    """mpe2's 25-step limit truncates: the last return is r_T + gamma * V(final obs/state)."""
    ppo, batch = _ppo_on_collected(algo)
    # the collector records the observation/state after every step and flags the truncated one
    assert batch["truncated"][:, -1].all() and not batch["truncated"][:, :-1].any()
    torch.testing.assert_close(batch["next_obs"][:, :-1], batch["obs"][:, 1:])
    if algo == "mappo":
        torch.testing.assert_close(batch["next_state"][:, :-1], batch["state"][:, 1:])
    with torch.no_grad():
        for p in ppo.critic.parameters():
            p.zero_()
        for net in ppo.critic.nets.values():
            net[-1].bias.fill_(-3.0)  # V = -3 everywhere
    data, _ = ppo.prepare(batch)
    ret = data["returns"].reshape(6, 25)
    rew = batch.rewards
    torch.testing.assert_close(ret[:, -1], rew[:, -1] - 0.9 * 3.0)
    torch.testing.assert_close(ret[:, -2], rew[:, -2] + 0.9 * ret[:, -1])
    # treated as termination (bootstrap_truncation=false) the last return is the reward alone
    ppo.bootstrap_truncation = False
    data, _ = ppo.prepare(batch)
    torch.testing.assert_close(data["returns"].reshape(6, 25)[:, -1], rew[:, -1])


def test_critic_time_input() -> None:
    ppo, batch = _ppo_on_collected("mappo", critic_time=True)
    data, _ = ppo.prepare(batch)
    torch.testing.assert_close(data["time"].reshape(6, 25)[0], torch.arange(25) / 25.0)
    v = ppo._values(data)
    data["time"] = data["time"] + 1.0
    assert not torch.allclose(v, ppo._values(data))
