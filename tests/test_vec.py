"""Vector envs and snapshots: a restore reproduces the future exactly (TimeLimit counter and env RNG
included), same-seed resets give identical group members, and finished envs follow SAME_STEP
autoreset semantics (the returned obs starts the next episode; the last real obs is ``final_obs``)."""

from __future__ import annotations

from typing import Callable

import gymnasium as gym
import numpy as np
import pytest

from grpo_marl.registry import get_spec
from grpo_marl.snapshot import restore_env, snapshot_env
from grpo_marl.vector import GymVecEnv, NativeCartPoleVecEnv, VecEnv, make_vec_env

pytestmark = pytest.mark.usefixtures("single_thread")

# name -> (gymnasium id, vectorization)
ENVS = {
    "cartpole-native": ("CartPole-v1", "native"),
    "cartpole-sync": ("CartPole-v1", "sync"),
    "acrobot": ("Acrobot-v1", "sync"),
    "pendulum": ("Pendulum-v1", "sync"),
    "mountaincar_continuous": ("MountainCarContinuous-v0", "sync"),
}


def build(name: str, num_envs: int, max_steps: int) -> VecEnv:
    gym_id, how = ENVS[name]
    if how == "native":
        return NativeCartPoleVecEnv(num_envs, max_episode_steps=max_steps)
    return GymVecEnv([lambda: gym.make(gym_id, max_episode_steps=max_steps)] * num_envs)


def controller(name: str, seed: int) -> Callable[[np.ndarray, int], np.ndarray]:
    """Actions for a ``[N, obs]`` batch at time t. CartPole gets a balancing feedback law, so time
    limits (not pole falls) end the episodes under test; the others get a fixed random sequence
    shared by every row (they cannot terminate within the short horizons used here)."""
    if name.startswith("cartpole"):
        return lambda obs, t: (3.0 * obs[:, 2] + obs[:, 3] > 0).astype(np.int64)
    space = gym.make(ENVS[name][0]).action_space
    rng = np.random.default_rng(seed)
    seq = [
        rng.integers(space.n) if isinstance(space, gym.spaces.Discrete)
        else rng.uniform(space.low, space.high).astype(np.float32)
        for _ in range(200)
    ]
    return lambda obs, t: np.stack([seq[t]] * obs.shape[0])


def rollout(vec: VecEnv, obs: np.ndarray, act, t0: int, steps: int) -> list[tuple]:
    """Step ``steps`` times; per step (obs, reward, terminated, truncated, final_obs or None)."""
    out = []
    for t in range(t0, t0 + steps):
        s = vec.step(act(obs, t))
        finals = None if s.final_obs is None else s.final_obs.copy()
        out.append((s.obs.copy(), s.reward.copy(), s.terminated.copy(), s.truncated.copy(), finals))
        obs = s.obs
    return out


def row(traj: list[tuple], i: int, until_done: bool) -> list[tuple]:
    """Env i's view of a trajectory: the native env's resets draw from a vector-level RNG that is
    not part of a per-env snapshot, so its comparison stops at the first finished episode."""
    res = []
    for obs, rew, term, trunc, finals in traj:
        done = bool(term[i] or trunc[i])
        res.append((None if (done and until_done) else obs[i], rew[i], term[i], trunc[i], finals[i] if done else None))
        if done and until_done:
            break
    return res


def assert_same(a: list[tuple], b: list[tuple]) -> None:
    assert len(a) == len(b)
    for t, (x, y) in enumerate(zip(a, b)):
        for u, v in zip(x, y):
            if u is None or v is None:
                assert u is None and v is None, f"step {t}"
            else:
                np.testing.assert_array_equal(u, v, err_msg=f"step {t}")


