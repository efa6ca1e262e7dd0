"""The streaming seed-group collector (``algo.rollout=stream``): slots never idle, every group's
members start from one state, whole episodes only, behaviour log-probs, carry-over between calls
(and through a checkpoint), and the configurations it refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from grpo_marl.collectors import StreamingCollector
from grpo_marl.config import ConfigError
from grpo_marl.errors import UserInputError
from grpo_marl.groups import AgentGroups
from grpo_marl.policies.mlp import ActorPolicy
from grpo_marl.registry import get_spec
from grpo_marl.vec import SnapshotUnsupported, VecEnv, make_vec_env

pytestmark = pytest.mark.usefixtures("single_thread")

NG, G = 3, 4


def make(vectorization: str = "native", seed: int = 0, env: str = "cartpole") -> tuple[StreamingCollector, ActorPolicy]:
    vec = make_vec_env(get_spec(env), NG * G, vectorization=vectorization)
    torch.manual_seed(seed)
    policy = ActorPolicy(AgentGroups.from_layout(vec.layout), hidden=(16,))
    return StreamingCollector(vec, policy.groups, NG, G, seed=seed, env_name=env), policy


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
        assert (batch["agent"] == 0).all()
        first = batch.grouped("obs")[:, :, 0]
        assert torch.equal(first, first[:, :1].expand_as(first)), "members of a group start from one state"
        for g in range(NG):
            seen_starts.add(tuple(first[g, 0].tolist()))
        m = batch.mask
        logp, _ = policy.log_prob(batch["obs"][m], batch["agent"][m], batch["actions"][m])
        torch.testing.assert_close(batch["logp"][m], logp.detach(), atol=1e-5, rtol=1e-5)
        # An untrained CartPole policy falls within 500 steps: every episode ended (not cut).
        assert (lengths < 500).all()
        assert batch.metrics["rollout/return_mean"] == pytest.approx(float(lengths.float().mean()))
    assert len(seen_starts) == 4 * NG, "every group has its own start state"


def test_members_replay_the_same_dynamics() -> None:
    """Members restored from a group's snapshot follow the env's dynamics exactly: replaying a
    member's actions in Gymnasium's single CartPole env set to the same start gives the same
    observations, and the episode ends (terminated) exactly where the member's did."""
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    collector, policy = make("native", seed=2)
    for _ in range(3):  # later batches hold groups born mid-stream (snapshot-restored members)
        batch = collector.collect(policy)
    for row in range(batch.num_rollouts):
        n = int(batch.mask[row].sum())
        env = CartPoleEnv()
        env.reset(seed=0)
        env.state = batch["obs"][row, 0].double().numpy().copy()
        for k in range(n):
            obs, _, terminated, _, _ = env.step(int(batch["actions"][row, k]))
            if k + 1 < n:
                np.testing.assert_allclose(obs, batch["obs"][row, k + 1].numpy(), rtol=1e-5, atol=1e-5)
                assert not terminated
        assert terminated, "the member's episode ended where the single env's does"


def test_no_slot_idles_and_steps_count_every_transition() -> None:
    collector, policy = make("native", seed=1)
    total_used = 0
    for _ in range(6):
        batch = collector.collect(policy)
        assert batch.metrics["rollout/vector_utilization"] == 1.0
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


class NoSnapshots(VecEnv):
    """A vector env that implements no snapshots (the base class's default)."""

    def __init__(self, inner: VecEnv) -> None:
        self.num_envs, self.layout, self.name = inner.num_envs, inner.layout, inner.name
        self.max_episode_steps = inner.max_episode_steps


def test_refuses_envs_without_snapshots_and_cut_episodes() -> None:
    vec = make_vec_env(get_spec("cartpole"), NG * G)
    groups = AgentGroups.from_layout(vec.layout)
    with pytest.raises(SnapshotUnsupported, match="vectorization=sync"):
        StreamingCollector(NoSnapshots(vec), groups, NG, G)
    with pytest.raises(UserInputError, match="vec.max_steps=100 cannot cut them"):
        StreamingCollector(vec, groups, NG, G, max_steps=100)
    with pytest.raises(UserInputError, match="12 envs but algo.num_groups"):
        StreamingCollector(vec, groups, NG, G + 1)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algo.rollout=stream", "algo.group_mode=state"], "algo.rollout=stream streams seed groups"),
        (["algo.rollout=stream", "vec.vectorization=async"], "vec.vectorization=sync"),
        (["algo.rollout=streaming"], "algo.rollout=streaming is not valid; choose one of batch, stream"),
    ],
)
def test_config_refuses_what_streaming_cannot_do(resolve, overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(["env=cartpole", *overrides])
