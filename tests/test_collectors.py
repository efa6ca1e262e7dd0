"""The episode collector and GRPO's use of it: batch layout and masks, seed groups that share a start,
state groups restored from archived snapshots, env-step accounting, non-finite data (single- and
multi-agent envs), the one evaluation loop, and zero-variance groups (counted, skipped, resampled)."""

from __future__ import annotations

import pytest
import torch

from grpo_marl.algos.grpo import GRPO
from grpo_marl.batch import Batch
from grpo_marl.collectors import (
    EpisodeCollector,
    StateGroupCollector,
    StepCollector,
    episode_collector,
    evaluate_policy,
)
from grpo_marl.errors import NonFiniteError, UserInputError
from grpo_marl.groups import AgentGroups
from grpo_marl.policies.mlp import ActorPolicy
from grpo_marl.registry import get_spec
from grpo_marl.tasks.control import ControlTask
from grpo_marl.vec import SnapshotUnsupported, VecEnv, make_vec_env
from grpo_marl.vec.ports.classic import CartPoleVec

pytestmark = pytest.mark.usefixtures("single_thread")

NG, G = 3, 4


def policy_for(vec: VecEnv, seed: int = 0) -> ActorPolicy:
    torch.manual_seed(seed)
    return ActorPolicy(AgentGroups.from_layout(vec.layout), hidden=(16,))


def make_collector(
    env: str = "cartpole", mode: str = "seed", seed: int = 0, vectorization: str = "auto", **kwargs
) -> tuple[EpisodeCollector, ActorPolicy]:
    vec = make_vec_env(get_spec(env), NG * G, vectorization=vectorization)
    policy = policy_for(vec, seed)
    return episode_collector(vec, policy.groups, NG, G, mode=mode, seed=seed, env_name=env, **kwargs), policy


def score(policy: ActorPolicy, batch: Batch) -> torch.Tensor:
    """The policy's log-probs of the batch's stored actions on its valid steps."""
    m = batch.mask
    logp, _ = policy.log_prob(batch["obs"][m], batch["agent"][m], batch["actions"][m])
    return logp.detach()


@pytest.mark.parametrize("host", [True, False], ids=["numpy-actor", "torch-actor"])
@pytest.mark.parametrize("env", ["cartpole", "pendulum"])
def test_batch_shapes_and_masks(env: str, host: bool) -> None:
    collector, policy = make_collector(env, host=host)
    batch = collector.collect(policy)
    b = NG * G
    t = batch.mask.shape[1]
    obs_dim = collector.vec.layout.obs_shape[0]
    assert batch.group_size == G and batch.num_groups == NG and batch.num_rollouts == b
    assert batch["obs"].shape == (b, t, obs_dim)
    assert batch["actions"].shape == ((b, t) if env == "cartpole" else (b, t, 1))
    assert batch["logp"].shape == batch.rewards.shape == batch.mask.shape == batch["agent"].shape == (b, t)
    assert (batch["agent"] == 0).all()  # a Gymnasium env is the one-agent case
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
    torch.testing.assert_close(batch["logp"][batch.mask], score(policy, batch), atol=1e-5, rtol=1e-5)
    returns = (batch.rewards * batch.mask).sum(1)
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


def test_native_and_sync_cartpole_start_from_the_same_seeded_states() -> None:
    """Per-env seeds draw like ``gym.make(id).reset(seed=seed)``: the native vector env and the
    Gymnasium envs collect the same start observations for the same collector seed."""
    native, p1 = make_collector("cartpole", vectorization="native", seed=6)
    sync, p2 = make_collector("cartpole", vectorization="sync", seed=6)
    torch.testing.assert_close(native.collect(p1)["obs"][:, 0], sync.collect(p2)["obs"][:, 0], rtol=0, atol=0)


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
    for key in ("obs", "actions", "logp", "rewards", "mask", "agent"):
        assert torch.equal(x[key], y[key])


