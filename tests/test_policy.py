"""The MLP actor (:class:`~grpo_marl.policies.mlp.ActorPolicy`) in the one-agent case: hand-written
log-probs and sampling agree with ``torch.distributions``; greedy modes; Box actions clipped to the
bounds only on the way to the env; the observation normaliser; unsupported spaces explained."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch import Tensor
from torch.distributions import Categorical, Normal

from grpo_marl.errors import UnsupportedSpaceError
from grpo_marl.groups import AgentGroups
from grpo_marl.policies.mlp import ActorPolicy
from grpo_marl.registry import get_spec
from grpo_marl.vec import make_vec_env
from grpo_marl.vec.base import layout_of
from grpo_marl.vec.spaces import flatten_obs

pytestmark = pytest.mark.usefixtures("single_thread")

OBS = spaces.Box(-5.0, 5.0, (3,), np.float32)
KEY = "agent"  # a Gymnasium env is one agent ("agent") in one group of that name


def build(obs_space: gym.Space, action_space: gym.Space, **kwargs) -> ActorPolicy:
    return ActorPolicy(AgentGroups.from_layout(layout_of((KEY,), (obs_space,), (action_space,))), **kwargs)


def policy_for(action_space: gym.Space, obs_space: gym.Space = OBS, **kwargs) -> ActorPolicy:
    torch.manual_seed(0)
    policy = build(obs_space, action_space, hidden=(16, 16), **kwargs)
    # Larger output weights than the 0.01-gain init, so the distributions are far from uniform.
    with torch.no_grad():
        policy.actors[KEY].net[-1].weight.mul_(100.0)
    return policy


def head(policy: ActorPolicy, obs: Tensor) -> Tensor:
    """The actor's raw output (logits or Gaussian means) on flat rows."""
    return policy.actors[KEY](policy.preprocess(KEY, obs))


def obs_batch(n: int = 32) -> Tensor:
    return torch.randn(n, 3, generator=torch.Generator().manual_seed(1))


def agents(n: int) -> Tensor:
    return torch.zeros(n, dtype=torch.long)


def test_categorical_log_prob_and_entropy_match_torch() -> None:
    policy = policy_for(spaces.Discrete(4))
    obs = obs_batch()
    actions = torch.randint(0, 4, (32,), generator=torch.Generator().manual_seed(2))
    logp, entropy = policy.log_prob(obs, agents(32), actions)
    dist = Categorical(logits=head(policy, obs))
    torch.testing.assert_close(logp, dist.log_prob(actions))
    torch.testing.assert_close(entropy, dist.entropy())
    assert logp.requires_grad  # the losses differentiate through it


@pytest.mark.parametrize("log_std_init", [-1.0, 0.0, 0.5])
def test_gaussian_log_prob_and_entropy_match_torch(log_std_init: float) -> None:
    space = spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 3.0], np.float32))
    policy = policy_for(space, log_std_init=log_std_init)
    obs = obs_batch()
    actions = torch.randn(32, 2, generator=torch.Generator().manual_seed(3)) * 2  # some outside bounds
    logp, entropy = policy.log_prob(obs, agents(32), actions)
    log_std = policy.actors[KEY].log_std
    dist = Normal(head(policy, obs), log_std.exp())
    torch.testing.assert_close(logp, dist.log_prob(actions).sum(-1))
    torch.testing.assert_close(entropy, dist.entropy().sum(-1))
    assert log_std.grad is None and logp.requires_grad


@pytest.mark.parametrize(
    "space", [spaces.Discrete(3), spaces.Box(-2.0, 2.0, (2,), np.float32)], ids=["discrete", "box"]
)
@pytest.mark.parametrize("deterministic", [False, True], ids=["sampled", "greedy"])
def test_act_log_prob_is_log_prob_of_returned_action(space: gym.Space, deterministic: bool) -> None:
    # acting computes the log-prob its own way (Gaussian: from the standard noise), scoring
    # recomputes it from the action: the two must agree
    policy = policy_for(space, log_std_init=-0.7)
    obs = obs_batch()
    torch.manual_seed(4)
    action, logp = policy.act(obs[:, None], deterministic=deterministic)  # the vector layout [E, A, D]
    assert logp.shape == (32, 1) and action.shape[:2] == (32, 1)
    expected, _ = policy.log_prob(obs, agents(32), action[:, 0])
    torch.testing.assert_close(logp[:, 0], expected.detach())
    assert not logp.requires_grad  # acting does not build graphs