@pytest.mark.parametrize("name", sorted(ENVS))
def test_restore_reproduces_next_steps(name: str) -> None:
    max_steps, warmup, horizon = 30, 20, 16  # the replay crosses the time limit at step 10
    n = 3
    vec, fresh = build(name, n, max_steps), build(name, n, max_steps)
    native = ENVS[name][1] == "native"
    act = controller(name, seed=0)
    try:
        obs = vec.reset([11, 12, 13])
        for t in range(warmup):
            obs = vec.step(act(obs, t)).obs
        snap = vec.snapshot(0)
        start = obs[0].copy()
        ref = row(rollout(vec, obs, act, warmup, horizon), 0, until_done=native)
        # The episode is cut by the time limit 10 steps in: the TimeLimit counter was captured.
        assert ref[max_steps - warmup - 1][3], "expected a truncation inside the replay"
        assert not any(step[2] for step in ref), "expected no termination (the test is about time limits)"

        # Restore into every env of the same vector env (mid-episode, other histories) ...
        vec.restore(range(n), snap)
        replay = rollout(vec, np.stack([start] * n), act, warmup, horizon)
        for i in range(n):
            assert_same(row(replay, i, until_done=native), ref)

        # ... and into a freshly reset vector env whose counters are all 0.
        fresh.reset([0, 1, 2])
        fresh.restore([2], snap)
        replay = rollout(fresh, np.stack([start] * n), act, warmup, horizon)
        assert_same(row(replay, 2, until_done=native), ref)
    finally:
        vec.close()
        fresh.close()


@pytest.mark.parametrize("name", sorted(ENVS))
def test_snapshot_is_independent_of_later_steps(name: str) -> None:
    """Stepping after a snapshot must not mutate it (no shared arrays or RNG objects)."""
    vec = build(name, 2, 50)
    act = controller(name, seed=1)
    try:
        obs = vec.reset([3, 4])
        snap = vec.snapshot(0)
        first = rollout(vec, obs, act, 0, 5)
        vec.restore([0, 1], snap)
        second = rollout(vec, np.stack([obs[0]] * 2), act, 0, 5)
        assert_same(row(first, 0, until_done=True), row(second, 1, until_done=True))
    finally:
        vec.close()


@pytest.mark.parametrize("name", sorted(ENVS))
def test_same_seed_same_start_within_group(name: str) -> None:
    vec = build(name, 6, 50)
    try:
        seeds = [5, 5, 5, 9, 9, 9]
        obs = vec.reset(seeds)
        np.testing.assert_array_equal(obs[0], obs[1])
        np.testing.assert_array_equal(obs[0], obs[2])
        np.testing.assert_array_equal(obs[3], obs[4])
        np.testing.assert_array_equal(obs[3], obs[5])
        assert not np.array_equal(obs[0], obs[3])
        np.testing.assert_array_equal(vec.reset(seeds), obs)  # reproducible
        # Members of a group then evolve identically under identical actions.
        act = controller(name, seed=2)
        traj = rollout(vec, obs, act, 0, 8)
        assert_same(row(traj, 0, until_done=True), row(traj, 2, until_done=True))
        assert_same(row(traj, 3, until_done=True), row(traj, 5, until_done=True))
    finally:
        vec.close()


@pytest.mark.parametrize("gym_id", ["CartPole-v1", "Acrobot-v1", "Pendulum-v1", "MountainCarContinuous-v0"])
def test_same_step_autoreset_matches_single_envs(gym_id: str) -> None:
    """Sync vector env vs. one plain env per slot, reset by hand when an episode ends."""
    seeds = [21, 22, 23]
    max_steps = 12
    vec = GymVecEnv([lambda: gym.make(gym_id, max_episode_steps=max_steps)] * 3)
    singles = [gym.make(gym_id, max_episode_steps=max_steps) for _ in seeds]
    rng = np.random.default_rng(0)
    space = singles[0].action_space
    try:
        obs = vec.reset(seeds)
        for env, s, o in zip(singles, seeds, obs):
            np.testing.assert_array_equal(env.reset(seed=s)[0], o)
        dones = 0
        for _ in range(40):
            actions = np.stack([_sample(space, rng) for _ in seeds])
            out = vec.step(actions)
            for i, env in enumerate(singles):
                o, r, term, trunc, _ = env.step(actions[i])
                assert (out.terminated[i], out.truncated[i]) == (term, trunc)
                assert out.reward[i] == np.float32(r)
                if term or trunc:
                    dones += 1
                    np.testing.assert_array_equal(out.final_obs[i], o)  # the last real obs
                    o, _ = env.reset()  # the next episode starts in the same step
                np.testing.assert_array_equal(out.obs[i], o)
        assert dones >= 3
    finally:
        vec.close()
        for env in singles:
            env.close()