def test_env_step_accounting() -> None:
    collector, policy = make_collector("cartpole")
    total = 0
    for _ in range(3):
        batch = collector.collect(policy)
        steps = int(batch.mask.sum())
        # Finished envs are frozen (not stepped) until the next collection resets them.
        assert batch.metrics["rollout/steps"] == steps
        total += steps
        assert collector.total_env_steps == total
    assert batch.num_steps == steps


@pytest.mark.parametrize("vectorization", ["native", "sync", "async"])
def test_state_groups_restore_archived_states(vectorization: str) -> None:
    collector, policy = make_collector(
        "cartpole", mode="state", seed=1, vectorization=vectorization, state_reset_frac=0.34
    )
    try:
        first = collector.collect(policy)
        assert "rollout/return_mean" in first.metrics and first.metrics["rollout/frac_restored_groups"] == 0.0
        archive = list(collector.archive)
        assert archive, "the first collection offers snapshots of visited states"
        snap_obs = [torch.as_tensor(item.step.obs[0, 0]) for item in archive]
        # The archived obs were visited by a group leader during the first collection.
        leader_obs = first["obs"][::G][first.mask[::G]]
        for o in snap_obs:
            assert (leader_obs == o).all(-1).any()

        second = collector.collect(policy)
        n_restored = round(NG * (1 - 0.34))
        assert second.metrics["rollout/frac_restored_groups"] == pytest.approx(n_restored / NG)
        starts = second.grouped("obs")[:, :, 0]
        lengths = second.grouped("mask").sum(-1)
        for g in range(NG):
            assert torch.equal(starts[g], starts[g, :1].expand_as(starts[g]))  # one start per group
            matches = [k for k, o in enumerate(snap_obs) if torch.equal(starts[g, 0], o)]
            assert bool(matches) == (g < n_restored)
            if matches:
                # The restored step counter shortens the time left: no branch outlives the limit.
                elapsed = archive[matches[0]].t
                assert elapsed > 0 and int(lengths[g].max()) <= 500 - elapsed
    finally:
        collector.vec.close()


def leader_visited(batch: Batch, g: int, item) -> bool:
    """Whether group ``g``'s first env visited ``item``'s archived observation in ``batch``."""
    target = torch.as_tensor(item.step.obs[0, 0])
    return bool((batch["obs"][g * G][batch.mask[g * G]] == target).all(-1).any())


def branch_prefix(batch: Batch, item, t0: int) -> float:
    """The leader's rewards in ``batch`` before it reached ``item`` (its branch started at ``t0``)."""
    g = next(g for g in range(NG) if leader_visited(batch, g, item))
    return float(batch["rewards"][g * G, : item.t - t0].sum())


def test_state_groups_with_branch_horizon() -> None:
    collector, policy = make_collector("pendulum", mode="state", seed=2, branch_horizon=10)
    batch = collector.collect(policy)
    assert batch.mask.shape[1] == 10 and batch.mask.all()
    assert "rollout/return_mean" not in batch.metrics  # cut rollouts are not whole episodes
    assert batch.metrics["rollout/episodes_finished"] == 0.0
    # Each archived state carries its episode's return so far (rollout/return_mean of state groups
    # adds it to the branch that ends the episode): the return before the branch + the branch's.
    parents = list(collector.archive)
    assert parents, "snapshot times fall within the first collection's 10-step branches"
    for item in parents:  # from a reset: the leader's first t rewards
        assert item.ret == pytest.approx([branch_prefix(batch, item, 0)], rel=1e-5)
    batch = collector.collect(policy)
    assert batch.mask.shape[1] == 10
    checked = 0
    for item in collector.archive:
        g = next(g for g in range(NG) if leader_visited(batch, g, item))
        start = torch.as_tensor(batch["obs"][g * G, 0])
        parent = next((p for p in parents if bool((torch.as_tensor(p.step.obs[0, 0]) == start).all())), None)
        before = 0.0 if parent is None else float(parent.ret[0])
        assert item.ret == pytest.approx(
            [before + branch_prefix(batch, item, 0 if parent is None else parent.t)], rel=1e-5
        )
        checked += parent is not None
    assert checked, "some archived states come from restored branches"


