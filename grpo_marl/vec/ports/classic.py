"""Gymnasium's classic-control envs (CartPole, Acrobot, Pendulum, MountainCar, MountainCarContinuous)
as one array program over all envs.

Gymnasium steps each of these envs as a Python object, so a vector of them costs a few tens of
microseconds per env per step -- more than the policy. Here the state of every env is one
``float64[E, S]`` array and a step is a fixed sequence of numpy operations over all rows (resets
loop over the reset envs; they are rare).

The ports are exact, not approximate: for the same per-env seeds and actions, observations,
rewards, terminations and truncations equal Gymnasium's single envs. Exactness is kept by doing
the arithmetic in the originals' order *and dtypes*:

* every expression is the original one with arrays in place of scalars, so Python's evaluation
  order (constants folded left to right) and numpy's promotion of Python scalars are the same;
* a numpy *scalar* ``x ** 2`` calls ``pow`` while an array ``x ** 2`` is ``x * x``, and the two
  differ in the last bit now and then, so squares of scalars are :func:`_pow2` (``np.power``
  with an array exponent, which calls ``pow``);
* Acrobot's reset state is float32 (its first observation takes float32 ``cos``/``sin``), then
  float64 after the first RK4 step; MountainCarContinuous's state is float64 at reset and float32
  after every step, so its steps after the first run in float32 exactly as the original's numpy
  scalar arithmetic does, with the Python-float branches (clipped force, clipped velocity and
  position) kept where the original takes them.

Resets draw env ``i``'s initial state from its own generator, ``PCG64(seed)`` (Gymnasium's
``seeding.np_random``), with the original's draw calls; ``reset`` with seed None continues the
env's generator, like Gymnasium. The time limit is Gymnasium's ``TimeLimit``: ``truncated`` is
set when the step counter reaches ``max_episode_steps``, also on a step that terminates.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from torch import Tensor

from grpo_marl.errors import EnvError, UserInputError
from grpo_marl.vec.base import HostStep, Step, VecEnv, host_actions, layout_of

_TWOS: dict[tuple[tuple[int, ...], Any], np.ndarray] = {}


def _array_pow_is_scalar_pow(dtype: Any) -> bool:
    """Whether ``np.power(array, 2.0-array)`` gives what ``scalar ** 2`` gives for ``dtype``.

    Gymnasium squares numpy scalars, which calls the C library's ``pow``; neither ``x * x`` nor
    ``pow`` is always the other (``pow`` is not correctly rounded). numpy's array ``power`` loop is
    that same ``pow`` on CPUs without AVX-512, but with AVX-512 numpy runs its own SIMD ``pow``,
    which differs in the last bit for ~3% of inputs. A sample of 4,096 values tells the two apart.
    """
    rng = np.random.default_rng(0)
    x = rng.uniform(-20.0, 20.0, 4096).astype(dtype)
    return bool(np.array_equal(np.power(x, np.full_like(x, 2.0)), np.array([v**2 for v in x], dtype)))


_POW_EXACT: dict[Any, bool] = {}


def _pow2(x: np.ndarray) -> np.ndarray:
    """``x ** 2`` as a numpy scalar computes it (``pow``), not as an array does (``x * x``):
    the array ``power`` loop where it is the same function (:func:`_array_pow_is_scalar_pow`),
    else element by element through numpy scalars (exact everywhere, ~0.3 us per element)."""
    exact = _POW_EXACT.get(x.dtype)
    if exact is None:
        exact = _POW_EXACT[x.dtype] = _array_pow_is_scalar_pow(x.dtype)
    if not exact:
        return np.array([v**2 for v in x.ravel()], x.dtype).reshape(x.shape)
    key = (x.shape, x.dtype)
    two = _TWOS.get(key)
    if two is None:
        two = _TWOS[key] = np.full(x.shape, 2.0, x.dtype)
        two.flags.writeable = False
    return np.power(x, two)


@dataclass
class _Snap:
    """One env's full state: physics row, step counter, flags, seed, RNG and last observation."""

    state: np.ndarray
    steps: int
    done: bool
    fresh: bool
    seed: int | None
    rng_state: dict
    obs: np.ndarray


