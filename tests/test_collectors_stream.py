"""The streaming seed-group collector (``algo.rollout=stream``): slots never idle, every group's
members start from one state, whole episodes only, behaviour log-probs, carry-over between calls
(and through a checkpoint), and the configurations it refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from grpo_marl.config import ConfigError
from grpo_marl.policies.mlp import MLPPolicy
from grpo_marl.registry import get_spec
from grpo_marl.rollout_stream import StreamingEpisodeCollector
from grpo_marl.vector import make_vec_env

pytestmark = pytest.mark.usefixtures("single_thread")

NG, G = 3, 4


def make(vectorization: str = "native", seed: int = 0, env: str = "cartpole") -> tuple[StreamingEpisodeCollector, MLPPolicy]:
    vec = make_vec_env(get_spec(env), NG * G, vectorization=vectorization)
    torch.manual_seed(seed)
    policy = MLPPolicy(vec.single_observation_space, vec.single_action_space, hidden=(16,))
    return StreamingEpisodeCollector(vec, NG, G, seed=seed, env_name=env), policy


@pytest.mark.parametrize("vectorization", ["native", "sync"])
def test_groups_share_a_start_and_hold_whole_episodes(vectorization: str) -> None:
    collector, policy = make(vectorization)
    seen_starts = set()
    for _ in range(4):
        batch = collector.collect(policy)
        assert batch.num_groups == NG and batch.group_size == G
        lengths = batch.mask.sum(1)
        t = batch.mask.shape[1]
        assert torch.equal(batch.mask, torch.arange(t)[None, :] < lengths[:, None])
        assert int(lengths.max()) == t
        # CartPole pays +1 per step: a whole episode's return is its length, padding is zero.
        assert torch.equal(batch.rewards, batch.mask.float())
        first = batch.grouped("obs")[:, :, 0]
        assert torch.equal(first, first[:, :1].expand_as(first)), "members of a group start from one state"
        for g in range(NG):
            seen_starts.add(tuple(first[g, 0].tolist()))
        m = batch.mask
        logp, _ = policy.log_prob(batch["obs"][m], batch["actions"][m])
        torch.testing.assert_close(batch["logp"][m], logp.detach(), atol=1e-5, rtol=1e-5)
        # An untrained CartPole policy falls within 500 steps: every episode ended (not cut).
        assert (lengths < 500).all()
        assert batch.metrics["rollout/return_mean"] == pytest.approx(float(lengths.float().mean()))
    assert len(seen_starts) == 4 * NG, "every group has its own start state"


def test_members_replay_the_same_dynamics() -> None:
    """Members restored from a group's snapshot follow the env's dynamics exactly: replaying a
    member's actions in a fresh env set to the same start gives the same observations."""
    collector, policy = make("native", seed=2)
    for _ in range(3):  # later batches hold groups born mid-stream (snapshot-restored members)
        batch = collector.collect(policy)
    from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv

    for row in range(batch.num_rollouts):
        n = int(batch.mask[row].sum())
        env = CartPoleVectorEnv(num_envs=1)
        env.reset(seed=0)
        env.state = batch["obs"][row, 0].double().numpy()[:, None].copy()
        for k in range(n - 1):
            obs, *_ = env.step(batch["actions"][row, k : k + 1].numpy())
            np.testing.assert_allclose(obs[0], batch["obs"][row, k + 1].numpy(), rtol=1e-5, atol=1e-5)


def test_no_slot_idles_and_steps_count_every_transition() -> None:
    collector, policy = make("native", seed=1)
    total_used = 0
    for _ in range(6):
        batch = collector.collect(policy)
        total_used += int(batch.mask.sum())
    # Every simulated transition is counted; the batches used all but those still in flight.
    assert collector.total_env_steps >= total_used
    assert collector.total_env_steps % (NG * G) == 0
    in_flight = int(collector._cursor.sum()) + sum(
        sum(len(e[3]) for e in grp.episodes if e is not None) for grp in collector._groups.values()
    )
    assert collector.total_env_steps == total_used + in_flight


@pytest.mark.parametrize("vectorization", ["native", "sync"])
def test_state_dict_round_trip_continues_exactly(vectorization: str) -> None:
    c1, policy = make(vectorization, seed=4)
    c1.collect(policy)
    c1.collect(policy)
    state = c1.state_dict()
    c2, _ = make(vectorization, seed=99)
    c2.load_state_dict(state)
    for _ in range(2):
        torch.manual_seed(0)
        a = c1.collect(policy)
        torch.manual_seed(0)
        b = c2.collect(policy)
        for key in ("obs", "actions", "logp", "rewards", "mask"):
            assert torch.equal(a[key], b[key]), key
    assert c1.total_env_steps == c2.total_env_steps


def test_refuses_envs_without_snapshots_and_cut_episodes() -> None:
    vec = make_vec_env(get_spec("cartpole"), NG * G, vectorization="async")
    try:
        with pytest.raises(ValueError, match="vectorization=sync"):
            StreamingEpisodeCollector(vec, NG, G)
    finally:
        vec.close()
    with pytest.raises(ValueError, match="vec.max_steps=100"):
        StreamingEpisodeCollector(make_vec_env(get_spec("cartpole"), NG * G), NG, G, max_steps=100)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algo.rollout=stream", "algo.group_mode=state"], "algo.rollout=stream streams seed groups"),
        (["algo.rollout=stream", "vec.vectorization=async"], "vec.vectorization=sync"),
        (["algo.rollout=streaming"], "algo.rollout='streaming' is not valid"),
    ],
)
def test_config_refuses_what_streaming_cannot_do(resolve, overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(["env=cartpole", *overrides])
