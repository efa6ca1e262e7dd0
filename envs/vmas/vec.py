"""VMAS's own batched envs under grpo_marl's tensor vector-env contract (:class:`VmasVec`).

A VMAS ``Environment`` already steps ``E`` copies of a scenario as torch ops on one device, so
:class:`VmasVec` is a thin adapter: actions ``[E, A, k]`` (or ``[E, A]`` discrete) become VMAS's
per-agent list, its per-agent observations ``[E, D_i]`` become ``obs [E, A, D]`` (zero-padded to
the largest ``D_i``), rewards ``[E, A]``, and VMAS's ``terminated`` / ``truncated`` (``max_steps``)
become the contract's flags. Nothing leaves the device: on CUDA the whole rollout stays there.

What the contract asks that VMAS does not do itself, and how:

* **No automatic reset; a done env keeps its final observation.** VMAS steps every env of the
  batch; a row whose episode ended is frozen here (its last observation repeated, reward 0,
  ``alive`` False) until the collector resets it.
* **Seeded resets of a subset.** VMAS resets all envs at once (``reset``) or one
  (``reset_at``, about as costly as all of them), drawing from a random state that is a *class*
  attribute of ``Environment`` shared by every instance. :meth:`VmasVec.reset` resets all ``E``
  envs in one vectorized call under a random state keyed by the call's seeds and indices, then
  puts back the rows that were not asked for (an in-batch copy, below) and copies the first row of
  each seed onto the other rows given the same seed. So envs given the same seed in one call start
  from the same state (seed groups), and the same seeds for the same indices give the same starts
  (evaluation); the training's own random streams are never touched.
* **Snapshots** (state groups, exact resume): VMAS has no state get/set API. Every tensor of the
  env's object graph (world, entities, their states and actions, sensors, the scenario's own
  attributes, ``torch.distributions`` objects it keeps, the step counter) whose leading axis is
  the env batch is a row of that env's state (:class:`BatchRows`); a snapshot is a clone of
  those rows and a restore an indexed write into them. Which tensors are batch-leading is decided
  once per vector env, by walking the graph of a second, 1-env (2-env when ``E`` is 1) instance
  of the same scenario: a tensor whose first axis equals ``E`` only by coincidence (a 40-cell
  grid with ``E = 40``) has another first axis there and is left out.

Randomness *inside* a step (agents with ``u_noise``, targets respawned at random) is drawn by
VMAS for the whole batch at once from its class-level random state, so it cannot be replayed per
env: branches restored from one snapshot then see different noise (which is what a group of
sampled continuations should see), and snapshot exactness holds for the scenarios whose
transitions are deterministic (tests/test_vmas.py checks it per scenario).
"""

from __future__ import annotations

import contextlib
import random
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor

from grpo_marl.errors import EnvError, UnsupportedSpaceError, UserInputError
from grpo_marl.vec.base import Step, VecEnv, canonical_device, layout_of

__all__ = ["BatchRows", "VmasTask", "VmasVec"]


@dataclass(frozen=True)
class VmasTask:
    """One VMAS task: what a ``vmas`` env's factory returns (``env_kwargs`` go here).

    ``scenario`` is a VMAS scenario name (``vmas.scenarios``, ``vmas.mpe_scenarios``,
    ``vmas.debug_scenarios``); ``kwargs`` the scenario's own keyword arguments (``n_agents``,
    ``package_mass``, ...). ``device`` ``auto`` follows the run's ``device``.
    """

    scenario: str
    max_steps: int = 100
    continuous_actions: bool = True
    device: str = "auto"
    kwargs: dict[str, Any] = field(default_factory=dict)


# -- the batch-leading tensors of a VMAS env --------------------------------------------------------
Path = tuple[str | int, ...]
_SKIP_ATTRS = frozenset({"viewer", "headless", "visible_display", "text_lines", "_render_geoms"})
_LEAVES = (int, float, bool, str, bytes, type(None), torch.device, torch.dtype, np.ndarray, np.generic)