class NoSnapshots(VecEnv):
    """A vector env that implements no snapshots (the base class's default)."""

    def __init__(self, inner: VecEnv) -> None:
        self.num_envs, self.layout, self.name = inner.num_envs, inner.layout, inner.name
        self.max_episode_steps = inner.max_episode_steps


def test_state_mode_needs_snapshots() -> None:
    vec = NoSnapshots(CartPoleVec(4))
    groups = AgentGroups.from_layout(vec.layout)
    with pytest.raises(SnapshotUnsupported, match="vectorization=sync"):
        StateGroupCollector(vec, groups, 2, 2, mode="state")
    EpisodeCollector(vec, groups, 2, 2, mode="seed")  # seed groups need none


def test_each_group_mode_has_its_collector() -> None:
    """``state`` groups are the state collector's (snapshots, an archive, branch metrics) and the
    other modes the episode collector's; each refuses the other's modes, naming the right class."""
    vec = CartPoleVec(4)
    groups = AgentGroups.from_layout(vec.layout)
    assert type(episode_collector(vec, groups, 2, 2, mode="state")) is StateGroupCollector
    assert type(episode_collector(vec, groups, 2, 2, mode="seed")) is EpisodeCollector
    with pytest.raises(
        UserInputError, match="starts members from env snapshots: collect it with .*StateGroupCollector"
    ):
        EpisodeCollector(vec, groups, 2, 2, mode="state")
    with pytest.raises(UserInputError, match="does not branch from snapshots: collect it with .*EpisodeCollector"):
        StateGroupCollector(vec, groups, 2, 2, mode="seed")
    with pytest.raises(UserInputError, match="unknown group mode 'sead'.*Did you mean seed"):
        episode_collector(vec, groups, 2, 2, mode="sead")


def test_collector_checks_vector_width_and_group_mode() -> None:
    vec = CartPoleVec(5)
    groups = AgentGroups.from_layout(vec.layout)
    with pytest.raises(UserInputError, match=r"5 envs but algo.num_groups \* algo.group_size = 4"):
        EpisodeCollector(vec, groups, 2, 2)
    with pytest.raises(UserInputError, match="has one agent; use algo.group_mode=seed or state"):
        EpisodeCollector(CartPoleVec(4), groups, 2, 2, mode="agent")


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


# --------------------------------------------------------------------------- non-finite data
@pytest.mark.parametrize("where", ["obs", "reward"])
def test_non_finite_data_stops_collection(where: str) -> None:
    spec = get_spec("tests.custom_envs:nan_cartpole")
    vec = make_vec_env(spec, 4, {"after": 3, "where": where}, vectorization="sync")
    policy = policy_for(vec)
    collector = EpisodeCollector(vec, policy.groups, 2, 2, env_name="nan_env")
    what = "observation" if where == "obs" else "reward"
    with pytest.raises(NonFiniteError, match=f"env 'nan_env' returned a non-finite {what}") as info:
        collector.collect(policy)
    # The message names the vector index and the episode's reset seed (to replay it alone).
    index = int(str(info.value).split("vector index ")[1].split(",")[0])
    assert f"reset seed {collector.env_seeds[index]})" in str(info.value)


@pytest.mark.parametrize("collector_kind", ["episodes", "steps"])
def test_non_finite_reward_of_a_multi_agent_env_stops_collection(collector_kind: str) -> None:
    """The multi-agent path has the same finite checks as the single-agent one (one collector base)."""
    spec = get_spec("tests.failing_envs:nan_marl")
    assert spec.kind == "pettingzoo"
    vec = make_vec_env(spec, 4, {"after": 12}, vectorization="sync")
    assert vec.layout.num_agents == 2
    policy = policy_for(vec)
    if collector_kind == "episodes":
        collector = EpisodeCollector(vec, policy.groups, 2, 2, env_name="nan_marl")
    else:
        collector = StepCollector(vec, policy.groups, n_steps=16, env_name="nan_marl")
    with pytest.raises(NonFiniteError, match=r"env 'nan_marl' returned a non-finite reward .*vector index \d"):
        for _ in range(3):
            collector.collect(policy)


