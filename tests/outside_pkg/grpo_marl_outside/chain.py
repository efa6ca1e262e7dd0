"""An env family of the user's own, with its own batched simulator (tests/test_outside_pkg.py).

``chain`` envs are walks on a 1-D chain of ``length`` cells: each episode the agent starts on one
cell and must reach a goal cell (both drawn from the episode's reset seed), moving left, staying
or moving right (``Discrete(3)``). Every step costs ``step_cost``; reaching the goal pays 1 and
ends the episode; ``horizon`` steps without it truncate the episode. With ``slip > 0`` a move
fails (the agent stays) with that probability. The observation is ``[position, goal]`` scaled to
``[-1, 1]``, so the optimal policy (move towards the goal) is one linear boundary.

What a user writes to plug such a simulator into grpo_marl, without editing the framework:

* :class:`ChainVec`, the vector env: implements :class:`grpo_marl.vec.base.VecEnv` directly. The
  state of all ``E`` envs is a handful of ``[E]`` arrays and :meth:`ChainVec.step` (and a reset of
  any subset) is a fixed sequence of numpy operations over all of them, with no per-env Python
  loop. It computes in numpy and meets the tensor contract at its boundary: its records are
  ``torch.from_numpy`` views of fresh arrays (CPU tensors, no copy) and the actions it is given
  (tensors) are read once with :func:`grpo_marl.vec.base.host_actions`. Randomness is counter-based (a hash of the episode's key and the step counter), so an
  env's future is its arrays: snapshots are copies of its rows, and state groups, streaming
  rollouts and exact resume work.
* :class:`ChainFamily`, the env family (``kind="chain"``): the framework asks it for the vector
  env (:meth:`ChainFamily.make_vec`), which vectorizations exist (``auto``/``native``: there are
  no per-env objects to drive one by one) and which group modes and rollouts apply.
* :func:`register_envs`, the ``grpo_marl.envs`` entry point: registers ``chain_reach`` (and
  ``chain_reach_long``) with ``kind="chain"``, tuned defaults and a solve threshold. A
  registered env's factory returns one env's :class:`Chain` parameters; the family batches them.

Both entry points are declared in ``grpo_marl_outside-0.1.dist-info/entry_points.txt``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor

from grpo_marl.errors import EnvError, UserInputError
from grpo_marl.families import EnvFamily
from grpo_marl.registry import EnvSpec, register_env
from grpo_marl.vec.base import Step, VecEnv, host_actions, layout_of

__all__ = ["Chain", "ChainFamily", "ChainVec", "chain", "register_envs"]

FAMILY = "chain"


@dataclass(frozen=True)
class Chain:
    """One chain env's parameters: what a ``chain`` env's factory returns (``env_kwargs`` go here)."""

    length: int = 9
    horizon: int = 24
    step_cost: float = 0.05
    slip: float = 0.0

    def __post_init__(self) -> None:
        if int(self.length) < 2:
            raise UserInputError(f"chain env: length must be >= 2, got {self.length}")
        if int(self.horizon) < 1:
            raise UserInputError(f"chain env: horizon must be >= 1, got {self.horizon}")
        if not 0.0 <= float(self.slip) < 1.0:
            raise UserInputError(f"chain env: slip must be in [0, 1), got {self.slip}")


def chain(**env_kwargs: Any) -> Chain:
    """The factory of ``chain`` envs (``env_kwargs``: ``length``, ``horizon``, ``step_cost``, ``slip``)."""
    unknown = sorted(set(env_kwargs) - set(Chain.__dataclass_fields__))
    if unknown:
        raise UserInputError(
            f"chain env: unknown env_kwargs {unknown}; supported: {sorted(Chain.__dataclass_fields__)}"
        )
    return Chain(**env_kwargs)


_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic): a counter -> 64 random bits."""
    x = x.astype(np.uint64, copy=True)
    x += np.uint64(0x9E3779B97F4A7C15)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def _uniform(key: np.ndarray, counter: np.ndarray) -> np.ndarray:
    """float64 in [0, 1) from (key, counter), element-wise."""
    bits = _mix(key ^ _mix(counter.astype(np.uint64)))
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


