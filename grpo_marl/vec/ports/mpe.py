"""mpe2's particle worlds as one array program over all envs and agents.

Scenarios: ``simple_spread_v3``, ``simple_speaker_listener_v4``, ``simple_reference_v3`` (in the
port registry) and ``simple_v3`` (same physics; :class:`SimpleVec`).

mpe2 steps each env as a Python object graph (one ``Agent``/``Landmark`` object per entity, a
Python double loop for collisions), which caps a single process at a few thousand joint steps
per second. Here every env of the batch lives in a few arrays -- agent positions/velocities
``[E, A, 2]``, landmark positions ``[E, L, 2]``, communication states ``[E, A, dim_c]`` and the
scenario's goals ``[E, ...]`` -- and a step is a fixed sequence of numpy operations over all of
them.

The port is exact, not approximate: for the same per-env seeds and actions, observations equal
mpe2's (float32 casts of the same float64 values) and rewards, terminations and truncations are
identical. Exactness is kept by doing the float64 arithmetic in mpe2's order:

* action -> force: discrete ids split into move ``a % 5`` and comm ``a // 5`` as mpe2 combines
  them; moves scaled by ``accel`` (sensitivity 5.0); continuous moves ``a[2]-a[1], a[4]-a[3]``
  subtracted in float32 after clipping to the Box, like mpe2's clip wrapper;
* collision forces (soft contact ``logaddexp`` penetration) are added to an agent's action
  force one partner at a time in entity order -- a reduction over a leading axis, which numpy
  does sequentially, because a pairwise (last-axis) sum would round differently;
* integration: position with the old velocity, damping, force/mass*dt, ``max_speed`` clipping;
* rewards: sums over landmarks accumulated sequentially as mpe2's Python loops do, and
  ``local_ratio`` mixing computed as ``global * (1 - r) + local * r``.

Resets draw each env's initial state from its own generator (``PCG64(seed)``, as mpe2's
``reset(seed=...)``), in the scenario's draw order; ``reset`` with seed None continues the env's
generator, like mpe2. Resets loop over the reset envs (they are rare; envs sharing a seed are
drawn once); steps never loop over envs or agents.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from torch import Tensor

from grpo_marl.errors import EnvError, UserInputError
from grpo_marl.vec.base import HostStep, Step, VecEnv, host_actions, layout_of

# mpe2's discrete movement actions: no-op, left, right, down, up.
_MOVES = np.array([[0.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [0.0, -1.0], [0.0, 1.0]])
_MOVE_DIM = 5  # world.dim_p * 2 + 1
_DT = 0.1
_DAMPING = 0.25
_CONTACT_FORCE = 1e2
_CONTACT_MARGIN = 1e-3
_DIM_COLOR = 3


@dataclass
class _World:
    """The state arrays of ``n`` envs (one row per env)."""

    apos: np.ndarray  # [n, A, 2] float64 agent positions
    avel: np.ndarray  # [n, A, 2] float64 agent velocities
    lpos: np.ndarray  # [n, L, 2] float64 landmark positions (landmarks never move)
    comm: np.ndarray  # [n, A, dim_c] float64 communication states (zeros for silent agents)
    goal: np.ndarray  # [n, G] int64 scenario goals (landmark indices); G may be 0
    cache: dict = field(default_factory=dict)  # geometry shared by a step's observation and reward

    def rows(self, idx: Any) -> _World:
        return _World(self.apos[idx], self.avel[idx], self.lpos[idx], self.comm[idx], self.goal[idx])


@dataclass
class _Snap:
    """One env's full state: world rows, step counter, done flag, seed, RNG and last record row."""

    apos: np.ndarray
    avel: np.ndarray
    lpos: np.ndarray
    comm: np.ndarray
    goal: np.ndarray
    steps: int
    done: bool
    seed: int | None
    rng_state: Mapping[str, Any]
    obs: np.ndarray
    state: np.ndarray | None