def _walk(obj: Any, path: Path, seen: set[int], out: dict[Path, Tensor]) -> None:
    if isinstance(obj, Tensor):
        if obj.dim() >= 1:
            out.setdefault(path, obj)
        return
    if isinstance(obj, _LEAVES) or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, (list, tuple)):
        for i, x in enumerate(obj):
            _walk(x, (*path, i), seen, out)
    elif isinstance(obj, dict):
        for k, x in obj.items():
            if isinstance(k, (str, int)):
                _walk(x, (*path, k), seen, out)
    elif hasattr(obj, "__dict__") and not isinstance(obj, (type, torch.nn.Module)) and not callable(obj):
        for k, x in vars(obj).items():
            if k not in _SKIP_ATTRS:
                _walk(x, (*path, k), seen, out)


def tensors_of(env: Any) -> dict[Path, Tensor]:
    """Every tensor (rank >= 1) reachable from ``env``'s attributes, by attribute path."""
    out: dict[Path, Tensor] = {}
    _walk(env, (), set(), out)
    return out


def _resolve(root: Any, path: Path) -> Any:
    obj = root
    for key in path:
        obj = obj[key] if isinstance(key, int) or isinstance(obj, dict) else getattr(obj, key)
    return obj


class BatchRows:
    """The rows of one VMAS env in every batch-leading tensor of a VMAS ``Environment``.

    The env's graph is walked on every use (well under a millisecond): VMAS reassigns tensors as it
    steps (``agent.state.pos = ...``) and creates some on first use (an action's ``u``, a
    scenario's reward terms). A tensor counts when its first axis is the batch and the probe (the
    same scenario with another batch size, reset and stepped once) agrees: at the same path the
    probe's tensor has the probe's batch size, or the probe has nothing there.

    What is not a tensor row is not copied: a scenario that draws one choice for the whole batch
    at a full reset (``simple_reference``'s goal landmark, an object reference) shares it across
    envs, so a snapshot restored into another VMAS instance carries only the rows.
    """

    def __init__(self, env: Any, probe: Any) -> None:
        self.env = env
        self.batch = int(env.batch_dim)
        size = int(probe.batch_dim)
        other = tensors_of(probe)
        self._other_size = {p: int(t.shape[0]) for p, t in other.items()}
        self._probe_batch = size

    def current(self) -> dict[Path, Tensor]:
        """The batch-leading tensors now, by path."""
        E, P, other = self.batch, self._probe_batch, self._other_size
        # an expanded tensor (stride 0 along the batch) holds one value for every env: not a row
        return {
            p: t
            for p, t in tensors_of(self.env).items()
            if t.shape[0] == E and other.get(p, P) == P and (E == 1 or t.stride(0) != 0)
        }

    def gather(self, idx: Tensor) -> dict[Path, Tensor]:
        """Copies of rows ``idx`` of every batch-leading tensor."""
        return {p: t[idx].clone() for p, t in self.current().items()}

    def scatter(self, idx: Tensor, rows: dict[Path, Tensor]) -> None:
        """Write ``rows`` (from :meth:`gather`) into rows ``idx``, in place (a tensor the env no
        longer has is skipped)."""
        now = self.current()
        for p, r in rows.items():
            t = now.get(p)
            if t is not None and t.shape[1:] == r.shape[1:]:
                t[idx] = r.to(t.dtype)

    def copy(self, src: Tensor, dst: Tensor) -> None:
        """Rows ``src`` onto rows ``dst`` (an in-batch copy: the envs ``dst`` become the envs ``src``)."""
        for t in self.current().values():
            t[dst] = t[src]


@dataclass
class _Rows:
    """Snapshot rows of several envs taken at once (each :class:`VmasSnapshot` points at one)."""

    tensors: dict[Path, Tensor]
    obs: Tensor
    done: Tensor
    seed: Tensor


@dataclass(frozen=True)
class VmasSnapshot:
    """One env's whole state: its row ``j`` of a :class:`_Rows` taken by :meth:`VmasVec.snapshot`."""

    rows: _Rows
    j: int


