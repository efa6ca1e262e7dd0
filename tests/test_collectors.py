"""The group collector and GRPO's use of it: batch layout and masks, seed groups that share a start,
state groups restored from archived snapshots, env-step accounting, and zero-variance groups
(counted, skipped, resampled)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from grpo_marl.algos.grpo import GRPO
from grpo_marl.batch import Batch
from grpo_marl.policies.mlp import MLPPolicy
from grpo_marl.registry import get_spec
from grpo_marl.rollout import EpisodeCollector, NonFiniteError, evaluate_policy
from grpo_marl.tasks.gym import GymTask
from grpo_marl.vector import NativeCartPoleVecEnv, make_vec_env

pytestmark = pytest.mark.usefixtures("single_thread")

NG, G = 3, 4


def make_collector(env: str = "cartpole", mode: str = "seed", seed: int = 0, **kwargs) -> tuple[EpisodeCollector, MLPPolicy]:
    vec = make_vec_env(get_spec(env), NG * G, vectorization=kwargs.pop("vectorization", "auto"))
    torch.manual_seed(seed)
    policy = MLPPolicy(vec.single_observation_space, vec.single_action_space, hidden=(16,))
    return EpisodeCollector(vec, NG, G, mode=mode, seed=seed, env_name=env, **kwargs), policy


@pytest.mark.parametrize("env", ["cartpole", "pendulum"])
def test_batch_shapes_and_masks(env: str) -> None:
    collector, policy = make_collector(env)
    batch = collector.collect(policy)
    b = NG * G
    t = batch.mask.shape[1]
    obs_dim = collector.vec.single_observation_space.shape[0]
    assert batch.group_size == G and batch.num_groups == NG and batch.num_rollouts == b
    assert batch["obs"].shape == (b, t, obs_dim)
    assert batch["actions"].shape == ((b, t) if env == "cartpole" else (b, t, 1))
    assert batch["logp"].shape == batch.rewards.shape == batch.mask.shape == (b, t)
    assert batch.mask.dtype == torch.bool
    lengths = batch.mask.sum(1)
    # Valid steps form a prefix of each row; the longest episode fills the time axis.
    assert torch.equal(batch.mask, torch.arange(t)[None, :] < lengths[:, None])
    assert int(lengths.max()) == t
    assert (batch.rewards[~batch.mask] == 0).all()
    if env == "cartpole":
        assert torch.equal(batch.rewards, batch.mask.float())  # +1 per step alive
    else:
        assert (lengths == 200).all()  # Pendulum only ends at its time limit
    # The stored behaviour log-probs are the policy's log-probs of the stored actions.
    m = batch.mask
    logp, _ = policy.log_prob(batch["obs"][m], batch["actions"][m])
    torch.testing.assert_close(batch["logp"][m], logp.detach(), atol=1e-5, rtol=1e-5)
    returns = (batch.rewards * m).sum(1)
    assert batch.metrics["rollout/return_mean"] == pytest.approx(float(returns.mean()), rel=1e-6)
    assert batch.metrics["rollout/length_mean"] == pytest.approx(float(lengths.float().mean()))
    assert 0 < batch.metrics["rollout/vector_utilization"] <= 1


@pytest.mark.parametrize("vectorization", ["native", "sync"])
def test_seed_group_members_share_first_observation(vectorization: str) -> None:
    collector, policy = make_collector("cartpole", vectorization=vectorization)
    for _ in range(2):
        first = collector.collect(policy).grouped("obs")[:, :, 0]  # [groups, G, obs]
        assert torch.equal(first, first[:, :1].expand_as(first))
        assert len({tuple(first[g, 0].tolist()) for g in range(NG)}) == NG  # groups differ


def test_collections_use_fresh_seeds_and_are_reproducible() -> None:
    c1, p1 = make_collector("cartpole", seed=3)
    c2, p2 = make_collector("cartpole", seed=3)
    a, b = c1.collect(p1), c1.collect(p1)
    assert not torch.equal(a["obs"][:, 0], b["obs"][:, 0])
    torch.manual_seed(7)
    x = c2.collect(p2)
    c3, p3 = make_collector("cartpole", seed=3)
    torch.manual_seed(7)
    y = c3.collect(p3)
    for key in ("obs", "actions", "logp", "rewards", "mask"):
        assert torch.equal(x[key], y[key])


def test_env_step_accounting() -> None:
    collector, policy = make_collector("cartpole")
    total = 0
    for _ in range(3):
        batch = collector.collect(policy)
        steps = int(batch.mask.sum())
        assert batch.metrics["rollout/steps"] == steps
        total += steps
        assert collector.total_env_steps == total
    assert batch.num_steps == steps


@pytest.mark.parametrize("vectorization", ["native", "sync"])
def test_state_groups_restore_archived_states(vectorization: str) -> None:
    collector, policy = make_collector("cartpole", mode="state", seed=1, vectorization=vectorization, state_reset_frac=0.34)
    first = collector.collect(policy)
    assert "rollout/return_mean" in first.metrics and first.metrics["rollout/frac_restored_groups"] == 0.0
    archive = list(collector.archive)
    assert archive, "the first collection offers snapshots of visited states"
    snap_obs = [o for _, o in archive]
    # The archived obs were visited by a group leader during the first collection.
    leader_obs = first["obs"][:: G][first.mask[::G]]
    for o in snap_obs:
        assert (leader_obs == torch.as_tensor(o)).all(-1).any()

    second = collector.collect(policy)
    n_restored = round(NG * (1 - 0.34))
    assert second.metrics["rollout/frac_restored_groups"] == pytest.approx(n_restored / NG)
    starts = second.grouped("obs")[:, :, 0]
    for g in range(NG):
        assert torch.equal(starts[g], starts[g, :1].expand_as(starts[g]))  # one start per group
        matches = [torch.equal(starts[g, 0], torch.as_tensor(o)) for o in snap_obs]
        assert any(matches) == (g < n_restored)
    if vectorization == "native":
        # The restored step counter shortens the time left: no branch outlives the episode limit.
        lengths = second.grouped("mask").sum(-1)
        for g in range(n_restored):
            k = next(i for i, o in enumerate(snap_obs) if torch.equal(starts[g, 0], torch.as_tensor(o)))
            elapsed = archive[k][0][1]
            assert elapsed > 0 and int(lengths[g].max()) <= 500 - elapsed


def test_state_groups_with_branch_horizon() -> None:
    collector, policy = make_collector("pendulum", mode="state", seed=2, branch_horizon=10)
    batch = collector.collect(policy)
    assert batch.mask.shape[1] == 10 and batch.mask.all()
    assert "rollout/return_mean" not in batch.metrics  # cut rollouts are not whole episodes
    batch = collector.collect(policy)
    assert batch.mask.shape[1] == 10


def test_state_mode_needs_snapshots() -> None:
    vec = make_vec_env(get_spec("cartpole"), 4, vectorization="async")
    try:
        with pytest.raises(ValueError, match="vectorization=sync"):
            EpisodeCollector(vec, 2, 2, mode="state")
    finally:
        vec.close()


def test_collector_checks_vector_width() -> None:
    with pytest.raises(ValueError, match="num_groups\\*group_size"):
        EpisodeCollector(NativeCartPoleVecEnv(5), 2, 2)


def test_collector_state_dict_round_trip() -> None:
    c1, policy = make_collector("cartpole", mode="state", seed=4)
    c1.collect(policy)
    state = c1.state_dict()
    c2, _ = make_collector("cartpole", mode="state", seed=99)
    c2.load_state_dict(state)
    torch.manual_seed(0)
    a = c1.collect(policy)
    torch.manual_seed(0)
    b = c2.collect(policy)
    for key in ("obs", "actions", "rewards", "mask"):
        assert torch.equal(a[key], b[key])
    assert c1.total_env_steps == c2.total_env_steps


@pytest.mark.parametrize("where", ["obs", "reward"])
def test_non_finite_data_stops_collection(where: str) -> None:
    from grpo_marl.vector import GymVecEnv
    from tests.custom_envs import nan_cartpole

    vec = GymVecEnv([lambda: nan_cartpole(after=3, where=where)] * 4)
    policy = MLPPolicy(vec.single_observation_space, vec.single_action_space)
    collector = EpisodeCollector(vec, 2, 2, env_name="nan_env")
    with pytest.raises(NonFiniteError, match=f"non-finite {'observation' if where == 'obs' else 'reward'} from env 'nan_env'"):
        collector.collect(policy)


def test_evaluate_policy_is_greedy_and_seeded() -> None:
    vec = make_vec_env(get_spec("cartpole"), 5)
    policy = MLPPolicy(vec.single_observation_space, vec.single_action_space)
    seeds = np.arange(5) + 100
    r1 = evaluate_policy(policy, vec, seeds, max_steps=100)
    r2 = evaluate_policy(policy, vec, seeds, max_steps=100)
    np.testing.assert_array_equal(r1, r2)
    assert r1.shape == (5,) and (r1 >= 1).all() and (r1 <= 100).all()


# --------------------------------------------------------------------------- zero-variance groups
def grpo_for(resolve, env: str, *overrides: str) -> GRPO:
    cfg = resolve([f"env={env}", *overrides])
    task = GymTask(cfg, get_spec(str(cfg.env)), torch.device("cpu"))
    return GRPO(cfg.algo, task, torch.device("cpu"))


def hand_batch(returns: list[list[float]], lengths: list[list[int]]) -> Batch:
    """CartPole-shaped batch whose rollouts have the given returns (reward on the last step)."""
    ng, g = len(returns), len(returns[0])
    t = max(max(row) for row in lengths)
    mask = torch.zeros(ng * g, t, dtype=torch.bool)
    rewards = torch.zeros(ng * g, t)
    for i in range(ng):
        for j in range(g):
            n = lengths[i][j]
            mask[i * g + j, :n] = True
            rewards[i * g + j, n - 1] = returns[i][j]
    data = {
        "obs": torch.randn(ng * g, t, 4),
        "actions": torch.randint(0, 2, (ng * g, t)),
        "logp": torch.full((ng * g, t), -0.69),
        "rewards": rewards,
        "mask": mask,
    }
    return Batch(data, group_size=g)


RETURNS = [[1.0, 1.0, 1.0], [0.0, 2.0, 1.0], [3.0, 3.0, 3.0], [5.0, 4.0, 4.0]]
# Zero-variance groups (0 and 2) have identical reward sequences, so they carry no signal under
# either estimator (return-to-go would otherwise see different timings of the same total).
LENGTHS = [[3, 3, 3], [1, 2, 3], [4, 4, 4], [2, 2, 2]]


@pytest.mark.parametrize("advantage", ["outcome", "rtg"])
@pytest.mark.parametrize("mode", ["keep", "skip", "resample"])
def test_zero_std_groups_counted_and_dropped(resolve, mode: str, advantage: str) -> None:
    algo = grpo_for(
        resolve, "cartpole", "algo.group_size=3", "algo.num_groups=4", f"algo.zero_std={mode}",
        f"algo.advantage={advantage}",
    )
    batch = hand_batch(RETURNS, LENGTHS)
    data, metrics = algo.prepare(batch)
    assert metrics["rollout/frac_zero_std_groups"] == 0.5
    valid = torch.tensor([sum(row) for row in LENGTHS])
    if mode == "keep":
        assert len(data["advantages"]) == int(valid.sum())
        # Every step of a zero-variance group gets advantage 0.
        adv = torch.zeros(batch.mask.shape)
        adv[batch.mask] = data["advantages"]
        assert (adv[0:3] == 0).all() and (adv[6:9] == 0).all()
        assert (adv[3:6][batch.mask[3:6]] != 0).any() and (adv[9:][batch.mask[9:]] != 0).any()
    else:
        assert len(data["advantages"]) == int(valid[1] + valid[3])  # only the groups with signal
        assert (data["advantages"] != 0).any()


@pytest.mark.parametrize("mode", ["keep", "skip"])
def test_all_zero_std_skips_the_update(resolve, mode: str) -> None:
    algo = grpo_for(resolve, "cartpole", "algo.group_size=3", "algo.num_groups=2", f"algo.zero_std={mode}")
    data, metrics = algo.prepare(hand_batch([[2.0, 2.0, 2.0], [1.0, 1.0, 1.0]], [[2, 3, 4], [1, 1, 1]]))
    assert data is None and metrics["rollout/frac_zero_std_groups"] == 1.0


def test_resample_collects_until_groups_carry_signal(resolve) -> None:
    """Groups of 2 on a one-step two-armed bandit: about half have zero variance. Resampling keeps
    collecting until num_groups informative groups are found (or max_resample is spent)."""
    algo = grpo_for(
        resolve, "tests.custom_envs:bandit", "algo.group_size=2", "algo.num_groups=8",
        "algo.zero_std=resample", "algo.max_resample=10", "vec.max_steps=1",
    )
    torch.manual_seed(0)
    steps_before = algo.task.env_steps
    batch = algo.collect()
    assert batch.num_groups == 8
    returns, _ = algo.group_returns(batch)
    assert (returns.std(-1) > 0).all()  # every kept group has signal
    collections = int(batch.metrics["rollout/resample_collections"]) + 1
    assert collections >= 2
    assert 0 < batch.metrics["rollout/frac_zero_std_groups_sampled"] < 1
    # Every collection's steps count as env steps.
    assert algo.task.env_steps - steps_before == collections * 16
    _, metrics = algo.prepare(batch)
    assert metrics["rollout/frac_zero_std_groups"] == 0.0


def test_resample_gives_up_after_max_resample(resolve) -> None:
    algo = grpo_for(
        resolve, "tests.custom_envs:constant_reward", "algo.group_size=2", "algo.num_groups=4",
        "algo.zero_std=resample", "algo.max_resample=2", "vec.max_steps=1",
    )
    batch = algo.collect()
    assert batch.metrics["rollout/frac_zero_std_groups_sampled"] == 1.0
    assert algo.task.env_steps == 3 * 8
    data, metrics = algo.prepare(batch)
    assert data is None and metrics["rollout/frac_zero_std_groups"] == 1.0


def test_zero_std_counted_in_real_collection(resolve) -> None:
    """CartPole groups of 2 from one start sometimes last equally long: the metric sees them."""
    algo = grpo_for(resolve, "cartpole", "algo.group_size=2", "algo.num_groups=32")
    torch.manual_seed(0)
    batch = algo.collect()
    _, metrics = algo.prepare(batch)
    returns, _ = algo.group_returns(batch)
    expected = float((returns[:, 0] == returns[:, 1]).float().mean())
    assert metrics["rollout/frac_zero_std_groups"] == pytest.approx(expected)
    assert 0 < expected < 1