def _sample(space: gym.Space, rng: np.random.Generator) -> np.ndarray:
    if isinstance(space, gym.spaces.Discrete):
        return np.int64(rng.integers(space.n))
    return rng.uniform(space.low, space.high).astype(np.float32)


def test_native_cartpole_same_step_autoreset() -> None:
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    vec = NativeCartPoleVecEnv(4, max_episode_steps=15)
    single = CartPoleEnv()
    single.reset(seed=0)
    rng = np.random.default_rng(1)
    vec.reset([1, 2, 3, 4])
    ends = {"terminated": 0, "truncated": 0}
    steps_before = vec.env.steps.copy()
    for _ in range(60):
        state_before = vec.env.state.copy()
        actions = rng.integers(0, 2, size=4)
        out = vec.step(actions)
        for i in range(4):
            single.state = state_before[:, i].copy()
            single.steps_beyond_terminated = None
            o, r, term, _, _ = single.step(int(actions[i]))
            trunc = steps_before[i] + 1 >= 15
            assert out.reward[i] == r == 1.0
            assert bool(out.terminated[i]) == term
            assert bool(out.truncated[i]) == trunc
            if term or trunc:
                ends["terminated" if term else "truncated"] += 1
                np.testing.assert_allclose(out.final_obs[i], o, rtol=1e-6, atol=1e-7)
                # The returned obs already starts the next episode: a fresh initial state.
                assert np.all(np.abs(out.obs[i]) <= 0.05)
                assert vec.env.steps[i] == 0
            else:
                np.testing.assert_allclose(out.obs[i], o, rtol=1e-6, atol=1e-7)
        steps_before = vec.env.steps.copy()
    assert ends["terminated"] > 0 and ends["truncated"] > 0


def test_restored_sync_env_is_not_awaiting_reset() -> None:
    """Restoring a mid-episode snapshot into a slot that just finished must not make the vector
    env reset that slot on the next step."""
    vec = GymVecEnv([lambda: gym.make("Pendulum-v1", max_episode_steps=3)] * 2)
    single = gym.make("Pendulum-v1", max_episode_steps=3)
    try:
        single.reset(seed=0)
        single.step(np.zeros(1, np.float32))
        snap = snapshot_env(single)  # one step into an episode
        expected = single.step(np.ones(1, np.float32))[0]
        vec.reset([0, 1])
        for _ in range(3):
            out = vec.step(np.zeros((2, 1), np.float32))
        assert out.truncated.all()  # every slot just finished an episode
        vec.restore([1], snap)
        out = vec.step(np.ones((2, 1), np.float32))
        np.testing.assert_array_equal(out.obs[1], expected)  # continued, not reset
        assert not out.truncated[1] and not out.terminated[1]
    finally:
        vec.close()
        single.close()


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


def test_async_cannot_snapshot() -> None:
    vec = make_vec_env(get_spec("cartpole"), 2, vectorization="async")
    try:
        assert not vec.supports_snapshot
        vec.reset([0, 1])
        with pytest.raises(NotImplementedError, match="vectorization=sync"):
            vec.snapshot(0)
    finally:
        vec.close()


@pytest.mark.parametrize(
    "name, vectorization, cls",
    [
        ("cartpole", "auto", NativeCartPoleVecEnv),
        ("cartpole", "native", NativeCartPoleVecEnv),
        ("cartpole", "sync", GymVecEnv),
        ("pendulum", "auto", GymVecEnv),
    ],
)
def test_make_vec_env_choice(name: str, vectorization: str, cls: type) -> None:
    vec = make_vec_env(get_spec(name), 4, vectorization=vectorization)
    try:
        assert isinstance(vec, cls)
        assert vec.num_envs == 4
        assert vec.max_episode_steps == {"cartpole": 500, "pendulum": 200}[name]
    finally:
        vec.close()


def test_native_unavailable_is_explained() -> None:
    with pytest.raises(ValueError, match="no native vector implementation; use sync or async"):
        make_vec_env(get_spec("pendulum"), 2, vectorization="native")
