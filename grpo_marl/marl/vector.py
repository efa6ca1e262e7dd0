"""Lock-step vectorization of PettingZoo Parallel envs over several processes.

mpe2 runs about 3,000 joint steps/s in one Python process, so collection is spread over worker
processes, each owning a contiguous slice of the envs. Per step the main process sends one
action array per worker and gets back preallocated-layout arrays; there is no per-agent Python
work in the main process.

Layout (``A`` = ``len(possible_agents)``, agents in ``possible_agents`` order, ``D`` = largest
flattened observation, ``K`` = largest discrete action count):

* ``obs[E, A, D]`` float32, zero-padded past each agent's own observation length;
* ``alive[E, A]`` bool — the agent is in ``env.agents`` and acts at this step (agents that leave
  mid-episode, and every agent of a finished env, are ``False``);
* ``action_mask[E, A, K]`` bool — env-provided masks, else all actions of the agent's space;
* ``rewards / terminated / truncated [E, A]``; ``state[E, S]`` (``env.state()``, on request).

Episodes do not auto-reset: GRPO compares whole episodes started together, so a finished env
idles (all ``alive`` False) until the next :meth:`MarlVecEnv.reset`.
"""

from __future__ import annotations

import multiprocessing as mp
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from grpo_marl.marl.envs import restore_env, snapshot_env
from grpo_marl.marl.groups import AgentGroups, action_mask_of, flat_obs_dim


@dataclass
class VecStep:
    """Arrays returned by reset/step (see the module docstring for shapes)."""

    obs: np.ndarray
    alive: np.ndarray
    action_mask: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    env_done: np.ndarray
    state: np.ndarray | None


@dataclass(frozen=True)
class _Layout:
    agents: tuple[str, ...]
    obs_dims: tuple[int, ...]
    n_actions: tuple[int, ...]
    action_dims: tuple[int, ...]
    obs_dim: int
    max_actions: int
    continuous: bool
    state_dim: int


def _layout_of(env: Any) -> _Layout:
    from gymnasium import spaces

    agents = tuple(env.possible_agents)
    obs_dims = tuple(flat_obs_dim(env.observation_space(a)) for a in agents)
    n_actions: list[int] = []
    action_dims: list[int] = []
    for a in agents:
        sp = env.action_space(a)
        if isinstance(sp, spaces.Discrete):
            n_actions.append(int(sp.n))
            action_dims.append(1)
        elif isinstance(sp, spaces.Box):
            n_actions.append(0)
            action_dims.append(int(np.prod(sp.shape)))
        else:
            raise TypeError(f"action space {sp} of {a} is not supported (Discrete or Box)")
    continuous = any(n == 0 for n in n_actions)
    if continuous and any(n > 0 for n in n_actions):
        raise TypeError("mixing discrete and continuous action spaces in one env is not supported")
    try:
        state_dim = int(np.prod(env.state_space.shape))
    except AttributeError:
        state_dim = 0
    return _Layout(
        agents=agents,
        obs_dims=obs_dims,
        n_actions=tuple(n_actions),
        action_dims=tuple(action_dims),
        obs_dim=max(obs_dims),
        max_actions=max(n_actions) if not continuous else 0,
        continuous=continuous,
        state_dim=state_dim,
    )