class _MpeVec(VecEnv):
    """The physics, the contract and the bookkeeping shared by every mpe2 scenario port.

    A subclass declares its entities in :meth:`_build` and implements the scenario's draws
    (:meth:`_draw`), observations (:meth:`_observe`), rewards (:meth:`_reward`) and, when it has
    one, its success test (:meth:`_terminal`).
    """

    supports_snapshot = True
    name = "mpe"
    # mpe2 kwargs of this scenario and their defaults (refused when not listed here)
    _DEFAULTS: ClassVar[dict[str, Any]] = {}

    # -- scenario declaration (set by _build) ----------------------------------------------
    agent_names: list[str]
    n_landmarks: int
    dim_c: int
    movable: np.ndarray  # [A] bool
    silent: np.ndarray  # [A] bool
    agent_collide: np.ndarray  # [A] bool
    landmark_collide: np.ndarray  # [L] bool
    agent_size: np.ndarray  # [A] float
    landmark_size: np.ndarray  # [L] float
    accel: np.ndarray  # [A] float (action sensitivity; mpe2's default 5.0 when accel is None)
    max_speed: np.ndarray  # [A] float (inf: no limit)
    mass: np.ndarray  # [A] float
    obs_dims: list[int]
    n_goals: int = 0
    max_episode_steps: int  # never None here: mpe2's max_cycles is the default

    def __init__(
        self, num_envs: int, *, max_episode_steps: int | None = None, with_state: bool = False, **env_kwargs: Any
    ) -> None:
        if int(num_envs) < 1:
            raise UserInputError(f"{type(self).__name__}: num_envs must be >= 1, got {num_envs}")
        kw = self._parse_kwargs(env_kwargs)
        self.kwargs = kw
        self.continuous = bool(kw["continuous_actions"])
        max_cycles = int(kw["max_cycles"])
        steps = max_cycles if max_episode_steps is None else int(max_episode_steps)
        if steps < 1:
            raise UserInputError(f"{self.name}: max_episode_steps (max_cycles) must be >= 1, got {steps}")
        self.max_episode_steps = steps
        self.num_envs = E = int(num_envs)
        self.with_state = bool(with_state)
        self._build(kw)
        self._prepare_physics()
        self._prepare_spaces()
        A, L = len(self.agent_names), self.n_landmarks
        self._world = _World(
            apos=np.zeros((E, A, 2)),
            avel=np.zeros((E, A, 2)),
            lpos=np.zeros((E, L, 2)),
            comm=np.zeros((E, A, self.dim_c)),
            goal=np.zeros((E, self.n_goals), np.int64),
        )
        self._steps = np.zeros(E, np.int64)
        self._done = np.ones(E, bool)
        self._seeds: list[int | None] = [None] * E
        # per env: its Generator, or (lazily) the state dict of one, or None (entropy, when first needed)
        self._rngs: list[Any] = [None] * E
        self._obs = np.zeros((E, A, *self.layout.obs_shape), np.float32)
        self._state = np.zeros((E, self.layout.state_dim), np.float32) if self.with_state else None

    # -- configuration ---------------------------------------------------------------------
    def _parse_kwargs(self, env_kwargs: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(env_kwargs) - set(self._DEFAULTS))
        if unknown:
            raise UserInputError(
                f"{self.name}: unsupported env kwarg(s) {unknown} for the batched port; "
                f"supported: {sorted(self._DEFAULTS)}"
            )
        kw = {**self._DEFAULTS, **env_kwargs}
        # accepted by mpe2 but only their defaults are implemented here
        for key, default in (("render_mode", None), ("benchmark_data", False)):
            if key in kw and kw[key] != default:
                raise UserInputError(
                    f"{self.name}: env kwarg {key}={kw[key]!r} is not implemented by the batched port "
                    f"(only {default!r}); use the mpe2-backed env for it"
                )
        if "local_ratio" in kw:
            lr = kw["local_ratio"]
            if not isinstance(lr, int | float) or not 0.0 <= float(lr) <= 1.0:
                raise UserInputError(f"{self.name}: env kwarg local_ratio must be in [0, 1], got {lr!r}")
            kw["local_ratio"] = float(lr)
        return kw

    def _build(self, kw: dict[str, Any]) -> None:
        raise NotImplementedError

    def _prepare_physics(self) -> None:
        A = len(self.agent_names)
        self._agents_idx = np.arange(A)[:, None]
        self._others = np.array([[j for j in range(A) if j != i] for i in range(A)], np.int64).reshape(A, A - 1)
        mv = np.flatnonzero(self.movable)
        self._mv: Any = slice(int(mv[0]), int(mv[-1]) + 1) if len(mv) and np.all(np.diff(mv) == 1) else mv
        self._n_mv = len(mv)
        # discrete: move = a % 5 for movable agents; comm = a // 5 (movable) or a (immobile)
        self._mdiv = np.where(self.movable, _MOVE_DIM, 1).astype(np.int64)
        table = np.zeros((A, _MOVE_DIM, 2))
        for i in range(A):
            if self.movable[i]:
                table[i] = _MOVES * self.accel[i]  # -1.0 * 5.0 as mpe2's ``u *= sensitivity``
        # flat [M * 5, 2]: row 5 * m + move is movable agent m's action force
        self._move_table = table[mv].reshape(-1, 2)
        self._move_base = _MOVE_DIM * np.arange(len(mv))
        self._all_movable = len(mv) == A
        self._mass_mv = self.mass[mv][:, None]
        self._n_actions_u = np.zeros(A, np.uint64)  # set with the spaces
        self._talkers = np.flatnonzero(~self.silent)
        self._comm_off = np.where(self.movable, _MOVE_DIM, 0)[self._talkers]  # continuous comm offset
        self._eye_c = np.eye(self.dim_c) if self.dim_c else np.zeros((0, 0))
        # colliders in entity order (agents first, then landmarks)
        ca = np.flatnonzero(self.agent_collide)
        cl = np.flatnonzero(self.landmark_collide)
        self._ca, self._cl = ca, cl
        self._collisions = len(ca) >= 1 and len(ca) + len(cl) >= 2 and bool(np.any(self.movable[ca]))
        if self._collisions:
            sizes = np.concatenate([self.agent_size[ca], self.landmark_size[cl]])
            C = len(sizes)
            # every ordered pair (i, j), flattened i-major; the soft-contact penetration is symmetric,
            # so it is computed once per unordered pair and gathered back (the diagonal borrows any
            # pair: its force is 0 * finite)
            self._pi, self._pj = np.repeat(np.arange(C), C), np.tile(np.arange(C), C)
            self._dist_min = (sizes[:, None] + sizes[None, :]).ravel()
            self._eye_coll = np.eye(C).ravel()
            iu, ju = np.triu_indices(C, 1)
            self._upper = iu * C + ju
            pair_of = np.zeros((C, C), np.int64)
            pair_of[iu, ju] = np.arange(len(iu))
            pair_of[ju, iu] = np.arange(len(iu))
            self._pair_of = pair_of.ravel()
            # rows of the movable agents that collide (in the movable block) / in the collider list
            mv_list = list(mv)
            self._coll_mv = np.array([mv_list.index(a) for a in ca if a in mv_list], np.int64)
            self._coll_rows = np.array([k for k, a in enumerate(ca) if a in mv_list], np.int64)
        self._speed_limit = bool(np.any(np.isfinite(self.max_speed[mv])))

    def _prepare_spaces(self) -> None:
        from gymnasium import spaces

        obs_spaces: list[spaces.Box] = []
        act_spaces: list[spaces.Box | spaces.Discrete] = []
        for i in range(len(self.agent_names)):
            # mpe2's SimpleEnv: movement part times/plus the comm part
            if self.movable[i]:
                space_dim = _MOVE_DIM
            elif self.continuous:
                space_dim = 0
            else:
                space_dim = 1
            if not self.silent[i]:
                space_dim = space_dim + self.dim_c if self.continuous else space_dim * self.dim_c
            if self.continuous:
                act_spaces.append(spaces.Box(low=0, high=1, shape=(space_dim,)))
            else:
                act_spaces.append(spaces.Discrete(space_dim))
            obs_spaces.append(
                spaces.Box(
                    low=-np.float32(np.inf), high=+np.float32(np.inf), shape=(self.obs_dims[i],), dtype=np.float32
                )
            )
        self.observation_spaces = obs_spaces
        self.action_spaces = act_spaces
        self.layout = layout_of(self.agent_names, obs_spaces, act_spaces, state_dim=sum(self.obs_dims))
        self._n_actions = np.array([int(s.n) if isinstance(s, spaces.Discrete) else 0 for s in act_spaces], np.int64)
        self._n_actions_u = self._n_actions.astype(np.uint64)
        D = self.layout.obs_shape[0]
        self._state_idx = np.concatenate([i * D + np.arange(d) for i, d in enumerate(self.obs_dims)])

    # -- scenario hooks --------------------------------------------------------------------
    def _draw(self, rng: np.random.Generator) -> tuple[list[int], np.ndarray]:
        """One env's initial state in mpe2's draw order: the scenario's goal draws first, then
        ``uniform(-1, 1, 2)`` per agent and per landmark (one call of the same stream)."""
        goals = self._draw_goals(rng)
        n = len(self.agent_names) + self.n_landmarks
        return goals, rng.uniform(-1, +1, n * 2).reshape(n, 2)

    def _draw_goals(self, rng: np.random.Generator) -> list[int]:
        return []

    def _rng(self, i: int) -> np.random.Generator:
        """Env ``i``'s generator (materialized from a stored state, or from entropy like an
        unseeded mpe2 env)."""
        r = self._rngs[i]
        if isinstance(r, np.random.Generator):
            return r
        g = np.random.Generator(np.random.PCG64())
        if r is not None:
            g.bit_generator.state = r
        self._rngs[i] = g
        return g

    def _rng_state(self, i: int) -> Mapping[str, Any]:
        r = self._rngs[i]
        if r is None:
            r = self._rng(i)
        return copy.deepcopy(r.bit_generator.state if isinstance(r, np.random.Generator) else r)

    def _observe(self, w: _World) -> np.ndarray:
        raise NotImplementedError

    def _reward(self, w: _World) -> np.ndarray:
        raise NotImplementedError

    def _terminal(self, w: _World) -> np.ndarray | None:
        return None

    # -- contract ----------------------------------------------------------------------------
    def reset(self, seeds: Sequence[int | None], indices: Sequence[int] | None = None) -> Step:
        idx = np.arange(self.num_envs) if indices is None else np.asarray(indices, np.int64).reshape(-1)
        seeds = list(seeds)
        if len(seeds) != len(idx):
            raise UserInputError(f"{self.name}: reset got {len(seeds)} seeds for {len(idx)} envs")
        w = self._world
        n, A = len(idx), len(self.agent_names)
        xy = np.empty((n, A + self.n_landmarks, 2))
        goals = np.empty((n, self.n_goals), np.int64)
        leaders: dict[int, tuple[int, Mapping[str, Any]]] = {}  # seed -> (row, generator state after the draws)
        for r, (i, seed) in enumerate(zip(idx.tolist(), seeds, strict=True)):
            if seed is not None:
                seed = int(seed)
                if seed < 0:
                    raise UserInputError(f"{self.name}: reset seeds must be >= 0, got {seed} for env {i}")
                if seed in leaders:
                    # same seed, same draws: copy the first env's (envs of one seed group)
                    lead, after = leaders[seed]
                    xy[r], goals[r] = xy[lead], goals[lead]
                    self._rngs[i] = after
                    self._seeds[i] = seed
                    continue
                self._rngs[i] = np.random.Generator(np.random.PCG64(seed))  # = gymnasium's seeding.np_random
            rng = self._rng(i)
            g, xy[r] = self._draw(rng)
            goals[r] = g
            if seed is not None:
                leaders[seed] = (r, rng.bit_generator.state)
            self._seeds[i] = seed
        w.apos[idx] = xy[:, :A]
        w.lpos[idx] = xy[:, A:]
        w.avel[idx] = 0.0
        w.comm[idx] = 0.0
        w.goal[idx] = goals
        self._steps[idx] = 0
        self._done[idx] = False
        sub = w.rows(idx)
        obs = self._observe(sub)
        self._obs[idx] = obs
        state = None
        if self._state is not None:
            state = self._state_of(obs)
            self._state[idx] = state
        return Step.observed(obs.copy(), np.zeros(n, bool), state)

    def step(self, actions: Tensor | np.ndarray) -> Step:
        E, A = self.num_envs, len(self.agent_names)
        done = self._done
        if done.all():
            return self._idle()
        some_done = bool(done.any())
        w = self._world
        u, comm = self._decode(actions, done if some_done else None)

        # forces on the movable agents: action force, then each collision partner in entity order
        force = u
        if self._collisions:
            force = self._collision_forces(u, w)

        # integrate (mpe2's World.integrate_state)
        mv = self._mv
        p = w.apos[:, mv]
        v = w.avel[:, mv]
        p_new = p + v * _DT
        v_new = v * (1 - _DAMPING) + (force / self._mass_mv) * _DT
        if self._speed_limit:
            speed = np.sqrt(np.square(v_new[..., 0]) + np.square(v_new[..., 1]))
            lim = self.max_speed[mv]
            over = speed > lim
            v_new = np.where(over[..., None], v_new / speed[..., None] * lim[:, None], v_new)
        if self._all_movable:
            apos, avel = p_new, v_new
        else:
            apos = w.apos.copy()
            avel = w.avel.copy()
            apos[:, mv] = p_new
            avel[:, mv] = v_new
        if some_done:
            apos[done] = w.apos[done]
            avel[done] = w.avel[done]
            if comm is not w.comm:
                comm[done] = w.comm[done]
        new = _World(apos, avel, w.lpos, comm, w.goal)

        steps = self._steps + (~done)
        rew = self._reward(new)
        trunc_env = steps >= self.max_episode_steps
        term = self._terminal(new)
        term_env = np.zeros(E, bool) if term is None else term & ~trunc_env
        obs = self._observe(new)
        if not np.isfinite(obs).all():
            bad = int(np.flatnonzero(~np.isfinite(obs).reshape(E, -1).all(axis=1) & ~done)[0])
            raise EnvError(
                f"{self.name}: non-finite observation in vector env {bad} (episode reset seed "
                f"{self._seeds[bad]}); check the actions given to it"
            )
        state = self._state_of(obs) if self._state is not None else None

        live = ~done
        rewards = rew.astype(np.float32)
        terminated = np.repeat((term_env & live)[:, None], A, axis=1)
        truncated = np.repeat((trunc_env & live)[:, None], A, axis=1)
        finished = (term_env | trunc_env) & live
        if some_done:
            rewards[done] = 0.0
            obs[done] = self._obs[done]
            if state is not None:
                state[done] = self._state[done]  # type: ignore[index]
        env_done = done | finished
        alive = np.repeat((~env_done)[:, None], A, axis=1)

        self._world = new
        self._steps = steps
        self._done = env_done
        self._obs = obs
        if state is not None:
            self._state = state
        return HostStep(
            obs=obs.copy(),
            rewards=rewards,
            terminated=terminated,
            truncated=truncated,
            alive=alive,
            env_done=env_done.copy(),
            state=None if state is None else state.copy(),
        ).to_step()

    def _idle(self) -> Step:
        E, A = self.num_envs, len(self.agent_names)
        return HostStep(
            obs=self._obs.copy(),
            rewards=np.zeros((E, A), np.float32),
            terminated=np.zeros((E, A), bool),
            truncated=np.zeros((E, A), bool),
            alive=np.zeros((E, A), bool),
            env_done=self._done.copy(),
            state=None if self._state is None else self._state.copy(),
        ).to_step()

    # -- physics pieces ----------------------------------------------------------------------
    def _decode(self, actions: Tensor | np.ndarray, done: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Actions -> (action force ``u[E, M, 2]`` of the movable agents, comm state ``[E, A, dim_c]``)."""
        E, A = self.num_envs, len(self.agent_names)
        w = self._world
        talk = self._talkers
        if self.continuous:
            a = host_actions(actions)
            k = max(self.layout.action_dims)
            if a.ndim != 3 or a.shape[:2] != (E, A) or a.shape[2] < k:
                raise UserInputError(
                    f"{self.name}: continuous actions must have shape [E, A, k >= {k}] = [{E}, {A}, {k}], got {a.shape}"
                )
            if done is not None:
                a = np.where(done[:, None, None], 0.0, a)
            a = np.clip(a.astype(np.float32, copy=False), 0, 1)  # mpe2's clip wrapper (float32 bounds)
            mv = self._mv
            am = a[:, mv]
            # float32 differences, then float64 (``u[0] += a[2] - a[1]``) scaled by the sensitivity
            dx = (am[..., 2] - am[..., 1]).astype(np.float64)
            dy = (am[..., 4] - am[..., 3]).astype(np.float64)
            sens = self.accel[mv][None, :]
            u = np.stack([dx * sens, dy * sens], axis=-1)
            if len(talk):
                comm = np.zeros((E, A, self.dim_c))
                cols = self._comm_off[:, None] + np.arange(self.dim_c)[None, :]
                comm[:, talk] = a[:, talk[:, None], cols]
            else:
                comm = w.comm
            return u, comm
        a = host_actions(actions)
        if a.shape != (E, A):
            raise UserInputError(f"{self.name}: discrete actions must have shape [E, A] = {(E, A)}, got {a.shape}")
        a = a.astype(np.int64, copy=False)
        if done is not None:
            a = np.where(done[:, None], 0, a)
        if (a.view(np.uint64) >= self._n_actions_u).any():  # negative ids wrap to huge
            e, k = (int(x) for x in np.argwhere((a < 0) | (a >= self._n_actions))[0])
            raise EnvError(
                f"{self.name}: action {int(a[e, k])} of agent {self.agent_names[k]!r} is outside "
                f"Discrete({int(self._n_actions[k])}) in vector env {e} (episode reset seed {self._seeds[e]})"
            )
        mv = self._mv
        move = a[:, mv] % _MOVE_DIM
        u = np.take(self._move_table, move + self._move_base, axis=0)
        if len(talk):
            comm = np.zeros((E, A, self.dim_c))
            comm[:, talk] = self._eye_c[a[:, talk] // self._mdiv[talk]]
        else:
            comm = w.comm
        return u, comm

    def _collision_forces(self, u: np.ndarray, w: _World) -> np.ndarray:
        """Action force plus mpe2's soft contact forces, added partner by partner in entity order."""
        P = w.apos[:, self._ca]
        if len(self._cl):
            P = np.concatenate([P, w.lpos[:, self._cl]], axis=1)
        E, C = P.shape[0], P.shape[1]
        delta = np.take(P, self._pi, axis=1) - np.take(P, self._pj, axis=1)  # [E, C*C, 2]: p_i - p_j
        sq = np.square(delta)
        # the diagonal (an entity with itself) gets distance 1 so it contributes a zero force
        dist = np.sqrt(sq[..., 0] + sq[..., 1]) + self._eye_coll
        k = _CONTACT_MARGIN
        upper = np.take(dist, self._upper, axis=1)
        pen = np.logaddexp(0, -(upper - np.take(self._dist_min, self._upper)) / k) * k
        pen = np.take(pen, self._pair_of, axis=1)
        F = _CONTACT_FORCE * delta / dist[..., None] * pen[..., None]
        rows = self._coll_rows
        # terms[0] = action force, terms[1 + j] = force from partner j; a reduction over the leading
        # axis adds them one after another, ((u + f_0) + f_1) + ..., which is mpe2's order
        terms = np.empty((C + 1, E, len(rows), 2))
        terms[0] = u[:, self._coll_mv]
        terms[1:] = F.reshape(E, C, C, 2)[:, rows].transpose(2, 0, 1, 3)
        total = np.add.reduce(terms, axis=0)
        if len(rows) == u.shape[1]:
            return total
        force = u.copy()
        force[:, self._coll_mv] = total
        return force

    def _state_of(self, obs: np.ndarray) -> np.ndarray:
        """mpe2's ``env.state()``: every agent's own observation, concatenated (no padding)."""
        return obs.reshape(obs.shape[0], -1)[:, self._state_idx]

    # -- snapshots ---------------------------------------------------------------------------
    def snapshot(self, indices: Sequence[int]) -> list[Any]:
        w = self._world
        out = []
        for i in np.asarray(indices, np.int64).reshape(-1).tolist():
            out.append(
                _Snap(
                    apos=w.apos[i].copy(),
                    avel=w.avel[i].copy(),
                    lpos=w.lpos[i].copy(),
                    comm=w.comm[i].copy(),
                    goal=w.goal[i].copy(),
                    steps=int(self._steps[i]),
                    done=bool(self._done[i]),
                    seed=self._seeds[i],
                    rng_state=self._rng_state(i),
                    obs=self._obs[i].copy(),
                    state=None if self._state is None else self._state[i].copy(),
                )
            )
        return out

    def restore(self, indices: Sequence[int], snaps: Sequence[Any]) -> None:
        idx = np.asarray(indices, np.int64).reshape(-1).tolist()
        if len(idx) != len(snaps):
            raise UserInputError(f"{self.name}: restore got {len(snaps)} snapshots for {len(idx)} envs")
        w = self._world
        for i, s in zip(idx, snaps, strict=True):
            if not isinstance(s, _Snap):
                raise UserInputError(f"{self.name}: restore got {type(s).__name__}, not a snapshot of this env")
            w.apos[i] = s.apos
            w.avel[i] = s.avel
            w.lpos[i] = s.lpos
            w.comm[i] = s.comm
            w.goal[i] = s.goal
            self._steps[i] = s.steps
            self._done[i] = s.done
            self._seeds[i] = s.seed
            self._rngs[i] = copy.deepcopy(s.rng_state)  # materialized when a reset draws from it
            self._obs[i] = s.obs
            if self._state is not None and s.state is not None:
                self._state[i] = s.state

    def observations(self, indices: Sequence[int] | None = None) -> Step:
        """The current record of envs ``indices`` (all when None) without stepping: after
        :meth:`restore`, the observations the restored envs act on next."""
        idx = np.arange(self.num_envs) if indices is None else np.asarray(indices, np.int64).reshape(-1)
        state = None if self._state is None else self._state[idx].copy()
        return Step.observed(self._obs[idx].copy(), self._done[idx], state)


def _norm(d: np.ndarray) -> np.ndarray:
    """mpe2's ``np.sqrt(np.sum(np.square(d)))`` over the last (x, y) axis."""
    sq = np.square(d)
    return np.sqrt(sq[..., 0] + sq[..., 1])


class SimpleSpreadVec(_MpeVec):
    """mpe2 ``simple_spread_v3``: N agents cover N landmarks; the shared reward is minus the sum
    over landmarks of the nearest agent's distance, each agent loses 1 per agent it overlaps,
    mixed by ``local_ratio``. Agents are silent, size 0.15, and collide with each other.

    Kwargs: ``N``, ``local_ratio``, ``max_cycles``, ``continuous_actions``, ``dynamic_rescaling``
    (rendering only), ``curriculum`` (stage 0 drops the collision penalty; see
    :meth:`advance_curriculum`), ``terminate_on_success``; partial observability
    (``num_*_neighbors``) is not implemented.
    """

    name = "simple_spread_v3"
    _DEFAULTS: ClassVar[dict[str, Any]] = {
        "N": 3,
        "local_ratio": 0.5,
        "max_cycles": 25,
        "continuous_actions": False,
        "render_mode": None,
        "dynamic_rescaling": True,
        "benchmark_data": False,
        "curriculum": False,
        "terminate_on_success": False,
        "num_agent_neighbors": None,
        "num_landmark_neighbors": None,
    }
    CAPTURE_RADIUS = 0.1

    def _build(self, kw: dict[str, Any]) -> None:
        for key in ("num_agent_neighbors", "num_landmark_neighbors"):
            if kw[key] is not None:
                raise UserInputError(
                    f"{self.name}: env kwarg {key}={kw[key]!r} (partial observability) is not implemented by "
                    "the batched port; use the mpe2-backed env for it"
                )
        N = kw["N"]
        if not isinstance(N, int) or isinstance(N, bool) or N < 1:
            raise UserInputError(f"{self.name}: env kwarg N must be an integer >= 1, got {N!r}")
        self.local_ratio = kw["local_ratio"]
        self.curriculum = bool(kw["curriculum"])
        self.terminate_on_success = bool(kw["terminate_on_success"])
        self.curriculum_stage = 0
        self.agent_names = [f"agent_{i}" for i in range(N)]
        self.n_landmarks = N
        self.dim_c = 2
        self.movable = np.ones(N, bool)
        self.silent = np.ones(N, bool)
        self.agent_collide = np.ones(N, bool)
        self.landmark_collide = np.zeros(N, bool)
        self.agent_size = np.full(N, 0.15)
        self.landmark_size = np.full(N, 0.05)
        self.accel = np.full(N, 5.0)
        self.max_speed = np.full(N, np.inf)
        self.mass = np.ones(N)
        self.obs_dims = [4 + 2 * N + 2 * (N - 1) + self.dim_c * (N - 1)] * N
        others = [[j for j in range(N) if j != i] for i in range(N)]
        self._oi, self._oj = np.repeat(np.arange(N), N - 1), np.array(others, np.int64).ravel()
        self._li, self._lj = np.repeat(np.arange(N), N), np.tile(np.arange(N), N)
        self._sizes_sum = (self.agent_size[self._oi] + self.agent_size[self._oj]).reshape(N, N - 1)

    def advance_curriculum(self) -> None:
        """Move to the next curriculum stage (stage 1 restores the collision penalty)."""
        self.curriculum_stage = min(self.curriculum_stage + 1, 1)

    def set_curriculum_stage(self, stage: int) -> None:
        self.curriculum_stage = max(0, min(int(stage), 1))

    def _geometry(self, w: _World) -> tuple[np.ndarray, np.ndarray]:
        """(landmark - agent ``[n, N*L, 2]``, other agent - agent ``[n, N*(N-1), 2]``), i-major,
        computed once per world and shared by the observation and the reward."""
        if "rel" not in w.cache:
            lm = np.take(w.lpos, self._lj, axis=1) - np.take(w.apos, self._li, axis=1)
            ag = np.take(w.apos, self._oj, axis=1) - np.take(w.apos, self._oi, axis=1)
            w.cache["rel"] = (lm, ag)
        return w.cache["rel"]

    def _observe(self, w: _World) -> np.ndarray:
        n, N = w.apos.shape[0], len(self.agent_names)
        lm, ag = self._geometry(w)
        out = np.empty((n, N, self.obs_dims[0]), np.float32)
        out[:, :, 0:2] = w.avel
        out[:, :, 2:4] = w.apos
        o = 4 + 2 * N
        out[:, :, 4:o] = lm.reshape(n, N, 2 * N)
        out[:, :, o : o + 2 * (N - 1)] = ag.reshape(n, N, 2 * (N - 1))
        out[:, :, o + 2 * (N - 1) :] = np.take(w.comm, self._oj, axis=1).reshape(n, N, -1)
        return out

    def _nearest(self, w: _World) -> np.ndarray:
        """Each landmark's distance to its nearest agent ``[n, L]``."""
        n, N = w.apos.shape[0], len(self.agent_names)
        return _norm(self._geometry(w)[0]).reshape(n, N, N).min(axis=1)

    def _reward(self, w: _World) -> np.ndarray:
        n, N = w.apos.shape[0], len(self.agent_names)
        nearest = self._nearest(w)
        # mpe2's ``rew -= min(dists)`` per landmark, in order: a reduction over a leading axis is
        # sequential (a last-axis sum would be pairwise and could round differently)
        glob = -np.add.reduce(np.ascontiguousarray(nearest.T), axis=0)
        if not self.curriculum or self.curriculum_stage >= 1:
            hits = _norm(self._geometry(w)[1]).reshape(n, N, N - 1) < self._sizes_sum
            local = -hits.sum(axis=2).astype(np.float64)
        else:
            local = np.zeros((n, N))
        lr = self.local_ratio
        return glob[:, None] * (1 - lr) + local * lr

    def _terminal(self, w: _World) -> np.ndarray | None:
        if not self.terminate_on_success:
            return None
        return np.asarray((self._nearest(w) < self.CAPTURE_RADIUS).all(axis=1))


class SimpleSpeakerListenerVec(_MpeVec):
    """mpe2 ``simple_speaker_listener_v4``: an immobile speaker sees the goal landmark's colour and
    says one of 3 words; the silent listener hears it and moves. Both get minus the squared
    listener-to-goal distance. Nothing collides.

    Kwargs: ``max_cycles``, ``continuous_actions``, ``dynamic_rescaling`` (rendering only).
    """

    name = "simple_speaker_listener_v4"
    _DEFAULTS: ClassVar[dict[str, Any]] = {
        "max_cycles": 25,
        "continuous_actions": False,
        "render_mode": None,
        "dynamic_rescaling": True,
        "benchmark_data": False,
    }
    n_goals = 1
    _COLORS = np.array([[0.65, 0.15, 0.15], [0.15, 0.65, 0.15], [0.15, 0.15, 0.65]])

    def _build(self, kw: dict[str, Any]) -> None:
        self.agent_names = ["speaker_0", "listener_0"]
        self.n_landmarks = 3
        self.dim_c = 3
        self.movable = np.array([False, True])
        self.silent = np.array([False, True])
        self.agent_collide = np.zeros(2, bool)
        self.landmark_collide = np.zeros(3, bool)
        self.agent_size = np.full(2, 0.075)
        self.landmark_size = np.full(3, 0.04)
        self.accel = np.full(2, 5.0)
        self.max_speed = np.full(2, np.inf)
        self.mass = np.ones(2)
        self.obs_dims = [_DIM_COLOR, 2 + 2 * 3 + self.dim_c]

    def _draw_goals(self, rng: np.random.Generator) -> list[int]:
        return [int(rng.integers(self.n_landmarks))]

    def _observe(self, w: _World) -> np.ndarray:
        n = w.apos.shape[0]
        out = np.zeros((n, 2, self.obs_dims[1]), np.float32)
        out[:, 0, :3] = self._COLORS[w.goal[:, 0]]
        out[:, 1, 0:2] = w.avel[:, 1]
        out[:, 1, 2:8] = (w.lpos - w.apos[:, 1:2]).reshape(n, 6)
        out[:, 1, 8:11] = w.comm[:, 0]
        return out

    def _reward(self, w: _World) -> np.ndarray:
        goal = w.lpos[np.arange(w.lpos.shape[0]), w.goal[:, 0]]
        sq = np.square(w.apos[:, 1] - goal)
        r = -(sq[:, 0] + sq[:, 1])
        return np.repeat(r[:, None], 2, axis=1)


class SimpleReferenceVec(_MpeVec):
    """mpe2 ``simple_reference_v3``: two agents that both move and speak (10 words); each sees the
    colour of the landmark the *other* agent must reach. Agent ``i``'s own reward is minus the
    distance of the other agent to ``i``'s goal landmark, mixed with the mean of both by
    ``local_ratio``. Nothing collides.

    Kwargs: ``local_ratio``, ``max_cycles``, ``continuous_actions``, ``dynamic_rescaling``
    (rendering only).
    """

    name = "simple_reference_v3"
    _DEFAULTS: ClassVar[dict[str, Any]] = {
        "local_ratio": 0.5,
        "max_cycles": 25,
        "continuous_actions": False,
        "render_mode": None,
        "dynamic_rescaling": True,
        "benchmark_data": False,
    }
    n_goals = 2
    _LI, _LJ = np.repeat(np.arange(2), 3), np.tile(np.arange(3), 2)  # (agent, landmark) pairs, agent-major
    _COLORS = np.array([[0.75, 0.25, 0.25], [0.25, 0.75, 0.25], [0.25, 0.25, 0.75]])

    def _build(self, kw: dict[str, Any]) -> None:
        self.local_ratio = kw["local_ratio"]
        self.agent_names = ["agent_0", "agent_1"]
        self.n_landmarks = 3
        self.dim_c = 10
        self.movable = np.ones(2, bool)
        self.silent = np.zeros(2, bool)
        self.agent_collide = np.zeros(2, bool)
        self.landmark_collide = np.zeros(3, bool)
        self.agent_size = np.full(2, 0.05)
        self.landmark_size = np.full(3, 0.05)
        self.accel = np.full(2, 5.0)
        self.max_speed = np.full(2, np.inf)
        self.mass = np.ones(2)
        self.obs_dims = [2 + 6 + _DIM_COLOR + self.dim_c] * 2

    def _draw_goals(self, rng: np.random.Generator) -> list[int]:
        # agent 0's goal first, then agent 1's
        return [int(rng.integers(self.n_landmarks)), int(rng.integers(self.n_landmarks))]

    def _observe(self, w: _World) -> np.ndarray:
        n = w.apos.shape[0]
        out = np.empty((n, 2, self.obs_dims[0]), np.float32)
        out[:, :, 0:2] = w.avel
        out[:, :, 2:8] = (np.take(w.lpos, self._LJ, axis=1) - np.take(w.apos, self._LI, axis=1)).reshape(n, 2, 6)
        out[:, :, 8:11] = self._COLORS[w.goal]
        out[:, :, 11:21] = w.comm[:, ::-1]  # the other agent's utterance
        return out

    def _reward(self, w: _World) -> np.ndarray:
        n = w.apos.shape[0]
        goals = w.lpos[np.arange(n)[:, None], w.goal]  # [n, 2, 2]: agent i's goal landmark
        own = -_norm(w.apos[:, ::-1] - goals)  # agent i's goal_a is the other agent
        glob = (own[:, 0] + own[:, 1]) / 2
        lr = self.local_ratio
        return glob[:, None] * (1 - lr) + own * lr


class SimpleVec(_MpeVec):
    """mpe2 ``simple_v3``: one silent agent, one landmark; reward minus the squared distance.
    Nothing collides. (Not in the port registry: it is the smoke-test scenario.)

    Kwargs: ``max_cycles``, ``continuous_actions``, ``dynamic_rescaling`` (rendering only).
    """

    name = "simple_v3"
    _DEFAULTS: ClassVar[dict[str, Any]] = {
        "max_cycles": 25,
        "continuous_actions": False,
        "render_mode": None,
        "dynamic_rescaling": True,
        "benchmark_data": False,
    }

    def _build(self, kw: dict[str, Any]) -> None:
        self.agent_names = ["agent_0"]
        self.n_landmarks = 1
        self.dim_c = 0  # mpe2's World default: this scenario never sets it
        self.movable = np.ones(1, bool)
        self.silent = np.ones(1, bool)
        self.agent_collide = np.zeros(1, bool)
        self.landmark_collide = np.zeros(1, bool)
        self.agent_size = np.full(1, 0.05)
        self.landmark_size = np.full(1, 0.05)
        self.accel = np.full(1, 5.0)
        self.max_speed = np.full(1, np.inf)
        self.mass = np.ones(1)
        self.obs_dims = [4]

    def _observe(self, w: _World) -> np.ndarray:
        n = w.apos.shape[0]
        out = np.empty((n, 1, 4), np.float32)
        out[:, 0, 0:2] = w.avel[:, 0]
        out[:, 0, 2:4] = w.lpos[:, 0] - w.apos[:, 0]
        return out

    def _reward(self, w: _World) -> np.ndarray:
        sq = np.square(w.apos[:, 0] - w.lpos[:, 0])
        return -(sq[:, 0] + sq[:, 1])[:, None]