class _ClassicVec(VecEnv):
    """The contract and the bookkeeping shared by the classic-control ports.

    A subclass names its Gymnasium env class and kwargs, draws one env's initial state
    (:meth:`_draw`) and advances all envs one step (:meth:`_advance`).
    """

    supports_snapshot = True
    name = "classic"
    _ENV_CLASS: ClassVar[str] = ""  # "module:Class" of the Gymnasium env (for its spaces)
    _LIMIT: ClassVar[int] = 0  # Gymnasium's registered max_episode_steps
    _DEFAULTS: ClassVar[dict[str, Any]] = {"render_mode": None}
    _STATE_DIM: ClassVar[int] = 2
    max_episode_steps: int  # always set (the env's registered limit unless given)

    def __init__(
        self, num_envs: int, *, max_episode_steps: int | None = None, with_state: bool = False, **env_kwargs: Any
    ) -> None:
        if int(num_envs) < 1:
            raise UserInputError(f"{type(self).__name__}: num_envs must be >= 1, got {num_envs}")
        unknown = sorted(set(env_kwargs) - set(self._DEFAULTS))
        if unknown:
            raise UserInputError(
                f"{self.name}: unsupported env kwarg(s) {unknown} for the batched port; "
                f"supported: {sorted(self._DEFAULTS)}"
            )
        if env_kwargs.get("render_mode") is not None:
            raise UserInputError(
                f"{self.name}: env kwarg render_mode={env_kwargs['render_mode']!r} is not implemented by the "
                "batched port; use vec.vectorization=sync to render"
            )
        self.kwargs = {**self._DEFAULTS, **env_kwargs}
        steps = self._LIMIT if max_episode_steps is None else int(max_episode_steps)
        if steps < 1:
            raise UserInputError(f"{self.name}: max_episode_steps must be >= 1, got {steps}")
        self.max_episode_steps = steps
        self.num_envs = E = int(num_envs)
        self.with_state = bool(with_state)
        self._configure(self.kwargs)
        # the original's own spaces (building the env object is cheap and draws nothing)
        import importlib

        module, _, cls = self._ENV_CLASS.partition(":")
        env = getattr(importlib.import_module(module), cls)(**self.kwargs)
        self.observation_space, self.action_space = env.observation_space, env.action_space
        env.close()
        self.layout = layout_of(("agent",), (self.observation_space,), (self.action_space,))
        self._discrete = not self.layout.continuous
        self._n_actions = self.layout.n_actions[0]
        D = self.layout.obs_shape[0]
        self._s = np.zeros((E, self._STATE_DIM))
        self._fresh = np.zeros(E, bool)  # no step since reset (the state still has its reset dtype)
        self._steps = np.zeros(E, np.int64)
        self._done = np.ones(E, bool)
        self._seeds: list[int | None] = [None] * E
        self._rngs = [np.random.Generator(np.random.PCG64()) for _ in range(E)]
        self._obs = np.zeros((E, 1, D), np.float32)

    # -- env hooks ---------------------------------------------------------------------------
    def _configure(self, kw: dict[str, Any]) -> None:
        pass

    def _draw(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(state row float64[S], observation float32[D]) of a reset, with the original's draws."""
        raise NotImplementedError

    def _advance(
        self, s: np.ndarray, a: np.ndarray, fresh: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """One step of every env: (state float64[E, S], obs float32[E, D], reward float64[E],
        terminated bool[E]); ``a`` is int64[E] or float32[E, k]; rows of done envs are discarded."""
        raise NotImplementedError

    # -- contract ----------------------------------------------------------------------------
    def reset(self, seeds: Sequence[int | None], indices: Sequence[int] | None = None) -> Step:
        idx = np.arange(self.num_envs) if indices is None else np.asarray(indices, np.int64).reshape(-1)
        seeds = list(seeds)
        if len(seeds) != len(idx):
            raise UserInputError(f"{self.name}: reset got {len(seeds)} seeds for {len(idx)} envs")
        for i, seed in zip(idx.tolist(), seeds, strict=True):
            if seed is not None:
                seed = int(seed)
                if seed < 0:
                    raise UserInputError(f"{self.name}: reset seeds must be >= 0, got {seed} for env {i}")
                self._rngs[i] = np.random.Generator(np.random.PCG64(seed))  # = gymnasium's seeding.np_random
            self._seeds[i] = seed
            self._s[i], self._obs[i, 0] = self._draw(self._rngs[i])
        self._steps[idx] = 0
        self._done[idx] = False
        self._fresh[idx] = True
        n = len(idx)
        state = np.zeros((n, 0), np.float32) if self.with_state else None
        return Step.observed(self._obs[idx].copy(), np.zeros(n, bool), state)

    def step(self, actions: Tensor | np.ndarray) -> Step:
        E = self.num_envs
        done = self._done
        if done.all():
            return self.observations()
        some_done = bool(done.any())
        a = self._decode(actions, done if some_done else None)
        s, obs, rew, term = self._advance(self._s, a, self._fresh)
        steps = self._steps + 1
        trunc = steps >= self.max_episode_steps
        rewards = rew.astype(np.float32)
        if some_done:  # done envs do not move: their rows keep the final step's values
            live = ~done
            steps[done] -= 1
            term = term & live
            trunc = trunc & live
            rewards[done] = 0.0
            s[done] = self._s[done]
            obs[done] = self._obs[done, 0]
            self._fresh &= done
        else:
            self._fresh[:] = False
        self._s = s
        self._obs[:, 0] = obs
        self._steps = steps
        self._done = done | term | trunc
        return HostStep(
            obs=self._obs.copy(),
            rewards=rewards[:, None],
            terminated=term[:, None],
            truncated=trunc[:, None],
            alive=~self._done[:, None],
            env_done=self._done.copy(),
            state=np.zeros((E, 0), np.float32) if self.with_state else None,
        ).to_step()

    def _decode(self, actions: Tensor | np.ndarray, done: np.ndarray | None) -> np.ndarray:
        """int64[E] (discrete) or float32[E, k] (Box) actions; rows of ``done`` envs are zeroed."""
        E = self.num_envs
        a = host_actions(actions)
        if self._discrete:
            if a.shape not in ((E, 1), (E,)):
                raise UserInputError(f"{self.name}: discrete actions must have shape [E, 1] = {(E, 1)}, got {a.shape}")
            a = a.reshape(E).astype(np.int64, copy=False)
            if done is not None:
                a = np.where(done, 0, a)
            bad = (a < 0) | (a >= self._n_actions)
            if bad.any():
                e = int(np.flatnonzero(bad)[0])
                raise EnvError(
                    f"{self.name}: action {int(a[e])} is outside Discrete({self._n_actions}) in vector env {e} "
                    f"(episode reset seed {self._seeds[e]})"
                )
            return a
        if a.ndim != 3 or a.shape[:2] != (E, 1):
            raise UserInputError(f"{self.name}: continuous actions must have shape [E, 1, k], got {a.shape}")
        a = a[:, 0].astype(np.float32, copy=False)  # what the Gymnasium driver hands the env
        return a if done is None else np.where(done[:, None], np.float32(0), a)

    def observations(self, indices: Sequence[int] | None = None) -> Step:
        """The current record of envs ``indices`` (all when None) without stepping: after
        :meth:`restore`, the observations the restored envs act on next."""
        idx = np.arange(self.num_envs) if indices is None else np.asarray(indices, np.int64).reshape(-1)
        state = np.zeros((len(idx), 0), np.float32) if self.with_state else None
        return Step.observed(self._obs[idx].copy(), self._done[idx], state)

    # -- snapshots ---------------------------------------------------------------------------
    def snapshot(self, indices: Sequence[int]) -> list[Any]:
        return [
            _Snap(
                state=self._s[i].copy(),
                steps=int(self._steps[i]),
                done=bool(self._done[i]),
                fresh=bool(self._fresh[i]),
                seed=self._seeds[i],
                rng_state=copy.deepcopy(dict(self._rngs[i].bit_generator.state)),
                obs=self._obs[i].copy(),
            )
            for i in np.asarray(indices, np.int64).reshape(-1).tolist()
        ]

    def restore(self, indices: Sequence[int], snaps: Sequence[Any]) -> None:
        idx = np.asarray(indices, np.int64).reshape(-1).tolist()
        if len(idx) != len(snaps):
            raise UserInputError(f"{self.name}: restore got {len(snaps)} snapshots for {len(idx)} envs")
        for i, snap in zip(idx, snaps, strict=True):
            if not isinstance(snap, _Snap) or snap.state.shape != (self._STATE_DIM,):
                raise UserInputError(f"{self.name}: restore got {type(snap).__name__}, not a snapshot of this env")
            self._s[i] = snap.state
            self._steps[i] = snap.steps
            self._done[i] = snap.done
            self._fresh[i] = snap.fresh
            self._seeds[i] = snap.seed
            rng = np.random.Generator(np.random.PCG64())
            rng.bit_generator.state = copy.deepcopy(snap.rng_state)
            self._rngs[i] = rng
            self._obs[i] = snap.obs


class AcrobotVec(_ClassicVec):
    """Gymnasium ``Acrobot-v1``: ``rk4`` with 4 derivative evaluations over ``dt = 0.2``, the
    book dynamics, no torque noise, angles wrapped to ``[-pi, pi]`` and velocities bounded;
    reward -1 per step, 0 on the step that lifts the tip above the bar (which terminates)."""

    name = "Acrobot-v1"
    _ENV_CLASS = "gymnasium.envs.classic_control.acrobot:AcrobotEnv"
    _LIMIT = 500
    _STATE_DIM = 4

    dt = 0.2
    LINK_LENGTH_1 = 1.0
    LINK_MASS_1 = 1.0
    LINK_MASS_2 = 1.0
    LINK_COM_POS_1 = 0.5
    LINK_COM_POS_2 = 0.5
    LINK_MOI = 1.0
    MAX_VEL_1 = 4 * np.pi
    MAX_VEL_2 = 9 * np.pi
    AVAIL_TORQUE = np.array([-1.0, 0.0, +1])
    _max_vel = np.array([[MAX_VEL_1], [MAX_VEL_2]])

    def _draw(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        s = rng.uniform(low=-0.1, high=0.1, size=(4,)).astype(np.float32)
        # float32 trig, as the original's first observation (its reset state is float32)
        obs = np.array([np.cos(s[0]), np.sin(s[0]), np.cos(s[1]), np.sin(s[1]), s[2], s[3]], dtype=np.float32)
        return s.astype(np.float64), obs

    def _dsdt(self, s: tuple[np.ndarray, ...], a: np.ndarray) -> tuple[np.ndarray, ...]:
        """The original's ``_dsdt`` (book dynamics) on columns; the torque's derivative (0) is left out."""
        cos, sin, pi = np.cos, np.sin, np.pi
        m1 = self.LINK_MASS_1
        m2 = self.LINK_MASS_2
        l1 = self.LINK_LENGTH_1
        lc1 = self.LINK_COM_POS_1
        lc2 = self.LINK_COM_POS_2
        I1 = self.LINK_MOI
        I2 = self.LINK_MOI
        g = 9.8
        theta1, theta2, dtheta1, dtheta2 = s
        # the original calls cos(theta2) twice and sin(theta2) three times; the values are the same
        cos_t2, sin_t2 = cos(theta2), sin(theta2)
        d1 = m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * cos_t2) + I1 + I2
        d2 = m2 * (lc2**2 + l1 * lc2 * cos_t2) + I2
        phi2 = m2 * lc2 * g * cos(theta1 + theta2 - pi / 2.0)
        phi1 = (
            -m2 * l1 * lc2 * _pow2(dtheta2) * sin_t2
            - 2 * m2 * l1 * lc2 * dtheta2 * dtheta1 * sin_t2
            + (m1 * lc1 + m2 * l1) * g * cos(theta1 - pi / 2)
            + phi2
        )
        ddtheta2 = (a + d2 / d1 * phi1 - m2 * l1 * lc2 * _pow2(dtheta1) * sin_t2 - phi2) / (
            m2 * lc2**2 + I2 - _pow2(d2) / d1
        )
        ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
        return dtheta1, dtheta2, ddtheta1, ddtheta2

    def _advance(
        self, s: np.ndarray, a: np.ndarray, fresh: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        torque = self.AVAIL_TORQUE[a]
        # gymnasium's rk4 over t = [0, dt]: one step of classic RK4, on the [4, E] state (every
        # operation is elementwise, so rows are computed exactly as the original's components)
        dt = self.dt - 0
        dt2 = dt / 2.0
        y0 = np.ascontiguousarray(s.T)
        k1 = np.stack(self._dsdt(tuple(y0), torque))
        k2 = np.stack(self._dsdt(tuple(y0 + dt2 * k1), torque))
        k3 = np.stack(self._dsdt(tuple(y0 + dt2 * k2), torque))
        k4 = np.stack(self._dsdt(tuple(y0 + dt * k3), torque))
        ns = y0 + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
        ns[:2] = _wrap(ns[:2], -np.pi, np.pi)
        ns[2:] = np.minimum(np.maximum(ns[2:], -self._max_vel), self._max_vel)
        cos_t, sin_t = np.cos(ns[:2]), np.sin(ns[:2])
        terminated = -cos_t[0] - np.cos(ns[1] + ns[0]) > 1.0
        reward = np.where(terminated, 0.0, -1.0)
        obs = np.stack([cos_t[0], sin_t[0], cos_t[1], sin_t[1], ns[2], ns[3]], axis=1).astype(np.float32)
        return ns.T, obs, reward, terminated


def _wrap(x: np.ndarray, m: float, M: float) -> np.ndarray:
    """The original's ``wrap``: subtract/add the period until inside, element by element."""
    diff = M - m
    while True:
        over = x > M
        if not over.any():
            break
        x = np.where(over, x - diff, x)
    while True:
        under = x < m
        if not under.any():
            break
        x = np.where(under, x + diff, x)
    return x


class PendulumVec(_ClassicVec):
    """Gymnasium ``Pendulum-v1``: torque clipped to ``[-2, 2]`` (float32, as the action), cost
    ``angle_normalize(th)^2 + 0.1 thdot^2 + 0.001 u^2``, speed clipped to 8; never terminates.
    Kwargs: ``g``."""

    name = "Pendulum-v1"
    _ENV_CLASS = "gymnasium.envs.classic_control.pendulum:PendulumEnv"
    _LIMIT = 200
    _DEFAULTS: ClassVar[dict[str, Any]] = {"render_mode": None, "g": 10.0}
    max_speed = 8
    max_torque = 2.0
    dt = 0.05
    m = 1.0
    length = 1.0  # the original's ``l``

    def _configure(self, kw: dict[str, Any]) -> None:
        self.g = kw["g"]

    def _draw(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        high = np.array([np.pi, 1.0])
        s = rng.uniform(low=-high, high=high)
        return s, np.array([np.cos(s[0]), np.sin(s[0]), s[1]], dtype=np.float32)

    def _advance(
        self, s: np.ndarray, a: np.ndarray, fresh: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        th, thdot = s[:, 0], s[:, 1]
        g, m, length, dt = self.g, self.m, self.length, self.dt
        u = np.clip(a, -self.max_torque, self.max_torque)[:, 0]  # float32
        costs = _pow2(_angle_normalize(th)) + 0.1 * _pow2(thdot) + 0.001 * _pow2(u)
        newthdot = thdot + (3 * g / (2 * length) * np.sin(th) + 3.0 / (m * length**2) * u) * dt
        newthdot = np.clip(newthdot, -self.max_speed, self.max_speed)
        newth = th + newthdot * dt
        obs = np.stack([np.cos(newth), np.sin(newth), newthdot], axis=1).astype(np.float32)
        return np.stack([newth, newthdot], axis=1), obs, -costs, np.zeros(len(th), bool)


def _angle_normalize(x: np.ndarray) -> np.ndarray:
    return ((x + np.pi) % (2 * np.pi)) - np.pi


class MountainCarVec(_ClassicVec):
    """Gymnasium ``MountainCar-v0``: push left/none/right, gravity ``-0.0025 cos(3x)``, velocity
    clipped to 0.07, position to ``[-1.2, 0.6]`` with the velocity zeroed at the left wall; reward
    -1 per step, terminates at ``x >= 0.5`` with velocity >= ``goal_velocity``. Kwargs:
    ``goal_velocity``."""

    name = "MountainCar-v0"
    _ENV_CLASS = "gymnasium.envs.classic_control.mountain_car:MountainCarEnv"
    _LIMIT = 200
    _DEFAULTS: ClassVar[dict[str, Any]] = {"render_mode": None, "goal_velocity": 0}
    min_position = -1.2
    max_position = 0.6
    max_speed = 0.07
    goal_position = 0.5
    force = 0.001
    gravity = 0.0025

    def _configure(self, kw: dict[str, Any]) -> None:
        self.goal_velocity = kw["goal_velocity"]

    def _draw(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        s = np.array([rng.uniform(low=-0.6, high=-0.4), 0])
        return s, s.astype(np.float32)

    def _advance(
        self, s: np.ndarray, a: np.ndarray, fresh: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        position, velocity = s[:, 0], s[:, 1]
        # np.cos of a float64 array is the same libm value as the original's math.cos
        velocity = velocity + ((a - 1) * self.force + np.cos(3 * position) * (-self.gravity))
        velocity = np.clip(velocity, -self.max_speed, self.max_speed)
        position = position + velocity
        position = np.clip(position, self.min_position, self.max_position)
        velocity = np.where((position == self.min_position) & (velocity < 0), 0.0, velocity)
        terminated = (position >= self.goal_position) & (velocity >= self.goal_velocity)
        ns = np.stack([position, velocity], axis=1)
        return ns, ns.astype(np.float32), np.full(len(position), -1.0), terminated


class MountainCarContinuousVec(_ClassicVec):
    """Gymnasium ``MountainCarContinuous-v0``: force ``clip(a, -1, 1) * 0.0015`` against gravity
    ``0.0025 cos(3x)``, the same clipping and left wall as MountainCar; terminates at
    ``x >= 0.45`` with velocity >= ``goal_velocity`` (reward +100), minus ``0.1 a^2`` of the
    unclipped action every step. Kwargs: ``goal_velocity``.

    The original keeps its state as a float32 array after the first step, so from then on its
    numpy-scalar arithmetic runs in float32 (Python floats cast to float32 on contact), except
    where a clip substitutes a Python float; both regimes are reproduced here (``fresh`` rows are
    the first step after a reset, in float64).
    """

    name = "MountainCarContinuous-v0"
    _ENV_CLASS = "gymnasium.envs.classic_control.continuous_mountain_car:Continuous_MountainCarEnv"
    _LIMIT = 999
    _DEFAULTS: ClassVar[dict[str, Any]] = {"render_mode": None, "goal_velocity": 0}
    min_action = -1.0
    max_action = 1.0
    min_position = -1.2
    max_position = 0.6
    max_speed = 0.07
    goal_position = 0.45
    power = 0.0015

    def _configure(self, kw: dict[str, Any]) -> None:
        self.goal_velocity = gv = kw["goal_velocity"]
        # The original's velocity goal test sees a Python float where a clip put one (+-0.07, or
        # 0 at the left wall) and a float32 otherwise; when both compare with goal_velocity alike
        # at those values (the default 0 does), the float32 values alone decide.
        at = np.array([self.max_speed, -self.max_speed, 0.0], np.float32)
        self._vel_test_f32 = bool(np.array_equal(at >= gv, [self.max_speed >= gv, -self.max_speed >= gv, 0 >= gv]))

    def _draw(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        s = np.array([rng.uniform(low=-0.6, high=-0.4), 0])
        return s, s.astype(np.float32)

    def _advance(
        self, s: np.ndarray, a: np.ndarray, fresh: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        act = a[:, 0]  # float32
        gv = self.goal_velocity
        # force = min(max(a, -1.0), 1.0): the Python float bound replaces a only when strictly outside
        f_lo, f_hi = act < self.min_action, act > self.max_action
        f_clip = f_lo | f_hi
        fp32 = act * self.power  # float32 * Python float -> float32
        # 0.0025 * math.cos(3 * position): float64 position when fresh, float32 (3 * p in float32) after
        p64, v64 = s[:, 0], s[:, 1]
        p32, v32 = p64.astype(np.float32), v64.astype(np.float32)
        any_fresh = bool(fresh.any())
        x = (3 * p32).astype(np.float64)
        c = 0.0025 * np.cos(np.where(fresh, 3 * p64, x) if any_fresh else x)
        # force * power - c: float32 (c cast to float32) unless the force is a clipped Python float
        dv32 = fp32 - c.astype(np.float32)
        dv = dv32.astype(np.float64)
        if f_clip.any():
            fp64 = np.where(f_hi, self.max_action * self.power, self.min_action * self.power)
            dv = np.where(f_clip, fp64 - c, dv)
            dv32 = dv.astype(np.float32)

        # fresh rows (the first step after a reset): float64 throughout
        if any_fresh:
            vf = np.clip(v64 + dv, -self.max_speed, self.max_speed)
            pf = np.clip(p64 + vf, self.min_position, self.max_position)
            vf = np.where((pf == self.min_position) & (vf < 0), 0.0, vf)
            term_f = (pf >= self.goal_position) & (vf >= gv)

        # the other rows: float32 scalars, Python floats cast to float32 on contact (the clips'
        # bounds 0.6, -1.2 and +-0.07 move and compare as their float32 values)
        vs_raw = v32 + dv32
        vs = np.clip(vs_raw, -self.max_speed, self.max_speed)
        ps = np.clip(p32 + vs, self.min_position, self.max_position)
        zero = (ps == self.min_position) & (vs < 0)
        vs = np.where(zero, np.float32(0), vs)
        if self._vel_test_f32:
            vel_ok = vs >= gv
        else:
            v_hi, v_lo = vs_raw > self.max_speed, vs_raw < -self.max_speed
            vel_ok = np.where(
                zero,
                0 >= gv,
                np.where(v_hi, self.max_speed >= gv, np.where(v_lo, -self.max_speed >= gv, vs >= gv)),
            )
        term_s = (ps >= self.goal_position) & vel_ok

        terminated, position, velocity = term_s, ps, vs
        if any_fresh:
            terminated = np.where(fresh, term_f, term_s)
            position = np.where(fresh, pf.astype(np.float32), ps)
            velocity = np.where(fresh, vf.astype(np.float32), vs)
        obs = np.stack([position, velocity], axis=1)  # float32, as the original's state
        reward = np.where(terminated, 100.0, 0.0) - _pow2(act.astype(np.float64)) * 0.1
        return obs.astype(np.float64), obs, reward, terminated


class CartPoleVec(_ClassicVec):
    """Gymnasium ``CartPole-v1`` (and ``-v0`` with ``max_episode_steps=200``): Euler steps of the
    cart-pole dynamics with force +-10, terminated when ``|x| > 2.4`` or ``|theta| > 12 deg``;
    reward 1 per step (``sutton_barto_reward``: 0, and -1 on the terminating step). Kwargs:
    ``sutton_barto_reward``.

    Gymnasium's own ``CartPoleVectorEnv`` is batched too, but it takes one seed and autoresets, so
    stepping it under this contract (frozen finished envs, per-env seeds) copies and restores the
    finished columns every step: ~1.8x this port's CPU time per vector step (32 envs), and on
    CartPole the env step is a large share of GRPO's collection and evaluation time.
    """

    name = "CartPole-v1"
    _ENV_CLASS = "gymnasium.envs.classic_control.cartpole:CartPoleEnv"
    _LIMIT = 500
    _STATE_DIM = 4
    _DEFAULTS: ClassVar[dict[str, Any]] = {"render_mode": None, "sutton_barto_reward": False}
    gravity = 9.8
    masscart = 1.0
    masspole = 0.1
    total_mass = masspole + masscart
    length = 0.5  # half the pole's length
    polemass_length = masspole * length
    force_mag = 10.0
    tau = 0.02
    theta_threshold_radians = 12 * 2 * math.pi / 360
    x_threshold = 2.4

    def _configure(self, kw: dict[str, Any]) -> None:
        self.sutton_barto_reward = bool(kw["sutton_barto_reward"])

    def _draw(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        s = rng.uniform(low=-0.05, high=0.05, size=(4,))
        return s, s.astype(np.float32)

    def _advance(
        self, s: np.ndarray, a: np.ndarray, fresh: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        x, x_dot, theta, theta_dot = s[:, 0], s[:, 1], s[:, 2], s[:, 3]
        force = np.where(a == 1, self.force_mag, -self.force_mag)
        costheta = np.cos(theta)
        sintheta = np.sin(theta)
        temp = (force + self.polemass_length * np.square(theta_dot) * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * np.square(costheta) / self.total_mass)
        )
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        ns = np.stack(
            [
                x + self.tau * x_dot,
                x_dot + self.tau * xacc,
                theta + self.tau * theta_dot,
                theta_dot + self.tau * thetaacc,
            ],
            axis=1,
        )
        x, theta = ns[:, 0], ns[:, 2]
        terminated = (
            (x < -self.x_threshold)
            | (x > self.x_threshold)
            | (theta < -self.theta_threshold_radians)
            | (theta > self.theta_threshold_radians)
        )
        if self.sutton_barto_reward:
            reward = np.where(terminated, -1.0, 0.0)
        else:
            reward = np.ones(len(x))
        return ns, ns.astype(np.float32), reward, terminated


class CartPoleV0Vec(CartPoleVec):
    """Gymnasium ``CartPole-v0``: ``CartPole-v1`` with Gymnasium's registered limit of 200 steps."""

    name = "CartPole-v0"
    _LIMIT = 200
