"""Vector envs (:mod:`grpo_marl.vec`) under their one contract, for every env kind: a snapshot
restore reproduces the future exactly (time-limit counter and env RNG included), same-seed resets
give identical group members, per-env seeds draw like ``gym.make(id).reset(seed=seed)``, finished
envs are frozen until the collector resets them (no automatic reset), and env failures name the
env, the vector index and the reset seed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from grpo_marl.errors import EnvError, UserInputError
from grpo_marl.registry import get_spec
from grpo_marl.vec import SnapshotUnsupported, Step, VecEnv, make_vec_env
from grpo_marl.vec.local import LocalVec
from grpo_marl.vec.ports.classic import PendulumVec
from grpo_marl.vec.ports.mpe import SimpleSpreadVec
from grpo_marl.vec.snapshot import restore_env, snapshot_env
from grpo_marl.vec.workers import WorkerVec
from tests.torch_envs import numpy_records

pytestmark = pytest.mark.usefixtures("single_thread")

# name -> (registered env, vectorization): every vector env kind (numpy-batched CartPole and ports,
# Gymnasium in-process and in workers, PettingZoo in-process and in workers).
ENVS = {
    "cartpole-native": ("cartpole", "native"),
    "cartpole-sync": ("cartpole", "sync"),
    "cartpole-async": ("cartpole", "async"),
    "acrobot-port": ("acrobot", "native"),
    "acrobot-sync": ("acrobot", "sync"),
    "pendulum-port": ("pendulum", "native"),
    "pendulum-sync": ("pendulum", "sync"),
    "mountaincar_continuous-sync": ("mountaincar_continuous", "sync"),
    "simple_spread-port": ("simple_spread", "native"),
    "simple_spread-sync": ("simple_spread", "sync"),
    "simple_spread-async": ("simple_spread", "async"),
    # a plain PettingZoo Parallel env (generic pickled snapshots), in-process and in workers
    "walkers-sync": ("tests.failing_envs:two_walkers", "sync"),
    "walkers-async": ("tests.failing_envs:two_walkers", "async"),
}


def build(name: str, num_envs: int, max_steps: int) -> VecEnv:
    env, how = ENVS[name]
    spec = get_spec(env)
    limit = {"max_cycles": max_steps} if spec.kind == "pettingzoo" else {"max_episode_steps": max_steps}
    vec = numpy_records(make_vec_env(spec, num_envs, limit, vectorization=how))
    assert vec.max_episode_steps == max_steps
    return vec


def controller(vec: VecEnv, seed: int) -> Callable[[np.ndarray, int], np.ndarray]:
    """Actions for ``obs[E, A, D]`` at time t. CartPole gets a balancing feedback law, so time
    limits (not pole falls) end the episodes under test; the others get a fixed random sequence
    shared by every env (they cannot terminate within the short horizons used here)."""
    lay = vec.layout
    if lay.obs_dims == (4,) and lay.n_actions == (2,):
        return lambda obs, t: (3.0 * obs[:, :, 2] + obs[:, :, 3] > 0).astype(np.int64)
    rng = np.random.default_rng(seed)
    seq = []
    for _ in range(200):
        a = lay.action_array(1)[0].numpy()
        for j, space in enumerate(lay.action_spaces):
            if lay.continuous:
                a[j, : lay.action_dims[j]] = rng.uniform(space.low, space.high).astype(np.float32)
            else:
                a[j] = rng.integers(space.n)
        seq.append(a)
    return lambda obs, t: np.stack([seq[t]] * obs.shape[0])


def rollout(vec: VecEnv, obs: np.ndarray, act: Callable, t0: int, steps: int) -> list[Step]:
    out = []
    for t in range(t0, t0 + steps):
        s = vec.step(act(obs, t)).copy()
        out.append(s)
        obs = s.obs
    return out


def row(traj: list[Step], i: int) -> list[tuple[np.ndarray, ...]]:
    """Env i's view of a trajectory (every field of the step record)."""
    return [(s.obs[i], s.rewards[i], s.terminated[i], s.truncated[i], s.alive[i], s.env_done[i]) for s in traj]


def assert_same(a: list[tuple], b: list[tuple]) -> None:
    assert len(a) == len(b)
    for t, (x, y) in enumerate(zip(a, b, strict=True)):
        for u, v in zip(x, y, strict=True):
            np.testing.assert_array_equal(u, v, err_msg=f"step {t}")