class _EnvSlice:
    """A contiguous slice of envs stepped in one process (the worker body, also used in-process)."""

    def __init__(self, env_fn: Callable[[], Any], n: int) -> None:
        from gymnasium import spaces

        self.envs = [env_fn() for _ in range(n)]
        self.layout = _layout_of(self.envs[0])
        lay = self.layout
        self.n = n
        self.index = {a: i for i, a in enumerate(lay.agents)}
        # per-agent fast converters: "box" copies the raveled array, others go through one-hot
        self.kinds: list[str] = []
        for a in lay.agents:
            sp = self.envs[0].observation_space(a)
            if isinstance(sp, spaces.Dict) and "observation" in sp.spaces:
                sp = sp.spaces["observation"]
            self.kinds.append("box" if isinstance(sp, spaces.Box | spaces.MultiBinary) else "onehot")
        self.spaces = [self.envs[0].observation_space(a) for a in lay.agents]
        self.done = np.ones(n, dtype=bool)
        self.with_state = False

    # -- helpers -----------------------------------------------------------------------------
    def _blank(self) -> VecStep:
        lay = self.layout
        n, a = self.n, len(lay.agents)
        mask = np.zeros((n, a, max(lay.max_actions, 1)), dtype=bool)
        return VecStep(
            obs=np.zeros((n, a, lay.obs_dim), np.float32),
            alive=np.zeros((n, a), bool),
            action_mask=mask,
            rewards=np.zeros((n, a), np.float32),
            terminated=np.zeros((n, a), bool),
            truncated=np.zeros((n, a), bool),
            env_done=self.done.copy(),
            state=np.zeros((n, lay.state_dim), np.float32) if self.with_state else None,
        )

    def _write_obs(self, out: VecStep, i: int, env: Any, obs: dict, infos: dict) -> None:
        from grpo_marl.marl.groups import flatten_obs

        lay = self.layout
        live = set(env.agents)
        # agents that just finished still get their final observation written (``alive`` False),
        # so that a truncated trajectory can bootstrap from it (IPPO/MAPPO)
        for agent in obs:
            k = self.index[agent]
            o = obs[agent]
            d = lay.obs_dims[k]
            if self.kinds[k] == "box":
                raw = o["observation"] if isinstance(o, dict) else o
                out.obs[i, k, :d] = np.asarray(raw, dtype=np.float32).ravel()
            else:
                flatten_obs(self.spaces[k], o, out.obs[i, k, :d])
            if agent not in live:
                continue
            out.alive[i, k] = True
            if lay.max_actions:
                m = action_mask_of(o, infos.get(agent))
                if m is None:
                    out.action_mask[i, k, : lay.n_actions[k]] = True
                else:
                    out.action_mask[i, k, : lay.n_actions[k]] = m
        if out.state is not None and (env.agents or obs):
            out.state[i] = np.asarray(env.state(), dtype=np.float32).ravel()

    # -- commands ----------------------------------------------------------------------------
    def reset(self, seeds: Sequence[int | None], with_state: bool) -> VecStep:
        self.with_state = with_state
        self.done[:] = False
        out = self._blank()
        out.env_done[:] = False
        for i, (env, seed) in enumerate(zip(self.envs, seeds, strict=True)):
            obs, infos = env.reset(seed=None if seed is None else int(seed))
            self._write_obs(out, i, env, obs, infos)
            if not env.agents:
                self.done[i] = True
        out.env_done[:] = self.done
        return out

    def step(self, actions: np.ndarray) -> VecStep:
        lay = self.layout
        out = self._blank()
        for i, env in enumerate(self.envs):
            if self.done[i]:
                continue
            if lay.continuous:
                act = {a: actions[i, self.index[a], : lay.action_dims[self.index[a]]] for a in env.agents}
            else:
                act = {a: int(actions[i, self.index[a]]) for a in env.agents}
            obs, rew, term, trunc, infos = env.step(act)
            for agent, r in rew.items():
                k = self.index[agent]
                out.rewards[i, k] = r
                out.terminated[i, k] = bool(term.get(agent, False))
                out.truncated[i, k] = bool(trunc.get(agent, False))
            self._write_obs(out, i, env, obs, infos)
            if not env.agents:
                self.done[i] = True
        out.env_done[:] = self.done
        return out

    def get_snapshots(self, idx: Sequence[int]) -> list[Any]:
        return [(snapshot_env(self.envs[i]), bool(self.done[i])) for i in idx]

    def set_snapshots(self, idx: Sequence[int], snaps: Sequence[Any]) -> None:
        for i, (snap, done) in zip(idx, snaps, strict=True):
            self.envs[i] = restore_env(self.envs[i], snap)
            self.done[i] = done

    def state(self) -> np.ndarray:
        lay = self.layout
        out = np.zeros((self.n, lay.state_dim), np.float32)
        for i, env in enumerate(self.envs):
            out[i] = np.asarray(env.state(), dtype=np.float32).ravel()
        return out

    def close(self) -> None:
        for env in self.envs:
            env.close()


def _worker(conn: Any, env_fn: Callable[[], Any], n: int) -> None:
    try:
        body = _EnvSlice(env_fn, n)
        conn.send(("ok", body.layout))
    except Exception:  # pragma: no cover - reported to the parent
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            cmd, args = conn.recv()
        except EOFError:
            break
        if cmd == "close":
            body.close()
            conn.send(("ok", None))
            break
        try:
            conn.send(("ok", getattr(body, cmd)(*args)))
        except Exception:
            conn.send(("error", traceback.format_exc()))


def _concat(parts: list[VecStep]) -> VecStep:
    if len(parts) == 1:
        return parts[0]
    state = None if parts[0].state is None else np.concatenate([p.state for p in parts])  # type: ignore[misc]
    return VecStep(
        obs=np.concatenate([p.obs for p in parts]),
        alive=np.concatenate([p.alive for p in parts]),
        action_mask=np.concatenate([p.action_mask for p in parts]),
        rewards=np.concatenate([p.rewards for p in parts]),
        terminated=np.concatenate([p.terminated for p in parts]),
        truncated=np.concatenate([p.truncated for p in parts]),
        env_done=np.concatenate([p.env_done for p in parts]),
        state=state,
    )


