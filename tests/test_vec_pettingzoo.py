"""PettingZoo envs under the one vector-env contract: layout and padding, seeding, agents that
leave, action masks, workers == in-process, snapshots moved between workers, and the reference
policies through the one evaluation loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pettingzoo.test import parallel_api_test

from grpo_marl.collectors import EpisodeCollector, evaluate_policy
from grpo_marl.errors import UserInputError
from grpo_marl.groups import AgentGroups
from grpo_marl.marl.references import GreedyLandmarkPolicy, RandomPolicy
from grpo_marl.policies.mlp import ActorPolicy
from grpo_marl.registry import get_spec
from grpo_marl.vec import VecEnv, make_vec_env
from grpo_marl.vec.drivers import PettingZooDriver
from grpo_marl.vec.local import LocalVec
from grpo_marl.vec.workers import WorkerVec
from tests.torch_envs import numpy_records
from tests.toy_marl import ToyLeaveEnv


def toy_vec(num_envs: int, num_workers: int = 0, with_state: bool = False) -> VecEnv:
    def factory(n: int, offset: int) -> PettingZooDriver:
        return PettingZooDriver(ToyLeaveEnv, n, name="toy_leave", offset=offset, with_state=with_state)

    if num_workers:
        return WorkerVec(factory, num_envs, num_workers, name="toy_leave")
    return LocalVec(factory(num_envs, 0))


def test_toy_env_is_api_compliant() -> None:
    parallel_api_test(ToyLeaveEnv(), num_cycles=10)


def test_layout_pads_heterogeneous_agents() -> None:
    vec = numpy_records(make_vec_env(get_spec("simple_speaker_listener"), 4, vectorization="sync", with_state=True))
    step = vec.reset([0, 0, 1, 1])
    lay = vec.layout
    assert vec.agents == ("speaker_0", "listener_0")
    assert lay.obs_dims == (3, 11) and lay.n_actions == (3, 5) and lay.state_dim == 14
    assert step.obs.shape == (4, 2, 11) and step.obs.dtype == np.float32
    assert np.all(step.obs[:, 0, 3:] == 0)  # speaker obs is 3 long, the rest is padding
    assert step.action_mask is None  # mpe2 hands out no masks: each actor samples its own actions
    np.testing.assert_array_equal(step.obs[0], step.obs[1])  # equal seeds, equal states
    assert not np.array_equal(step.obs[0], step.obs[2])
    assert step.state is not None and step.state.shape == (4, 14)
    np.testing.assert_array_equal(step.state[0], step.state[1])
    vec.close()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_agents_leaving_and_action_masks(num_workers: int) -> None:
    vec = numpy_records(toy_vec(2, num_workers))
    step = vec.reset([0, 0])
    assert step.alive.all()
    assert step.action_mask is not None
    assert step.action_mask[:, 0].tolist() == [[False, True, True]] * 2
    alive, rewards = [step.alive.copy()], []
    while not step.env_done.all():
        step = vec.step(np.full((2, 2), 2))
        alive.append(step.alive.copy())
        rewards.append(step.rewards.copy())
    # quitter alive for steps 0,1 only; stayer for 0..3; after the last step nobody
    assert [a[0].tolist() for a in alive] == [[True, True], [True, True], [True, False], [True, False], [False, False]]
    assert [r[0].tolist() for r in rewards] == [[2, 2], [2, 2], [2, 0], [2, 0]]
    # the quitter's final observation stays in its row (for truncation bootstrapping)
    assert step.obs[0, 1].tolist() == [2.0, len("quitter_0")]
    # a finished env is frozen until it is reset: stepping again changes nothing
    idle = vec.step(np.full((2, 2), 1))
    assert not idle.alive.any() and not idle.rewards.any() and idle.env_done.all()
    np.testing.assert_array_equal(idle.obs, step.obs)
    # a reset of a subset brings back only those envs
    back = vec.reset([5], indices=[1])
    assert back.obs.shape[0] == 1 and back.alive.all()
    after = vec.step(np.full((2, 2), 1))
    assert after.env_done.tolist() == [True, False] and after.rewards[1].tolist() == [1, 1]
    vec.close()


def _toy_batch(num_workers: int):
    vec = toy_vec(4, num_workers)
    groups = AgentGroups.from_layout(vec.layout)
    torch.manual_seed(0)
    policy = ActorPolicy(groups)
    col = EpisodeCollector(vec, groups, num_groups=2, group_size=2, seed=1, env_name="toy_leave")
    try:
        return col.collect(policy), col
    finally:
        vec.close()


def test_episode_collector_masks_leaving_agents_and_workers_match() -> None:
    """Rows of agents that leave end with them; env action masks reach the batch and the sampler;
    the collector gives the same batch over worker processes as in-process."""
    batch, col = _toy_batch(0)
    # seed grouping: [stayer of envs 0, 1], [quitter of envs 0, 1], ... (rollout e * A + a)
    assert batch.group_size == 2 and batch.num_groups == 4
    agent = batch["agent"][:, 0]
    steps = batch.mask.sum(1)
    assert steps[agent == 0].tolist() == [4] * 4 and steps[agent == 1].tolist() == [2] * 4
    assert col.total_env_steps == 4 * 4
    stayer = batch["actions"][agent == 0][batch.mask[agent == 0]]
    assert stayer.numel() == 16 and not (stayer == 0).any()  # its action 0 is masked
    assert batch["action_mask"][agent == 0][..., 0].logical_not().all()
    remote, _ = _toy_batch(2)
    for key in ("obs", "actions", "logp", "rewards", "mask", "action_mask"):
        torch.testing.assert_close(batch[key], remote[key])


def test_centralized_state_is_refused_for_an_env_without_one() -> None:
    with pytest.raises(UserInputError, match="algo=ippo"):
        toy_vec(2, with_state=True)


def test_workers_match_in_process_and_move_snapshots() -> None:
    spec = get_spec("simple_spread")
    local = numpy_records(make_vec_env(spec, 4, vectorization="sync", with_state=True))
    remote = numpy_records(make_vec_env(spec, 4, vectorization="async", with_state=True, num_workers=2))
    assert isinstance(local.vec, LocalVec) and isinstance(remote.vec, WorkerVec) and len(remote._procs) == 2
    rng = np.random.default_rng(0)
    s1, s2 = local.reset([0, 1, 2, 3]), remote.reset([0, 1, 2, 3])
    np.testing.assert_array_equal(s1.obs, s2.obs)
    for _ in range(5):
        act = rng.integers(0, 5, (4, 3))
        s1, s2 = local.step(act), remote.step(act)
        np.testing.assert_array_equal(s1.obs, s2.obs)
        np.testing.assert_array_equal(s1.rewards, s2.rewards)
        np.testing.assert_array_equal(s1.state, s2.state)
    # branch env 0 (worker 0) into env 3 (worker 1): both then follow the same trajectory
    remote.restore([3], remote.snapshot([0]))
    act = rng.integers(0, 5, (4, 3))
    act[3] = act[0]
    s2 = remote.step(act)
    assert s2.state is not None
    np.testing.assert_array_equal(s2.obs[0], s2.obs[3])
    np.testing.assert_array_equal(s2.state[0], s2.state[3])
    while not s2.env_done.all():
        s2 = remote.step(rng.integers(0, 5, (4, 3)))
    assert s2.truncated.all()
    local.close()
    remote.close()


def test_reference_policies_order() -> None:
    vec = make_vec_env(get_spec("simple_spread"), 40)
    groups = AgentGroups.from_layout(vec.layout)
    seeds = list(range(100, 140))
    rnd = evaluate_policy(RandomPolicy(groups, 0), vec, seeds)
    greedy = evaluate_policy(GreedyLandmarkPolicy(groups), vec, seeds)
    optimal = evaluate_policy(GreedyLandmarkPolicy(groups, assignment="optimal"), vec, seeds)
    assert rnd["eval/episodes"] == 40
    assert set(rnd) >= {"eval/return_mean/agent", "eval/agent_return/agent_0", "eval/return_std"}
    assert rnd["eval/return_mean"] < -18  # about -26 on 1,000 episodes
    assert -12 < greedy["eval/return_mean"] < -7  # about -8.8 on 1,000 episodes
    assert optimal["eval/return_mean"] > greedy["eval/return_mean"] - 0.5
    vec.close()


def test_random_policy_respects_masks_and_action_counts() -> None:
    vec = numpy_records(toy_vec(3))
    step = vec.reset([0, 1, 2])
    groups = AgentGroups.from_layout(vec.layout)
    mask = torch.as_tensor(step.action_mask)
    acts = torch.stack([RandomPolicy(groups, i).act(torch.as_tensor(step.obs), mask)[0] for i in range(30)])
    assert not torch.any(acts[:, :, 0] == 0)  # stayer's action 0 is masked
    assert set(acts[:, :, 1].unique().tolist()) == {0, 1, 2}
    vec.close()
    spec = get_spec("simple_speaker_listener")
    vec = numpy_records(make_vec_env(spec, 50, vectorization="sync"))
    step = vec.reset(list(range(50)))
    pol = RandomPolicy(AgentGroups.from_layout(vec.layout), 0)
    acts, _ = pol.act(torch.as_tensor(step.obs))
    assert int(acts[:, 0].max()) == 2 and int(acts[:, 1].max()) == 4  # speaker 3 actions, listener 5
    vec.close()


def test_bad_arguments() -> None:
    with pytest.raises(UserInputError, match="num_envs"):
        make_vec_env(get_spec("simple_spread"), 0, vectorization="sync")
    vec = toy_vec(2)
    with pytest.raises(ValueError, match="seeds"):
        vec.reset([0])
    vec.close()