@pytest.mark.parametrize("name", sorted(ENVS))
def test_restore_reproduces_next_steps(name: str) -> None:
    max_steps, warmup, horizon = 30, 20, 16  # the replay crosses the time limit at step 10
    n = 3
    vec, fresh = build(name, n, max_steps), build(name, n, max_steps)
    act = controller(vec, seed=0)
    try:
        obs = vec.reset([11, 12, 13]).obs
        for t in range(warmup):
            obs = vec.step(act(obs, t)).obs
        snap = vec.snapshot([0])
        start = obs[0].copy()
        ref = row(rollout(vec, obs, act, warmup, horizon), 0)
        # The episode is cut by the time limit 10 steps in: the time-limit counter was captured.
        cut = max_steps - warmup - 1
        assert ref[cut][3].all() and ref[cut][5], "expected a truncation inside the replay"
        assert not any(step[2].any() for step in ref), "expected no termination (the test is about time limits)"
        assert all(not step[5] for step in ref[:cut])
        # No automatic reset: the finished env is frozen on its final observation.
        for step in ref[cut + 1 :]:
            np.testing.assert_array_equal(step[0], ref[cut][0])
            assert not step[1].any() and not step[3].any() and not step[4].any() and step[5]

        # Restore into every env of the same vector env (mid-episode or finished, other histories) ...
        vec.restore(range(n), snap * n)
        replay = rollout(vec, np.stack([start] * n), act, warmup, horizon)
        for i in range(n):
            assert_same(row(replay, i), ref)

        # ... and into a freshly reset vector env whose counters are all 0.
        fresh.reset([0, 1, 2])
        fresh.restore([2], snap)
        replay = rollout(fresh, np.stack([start] * n), act, warmup, horizon)
        assert_same(row(replay, 2), ref)
    finally:
        vec.close()
        fresh.close()


@pytest.mark.parametrize("name", sorted(ENVS))
def test_get_state_set_state_resumes_every_env_exactly(name: str) -> None:
    """Exact resume: the whole vector state, pickled as a checkpoint stores it, continues in another
    vector env of the same kind step for step (across the time limit, then frozen)."""
    import pickle

    vec, other = build(name, 3, 20), build(name, 3, 20)
    act = controller(vec, seed=4)
    try:
        obs = vec.reset([1, 2, 3]).obs
        for t in range(15):
            obs = vec.step(act(obs, t)).obs
        state = pickle.loads(pickle.dumps(vec.get_state()))
        other.reset([7, 8, 9])
        other.set_state(state)
        a, b = rollout(vec, obs, act, 15, 10), rollout(other, obs, act, 15, 10)
        assert a[-1].env_done.all()
        for i in range(3):
            assert_same(row(a, i), row(b, i))
    finally:
        vec.close()
        other.close()


@pytest.mark.parametrize("name", sorted(ENVS))
def test_snapshot_is_independent_of_later_steps(name: str) -> None:
    """Stepping after a snapshot must not mutate it (no shared arrays or RNG objects)."""
    vec = build(name, 2, 50)
    act = controller(vec, seed=1)
    try:
        obs = vec.reset([3, 4]).obs
        snap = vec.snapshot([0])
        first = rollout(vec, obs, act, 0, 5)
        vec.restore([0, 1], snap * 2)
        second = rollout(vec, np.stack([obs[0]] * 2), act, 0, 5)
        assert_same(row(first, 0), row(second, 1))
        vec.restore([1], snap)  # a snapshot stays reusable
        third = rollout(vec, np.stack([obs[0]] * 2), act, 0, 5)
        assert_same(row(first, 0), row(third, 1))
    finally:
        vec.close()


@pytest.mark.parametrize("name", sorted(ENVS))
def test_same_seed_same_start_within_group(name: str) -> None:
    vec = build(name, 6, 50)
    try:
        seeds = [5, 5, 5, 9, 9, 9]
        obs = vec.reset(seeds).obs
        np.testing.assert_array_equal(obs[0], obs[1])
        np.testing.assert_array_equal(obs[0], obs[2])
        np.testing.assert_array_equal(obs[3], obs[4])
        np.testing.assert_array_equal(obs[3], obs[5])
        assert not np.array_equal(obs[0], obs[3])
        np.testing.assert_array_equal(vec.reset(seeds).obs, obs)  # reproducible
        # Members of a group then evolve identically under identical actions.
        traj = rollout(vec, obs, controller(vec, seed=2), 0, 8)
        assert_same(row(traj, 0), row(traj, 2))
        assert_same(row(traj, 3), row(traj, 5))
        # A subset reset touches only its rows (returned in the order asked).
        again = vec.reset([9, 5], indices=[4, 1])
        np.testing.assert_array_equal(again.obs, obs[[3, 0]])
    finally:
        vec.close()


CASES = [
    ("CartPole-v1", "native"),
    ("CartPole-v1", "sync"),
    ("CartPole-v1", "async"),
    ("Acrobot-v1", "native"),
    ("Acrobot-v1", "sync"),
    ("Pendulum-v1", "native"),
    ("Pendulum-v1", "sync"),
    ("MountainCarContinuous-v0", "native"),
    ("MountainCarContinuous-v0", "sync"),
]