class MarlVecEnv:
    """``num_envs`` copies of a Parallel env, stepped in lock-step by ``num_workers`` processes.

    num_workers=0 steps everything in this process (no pickling requirements on ``env_fn``).
    With workers, ``env_fn`` must be picklable under the chosen start method ("fork" by default
    on Linux, which accepts any callable).
    """

    def __init__(
        self,
        env_fn: Callable[[], Any],
        num_envs: int,
        num_workers: int = 0,
        start_method: str | None = None,
    ) -> None:
        if num_envs < 1:
            raise ValueError("num_envs must be >= 1")
        self.num_envs = num_envs
        self.num_workers = min(num_workers, num_envs)
        self._local: _EnvSlice | None = None
        self._conns: list[Any] = []
        self._procs: list[Any] = []
        self._slices: list[tuple[int, int]] = []
        if self.num_workers <= 0:
            self._local = _EnvSlice(env_fn, num_envs)
            self.layout = self._local.layout
            self._slices = [(0, num_envs)]
        else:
            method = start_method or ("fork" if "fork" in mp.get_all_start_methods() else "spawn")
            ctx = mp.get_context(method)
            bounds = np.linspace(0, num_envs, self.num_workers + 1).round().astype(int)
            for w in range(self.num_workers):
                lo, hi = int(bounds[w]), int(bounds[w + 1])
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_worker, args=(child, env_fn, hi - lo), daemon=True)
                proc.start()
                child.close()
                self._conns.append(parent)
                self._procs.append(proc)
                self._slices.append((lo, hi))
            layouts = [self._recv(c) for c in self._conns]
            self.layout = layouts[0]
        self.agents: tuple[str, ...] = self.layout.agents
        self.closed = False

    # -- plumbing ---------------------------------------------------------------------------
    @staticmethod
    def _recv(conn: Any) -> Any:
        status, payload = conn.recv()
        if status != "ok":
            raise RuntimeError(f"env worker failed:\n{payload}")
        return payload

    def _call(self, cmd: str, per_slice_args: list[tuple[Any, ...]]) -> list[Any]:
        if self._local is not None:
            return [getattr(self._local, cmd)(*per_slice_args[0])]
        for conn, args in zip(self._conns, per_slice_args, strict=True):
            conn.send((cmd, args))
        return [self._recv(conn) for conn in self._conns]

    # -- API --------------------------------------------------------------------------------
    def reset(self, seeds: Sequence[int | None], with_state: bool = False) -> VecStep:
        """Reset every env; ``seeds[i]`` seeds env ``i`` (equal seeds give equal initial states)."""
        if len(seeds) != self.num_envs:
            raise ValueError(f"reset needs {self.num_envs} seeds, got {len(seeds)}")
        seeds = list(seeds)
        return _concat(self._call("reset", [(seeds[lo:hi], with_state) for lo, hi in self._slices]))

    def step(self, actions: np.ndarray) -> VecStep:
        """Step every unfinished env with ``actions[E, A]`` (discrete) or ``[E, A, k]`` (Box)."""
        actions = np.asarray(actions)
        return _concat(self._call("step", [(actions[lo:hi],) for lo, hi in self._slices]))

    def state(self) -> np.ndarray:
        """``env.state()`` of every env, ``[E, S]``."""
        return np.concatenate(self._call("state", [() for _ in self._slices]))

    def _owner(self, i: int) -> tuple[int, int]:
        for w, (lo, hi) in enumerate(self._slices):
            if lo <= i < hi:
                return w, i - lo
        raise IndexError(i)

    def get_snapshots(self, indices: Sequence[int]) -> list[Any]:
        """Snapshots of envs ``indices`` (world, step counter, RNG — see ``snapshot_env``)."""
        per: list[list[int]] = [[] for _ in self._slices]
        where: list[tuple[int, int]] = []
        for i in indices:
            w, j = self._owner(i)
            where.append((w, len(per[w])))
            per[w].append(j)
        results = self._call("get_snapshots", [(p,) for p in per])
        return [results[w][k] for w, k in where]

    def set_snapshots(self, indices: Sequence[int], snaps: Sequence[Any]) -> None:
        """Restore ``snaps[k]`` into env ``indices[k]`` (branches of one state for ``state`` groups)."""
        per_idx: list[list[int]] = [[] for _ in self._slices]
        per_snap: list[list[Any]] = [[] for _ in self._slices]
        for i, s in zip(indices, snaps, strict=True):
            w, j = self._owner(i)
            per_idx[w].append(j)
            per_snap[w].append(s)
        self._call("set_snapshots", list(zip(per_idx, per_snap, strict=True)))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._local is not None:
            self._local.close()
            return
        for conn in self._conns:
            try:
                conn.send(("close", ()))
                conn.recv()
            except (BrokenPipeError, EOFError, OSError):
                pass
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def group_views(groups: AgentGroups, agents: Sequence[str]) -> dict[str, np.ndarray]:
    """For each agent-group, the agent-slot indices (into the ``A`` axis) of its members."""
    pos = {a: i for i, a in enumerate(agents)}
    return {g: np.array([pos[a] for a in spec.agents], dtype=np.int64) for g, spec in groups.specs.items()}