def test_categorical_sampling_frequencies() -> None:
    """Gumbel-max samples follow softmax(logits)."""
    policy = policy_for(spaces.Discrete(3))
    obs = obs_batch(1).expand(20000, 3)
    torch.manual_seed(5)
    action, _ = policy.act(obs[:, None])
    freq = torch.bincount(action[:, 0], minlength=3).float() / len(action)
    probs = torch.softmax(head(policy, obs[:1]), -1)[0].detach()
    torch.testing.assert_close(freq, probs, atol=0.015, rtol=0)


def test_gaussian_sampling_moments() -> None:
    policy = policy_for(spaces.Box(-1.0, 1.0, (2,), np.float32), log_std_init=-0.5)
    obs = obs_batch(1).expand(20000, 3)
    torch.manual_seed(6)
    action, _ = policy.act(obs[:, None])
    action = action[:, 0]
    mean = head(policy, obs[:1])[0].detach()
    torch.testing.assert_close(action.mean(0), mean, atol=0.02, rtol=0)
    torch.testing.assert_close(action.std(0), torch.full((2,), float(np.exp(-0.5))), atol=0.02, rtol=0)


def test_deterministic_categorical_is_argmax() -> None:
    policy = policy_for(spaces.Discrete(5))
    obs = obs_batch()
    a1, logp1 = policy.act(obs[:, None], deterministic=True)
    a2, _ = policy.act(obs[:, None], deterministic=True)
    assert torch.equal(a1, a2)
    logits = head(policy, obs).detach()
    assert torch.equal(a1[:, 0], logits.argmax(-1))
    torch.testing.assert_close(logp1[:, 0], torch.log_softmax(logits, -1).max(-1).values)


def test_deterministic_gaussian_is_mean_unclipped() -> None:
    space = spaces.Box(-0.01, 0.01, (2,), np.float32)  # the mean will lie outside these bounds
    policy = policy_for(space)
    obs = obs_batch()
    a1, _ = policy.act(obs[:, None], deterministic=True)
    a2, _ = policy.act(obs[:, None], deterministic=True)
    assert torch.equal(a1, a2)
    torch.testing.assert_close(a1[:, 0], head(policy, obs).detach())
    assert (a1.abs() > 0.01).any()
    sent = policy.to_env(a1)
    assert np.all(sent <= 0.01) and np.all(sent >= -0.01)


def test_box_actions_clipped_to_bounds_in_to_env() -> None:
    space = spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 3.0], np.float32))
    policy = policy_for(space)
    action = torch.tensor([[5.0, -2.0], [-5.0, 4.0], [0.5, 1.5]])
    sent = policy.to_env(action[:, None])
    np.testing.assert_array_equal(sent[:, 0], np.array([[1.0, 0.0], [-1.0, 3.0], [0.5, 1.5]], np.float32))
    assert isinstance(sent, np.ndarray)
    assert all(space.contains(a) for a in sent[:, 0])
    # log-probs use the unclipped sample (the surrogate ratio stays exact)
    logp, _ = policy.log_prob(obs_batch(3), agents(3), action)
    assert torch.isfinite(logp).all()


def test_discrete_to_env_passes_integers() -> None:
    policy = policy_for(spaces.Discrete(3))
    sent = policy.to_env(torch.tensor([[0], [2], [1]]))
    np.testing.assert_array_equal(sent, [[0], [2], [1]])
    assert np.issubdtype(sent.dtype, np.integer)


def test_discrete_observations_are_one_hot() -> None:
    """A Discrete observation reaches the policy one-hot (the vector env writes it that way)."""
    obs_space = spaces.Discrete(5)
    policy = policy_for(spaces.Discrete(2), obs_space=obs_space)
    assert policy.actors[KEY].net[0].in_features == 5
    obs = torch.as_tensor(np.stack([flatten_obs(obs_space, 0), flatten_obs(obs_space, 4)]))
    np.testing.assert_array_equal(obs.numpy(), np.eye(5, dtype=np.float32)[[0, 4]])
    assert head(policy, obs).shape == (2, 2)