def _gym_to_gymnasium(space: Any, agent: str, scenario: str) -> spaces.Space[Any]:
    """VMAS's ``gym`` spaces as the ``gymnasium`` spaces the layout reads."""
    kind = type(space).__name__
    if kind == "Box":
        return spaces.Box(np.asarray(space.low, np.float32), np.asarray(space.high, np.float32), dtype=np.float32)
    if kind == "Discrete":
        return spaces.Discrete(int(space.n))
    raise UnsupportedSpaceError(
        f"vmas:{scenario}: agent {agent!r} has a {kind} action space (discrete actions with communication); "
        "set env_kwargs.continuous_actions=true"
    )


@contextlib.contextmanager
def _vmas_random_state(seed: int | None, device: torch.device) -> Iterator[None]:
    """VMAS's class-level random state (torch CPU, numpy, random) seeded with ``seed`` for the
    duration (None: left as it is), and given back afterwards; on CUDA the device generator is
    forked and seeded as well. The caller's own random streams are untouched either way."""
    from vmas.simulator.environment import Environment

    if seed is None:
        yield
        return
    state = Environment.vmas_random_state
    saved = list(state)
    state[0] = torch.Generator().manual_seed(seed).get_state()
    state[1] = np.random.RandomState(seed % 2**32).get_state()
    state[2] = random.Random(seed).getstate()
    devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices, device_type=device.type if devices else "cuda"):
            if devices:
                torch.cuda.manual_seed(seed)
            yield
    finally:
        state[:] = saved


def _make(task: VmasTask, num_envs: int, device: torch.device, name: str) -> Any:
    import vmas

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            env = vmas.make_env(
                task.scenario,
                num_envs=num_envs,
                device=device,
                continuous_actions=bool(task.continuous_actions),
                max_steps=int(task.max_steps),
                terminated_truncated=True,
                clamp_actions=True,  # the policy clips to the Box already; comm ranges are [0, 1]
                seed=0,
                **task.kwargs,
            )
        except (TypeError, ValueError, AssertionError, KeyError) as exc:
            raise UserInputError(
                f"env {name!r}: VMAS scenario {task.scenario!r} rejected env_kwargs {sorted(task.kwargs)}: {exc}"
            ) from exc
    for w in caught:
        text = str(w.message)
        if "passed but not used by the scenario" in text:
            raise UserInputError(f"env {name!r}: {text.split(' This will')[0]} Remove or correct those env_kwargs keys")
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return env