@pytest.mark.parametrize("gym_id, vectorization", CASES)
def test_trajectories_equal_single_gymnasium_envs(gym_id: str, vectorization: str) -> None:
    """Every vector env vs. one plain ``gym.make`` env per slot: ``reset(seeds)`` starts where
    ``env.reset(seed=seed)`` does, steps agree, and an env whose episode ended stays frozen (final
    observation, zero reward, ``env_done``) until it is reset, here one full step later."""
    max_steps = 12
    n = 3
    vec = numpy_records(
        make_vec_env(get_spec(f"gym:{gym_id}"), n, {"max_episode_steps": max_steps}, vectorization=vectorization)
    )
    singles = [gym.make(gym_id, max_episode_steps=max_steps) for _ in range(n)]
    exact = vectorization in ("sync", "async")  # batched numpy may differ from math.sin/cos in the last bit

    def same(u: Any, v: Any) -> None:
        if exact:
            np.testing.assert_array_equal(u, v)
        else:
            np.testing.assert_allclose(u, v, rtol=1e-6, atol=1e-6)

    rng = np.random.default_rng(0)
    space = singles[0].action_space
    try:
        first = vec.reset([21, 22, 23])
        for env, s, o in zip(singles, [21, 22, 23], first.obs, strict=True):
            same(o[0], env.reset(seed=s)[0])
        frozen: dict[int, tuple[int, np.ndarray]] = {}  # env -> (step it ended, final obs)
        dones = 0
        for k in range(60):
            actions = vec.layout.action_array(n).numpy()
            for i in range(n):
                actions[i, 0] = _sample(space, rng)
            out = vec.step(actions)
            for i, env in enumerate(singles):
                if i in frozen:
                    np.testing.assert_array_equal(out.obs[i, 0], frozen[i][1])
                    assert out.rewards[i, 0] == 0 and out.env_done[i] and not out.alive[i, 0]
                    assert not out.terminated[i, 0] and not out.truncated[i, 0]
                    continue
                o, r, term, trunc, _ = env.step(actions[i, 0] if vec.layout.continuous else int(actions[i, 0]))
                assert (bool(out.terminated[i, 0]), bool(out.truncated[i, 0])) == (term, trunc)
                same(out.rewards[i, 0], np.float32(r))
                same(out.obs[i, 0], o)
                assert bool(out.env_done[i]) == (term or trunc) == (not out.alive[i, 0])
                if term or trunc:
                    dones += 1
                    frozen[i] = (k, out.obs[i, 0].copy())
            # The collector's part: reset envs that have been frozen for a whole step.
            due = [i for i, (ended, _) in frozen.items() if ended < k]
            if due:
                seeds = [int(s) for s in rng.integers(0, 2**31 - 1, size=len(due))]
                fresh = vec.reset(seeds, indices=due)
                for j, (i, s) in enumerate(zip(due, seeds, strict=True)):
                    same(fresh.obs[j, 0], singles[i].reset(seed=s)[0])
                    del frozen[i]
        assert dones >= 3
    finally:
        vec.close()
        for env in singles:
            env.close()


def _sample(space: gym.Space, rng: np.random.Generator) -> Any:
    if isinstance(space, gym.spaces.Discrete):
        return np.int64(rng.integers(space.n))
    return rng.uniform(space.low, space.high).astype(np.float32)


@pytest.mark.parametrize("name", ["cartpole-native", "pendulum-sync", "pendulum-port", "simple_spread-async"])
def test_restore_revives_a_finished_env(name: str) -> None:
    """Restoring a mid-episode snapshot into a slot whose episode just ended makes it step again
    (continued, not reset), while the other finished slot stays frozen."""
    vec, other = build(name, 2, 3), build(name, 2, 3)
    act = controller(vec, seed=3)
    try:
        obs = other.reset([0, 0]).obs
        obs = other.step(act(obs, 0)).obs
        snap, snap_obs = other.snapshot([0]), obs[0].copy()  # one step into an episode
        expected = other.step(act(obs, 1))
        obs = vec.reset([4, 5]).obs
        for t in range(3):
            out = vec.step(act(obs, t))
            obs = out.obs
        assert out.truncated.all() and out.env_done.all()  # every slot just finished an episode
        vec.restore([1], snap)
        out = vec.step(act(np.stack([snap_obs] * 2), 1))
        np.testing.assert_array_equal(out.obs[1], expected.obs[0])  # continued, not reset
        np.testing.assert_array_equal(out.rewards[1], expected.rewards[0])
        assert not out.truncated[1].any() and not out.terminated[1].any() and not out.env_done[1]
        assert out.env_done[0] and not out.rewards[0].any()  # still frozen
    finally:
        vec.close()
        other.close()


