"""The numpy greedy path of the evaluation loop (grpo_marl/policies/host.py) chooses the actions
the torch policy chooses: categorical and Gaussian heads, several parameter sets, agent-id
one-hots, running normalisation, action masks and every activation it supports; and whole
evaluations give identical metrics either way."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from grpo_marl.collectors import evaluate_policy
from grpo_marl.groups import AgentGroups
from grpo_marl.marl.envs import make_parallel_env
from grpo_marl.policies.mlp import ActorPolicy
from grpo_marl.registry import get_spec
from grpo_marl.vec import make_vec_env


def torch_greedy(pol: ActorPolicy, obs: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    actions, _ = pol.act(torch.as_tensor(obs), None if mask is None else torch.as_tensor(mask), deterministic=True)
    return pol.to_env(actions)


def perturb(pol: ActorPolicy, seed: int) -> None:
    """Move weights, biases, log-stds and running statistics away from their initial values."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in pol.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.15)
        for norm in pol.norms.values():
            norm.update(torch.randn(64, *norm.mean.shape, generator=g) * 3 + 1)


@pytest.mark.parametrize("activation", ["tanh", "relu", "elu", "silu"])
@pytest.mark.parametrize("normalize_obs", [False, True])
@pytest.mark.parametrize("env", ["cartpole", "pendulum"])
def test_single_agent_matches_torch(env: str, activation: str, normalize_obs: bool) -> None:
    vec = make_vec_env(get_spec(env), 2)
    pol = ActorPolicy(AgentGroups.from_layout(vec.layout), activation=activation, normalize_obs=normalize_obs)
    perturb(pol, 0)
    obs = np.random.default_rng(1).normal(size=(300, 1, vec.layout.obs_shape[0])).astype(np.float32) * 2
    if pol.kind == "gaussian":  # centre the means and spread them (std 3) over and beyond the +-2 torque bounds
        with torch.no_grad():
            last = pol.actors["agent"].net[-1]
            out = pol.actors["agent"](pol.preprocess("agent", torch.as_tensor(obs))) - last.bias
            scale = 3.0 / out.std()
            last.weight.mul_(scale)
            last.bias.copy_(-out.mean() * scale)
    host = pol.host_actor()
    assert host is not None
    ours, ref = host.greedy(obs), torch_greedy(pol, obs, None)
    assert ours.shape == ref.shape and ours.dtype == ref.dtype
    if pol.kind == "categorical":
        np.testing.assert_array_equal(ours, ref)
    else:
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)  # float32 sums in another order
        assert (np.abs(ours) == 2.0).any() and (np.abs(ours) < 2.0).any()  # Pendulum torque clipped to +-2 (and not)
    vec.close()


@pytest.mark.parametrize(
    ("env", "share", "agent_id"),
    [("simple_speaker_listener", "group", False), ("simple_spread", "agent", False), ("simple_spread", "group", True)],
)
def test_multi_agent_matches_torch_with_masks(env: str, share: str, agent_id: bool) -> None:
    groups = AgentGroups.from_env(make_parallel_env(env), share=share, agent_id=agent_id)
    torch.manual_seed(0)
    pol = ActorPolicy(groups, normalize_obs=True)
    perturb(pol, 2)
    host = pol.host_actor()
    assert host is not None
    rng = np.random.default_rng(3)
    n_agents = len(groups.agents)
    obs = rng.normal(size=(400, n_agents, max(s.obs_dim for s in groups.specs.values()))).astype(np.float32)
    mask = rng.random((400, n_agents, max(s.n_actions for s in groups.specs.values()))) < 0.5
    mask[:7] = False  # rows without a valid action keep their raw logits, as in torch
    for i, a in enumerate(groups.agents):
        mask[:, i, groups.specs[groups.group_of[a]].n_actions :] = False
    np.testing.assert_array_equal(host.greedy(obs, mask), torch_greedy(pol, obs, mask))
    np.testing.assert_array_equal(host.greedy(obs), torch_greedy(pol, obs, None))


def test_unsupported_policies_fall_back_to_torch() -> None:
    vec = make_vec_env(get_spec("cartpole"), 2)
    assert ActorPolicy(AgentGroups.from_layout(vec.layout), activation="gelu").host_actor() is None
    vec.close()


@pytest.mark.parametrize("env", ["cartpole", "pendulum", "acrobot", "simple_spread", "simple_speaker_listener"])
def test_evaluations_identical_through_numpy_and_torch(env: str) -> None:
    vec = make_vec_env(get_spec(env), 6)
    torch.manual_seed(4)
    pol = ActorPolicy(AgentGroups.from_layout(vec.layout))
    perturb(pol, 5)
    seeds = list(range(40, 46))
    fast = evaluate_policy(pol, vec, seeds)
    slow = evaluate_policy(pol, vec, seeds, host=False)
    assert fast == pytest.approx(slow, rel=1e-6)
    assert fast["eval/length_mean"] > 1
    vec.close()


