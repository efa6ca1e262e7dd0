"""MLP policy: hand-written log-probs and sampling agree with ``torch.distributions``; greedy modes;
Box actions clipped to the bounds only on the way to the env; unsupported spaces explained."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from torch.distributions import Categorical, Normal

from grpo_marl.policies.mlp import MLPPolicy, UnsupportedSpaceError

pytestmark = pytest.mark.usefixtures("single_thread")

OBS = spaces.Box(-5.0, 5.0, (3,), np.float32)


def policy_for(action_space: gym.Space, obs_space: gym.Space = OBS, **kwargs) -> MLPPolicy:
    torch.manual_seed(0)
    policy = MLPPolicy(obs_space, action_space, hidden=(16, 16), **kwargs)
    # Larger output weights than the 0.01-gain init, so the distributions are far from uniform.
    with torch.no_grad():
        policy.net[-1].weight.mul_(100.0)
    return policy


def obs_batch(n: int = 32) -> torch.Tensor:
    return torch.randn(n, 3, generator=torch.Generator().manual_seed(1))


def test_categorical_log_prob_and_entropy_match_torch() -> None:
    policy = policy_for(spaces.Discrete(4))
    obs = obs_batch()
    actions = torch.randint(0, 4, (32,), generator=torch.Generator().manual_seed(2))
    logp, entropy = policy.log_prob(obs, actions)
    dist = Categorical(logits=policy(obs))
    torch.testing.assert_close(logp, dist.log_prob(actions))
    torch.testing.assert_close(entropy, dist.entropy())
    assert logp.requires_grad  # the losses differentiate through it


@pytest.mark.parametrize("log_std_init", [-1.0, 0.0, 0.5])
def test_gaussian_log_prob_and_entropy_match_torch(log_std_init: float) -> None:
    space = spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 3.0], np.float32))
    policy = policy_for(space, log_std_init=log_std_init)
    obs = obs_batch()
    actions = torch.randn(32, 2, generator=torch.Generator().manual_seed(3)) * 2  # some outside bounds
    logp, entropy = policy.log_prob(obs, actions)
    dist = Normal(policy(obs), policy.log_std.exp())
    torch.testing.assert_close(logp, dist.log_prob(actions).sum(-1))
    torch.testing.assert_close(entropy, dist.entropy().sum(-1))
    assert policy.log_std.grad is None and logp.requires_grad


@pytest.mark.parametrize("space", [spaces.Discrete(3), spaces.Box(-2.0, 2.0, (2,), np.float32)], ids=["discrete", "box"])
def test_act_log_prob_is_log_prob_of_returned_action(space: gym.Space) -> None:
    policy = policy_for(space)
    obs = obs_batch()
    torch.manual_seed(4)
    action, logp = policy.act(obs)
    expected, _ = policy.log_prob(obs, action)
    torch.testing.assert_close(logp, expected.detach())
    assert not logp.requires_grad  # acting does not build graphs


def test_categorical_sampling_frequencies() -> None:
    """Gumbel-max samples follow softmax(logits)."""
    policy = policy_for(spaces.Discrete(3))
    obs = obs_batch(1).expand(20000, 3)
    torch.manual_seed(5)
    action, _ = policy.act(obs)
    freq = torch.bincount(action, minlength=3).float() / len(action)
    probs = torch.softmax(policy(obs[:1]), -1)[0].detach()
    torch.testing.assert_close(freq, probs, atol=0.015, rtol=0)


def test_gaussian_sampling_moments() -> None:
    policy = policy_for(spaces.Box(-1.0, 1.0, (2,), np.float32), log_std_init=-0.5)
    obs = obs_batch(1).expand(20000, 3)
    torch.manual_seed(6)
    action, _ = policy.act(obs)
    mean = policy(obs[:1])[0].detach()
    torch.testing.assert_close(action.mean(0), mean, atol=0.02, rtol=0)
    torch.testing.assert_close(action.std(0), torch.full((2,), float(np.exp(-0.5))), atol=0.02, rtol=0)


def test_deterministic_categorical_is_argmax() -> None:
    policy = policy_for(spaces.Discrete(5))
    obs = obs_batch()
    a1, logp1 = policy.act(obs, deterministic=True)
    a2, _ = policy.act(obs, deterministic=True)
    assert torch.equal(a1, a2)
    assert torch.equal(a1, policy(obs).argmax(-1))
    torch.testing.assert_close(logp1, torch.log_softmax(policy(obs), -1).max(-1).values.detach())


def test_deterministic_gaussian_is_mean_unclipped() -> None:
    space = spaces.Box(-0.01, 0.01, (2,), np.float32)  # the mean will lie outside these bounds
    policy = policy_for(space)
    obs = obs_batch()
    a1, _ = policy.act(obs, deterministic=True)
    a2, _ = policy.act(obs, deterministic=True)
    assert torch.equal(a1, a2)
    torch.testing.assert_close(a1, policy(obs).detach())
    assert (a1.abs() > 0.01).any()
    sent = policy.to_env(a1)
    assert np.all(sent <= 0.01) and np.all(sent >= -0.01)


def test_box_actions_clipped_to_bounds_in_to_env() -> None:
    space = spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([1.0, 3.0], np.float32))
    policy = policy_for(space)
    action = torch.tensor([[5.0, -2.0], [-5.0, 4.0], [0.5, 1.5]])
    sent = policy.to_env(action)
    np.testing.assert_array_equal(sent, np.array([[1.0, 0.0], [-1.0, 3.0], [0.5, 1.5]], np.float32))
    assert isinstance(sent, np.ndarray)
    assert all(space.contains(a) for a in sent)
    # log-probs use the unclipped sample (the surrogate ratio stays exact)
    logp, _ = policy.log_prob(obs_batch(3), action)
    assert torch.isfinite(logp).all()


def test_discrete_to_env_passes_integers() -> None:
    policy = policy_for(spaces.Discrete(3))
    sent = policy.to_env(torch.tensor([0, 2, 1]))
    np.testing.assert_array_equal(sent, [0, 2, 1])
    assert np.issubdtype(sent.dtype, np.integer)


def test_discrete_observations_are_one_hot() -> None:
    policy = policy_for(spaces.Discrete(2), obs_space=spaces.Discrete(5))
    logits = policy(torch.tensor([0, 4]))
    assert logits.shape == (2, 2)
    assert policy.obs_dim == 5


def test_observation_normalizer_is_saved_and_applied() -> None:
    policy = policy_for(spaces.Discrete(2), normalize_obs=True)
    data = torch.randn(500, 3) * 3 + 7
    policy.obs_norm.update(data)
    normalized = policy.obs_norm(data)
    torch.testing.assert_close(normalized.mean(0), torch.zeros(3), atol=1e-4, rtol=0)
    torch.testing.assert_close(normalized.std(0), torch.ones(3), atol=1e-2, rtol=0)
    state = policy.state_dict()
    assert {"obs_norm.mean", "obs_norm.var", "obs_norm.count"} <= set(state)
    clone = policy_for(spaces.Discrete(2), normalize_obs=True)
    clone.load_state_dict(state)
    torch.testing.assert_close(clone(data[:4]), policy(data[:4]))


def test_real_envs_round_trip() -> None:
    for gym_id in ("CartPole-v1", "Pendulum-v1", "MountainCarContinuous-v0", "Acrobot-v1"):
        env = gym.make(gym_id)
        policy = MLPPolicy(env.observation_space, env.action_space)
        obs, _ = env.reset(seed=0)
        action, _ = policy.act(torch.as_tensor(obs)[None])
        env.step(policy.to_env(action)[0])
        env.close()


@pytest.mark.parametrize(
    "obs_space, action_space, message",
    [
        (OBS, spaces.MultiBinary(3), "action space MultiBinary"),
        (OBS, spaces.MultiDiscrete([2, 3]), "action space MultiDiscrete"),
        (OBS, spaces.Box(-np.inf, np.inf, (2,), np.float32), "finite bounds"),
        (OBS, spaces.Box(-1.0, 1.0, (2, 2), np.float32), "1-D Box"),
        (spaces.Dict({"a": OBS}), spaces.Discrete(2), "FlattenObservation"),
        (spaces.Tuple((OBS, OBS)), spaces.Discrete(2), "observation space"),
        (OBS, spaces.Dict({"a": spaces.Discrete(2)}), "supported: Discrete"),
    ],
    ids=["multibinary", "multidiscrete", "unbounded-box", "2d-box", "dict-obs", "tuple-obs", "dict-action"],
)
def test_unsupported_spaces_raise_helpful_error(obs_space, action_space, message: str) -> None:
    with pytest.raises(UnsupportedSpaceError, match=message):
        MLPPolicy(obs_space, action_space)


def test_unsupported_space_error_is_a_value_error() -> None:
    assert issubclass(UnsupportedSpaceError, ValueError)