def test_snapshot_roundtrip_on_wrapped_env() -> None:
    env = gym.make("Acrobot-v1")
    env.reset(seed=3)
    for _ in range(5):
        env.step(1)
    snap = snapshot_env(env)
    a = [env.step(a)[0] for a in (0, 2, 1)]
    restore_env(env, snap)
    b = [env.step(a)[0] for a in (0, 2, 1)]
    np.testing.assert_array_equal(np.stack(a), np.stack(b))
    with pytest.raises(TypeError, match="cannot restore a snapshot of AcrobotEnv"):
        restore_env(gym.make("Pendulum-v1"), snap)


def test_vec_env_without_snapshots_says_what_to_change() -> None:
    class Plain(VecEnv):
        num_envs, name = 1, "plain"

    with pytest.raises(SnapshotUnsupported, match=r"\(env 'plain'\) cannot snapshot .*vec.vectorization=sync"):
        Plain().snapshot([0])
    with pytest.raises(SnapshotUnsupported):
        Plain().get_state()


@pytest.mark.parametrize(
    "name, vectorization, cls, limit",
    [
        ("cartpole", "auto", None, 500),
        ("cartpole", "native", None, 500),
        ("cartpole", "sync", LocalVec, 500),
        ("cartpole", "async", WorkerVec, 500),
        ("pendulum", "auto", PendulumVec, 200),
        ("pendulum", "sync", LocalVec, 200),
        ("simple_spread", "auto", SimpleSpreadVec, 25),
        ("simple_spread", "sync", LocalVec, 25),
        ("simple_spread", "async", WorkerVec, 25),
    ],
)
def test_make_vec_env_choice(name: str, vectorization: str, cls: type | None, limit: int) -> None:
    """``cls`` None: a numpy-batched CartPole (not one env stepped at a time)."""
    vec = make_vec_env(get_spec(name), 4, vectorization=vectorization)
    try:
        assert isinstance(vec, cls) if cls is not None else not isinstance(vec, (LocalVec, WorkerVec))
        assert vec.num_envs == 4 and vec.max_episode_steps == limit
        assert vec.supports_snapshot
        assert vec.layout.num_agents == (3 if name == "simple_spread" else 1)
    finally:
        vec.close()


def test_native_cartpole_takes_the_env_kwargs_time_limit() -> None:
    vec = numpy_records(make_vec_env(get_spec("cartpole"), 2, {"max_episode_steps": 7}, vectorization="native"))
    assert not isinstance(vec, (LocalVec, WorkerVec)) and vec.max_episode_steps == 7
    step = vec.reset([1, 2])
    for _ in range(7):
        step = vec.step(np.stack([np.arange(2) % 2] * 1, 1))
    assert step.env_done.all() and step.truncated.any()


def test_native_unavailable_is_explained() -> None:
    with pytest.raises(UserInputError, match="no native .*set vec.vectorization=sync or async"):
        make_vec_env(get_spec("tests.custom_envs:bandit"), 2, vectorization="native")


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_multi_agent_env_failure_names_env_index_and_seed(vectorization: str) -> None:
    """A PettingZoo env raising in this process or in a worker process comes back as one
    :class:`EnvError` (a clean training stop) naming the env, the vector index and the reset seed."""
    vec = numpy_records(
        make_vec_env(get_spec("tests.failing_envs:crash_marl"), 3, {"after": 4}, vectorization=vectorization)
    )
    assert isinstance(vec.vec, WorkerVec if vectorization == "async" else LocalVec)
    try:
        assert vec.reset([7, 8, 9]).alive.all()
        with pytest.raises(EnvError, match=r"env 'tests.failing_envs:crash_marl' failed during step") as info:
            for _ in range(10):
                vec.step(vec.layout.action_array(3))
        message = str(info.value)
        assert "vector index 0, reset seed 7" in message and "EnvCrash" in message
    finally:
        vec.close()


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_multi_dimensional_box_action_reaches_the_env_in_its_shape(vectorization: str) -> None:
    """Box actions travel flat in ``[E, A, k]``; a 2 x 2 Box reaches the env as 2 x 2, row-major."""
    vec = numpy_records(make_vec_env(get_spec("tests.custom_envs:matrix_action"), 2, vectorization=vectorization))
    try:
        assert vec.layout.action_dims == (4,) and vec.layout.action_array(2).shape == (2, 1, 4)
        vec.reset([0, 1])
        actions = vec.layout.action_array(2).numpy()
        actions[:, 0] = [[0.1, 0.2, 0.3, 0.4], [0.0, -0.5, 0.5, 0.0]]
        out = vec.step(actions)
        np.testing.assert_allclose(out.rewards[:, 0], [0.2 - 0.3, -0.5 - 0.5], rtol=1e-6)
    finally:
        vec.close()