# --------------------------------------------------------------------------- sampling (collection)
def torch_log_prob(pol: ActorPolicy, obs: np.ndarray, actions: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """The update's log-prob of stored actions: ``ActorPolicy.log_prob`` on flat rows."""
    e, a = obs.shape[:2]
    flat_mask = None if mask is None else torch.as_tensor(mask).reshape(e * a, -1)
    lp, _ = pol.log_prob(
        torch.as_tensor(obs).reshape(e * a, -1),
        torch.arange(a).repeat(e),
        torch.as_tensor(actions).reshape(e * a, *actions.shape[2:]),
        flat_mask,
    )
    return lp.detach().numpy().reshape(e, a)


@pytest.mark.parametrize(
    ("env", "share", "agent_id"),
    [("simple_speaker_listener", "group", False), ("simple_spread", "agent", True)],
)
def test_sampled_log_probs_are_the_updates_log_probs(env: str, share: str, agent_id: bool) -> None:
    """The ratio of the first update is exp(log_prob - stored log-prob) = 1 up to float32 rounding."""
    groups = AgentGroups.from_env(make_parallel_env(env), share=share, agent_id=agent_id)
    torch.manual_seed(0)
    pol = ActorPolicy(groups, normalize_obs=True)
    perturb(pol, 6)
    host = pol.host_actor()
    assert host is not None
    rng = np.random.default_rng(7)
    n_agents = len(groups.agents)
    obs = rng.normal(size=(300, n_agents, max(s.obs_dim for s in groups.specs.values()))).astype(np.float32)
    mask = rng.random((300, n_agents, max(s.n_actions for s in groups.specs.values()))) < 0.6
    for i, a in enumerate(groups.agents):
        mask[:, i, groups.specs[groups.group_of[a]].n_actions :] = False
    actions, logp = host.sample(obs, mask, rng)
    assert actions.dtype == np.int64 and logp.dtype == np.float32
    usable = mask.any(-1)
    assert np.take_along_axis(mask, actions[..., None], -1)[..., 0][usable].all()  # masked actions never drawn
    np.testing.assert_allclose(logp, torch_log_prob(pol, obs, actions, mask), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("env", ["pendulum", "mountaincar_continuous"])
def test_gaussian_samples_and_log_probs(env: str) -> None:
    vec = make_vec_env(get_spec(env), 2)
    pol = ActorPolicy(AgentGroups.from_layout(vec.layout), log_std_init=-0.7)
    perturb(pol, 8)
    host = pol.host_actor()
    assert host is not None
    obs = np.repeat(np.random.default_rng(9).normal(size=(1, 1, vec.layout.obs_shape[0])).astype(np.float32), 20000, 0)
    actions, logp = host.sample(obs, None, np.random.default_rng(10))
    np.testing.assert_allclose(logp, torch_log_prob(pol, obs, actions, None), rtol=1e-5, atol=1e-5)
    mean = host.greedy(obs[:1])  # the mean, inside the bounds here
    std = float(pol.actors["agent"].log_std.detach().exp())
    assert abs(actions.mean() - float(mean.reshape(-1)[0])) < 4 * std / np.sqrt(len(actions))
    assert actions.std() == pytest.approx(std, rel=0.03)
    low, high = pol.actors["agent"].low.numpy(), pol.actors["agent"].high.numpy()
    np.testing.assert_array_equal(host.to_env(actions), np.clip(actions, low, high))
    vec.close()


def test_categorical_frequencies_follow_the_softmax() -> None:
    vec = make_vec_env(get_spec("acrobot"), 2)
    pol = ActorPolicy(AgentGroups.from_layout(vec.layout))
    perturb(pol, 11)
    with torch.no_grad():
        pol.actors["agent"].net[-1].weight.mul_(30)  # a clearly non-uniform distribution
    host = pol.host_actor()
    assert host is not None
    obs = np.repeat(np.random.default_rng(12).normal(size=(1, 1, 6)).astype(np.float32), 30000, 0)
    actions, logp = host.sample(obs, None, np.random.default_rng(13))
    probs = np.exp(torch_log_prob(pol, obs[:3], np.array([[0], [1], [2]]), None)[:, 0])
    freq = np.bincount(actions.reshape(-1), minlength=3) / len(actions)
    assert probs.max() - probs.min() > 0.2
    np.testing.assert_allclose(freq, probs, atol=4 * np.sqrt(0.25 / len(actions)))