class VmasVec(VecEnv):
    """``num_envs`` copies of a VMAS scenario: one VMAS ``Environment`` of that batch size."""

    backend = "torch"
    supports_snapshot = True

    def __init__(self, task: VmasTask, num_envs: int, *, with_state: bool = False, name: str | None = None) -> None:
        if int(num_envs) < 1:
            raise UserInputError(f"vmas:{task.scenario}: num_envs must be >= 1, got {num_envs}")
        if int(task.max_steps) < 1:
            raise UserInputError(
                f"vmas:{task.scenario}: env_kwargs.max_steps must be >= 1 (episodes need a limit), got {task.max_steps}"
            )
        device = "cuda" if task.device == "auto" and torch.cuda.is_available() else task.device
        self.device = canonical_device("cpu" if device == "auto" else device)
        self.task = task
        self.name = name or f"vmas:{task.scenario}"
        self.num_envs = E = int(num_envs)
        self.with_state = bool(with_state)
        self.max_episode_steps = int(task.max_steps)
        self.env = _make(task, E, self.device, self.name)
        agents = tuple(a.name for a in self.env.agents)
        obs_spaces = [
            spaces.Box(-np.inf, np.inf, (int(np.prod(s.shape)),), np.float32) for s in self.env.observation_space
        ]
        act_spaces = [
            _gym_to_gymnasium(s, a, task.scenario) for s, a in zip(self.env.action_space, agents, strict=True)
        ]
        self._obs_dims = [int(s.shape[0]) for s in obs_spaces]
        D = max(self._obs_dims)
        self.layout = layout_of(agents, obs_spaces, act_spaces, state_dim=len(agents) * D if with_state else 0)
        self._act_dims = list(self.layout.action_dims)
        self._pad = any(d != D for d in self._obs_dims)
        dev = self.device
        self._obs = torch.zeros((E, len(agents), D), dtype=torch.float32, device=dev)
        self._done = torch.ones(E, dtype=torch.bool, device=dev)
        self._seed = torch.full((E,), -1, dtype=torch.long, device=dev)
        self._rows_: BatchRows | None = None

    # -- helpers --------------------------------------------------------------------------------
    @property
    def rows(self) -> BatchRows:
        """The batch-leading tensors (found on first use: it builds a 1-env probe)."""
        if self._rows_ is None:
            probe = _make(self.task, 2 if self.num_envs == 1 else 1, self.device, self.name)
            probe.reset()
            probe.step(self._zero_actions(probe.batch_dim))
            self._rows_ = BatchRows(self.env, probe)
        return self._rows_

    def _zero_actions(self, n: int) -> list[Tensor]:
        if self.layout.continuous:
            return [torch.zeros((n, k), device=self.device) for k in self._act_dims]
        return [torch.zeros(n, dtype=torch.long, device=self.device) for _ in self._act_dims]

    def _stack(self, obs: Sequence[Tensor]) -> Tensor:
        if not self._pad:
            return torch.stack(list(obs), 1).to(torch.float32)
        out = self._obs.new_zeros(self._obs.shape)
        for i, o in enumerate(obs):
            out[:, i, : o.shape[-1]] = o
        return out

    def _state(self, obs: Tensor) -> Tensor | None:
        return obs.reshape(obs.shape[0], -1).clone() if self.with_state else None

    def _index(self, indices: Sequence[int] | Tensor | None) -> Tensor:
        if indices is None:
            return torch.arange(self.num_envs, device=self.device)
        if isinstance(indices, Tensor):
            return indices.to(device=self.device, dtype=torch.long).reshape(-1)
        return torch.as_tensor(np.asarray(indices, np.int64).reshape(-1), device=self.device)

    # -- contract ---------------------------------------------------------------------------------
    def reset(self, seeds: Sequence[int | None], indices: Sequence[int] | None = None) -> Step:
        idx = self._index(indices)
        seeds = list(seeds)
        if len(seeds) != len(idx):
            raise UserInputError(f"{self.name}: reset got {len(seeds)} seeds for {len(idx)} envs")
        rows = idx.tolist()
        if len(set(rows)) != len(rows):
            raise UserInputError(f"{self.name}: reset got repeated indices {rows}")
        given = [s for s in seeds if s is not None]
        if any(int(s) < 0 for s in given):
            raise UserInputError(f"{self.name}: reset seeds must be >= 0, got {seeds}")
        key: int | None = None
        if given:
            # one stream for the whole call, keyed by its seeds and rows (None: a fresh draw)
            # a seedless env draws fresh OS entropy, not from any stream the training uses
            entropy = [int(s) if s is not None else int(np.random.SeedSequence().entropy) % 2**62 for s in seeds]
            key = int(np.random.SeedSequence([*entropy, *rows, len(rows)]).generate_state(1, np.uint64)[0] >> 1)
        E = self.num_envs
        keep = torch.ones(E, dtype=torch.bool, device=self.device)
        keep[idx] = False
        kept = keep.nonzero().reshape(-1)
        saved = self.rows.gather(kept) if len(kept) else None
        try:
            with _vmas_random_state(key, self.device):
                self.env.reset(return_observations=False)
        except Exception as exc:
            raise EnvError(f"{self.name}: reset of envs {rows[:8]} (seeds {seeds[:8]}) raised {exc!r}") from exc
        if saved is not None:
            self.rows.scatter(kept, saved)
        first: dict[int, int] = {}
        src, dst = [], []
        for row, s in zip(rows, seeds, strict=True):
            if s is None:
                continue
            if int(s) in first:
                src.append(first[int(s)])
                dst.append(row)
            else:
                first[int(s)] = row
        if src:
            self.rows.copy(self._index(src), self._index(dst))
        obs = self._stack(self.env.get_from_scenario(True, False, False, False)[0])
        # out of place: the records handed out before keep their observations
        self._obs = self._obs.index_put((idx,), obs[idx])
        self._done[idx] = False
        self._seed[idx] = torch.as_tensor([-1 if s is None else int(s) for s in seeds], device=self.device)
        reset_obs = self._obs[idx].clone()
        return Step.observed(reset_obs, self._done[idx].clone(), self._state(reset_obs))

    def step(self, actions: Tensor) -> Step:
        E, A = self.num_envs, self.layout.num_agents
        if not isinstance(actions, Tensor):
            actions = torch.as_tensor(np.asarray(actions), device=self.device)
        actions = actions.to(self.device)
        if self.layout.continuous:
            k = max(self._act_dims)
            if actions.shape != (E, A, k):
                raise UserInputError(
                    f"{self.name}: actions must have shape [E, A, k] = {(E, A, k)}, got {tuple(actions.shape)}"
                )
            acts = [actions[:, i, :d] for i, d in enumerate(self._act_dims)]
        else:
            if actions.shape != (E, A):
                raise UserInputError(
                    f"{self.name}: actions must have shape [E, A] = {(E, A)}, got {tuple(actions.shape)}"
                )
            acts = list(actions.long().unbind(1))
        try:
            obs_l, rew_l, terminated, truncated, _ = self.env.step(acts)
        except Exception as exc:
            raise EnvError(f"{self.name}: step raised {exc!r} (envs' reset seeds {self._seed[:8].tolist()})") from exc
        live = ~self._done
        obs = torch.where(live[:, None, None], self._stack(obs_l), self._obs)
        rewards = torch.stack([r.reshape(E) for r in rew_l], 1).to(torch.float32) * live[:, None]
        term = terminated.reshape(E) & live
        trunc = truncated.reshape(E) & live & ~term
        self._done = self._done | term | trunc
        self._obs = obs
        return Step(
            obs=obs,
            rewards=rewards,
            terminated=term[:, None].expand(E, A),
            truncated=trunc[:, None].expand(E, A),
            alive=(~self._done)[:, None].expand(E, A),
            env_done=self._done.clone(),
            state=self._state(obs),
        )

    def observations(self, indices: Sequence[int] | None = None) -> Step:
        """The current record of envs ``indices`` (all when None) without stepping."""
        idx = self._index(indices)
        obs = self._obs[idx].clone()
        return Step.observed(obs, self._done[idx].clone(), self._state(obs))

    # -- snapshots: in-batch copies of each env's rows ----------------------------------------------
    def snapshot(self, indices: Sequence[int]) -> list[Any]:
        idx = self._index(indices)
        rows = _Rows(self.rows.gather(idx), self._obs[idx].clone(), self._done[idx].clone(), self._seed[idx].clone())
        return [VmasSnapshot(rows, j) for j in range(len(idx))]

    def restore(self, indices: Sequence[int], snaps: Sequence[Any]) -> None:
        idx = self._index(indices)
        if len(idx) != len(snaps):
            raise UserInputError(f"{self.name}: restore got {len(snaps)} snapshots for {len(idx)} envs")
        by_rows: dict[int, tuple[_Rows, list[int], list[int]]] = {}
        for pos, snap in enumerate(snaps):
            if not isinstance(snap, VmasSnapshot):
                raise UserInputError(f"{self.name}: restore got {type(snap).__name__}, not a snapshot of this env")
            entry = by_rows.setdefault(id(snap.rows), (snap.rows, [], []))
            entry[1].append(snap.j)
            entry[2].append(pos)
        for rows, js, positions in by_rows.values():
            j = torch.as_tensor(js, device=self.device)
            dst = idx[torch.as_tensor(positions, device=self.device)]
            self.rows.scatter(dst, {p: t[j] for p, t in rows.tensors.items()})
            self._obs = self._obs.index_put((dst,), rows.obs[j])
            self._done[dst] = rows.done[j]
            self._seed[dst] = rows.seed[j]

    def get_state(self) -> Any:
        from vmas.simulator.environment import Environment

        return {
            "envs": self.snapshot(list(range(self.num_envs))),
            "vmas_random_state": list(Environment.vmas_random_state),
        }

    def set_state(self, state: Any) -> None:
        from vmas.simulator.environment import Environment

        self.restore(list(range(self.num_envs)), state["envs"])
        Environment.vmas_random_state[:] = list(state["vmas_random_state"])

    def close(self) -> None:
        self.env = None