@dataclass(frozen=True)
class ChainSnapshot:
    """One env's whole state (its row of every array): what :meth:`ChainVec.snapshot` returns."""

    pos: int
    goal: int
    t: int
    done: bool
    key: int
    seed: int


class ChainVec(VecEnv):
    """``num_envs`` chain envs as one array program (the :class:`VecEnv` contract, snapshots included)."""

    supports_snapshot = True

    def __init__(self, params: Chain, num_envs: int, *, name: str = "chain", with_state: bool = False) -> None:
        if int(num_envs) < 1:
            raise UserInputError(f"{name}: num_envs must be >= 1, got {num_envs}")
        self.params = params
        self.name = name
        self.num_envs = E = int(num_envs)
        self.with_state = bool(with_state)
        self.max_episode_steps = int(params.horizon)
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Discrete(3)
        self.layout = layout_of(("agent",), (self.observation_space,), (self.action_space,))
        self._last = int(params.length) - 1
        self._pos = np.zeros(E, np.int64)
        self._goal = np.zeros(E, np.int64)
        self._t = np.zeros(E, np.int64)
        self._done = np.ones(E, bool)
        self._key = np.zeros(E, np.uint64)  # the episode's random stream (from its seed)
        self._seed = np.full(E, -1, np.int64)  # the episode's reset seed (-1: none given), for errors
        self._draws = 0  # resets without a seed draw their key from this counter

    # -- contract ------------------------------------------------------------------------------
    def reset(self, seeds: Sequence[int | None], indices: Sequence[int] | None = None) -> Step:
        idx = np.arange(self.num_envs) if indices is None else np.asarray(indices, np.int64).reshape(-1)
        seeds = list(seeds)
        if len(seeds) != len(idx):
            raise UserInputError(f"{self.name}: reset got {len(seeds)} seeds for {len(idx)} envs")
        given = np.array([s is not None for s in seeds], bool)
        seed = np.array([-1 if s is None else int(s) for s in seeds], np.int64)
        if (seed[given] < 0).any():
            raise UserInputError(f"{self.name}: reset seeds must be >= 0, got {seeds}")
        # the same seed -> the same key -> the same start and goal (seed groups)
        fresh = _mix(np.uint64(0xA5A5A5A5A5A5A5A5) + np.arange(self._draws, self._draws + len(idx), dtype=np.uint64))
        self._draws += len(idx)
        key = np.where(given, _mix(seed.astype(np.uint64)), fresh)
        n = self._last + 1
        goal = (_mix(key ^ np.uint64(1)) % np.uint64(n)).astype(np.int64)
        # the start is any other cell: goal + 1 + (0 .. n - 2), around the chain
        pos = (goal + 1 + (_mix(key ^ np.uint64(2)) % np.uint64(n - 1)).astype(np.int64)) % n
        self._key[idx], self._seed[idx] = key, seed
        self._goal[idx], self._pos[idx] = goal, pos
        self._t[idx] = 0
        self._done[idx] = False
        return self._record(idx)

    def step(self, actions: Tensor | np.ndarray) -> Step:
        E, p = self.num_envs, self.params
        a = host_actions(actions)
        if a.shape not in ((E, 1), (E,)):
            raise UserInputError(f"{self.name}: actions must have shape [E, 1] = {(E, 1)}, got {a.shape}")
        live = ~self._done
        a = np.where(live, a.reshape(E).astype(np.int64), 1)
        bad = (a < 0) | (a > 2)
        if bad.any():
            e = int(np.flatnonzero(bad)[0])
            raise EnvError(
                f"{self.name}: action {int(a[e])} is outside Discrete(3) in vector env {e} "
                f"(episode reset seed {int(self._seed[e])})"
            )
        move = a - 1
        if p.slip > 0:
            move = np.where(_uniform(self._key, self._t) < p.slip, 0, move)
        self._pos = np.where(live, np.clip(self._pos + move, 0, self._last), self._pos)
        self._t = self._t + live
        arrived = live & (self._pos == self._goal)
        truncated = live & (self._t >= p.horizon)
        rewards = np.where(live, np.where(arrived, 1.0, 0.0) - p.step_cost, 0.0).astype(np.float32)
        self._done = self._done | arrived | truncated
        return replace(
            self._record(np.arange(E)),
            rewards=torch.from_numpy(rewards[:, None]),
            terminated=torch.from_numpy(arrived[:, None]),
            truncated=torch.from_numpy(truncated[:, None]),
        )

    def _record(self, idx: np.ndarray) -> Step:
        """The current record of envs ``idx`` (zero rewards and flags; ``step`` replaces them)."""
        n, scale = len(idx), 2.0 / self._last
        obs = np.empty((n, 1, 2), np.float32)
        obs[:, 0, 0] = self._pos[idx] * scale - 1.0
        obs[:, 0, 1] = self._goal[idx] * scale - 1.0
        state = np.zeros((n, 0), np.float32) if self.with_state else None
        return Step.observed(obs, self._done[idx], state)

    # -- snapshots (state groups, streaming rollouts, exact resume) ------------------------------
    def snapshot(self, indices: Sequence[int]) -> list[Any]:
        return [
            ChainSnapshot(
                int(self._pos[i]),
                int(self._goal[i]),
                int(self._t[i]),
                bool(self._done[i]),
                int(self._key[i]),
                int(self._seed[i]),
            )
            for i in np.asarray(indices, np.int64).reshape(-1).tolist()
        ]

    def restore(self, indices: Sequence[int], snaps: Sequence[Any]) -> None:
        idx = np.asarray(indices, np.int64).reshape(-1)
        if len(idx) != len(snaps) or not all(isinstance(s, ChainSnapshot) for s in snaps):
            raise UserInputError(f"{self.name}: restore needs one ChainSnapshot per env index")
        self._pos[idx] = [s.pos for s in snaps]
        self._goal[idx] = [s.goal for s in snaps]
        self._t[idx] = [s.t for s in snaps]
        self._done[idx] = [s.done for s in snaps]
        self._key[idx] = np.array([s.key for s in snaps], np.uint64)
        self._seed[idx] = [s.seed for s in snaps]

    def get_state(self) -> Any:
        return {"envs": self.snapshot(range(self.num_envs)), "draws": self._draws}

    def set_state(self, state: Any) -> None:
        self.restore(range(self.num_envs), state["envs"])
        self._draws = int(state["draws"])