def test_evaluate_policy_is_greedy_and_seeded() -> None:
    vec = make_vec_env(get_spec("cartpole"), 5)
    policy = policy_for(vec)
    seeds = list(range(100, 105))
    r1 = evaluate_policy(policy, vec, seeds, max_steps=100)
    r2 = evaluate_policy(policy, vec, seeds, max_steps=100)
    assert r1 == r2
    assert r1["eval/episodes"] == 5
    assert 1 <= r1["eval/return_min"] <= r1["eval/return_mean"] <= r1["eval/return_max"] <= 100
    assert r1["eval/length_mean"] == pytest.approx(r1["eval/return_mean"])  # CartPole pays +1 per step
    with pytest.raises(ValueError, match="one seed per env"):
        evaluate_policy(policy, vec, seeds[:2])


# --------------------------------------------------------------------------- zero-variance groups
def grpo_for(resolve, env: str, *overrides: str) -> GRPO:
    cfg = resolve([f"env={env}", *overrides])
    task = ControlTask(cfg, get_spec(str(cfg.env)), torch.device("cpu"))
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
        "agent": torch.zeros(ng * g, t, dtype=torch.long),
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
        resolve,
        "cartpole",
        "algo.group_size=3",
        "algo.num_groups=4",
        f"algo.zero_std={mode}",
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
    assert len(data["agent"]) == len(data["advantages"])  # batches always carry the agent index


@pytest.mark.parametrize("mode", ["keep", "skip"])
def test_all_zero_std_skips_the_update(resolve, mode: str) -> None:
    algo = grpo_for(resolve, "cartpole", "algo.group_size=3", "algo.num_groups=2", f"algo.zero_std={mode}")
    data, metrics = algo.prepare(hand_batch([[2.0, 2.0, 2.0], [1.0, 1.0, 1.0]], [[2, 3, 4], [1, 1, 1]]))
    assert data is None and metrics["rollout/frac_zero_std_groups"] == 1.0


@pytest.mark.parametrize("regulariser", ["algo.entropy_coef=0.01", "algo.beta=0.04"])
def test_all_zero_std_still_trains_a_regularised_loss(resolve, regulariser: str) -> None:
    """An entropy bonus or a KL term has a gradient without any advantage: the update runs."""
    algo = grpo_for(
        resolve, "cartpole", "algo.group_size=3", "algo.num_groups=2", "algo.advantage=outcome", regulariser
    )
    data, metrics = algo.prepare(hand_batch([[2.0, 2.0, 2.0], [1.0, 1.0, 1.0]], [[2, 3, 4], [1, 1, 1]]))
    assert data is not None and metrics["rollout/frac_zero_std_groups"] == 1.0
    assert (data["advantages"] == 0).all() and len(data["advantages"]) == 2 + 3 + 4 + 1 + 1 + 1


def test_resample_collects_until_groups_carry_signal(resolve) -> None:
    """Groups of 2 on a one-step two-armed bandit: about half have zero variance. Resampling keeps
    collecting until num_groups informative groups are found (or max_resample is spent)."""
    algo = grpo_for(
        resolve,
        "tests.custom_envs:bandit",
        "algo.group_size=2",
        "algo.num_groups=8",
        "algo.zero_std=resample",
        "algo.max_resample=10",
        "vec.max_steps=1",
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
        resolve,
        "tests.custom_envs:constant_reward",
        "algo.group_size=2",
        "algo.num_groups=4",
        "algo.zero_std=resample",
        "algo.max_resample=2",
        "vec.max_steps=1",
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
