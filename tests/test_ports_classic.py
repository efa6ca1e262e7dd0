"""The batched classic-control ports against Gymnasium's own single envs.

Each port must reproduce ``gym.make(id)`` exactly: for the same reset seeds and actions, the same
observations (to 1e-6), and identical rewards (float32 of the same float64 value), terminations
and truncations -- through episodes that end at different times, envs reset mid-batch while
others run, TimeLimit truncations, snapshots restored into other envs and exact resume.
Actions come from simple heuristic controllers plus noise, so that episodes really terminate
(Acrobot swings up, the cars reach the flag) and the continuous actions include clipped values.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from grpo_marl.errors import EnvError, UserInputError
from grpo_marl.vec.ports import port_class
from grpo_marl.vec.ports.classic import AcrobotVec, CartPoleVec, MountainCarContinuousVec, MountainCarVec, PendulumVec


def _cartpole(obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Push toward the pole's lean, 80% random (episodes of a few dozen steps)."""
    a = (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int64)
    return np.where(rng.random(len(obs)) < 0.8, rng.integers(0, 2, len(obs)), a)[:, None]


def _acrobot(obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Torque along the second joint's velocity (swings up in ~100 steps), 20% random."""
    a = np.where(obs[:, 5] > 0, 2, 0)
    return np.where(rng.random(len(obs)) < 0.2, rng.integers(0, 3, len(obs)), a)[:, None]


def _pendulum(obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Uniform torques in [-3, 3]: a third of them outside the Box and clipped by the env."""
    return rng.uniform(-3.0, 3.0, (len(obs), 1, 1)).astype(np.float32)


def _mountain_car(obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Push along the velocity (reaches the flag in ~100 steps), 20% random."""
    a = np.where(obs[:, 1] > 0, 2, 0)
    return np.where(rng.random(len(obs)) < 0.2, rng.integers(0, 3, len(obs)), a)[:, None]


def _mountain_car_continuous(obs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Push along the velocity with forces exactly +-1, scaled 0.5-1.5 (clipped above 1) or uniform
    in [-2, 2], so every clipping branch of the original is taken."""
    n = len(obs)
    base = np.where(obs[:, 1] > 0, 1.0, -1.0)
    pick = rng.integers(0, 3, n)
    a = np.select([pick == 0, pick == 1], [base, base * rng.uniform(0.5, 1.5, n)], rng.uniform(-2.0, 2.0, n))
    return a.astype(np.float32)[:, None, None]


@dataclass
class Case:
    cls: type
    env_id: str
    policy: Callable[[np.ndarray, np.random.Generator], np.ndarray]
    steps: int  # long enough for several episodes per env
    kwargs: dict[str, Any] = field(default_factory=dict)
    terminates: bool = True
    min_ends: int = 6  # episodes the run must see end (by termination, or truncation if it never terminates)

    def __str__(self) -> str:
        return self.env_id + "".join(f"-{k}={v}" for k, v in self.kwargs.items())


CASES = [
    Case(CartPoleVec, "CartPole-v1", _cartpole, 200),
    Case(CartPoleVec, "CartPole-v1", _cartpole, 120, {"sutton_barto_reward": True}),
    Case(AcrobotVec, "Acrobot-v1", _acrobot, 250),
    Case(PendulumVec, "Pendulum-v1", _pendulum, 210, terminates=False),
    Case(PendulumVec, "Pendulum-v1", _pendulum, 60, {"g": 9.81}, terminates=False, min_ends=0),
    Case(MountainCarVec, "MountainCar-v0", _mountain_car, 220),
    Case(MountainCarVec, "MountainCar-v0", _mountain_car, 220, {"goal_velocity": 0.01}),
    Case(MountainCarContinuousVec, "MountainCarContinuous-v0", _mountain_car_continuous, 220),
    Case(MountainCarContinuousVec, "MountainCarContinuous-v0", _mountain_car_continuous, 220, {"goal_velocity": 0.02}),
]
BY_ENV = {c.env_id: c for c in CASES if not c.kwargs}


class Reference:
    """``E`` Gymnasium envs stepped one by one, with the port's semantics (done envs not stepped)."""

    def __init__(self, case: Case, num_envs: int, max_episode_steps: int | None = None) -> None:
        extra = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
        self.envs = [gym.make(case.env_id, **case.kwargs, **extra) for _ in range(num_envs)]
        self.discrete = isinstance(self.envs[0].action_space, gym.spaces.Discrete)

    def reset(self, seeds: list[int | None], indices: list[int]) -> np.ndarray:
        return np.stack([self.envs[i].reset(seed=s)[0] for i, s in zip(indices, seeds, strict=True)])

    def step(self, actions: np.ndarray, live: np.ndarray) -> tuple[np.ndarray, ...]:
        n = len(self.envs)
        rew, term, trunc = np.zeros(n), np.zeros(n, bool), np.zeros(n, bool)
        obs: list[np.ndarray | None] = [None] * n
        for i in np.flatnonzero(live):
            act = int(actions[i, 0]) if self.discrete else actions[i, 0]
            obs[i], rew[i], term[i], trunc[i], _ = self.envs[i].step(act)
        return obs, rew, term, trunc

    def states(self) -> np.ndarray:
        """The unwrapped envs' physical states, as float64 (their dtype varies: see the port)."""
        return np.stack([np.asarray(env.unwrapped.state, dtype=np.float64) for env in self.envs])


def _check_step(step: Any, ref: tuple[np.ndarray, ...], live: np.ndarray) -> None:
    obs, rew, term, trunc = ref
    for i in np.flatnonzero(live):
        np.testing.assert_allclose(step.obs[i, 0], obs[i], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(step.rewards[:, 0], rew.astype(np.float32))
    np.testing.assert_array_equal(step.terminated[:, 0], term)
    np.testing.assert_array_equal(step.truncated[:, 0], trunc)
    done = term | trunc
    np.testing.assert_array_equal(step.alive[:, 0], live & ~done)


def _step_bit_exact(vec: Any, ref: Reference, actions: np.ndarray) -> Any:
    """Step every env of both and check the stronger property the 1e-6 contract rests on: the
    port's float64 state and float64 reward are bit-equal to the original's, so no rounding
    difference can accumulate or flip a termination over a long episode."""
    s0, fresh0 = vec._s.copy(), vec._fresh.copy()
    _, _, rew64, _ = vec._advance(s0, vec._decode(actions, np.zeros(vec.num_envs, bool)), fresh0)
    live = np.ones(vec.num_envs, bool)
    step = vec.step(actions)
    out = ref.step(actions, live)
    _check_step(step, out, live)
    np.testing.assert_array_equal(rew64, out[1])
    np.testing.assert_array_equal(vec._s, ref.states())
    return step


def _run_against_gym(case: Case, num_envs: int, steps: int, max_episode_steps: int | None = None) -> dict[str, int]:
    """Step the port and the reference side by side; finished envs are reset at once with fresh
    seeds (some repeated) while the others keep running. Returns episode-end counts."""
    rng = np.random.default_rng(2024)
    vec = case.cls(num_envs, max_episode_steps=max_episode_steps, **case.kwargs)
    ref = Reference(case, num_envs, max_episode_steps)
    seeds: list[int | None] = [0, 1, 1, 2, 3, 3][:num_envs]
    first = vec.reset(seeds)
    np.testing.assert_allclose(first.obs[:, 0], ref.reset(seeds, list(range(num_envs))), rtol=0, atol=1e-6)
    np.testing.assert_array_equal(vec._s, ref.states())
    assert first.alive.all() and not first.env_done.any()
    obs = first.obs[:, 0]
    counts = {"terminated": 0, "truncated": 0}
    for _ in range(steps):
        step = _step_bit_exact(vec, ref, case.policy(obs, rng))
        counts["terminated"] += int(step.terminated.sum())
        counts["truncated"] += int(step.truncated.sum())
        obs = step.obs[:, 0].copy()
        done = np.flatnonzero(step.env_done)
        if len(done):
            new = [int(s) for s in rng.integers(0, 4, len(done))]
            rows = vec.reset(new, done)
            np.testing.assert_allclose(rows.obs[:, 0], ref.reset(new, done.tolist()), rtol=0, atol=1e-6)
            np.testing.assert_array_equal(vec._s, ref.states())
            obs[done] = rows.obs[:, 0]
    return counts


@pytest.mark.parametrize("case", CASES, ids=str)
def test_trajectories_equal_gymnasium(case: Case) -> None:
    counts = _run_against_gym(case, 6, case.steps)
    assert counts["terminated" if case.terminates else "truncated"] >= case.min_ends, counts


def _states_and_actions(env_id: str, rng: np.random.Generator) -> tuple[list[np.ndarray], np.ndarray]:
    """Single-env states (in the dtype the original holds them) and actions spread over the whole
    state space, with the boundary cases of every clip, wrap and goal test."""
    n = 600
    f32 = np.float32
    if env_id == "CartPole-v1":
        s = rng.uniform([-2.5, -3.0, -0.25, -3.5], [2.5, 3.0, 0.25, 3.5], (n, 4))
        s[:40, 0] = np.repeat([-2.4, 2.4], 20)  # on the termination bounds
        s[40:80, 2] = np.repeat([-12 * 2 * np.pi / 360, 12 * 2 * np.pi / 360], 20)
        return list(s), rng.integers(0, 2, (n, 1))
    if env_id == "Acrobot-v1":
        s = rng.uniform([-np.pi, -np.pi, -4 * np.pi, -9 * np.pi], [np.pi, np.pi, 4 * np.pi, 9 * np.pi], (n, 4))
        s[:50, 2:] = [4 * np.pi, -9 * np.pi]  # at the velocity bounds (the angles wrap more than once)
        return list(s), rng.integers(0, 3, (n, 1))
    if env_id == "Pendulum-v1":
        s = np.stack([rng.uniform(-20, 20, n), rng.uniform(-8, 8, n)], axis=1)  # theta is never wrapped
        u = rng.uniform(-3, 3, n).astype(f32)
        u[:40] = [2.0, -2.0] * 20
        # torques whose square differs between pow (a numpy scalar's ``u ** 2``) and u * u
        pool = rng.uniform(-2, 2, 100_000).astype(f32)
        u[40:80] = pool[pool * pool != np.power(pool, np.full_like(pool, 2.0))][:40]
        return list(s), u[:, None, None]
    pos = rng.uniform(-1.2, 0.6, n)
    vel = rng.uniform(-0.07, 0.07, n)
    pos[:60] = np.repeat([-1.2, 0.6, 0.45, 0.5], 15)
    vel[:60] = np.tile([-0.07, 0.07, 0.0, -0.01, 0.069], 12)
    pos[60:120] = rng.uniform(-1.2, -1.1, 60)  # pushed into the left wall
    vel[60:120] = rng.uniform(-0.07, -0.05, 60)
    pos[120:180] = rng.uniform(0.4, 0.6, 60)  # reaching the goal at top speed
    vel[120:180] = rng.uniform(0.06, 0.07, 60)
    if env_id == "MountainCar-v0":
        return list(np.stack([pos, vel], axis=1)), rng.integers(0, 3, (n, 1))
    # MountainCarContinuous: float64 reset states (velocity 0), float32 states after a step
    act = rng.uniform(-2, 2, n).astype(f32)
    act[:100] = np.tile(np.array([1.0, -1.0, 0.0, 1.5, -1.5], f32), 20)
    states: list[np.ndarray] = [np.array([p, 0.0]) for p in pos[:150]]
    states += [np.array([p, v], f32) for p, v in zip(pos[150:], vel[150:], strict=True)]
    # at the left wall with a velocity a few ulps either side of cancelling the push: the new
    # position rounds to the wall in float32 without going below it
    probe = gym.make(env_id).unwrapped
    probe.reset(seed=0)
    for j, a in enumerate(np.array([0.0, 0.5, -1.0], f32)):
        probe.state = np.array([-1.2, 0.0], f32)
        dv = probe.step(np.array([a]))[0][1]  # = the velocity change from rest
        v = -dv
        for _ in range(6):
            v = np.nextafter(v, f32(-1))
        for k in range(12):
            states[150 + 12 * j + k] = np.array([-1.2, v], f32)
            act[150 + 12 * j + k] = a
            v = np.nextafter(v, f32(1))
    return states, act[:, None, None]


ONE_STEP = [c for c in CASES if c.env_id != "Pendulum-v1" or not c.kwargs]
ONE_STEP.append(
    Case(
        MountainCarContinuousVec,
        "MountainCarContinuous-v0",
        _mountain_car_continuous,
        0,
        {"goal_velocity": 0.0700000001},
    )
)


@pytest.mark.parametrize("case", ONE_STEP, ids=str)
def test_one_step_bit_exact_over_the_state_space(case: Case) -> None:
    """From states all over the state space (and every clipping boundary), one step of the port
    gives bit-identical float64 states and rewards, observations and terminations."""
    rng = np.random.default_rng(11)
    states, actions = _states_and_actions(case.env_id, rng)
    n = len(states)
    env = gym.make(case.env_id, **case.kwargs).unwrapped
    env.reset(seed=0)
    new_states, obs, rew, term = [], [], [], []
    for state, act in zip(states, actions, strict=True):
        env.state = state.copy()
        if case.env_id == "CartPole-v1":
            env.steps_beyond_terminated = None  # a fresh state, not a step after a termination
        o, r, t, _, _ = env.step(int(act[0]) if actions.ndim == 2 else act[0].copy())
        new_states.append(np.asarray(env.state, np.float64))
        obs.append(o)
        rew.append(r)
        term.append(t)
    vec = case.cls(n, **case.kwargs)
    fresh = np.array([s.dtype == np.float64 for s in states]) & (case.env_id == "MountainCarContinuous-v0")
    s, o, r, t = vec._advance(np.array(states, np.float64), vec._decode(actions, np.zeros(n, bool)), fresh)
    np.testing.assert_array_equal(s, np.array(new_states))
    np.testing.assert_array_equal(o, np.array(obs))
    np.testing.assert_array_equal(r, np.array(rew, np.float64))
    np.testing.assert_array_equal(t, np.array(term))


@pytest.mark.parametrize("env_id", list(BY_ENV))
def test_time_limit_truncation_equals_gymnasium(env_id: str) -> None:
    counts = _run_against_gym(BY_ENV[env_id], 4, 40, max_episode_steps=7)
    assert counts["truncated"] >= 16, counts


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0"])
def test_termination_on_the_last_step_is_also_truncated(env_id: str) -> None:
    """Gymnasium's TimeLimit sets truncated on the limit step even when the env terminates there."""
    case = BY_ENV[env_id]
    vec = case.cls(1)
    obs = vec.reset([5]).obs[:, 0]
    rng = np.random.default_rng(0)
    n = 0
    while n < 500:
        step = vec.step(case.policy(obs, rng))
        obs = step.obs[:, 0]
        n += 1
        if step.env_done[0]:
            break
    assert step.terminated[0, 0]
    vec = case.cls(1, max_episode_steps=n)
    ref = Reference(case, 1, max_episode_steps=n)
    obs = vec.reset([5]).obs[:, 0]
    ref.reset([5], [0])
    rng = np.random.default_rng(0)
    for _ in range(n):
        actions = case.policy(obs, rng)
        step = vec.step(actions)
        _check_step(step, ref.step(actions, np.ones(1, bool)), np.ones(1, bool))
        obs = step.obs[:, 0]
    assert step.terminated[0, 0] and step.truncated[0, 0] and step.env_done[0]


@pytest.mark.parametrize("env_id", list(BY_ENV))
def test_registration_and_layout(env_id: str) -> None:
    cls = BY_ENV[env_id].cls
    assert port_class(env_id) is cls
    vec = cls(3)
    env = gym.make(env_id)
    assert vec.name == env_id
    assert vec.max_episode_steps == env.spec.max_episode_steps
    assert cls(3, max_episode_steps=11).max_episode_steps == 11
    assert vec.supports_snapshot
    lay = vec.layout
    assert lay.agents == ("agent",)
    assert lay.obs_shape == env.observation_space.shape and lay.obs_dtype == np.float32
    assert lay.continuous == isinstance(env.action_space, gym.spaces.Box)
    assert vec.observation_space == env.observation_space and vec.action_space == env.action_space
    step = vec.reset([0, 1, 2])
    assert step.obs.shape == (3, 1, *env.observation_space.shape) and step.obs.dtype == np.float32
    assert step.state is None
    assert cls(2, with_state=True).reset([0, 1]).state.shape == (2, 0)


@pytest.mark.parametrize("env_id", list(BY_ENV))
def test_done_envs_are_frozen(env_id: str) -> None:
    """A finished env is not stepped: its row keeps the final observation, nothing alive, zero
    rewards, until it is reset; the others keep matching Gymnasium."""
    case = BY_ENV[env_id]
    n = 4
    vec = case.cls(n, max_episode_steps=None if case.terminates else 30)
    ref = Reference(case, n, None if case.terminates else 30)
    seeds = [10, 11, 12, 13]
    obs = vec.reset(seeds).obs[:, 0]
    ref.reset(seeds, list(range(n)))
    rng = np.random.default_rng(1)
    live = np.ones(n, bool)
    final: dict[int, np.ndarray] = {}
    for _ in range(1000):
        actions = case.policy(obs, rng)
        step = vec.step(actions)
        _check_step(step, ref.step(actions, live), live)
        for i, last in final.items():
            np.testing.assert_array_equal(step.obs[i, 0], last)
        assert not step.alive[~live].any() and step.env_done[~live].all()
        for i in np.flatnonzero(live & step.env_done):
            final[int(i)] = step.obs[i, 0].copy()
        live = ~step.env_done
        obs = step.obs[:, 0]
        if not live.any():
            break
    assert len(final) == n
    idle = vec.step(case.policy(obs, rng))  # every env done: nothing moves
    np.testing.assert_array_equal(idle.obs, step.obs)
    assert not idle.rewards.any() and not idle.terminated.any() and not idle.truncated.any()
    # a frozen env resets to exactly Gymnasium's reset
    rows = vec.reset([99], [2])
    np.testing.assert_allclose(rows.obs[:, 0], ref.reset([99], [2]), rtol=0, atol=1e-6)
    assert vec.step(case.policy(vec.observations().obs[:, 0], rng)).alive[:, 0].tolist() == [False, False, True, False]


@pytest.mark.parametrize("env_id", list(BY_ENV))
@pytest.mark.parametrize("at", [0, 9])
def test_snapshot_restore_replays_exactly(env_id: str, at: int) -> None:
    """A snapshot (taken right after reset or mid-episode) restored into several envs replays the
    same trajectory under the same actions, and the snapshot stays reusable."""
    case = BY_ENV[env_id]
    n = 5
    vec = case.cls(n)
    obs = vec.reset([3, 4, 5, 6, 7]).obs[:, 0]
    rng = np.random.default_rng(3)
    for _ in range(at):
        obs = vec.step(case.policy(obs, rng)).obs[:, 0]
    snap = vec.snapshot([0])[0]
    start = vec.observations([0]).obs
    for members in ([1, 2, 4], [0, 3]):
        vec.restore(members, [snap] * len(members))
        cur = vec.observations()
        np.testing.assert_array_equal(cur.obs[members], np.repeat(start, len(members), axis=0))
        assert cur.alive[members].all()
        obs = cur.obs[:, 0]
        for _ in range(40):
            actions = case.policy(obs[:1], rng)
            step = vec.step(np.repeat(actions, n, axis=0))
            for key in ("obs", "rewards", "terminated", "truncated", "alive"):
                rows = getattr(step, key)[members]
                np.testing.assert_array_equal(rows, np.repeat(rows[:1], len(members), axis=0), err_msg=key)
            obs = step.obs[:, 0]


@pytest.mark.parametrize("env_id", list(BY_ENV))
def test_reset_without_seed_continues_the_generator(env_id: str) -> None:
    """``reset(None)`` draws from the env's generator like Gymnasium's, also after a restore."""
    case = BY_ENV[env_id]
    vec = case.cls(3)
    ref = Reference(case, 1)
    vec.reset([21, 22, 23])
    snap = vec.snapshot([0])
    expect = [ref.reset([21], [0]), ref.reset([None], [0]), ref.reset([None], [0])]
    np.testing.assert_allclose(vec.reset([None], [0]).obs[:, 0], expect[1], rtol=0, atol=1e-6)
    vec.restore([1, 2], snap * 2)
    rows = vec.reset([None, None], [1, 2]).obs[:, 0]
    np.testing.assert_allclose(rows, np.concatenate([expect[1]] * 2), rtol=0, atol=1e-6)
    np.testing.assert_allclose(vec.reset([None], [0]).obs[:, 0], expect[2], rtol=0, atol=1e-6)


@pytest.mark.parametrize("env_id", list(BY_ENV))
def test_get_state_set_state_resumes_exactly(env_id: str) -> None:
    case = BY_ENV[env_id]
    vec = case.cls(4, max_episode_steps=25)
    obs = vec.reset([1, 2, 3, 3]).obs[:, 0]
    rng = np.random.default_rng(5)
    for _ in range(20):
        step = vec.step(case.policy(obs, rng))
        obs = step.obs[:, 0]
    state = pickle.loads(pickle.dumps(vec.get_state()))
    actions = [case.policy(obs, rng) for _ in range(12)]

    def play(env: Any) -> list[Any]:
        out = []
        for a in actions:
            out.append(env.step(a))
            done = np.flatnonzero(out[-1].env_done)
            if len(done):
                env.reset([None] * len(done), done)  # draws from the restored generators
                out.append(env.observations())
        return out

    first = play(vec)
    other = case.cls(4, max_episode_steps=25)
    other.set_state(state)
    second = play(other)
    assert len(first) == len(second)
    for a, b in zip(first, second, strict=True):
        for key in ("obs", "rewards", "terminated", "truncated", "alive", "env_done"):
            np.testing.assert_array_equal(getattr(a, key), getattr(b, key), err_msg=key)


@pytest.mark.parametrize(
    ("cls", "kwargs", "named"),
    [
        (AcrobotVec, {"book_or_nips": "nips"}, "book_or_nips"),
        (PendulumVec, {"G": 9.8}, "'G'"),
        (MountainCarVec, {"gravity": 0.003}, "gravity"),
        (MountainCarContinuousVec, {"power": 0.002}, "power"),
        (PendulumVec, {"render_mode": "human"}, "render_mode"),
    ],
)
def test_unsupported_kwargs_are_refused(cls: type, kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(UserInputError, match=named):
        cls(2, **kwargs)


def test_bad_inputs_are_named() -> None:
    vec = AcrobotVec(2)
    vec.reset([0, 1])
    with pytest.raises(EnvError, match="outside Discrete"):
        vec.step(np.array([[0], [3]]))
    with pytest.raises(UserInputError, match="seeds"):
        vec.reset([0])
    with pytest.raises(UserInputError, match="shape"):
        pendulum = PendulumVec(2)
        pendulum.reset([0, 1])
        pendulum.step(np.zeros((2, 1)))
    with pytest.raises(UserInputError, match="snapshot"):
        vec.restore([0], [object()])


def test_a_port_registered_from_user_code_is_used_like_a_built_in(registry_sandbox) -> None:
    """``register_port`` is the one way to add a port: ``native`` always uses it, ``auto`` only a
    port registered with ``auto=True`` (the default); the original env stays under ``sync``."""
    from grpo_marl.registry import get_spec
    from grpo_marl.vec import make_vec_env
    from grpo_marl.vec.ports import PORTS, register_port
    from grpo_marl.vec.ports.classic import CartPoleVec

    gym.register("UserCartPole-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv", max_episode_steps=500)
    spec = get_spec("gym:UserCartPole-v0")
    try:
        assert not isinstance(make_vec_env(spec, 2, vectorization="auto"), CartPoleVec)  # no port yet
        register_port("UserCartPole-v0", CartPoleVec, auto=False)
        assert isinstance(make_vec_env(spec, 2, vectorization="native"), CartPoleVec)
        assert not isinstance(make_vec_env(spec, 2, vectorization="auto"), CartPoleVec)
        register_port("UserCartPole-v0", "grpo_marl.vec.ports.classic:CartPoleVec", overwrite=True)
        assert isinstance(make_vec_env(spec, 2, vectorization="auto"), CartPoleVec)
        assert not isinstance(make_vec_env(spec, 2, vectorization="sync"), CartPoleVec)
        with pytest.raises(ValueError, match="port 'UserCartPole-v0' is already registered"):
            register_port("UserCartPole-v0", CartPoleVec)
    finally:
        PORTS.pop("UserCartPole-v0")
        gym.registry.pop("UserCartPole-v0")
