"""Per-agent-group actors and critics: log-probs consistent with sampling (ratio 1 at the start of
an update), masks honoured, heterogeneous inputs kept apart, parameter sharing per group or per
agent, IPPO/MAPPO critic options of the one PPO, and value normalisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from grpo_marl.algos.ppo import ValueNorm
from grpo_marl.groups import AgentGroups
from grpo_marl.marl.envs import make_parallel_env
from grpo_marl.policies.mlp import ActorPolicy, Critic


@pytest.mark.parametrize(
    ("env", "share", "agent_id"),
    [("simple_speaker_listener", "group", False), ("simple_spread", "agent", False), ("simple_spread", "group", True)],
)
def test_act_and_log_prob_agree(env: str, share: str, agent_id: bool) -> None:
    groups = AgentGroups.from_env(make_parallel_env(env), share=share, agent_id=agent_id)
    torch.manual_seed(0)
    pol = ActorPolicy(groups)
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
    pol = ActorPolicy(groups)
    obs = torch.randn(4, 2, 11)
    a1, l1 = pol.act(obs, deterministic=True)
    obs2 = obs.clone()
    obs2[:, 0, 3:] = 99.0  # garbage in the speaker's padding
    a2, l2 = pol.act(obs2, deterministic=True)
    torch.testing.assert_close(l1, l2)
    assert torch.equal(a1, a2)


def test_action_masks_are_respected() -> None:
    groups = AgentGroups.from_env(make_parallel_env("simple_spread"))
    pol = ActorPolicy(groups)
    obs = torch.randn(200, 3, 18)
    mask = torch.zeros(200, 3, 5, dtype=torch.bool)
    mask[..., 2] = True
    mask[..., 4] = True
    actions, logp = pol.act(obs, mask)
    assert set(actions.unique().tolist()) <= {2, 4}
    lp, _ = pol.log_prob(obs.reshape(600, 18), torch.arange(3).repeat(200), actions.reshape(-1), mask.reshape(600, 5))
    torch.testing.assert_close(lp, logp.reshape(-1))
    assert float(lp.detach().exp().max()) <= 1.0


def test_parameter_sets_follow_sharing() -> None:
    """share=group: one actor for the three spread agents (identical outputs for identical inputs);
    share=agent: one per agent; agent_id: shared parameters still tell the agents apart."""
    obs = torch.randn(1, 1, 18).expand(4, 3, 18)
    shared = ActorPolicy(AgentGroups.from_env(make_parallel_env("simple_spread")))
    _, lp = shared.act(obs, deterministic=True)
    assert list(shared.actors) == ["agent"] and torch.allclose(lp, lp[:, :1].expand_as(lp))
    torch.manual_seed(0)
    per_agent = ActorPolicy(AgentGroups.from_env(make_parallel_env("simple_spread"), share="agent"), hidden=(8,))
    assert list(per_agent.actors) == ["agent_0", "agent_1", "agent_2"]
    with torch.no_grad():
        for k, actor in enumerate(per_agent.actors.values()):
            actor.net[-1].bias.copy_(100.0 * torch.nn.functional.one_hot(torch.tensor(2 * k), 5))  # agent k: 2k
    acts, _ = per_agent.act(obs, deterministic=True)
    assert acts.tolist() == [[0, 2, 4]] * 4
    with_id = ActorPolicy(AgentGroups.from_env(make_parallel_env("simple_spread"), agent_id=True))
    _, lp = with_id.act(obs, deterministic=True)
    assert with_id.actors["agent"].net[0].in_features == 18 + 3
    assert not torch.allclose(lp[:, 0], lp[:, 1])


def test_critics_ippo_and_mappo() -> None:
    groups = AgentGroups.from_env(make_parallel_env("simple_speaker_listener"))
    pol = ActorPolicy(groups)
    ippo = Critic(pol)
    mappo = Critic(pol, state_dim=14)
    assert set(ippo.nets) == set(mappo.nets) == {"speaker", "listener"}
    obs, agent, state = torch.randn(6, 11), torch.tensor([0, 1, 0, 1, 0, 1]), torch.randn(6, 14)
    v = ippo(pol, obs, agent)
    assert v.shape == (6,)
    obs2 = obs.clone()
    obs2[agent == 0, 3:] = 99.0  # the speaker's critic reads only the speaker's observation
    torch.testing.assert_close(ippo(pol, obs2, agent)[agent == 0], v[agent == 0])
    v = mappo(pol, obs, agent, state)
    assert v.shape == (6,)
    assert not torch.allclose(v, mappo(pol, obs, agent, state + 1.0))  # the centralized critic reads the state
    timed = Critic(pol, time_input=True)
    t = torch.zeros(6)
    assert not torch.allclose(timed(pol, obs, agent, time=t), timed(pol, obs, agent, time=t + 1.0))


def test_value_norm_roundtrip() -> None:
    norm = ValueNorm()
    x = torch.tensor(np.random.default_rng(0).normal(-20.0, 5.0, 1000), dtype=torch.float32)
    norm.update(x)
    z = norm.normalize(x)
    assert abs(float(z.mean())) < 1e-3 and abs(float(z.std()) - 1.0) < 1e-2
    torch.testing.assert_close(norm.denormalize(z), x, atol=1e-3, rtol=1e-4)


def _ppo_on_collected(resolve, algo: str, *over: str):
    """The one PPO (under ``algo``'s config) and one collected batch of simple_spread: 2 envs x 25
    steps from a fresh start, so every row is one whole 25-step episode."""
    from grpo_marl.algos import get_algo
    from grpo_marl.registry import get_spec
    from grpo_marl.tasks import make_task

    cfg = resolve(
        [
            "env=simple_spread",
            f"algo={algo}",
            "algo.n_envs=2",
            "algo.batch_size=25",
            "algo.gamma=0.9",
            "algo.gae_lambda=1.0",
            "algo.bootstrap_truncation=true",
            "algo.critic_time=false",
            "algo.value_norm=false",
            "policy.hidden=[8]",
            "marl.num_workers=0",
            *over,
        ]
    )
    cls = get_algo(algo)
    device = torch.device("cpu")
    task = make_task(cfg, get_spec("simple_spread"), device, collector=cls.collector, with_state=cls.needs_state(cfg))
    torch.manual_seed(0)
    batch = task.collect(task.policy)
    return cls(cfg.algo, task, device), batch


@pytest.mark.parametrize("algo", ["ippo", "mappo"])
def test_time_limit_truncation_bootstraps(resolve, algo: str) -> None:
    """mpe2's 25-step limit truncates: the last return is r_T + gamma * V(final obs/state)."""
    ppo, batch = _ppo_on_collected(resolve, algo)
    assert ppo.use_state == (algo == "mappo")
    # the collector flags the truncated step and keeps the observation (and state) it ended on
    assert batch["truncated"][:, -1].all() and not batch["truncated"][:, :-1].any()
    assert not batch["terminated"].any()
    assert batch["final_obs"][:, -1].abs().sum(-1).gt(0).all() and not batch["final_obs"][:, :-1].any()
    if algo == "mappo":
        assert batch["final_state"][:, -1].abs().sum(-1).gt(0).all()
        torch.testing.assert_close(batch["state"][0::3], batch["state"][1::3])  # one env state, every agent
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


def test_critic_time_input(resolve) -> None:
    ppo, batch = _ppo_on_collected(resolve, "mappo", "algo.critic_time=true")
    data, _ = ppo.prepare(batch)
    torch.testing.assert_close(data["time"].reshape(6, 25)[0], torch.arange(25) / 25.0)
    v = ppo.values(data["obs"], data["agent"], data["state"], data["time"])
    assert not torch.allclose(v, ppo.values(data["obs"], data["agent"], data["state"], data["time"] + 1.0))


def test_named_configs_differ_only_in_critic_options(resolve) -> None:
    """ppo / ippo / mappo are one PPO; on a multi-agent env the critic options tell them apart."""
    from grpo_marl.algos import get_algo

    critic = ("critic_state", "critic_time", "value_norm", "bootstrap_truncation")
    assert get_algo("ppo") is get_algo("ippo") is get_algo("mappo")
    mappo = resolve(["env=simple_spread", "algo=mappo"]).algo
    ippo = resolve(["env=simple_spread", "algo=ippo"]).algo
    assert {k for k in mappo if k != "name" and mappo[k] != ippo[k]} <= set(critic)
    assert mappo.critic_state and not ippo.critic_state