def test_observation_normalizer_is_saved_and_applied() -> None:
    policy = policy_for(spaces.Discrete(2), normalize_obs=True)
    data = torch.randn(500, 3) * 3 + 7
    policy.update_obs_stats(data, agents(500))
    normalized = policy.preprocess(KEY, data)
    torch.testing.assert_close(normalized.mean(0), torch.zeros(3), atol=1e-4, rtol=0)
    torch.testing.assert_close(normalized.std(0), torch.ones(3), atol=1e-2, rtol=0)
    state = policy.state_dict()
    assert {f"norms.{KEY}.mean", f"norms.{KEY}.var", f"norms.{KEY}.count"} <= set(state)
    clone = policy_for(spaces.Discrete(2), normalize_obs=True)
    clone.load_state_dict(state)
    torch.testing.assert_close(head(clone, data[:4]), head(policy, data[:4]))


@pytest.mark.parametrize("gym_id", ["CartPole-v1", "Pendulum-v1", "MountainCarContinuous-v0", "Acrobot-v1"])
def test_real_envs_round_trip(gym_id: str) -> None:
    """Policy -> vector env -> policy on real envs: the actions the policy hands the env are valid
    for its action space, and the env steps exactly as a plain ``gym.make`` env given them."""
    vec = make_vec_env(get_spec(f"gym:{gym_id}"), 3, vectorization="sync")
    single = gym.make(gym_id)
    try:
        torch.manual_seed(0)
        policy = ActorPolicy(AgentGroups.from_layout(vec.layout))
        seeds = [0, 1, 2]
        step = vec.reset(seeds)
        obs = torch.as_tensor(step.obs)
        actions, logp = policy.act(obs)
        assert logp.shape == (3, 1) and torch.isfinite(logp).all()
        scored, _ = policy.log_prob(obs[:, 0], agents(3), actions[:, 0])
        torch.testing.assert_close(logp[:, 0], scored.detach())
        sent = policy.to_env(actions)
        out = vec.step(sent)
        for i, seed in enumerate(seeds):
            action = sent[i, 0] if vec.layout.continuous else int(sent[i, 0])
            assert single.action_space.contains(action), action
            first, _ = single.reset(seed=seed)
            np.testing.assert_array_equal(step.obs[i, 0], first)
            o, r, term, trunc, _ = single.step(action)
            np.testing.assert_array_equal(out.obs[i, 0], o)
            assert out.rewards[i, 0] == np.float32(r)
            assert (bool(out.terminated[i, 0]), bool(out.truncated[i, 0])) == (term, trunc)
    finally:
        vec.close()
        single.close()


def test_multi_dimensional_box_action_is_one_flat_gaussian() -> None:
    """A 2 x 2 Box is a 4-dim diagonal Gaussian (the vector env reshapes it for the env)."""
    space = spaces.Box(np.array([[-1.0, 0.0], [0.0, 2.0]], np.float32), np.array([[1.0, 1.0], [1.0, 3.0]], np.float32))
    policy = policy_for(space)
    assert policy.action_shape() == (4,)
    sent = policy.to_env(torch.full((1, 1, 4), 5.0))
    np.testing.assert_array_equal(sent[0, 0], space.high.ravel())


@pytest.mark.parametrize(
    "obs_space, action_space, message",
    [
        (OBS, spaces.MultiBinary(3), "action space MultiBinary.* supported: Discrete and Box"),
        (OBS, spaces.MultiDiscrete([2, 3]), "action space MultiDiscrete"),
        (OBS, spaces.Box(-np.inf, np.inf, (2,), np.float32), "finite bounds"),
        (spaces.Dict({"a": OBS}), spaces.Discrete(2), "observation space Dict.* gymnasium.wrappers.FlattenObservation"),
        (
            spaces.Tuple((OBS, OBS)),
            spaces.Discrete(2),
            "observation space Tuple.* gymnasium.wrappers.FlattenObservation",
        ),
        (OBS, spaces.Dict({"a": spaces.Discrete(2)}), "supported: Discrete"),
    ],
    ids=["multibinary", "multidiscrete", "unbounded-box", "dict-obs", "tuple-obs", "dict-action"],
)
def test_unsupported_spaces_raise_helpful_error(obs_space, action_space, message: str) -> None:
    with pytest.raises(UnsupportedSpaceError, match=message):
        build(obs_space, action_space)


def test_unsupported_space_error_is_a_value_error() -> None:
    assert issubclass(UnsupportedSpaceError, ValueError)