class ChainFamily(EnvFamily):
    """The ``chain`` env family: single-agent, batched by :class:`ChainVec`, trained by GRPO and PPO."""

    name = FAMILY
    noun = "a batched chain env (grpo_marl_outside)"
    plural = "batched chain envs"
    vectorizations = ("auto", "native")  # one array program; there are no per-env objects to drive
    streams = True  # snapshots: streaming seed groups work
    one_env_per_member = True  # GRPO: vec.num_envs = num_groups x group_size

    def make_vec(
        self,
        spec: EnvSpec,
        num_envs: int,
        env_kwargs: dict[str, Any],
        vectorization: str,
        *,
        with_state: bool,
        num_workers: int,
    ) -> VecEnv:
        params = spec.make(**env_kwargs)
        if not isinstance(params, Chain):
            raise UserInputError(
                f"env {spec.name!r} is registered as kind {FAMILY!r} but its factory returned "
                f"{type(params).__name__}, not grpo_marl_outside.chain.Chain"
            )
        return ChainVec(params, num_envs, name=spec.name, with_state=with_state)

    def recognises(self, env: object) -> bool:
        return isinstance(env, Chain)


#: Tuned for a few seconds of training (``chain_reach`` is solved in ~10k env steps).
DEFAULTS: dict[str, Any] = {
    "common": {"total_steps": 20_000, "eval": {"episodes": 32}},
    "grpo": {"algo": {"num_groups": 8, "group_size": 8, "lr": 0.003, "epochs": 2, "minibatches": 2}},
}


def register_envs() -> None:
    """The ``grpo_marl.envs`` entry point: registers this package's ``chain`` envs."""
    register_env(
        "chain_reach",
        chain,
        kind=FAMILY,
        defaults=DEFAULTS,
        threshold=0.75,
        description="walk to the goal on a 9-cell chain (grpo_marl_outside)",
    )
    register_env(
        "chain_reach_long",
        lambda **kw: chain(**{"length": 15, "horizon": 40, **kw}),
        kind=FAMILY,
        defaults=DEFAULTS,
        description="walk to the goal on a 15-cell chain (grpo_marl_outside)",
    )
