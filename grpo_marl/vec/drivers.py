"""Drivers: a slice of single envs (Gymnasium or PettingZoo Parallel) stepped one by one, writing
the rows of a numpy :class:`~grpo_marl.vec.base.HostStep` record (the vector env that runs the
driver turns it into the tensor :class:`~grpo_marl.vec.base.Step` once, at its boundary).

A driver is what a vector env runs, in this process (:class:`~grpo_marl.vec.local.LocalVec`) or
in a worker process (:class:`~grpo_marl.vec.workers.WorkerVec`). It is the only place that calls
an env's ``reset``/``step``, so it is where every env failure becomes one
:class:`~grpo_marl.errors.EnvError` naming the env, the vector index and the episode's reset
seed: an exception raised by the env or an observation of the wrong shape. (Non-finite values
are caught for every vector env alike, by the collectors.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from grpo_marl.errors import EnvError
from grpo_marl.vec.base import HostStep, Layout, layout_of
from grpo_marl.vec.snapshot import restore_env, snapshot_env
from grpo_marl.vec.spaces import action_mask_of, obs_dtype_problem, obs_writer


def time_limit_of(env: Any) -> int | None:
    """The episode limit of a Gymnasium env: its ``TimeLimit`` wrapper (anywhere in the wrapper
    chain, however the env was built) or, failing that, its spec."""
    from gymnasium.wrappers import TimeLimit

    from grpo_marl.vec.snapshot import wrapper_chain

    for wrapper in wrapper_chain(env):
        if isinstance(wrapper, TimeLimit):
            return int(wrapper._max_episode_steps)
    spec = env.spec if hasattr(env, "spec") else None
    limit = spec.max_episode_steps if spec is not None else None
    return int(limit) if limit else None


class Driver:
    """``n`` envs of one kind; global vector indices start at ``offset`` (for messages)."""

    layout: Layout
    max_episode_steps: int | None = None
    supports_snapshot: bool = True

    def __init__(self, env_fn: Callable[[], Any], n: int, name: str, offset: int = 0, with_state: bool = False) -> None:
        self.name = name
        self.offset = offset
        self.n = n
        self.with_state = with_state
        self.envs = [env_fn() for _ in range(n)]
        self._check_dtypes = True  # the first reset's observations are checked against the spaces
        self.done = np.ones(n, dtype=bool)
        self.seeds = np.full(n, -1, dtype=np.int64)
        self._init_layout()
        self.out = self.layout.blank(n, with_state)

    def _init_layout(self) -> None:
        raise NotImplementedError

    # -- errors ----------------------------------------------------------------------------------
    def _error(self, i: int, during: str, detail: str) -> EnvError:
        seed = int(self.seeds[i])
        return EnvError(
            f"env {self.name!r} failed during {during} (vector index {self.offset + i}, "
            f"reset seed {seed if seed >= 0 else 'none'}): {detail}"
        )

    # -- commands --------------------------------------------------------------------------------
    def reset(self, seeds: Sequence[int], indices: Sequence[int] | None = None) -> HostStep:
        rows = np.arange(self.n) if indices is None else np.asarray(indices, dtype=np.int64)
        if len(seeds) != len(rows):
            raise ValueError(f"reset needs {len(rows)} seeds, got {len(seeds)}")
        out = self.layout.blank(len(rows), self.with_state)
        out.env_done[:] = False
        for k, (i, seed) in enumerate(zip(rows, seeds, strict=True)):
            self.seeds[i] = int(seed)
            try:
                self._reset_one(int(i), int(seed), out, k)
            except EnvError:
                raise
            except Exception as exc:
                raise self._error(int(i), "reset", f"{type(exc).__name__}: {exc}") from exc
            self.done[i] = bool(out.env_done[k])
        self._check_dtypes = False
        self.out.put(rows, out)
        return out

    def step(self, actions: np.ndarray) -> HostStep:
        out = self.out
        out.rewards[:] = 0.0
        out.terminated[:] = False
        out.truncated[:] = False
        live = np.flatnonzero(~self.done)
        for i in live:
            try:
                self._step_one(int(i), actions[i], out)
            except EnvError:
                raise
            except Exception as exc:
                raise self._error(int(i), "step", f"{type(exc).__name__}: {exc}") from exc
        self.done |= out.env_done
        return out.copy()

    def _write(
        self, i: int, rec: HostStep, k: int, writer: Callable[[Any, np.ndarray], None], obs: Any, j: int
    ) -> None:
        if self._check_dtypes:
            problem = obs_dtype_problem(obs, self.layout.observation_spaces[j])
            if problem:
                who = f"agent {self.layout.agents[j]!r}: " if len(self.layout.agents) > 1 else ""
                raise self._error(i, "reset", who + problem)
        try:
            writer(obs, rec.obs[k, j])
        except (ValueError, TypeError) as exc:
            shape = getattr(obs, "shape", None)
            raise self._error(
                i,
                "reset/step",
                f"observation of agent {self.layout.agents[j]!r} has shape {shape}, expected "
                f"{self.layout.observation_spaces[j]} ({exc})",
            ) from exc

    def _reset_one(self, i: int, seed: int, rec: HostStep, k: int) -> None:
        raise NotImplementedError

    def _step_one(self, i: int, action: np.ndarray, rec: HostStep) -> None:
        raise NotImplementedError

    def snapshot(self, indices: Sequence[int]) -> list[Any]:
        return [
            (snapshot_env(self.envs[i]), bool(self.done[i]), int(self.seeds[i]), self.out.rows([i])) for i in indices
        ]

    def restore(self, indices: Sequence[int], snaps: Sequence[Any]) -> None:
        for i, (snap, done, seed, row) in zip(indices, snaps, strict=True):
            self.envs[i] = restore_env(self.envs[i], snap)
            self.done[i] = done
            self.seeds[i] = seed
            self.out.put([i], row)

    def close(self) -> None:
        for env in self.envs:
            env.close()


class GymDriver(Driver):
    """Gymnasium envs (one agent, ``"agent"``)."""

    def _init_layout(self) -> None:
        env = self.envs[0]
        self.layout = layout_of(("agent",), (env.observation_space,), (env.action_space,))
        self._writer = obs_writer(env.observation_space)
        self.max_episode_steps = time_limit_of(env)
        self._discrete = not self.layout.continuous
        self._act_dim = self.layout.action_dims[0]
        # Box actions travel flat ([k]); the env gets them in its own shape (e.g. 2 x 2)
        self._act_shape = None if self._discrete else tuple(env.action_space.shape)

    def _reset_one(self, i: int, seed: int, rec: HostStep, k: int) -> None:
        obs, _ = self.envs[i].reset(seed=seed)
        self._write(i, rec, k, self._writer, obs, 0)
        rec.alive[k, 0] = True

    def _step_one(self, i: int, action: np.ndarray, rec: HostStep) -> None:
        act: int | np.ndarray
        if self._discrete:
            act = int(action[0])
        else:
            act = np.asarray(action[0, : self._act_dim], dtype=np.float32).reshape(self._act_shape)
        obs, reward, terminated, truncated, _ = self.envs[i].step(act)
        self._write(i, rec, i, self._writer, obs, 0)
        rec.rewards[i, 0] = float(reward)
        rec.terminated[i, 0] = bool(terminated)
        rec.truncated[i, 0] = bool(truncated)
        done = bool(terminated or truncated)
        rec.alive[i, 0] = not done
        rec.env_done[i] = done


class PettingZooDriver(Driver):
    """PettingZoo Parallel envs: agents in ``possible_agents`` order; agents that leave mid-episode
    get ``alive`` False and their final observation; the env is done when no agent is left."""

    def _init_layout(self) -> None:
        env = self.envs[0]
        agents = tuple(env.possible_agents)
        obs, infos = env.reset(seed=0)
        has_mask = any(action_mask_of(obs.get(a), infos.get(a)) is not None for a in agents)
        state_dim = 0
        space = env.state_space if hasattr(env, "state_space") else None
        if space is not None and space.shape is not None:
            state_dim = int(np.prod(space.shape))
        if self.with_state and state_dim == 0:
            from grpo_marl.errors import UserInputError

            raise UserInputError(
                f"env {self.name!r} has no global state (env.state()); a centralized critic needs one: "
                "use algo=ippo (per-agent critics) instead"
            )
        self.layout = layout_of(
            agents,
            tuple(env.observation_space(a) for a in agents),
            tuple(env.action_space(a) for a in agents),
            has_action_mask=has_mask,
            state_dim=state_dim,
        )
        self.index = {a: j for j, a in enumerate(agents)}
        self._writers = [obs_writer(env.observation_space(a)) for a in agents]
        # PettingZoo envs end by themselves (every agent leaves); their cycle limit, where they
        # declare one (mpe2, sisl, butterfly), bounds the storage of a rollout.
        limit = vars(env.unwrapped).get("max_cycles")
        self.max_episode_steps = int(limit) if isinstance(limit, int) else None

    def _write_agents(self, i: int, env: Any, rec: HostStep, k: int, obs: dict, infos: dict) -> None:
        lay = self.layout
        live = set(env.agents)
        # Agents that just finished still get their final observation written (alive False), so
        # a truncated trajectory can bootstrap from it.
        for agent, o in obs.items():
            j = self.index[agent]
            self._write(i, rec, k, self._writers[j], o, j)
            if agent not in live:
                continue
            rec.alive[k, j] = True
            if rec.action_mask is not None:
                m = action_mask_of(o, infos.get(agent))
                rec.action_mask[k, j, : lay.n_actions[j]] = True if m is None else m
        if rec.state is not None:
            rec.state[k] = np.asarray(env.state(), dtype=np.float32).ravel()

    def _reset_one(self, i: int, seed: int, rec: HostStep, k: int) -> None:
        env = self.envs[i]
        obs, infos = env.reset(seed=seed)
        self._write_agents(i, env, rec, k, obs, infos)
        rec.env_done[k] = not env.agents

    def _step_one(self, i: int, action: np.ndarray, rec: HostStep) -> None:
        env = self.envs[i]
        lay = self.layout
        rec.alive[i] = False
        if rec.action_mask is not None:
            rec.action_mask[i] = False
        act: dict[str, int | np.ndarray]
        if lay.continuous:
            act = {
                a: action[self.index[a], : lay.action_dims[self.index[a]]].reshape(
                    lay.action_spaces[self.index[a]].shape
                )
                for a in env.agents
            }
        else:
            act = {a: int(action[self.index[a]]) for a in env.agents}
        obs, rew, term, trunc, infos = env.step(act)
        for agent, r in rew.items():
            j = self.index[agent]
            rec.rewards[i, j] = r
            rec.terminated[i, j] = bool(term.get(agent, False))
            rec.truncated[i, j] = bool(trunc.get(agent, False))
        self._write_agents(i, env, rec, i, obs, infos)
        rec.env_done[i] = not env.agents
