"""The one vector-env contract every collector uses, for every env kind.

Every tensor carries an env axis and an agent axis, ``[E, A, ...]``; a Gymnasium env is the
one-agent case (``A = 1``, agent ``"agent"``). Agents are in ``layout.agents`` order.

**Tensors on the env's device.** A :class:`Step` holds ``torch.Tensor`` s on
:attr:`VecEnv.device`, and ``step()`` takes its actions as a tensor (on that device; a numpy env
also takes a numpy array). An env family that lives in torch (a batched simulator on the GPU)
hands its tensors through as they are, so a collector on the same device never copies a step to
the host and back. Envs that compute in numpy (the Gymnasium and PettingZoo drivers, the batched
ports of :mod:`grpo_marl.vec.ports`, ``VecEnv.backend == "numpy"``) stay numpy inside, fill a
:class:`HostStep`, and convert once at their boundary: ``torch.from_numpy`` of each array (no copy;
their device is the CPU), and actions ``.cpu().numpy()`` once per step (:func:`host_actions`).

Semantics (the same for Gymnasium native/sync/async, PettingZoo in-process/workers, the batched
numpy ports and torch envs):

* **No automatic reset.** An env whose episode ended is *done*: it is not stepped again, its row
  keeps the final observation (``alive`` False, ``rewards`` 0) until the collector resets it with
  :meth:`VecEnv.reset` (all envs, or a subset with ``indices``). Episode collectors reset whole
  groups; streaming and fixed-horizon collectors reset finished envs as they go. So the final
  observation of an episode is simply the observation of the step that ended it (what truncation
  bootstrapping needs), and no env steps are wasted on finished envs.
* **Per-env seeds.** ``reset(seeds)``: envs given the same seed start from the same state (seed
  groups); a fresh seed per env gives independent episodes.
* **Snapshots.** ``snapshot(indices)`` returns an opaque, independent copy of each env's state
  (physics, step counter, RNG); ``restore(indices, snaps)`` puts envs into them (mid-episode,
  not done). Where it cannot be done, ``supports_snapshot`` is False and both raise
  :class:`SnapshotUnsupported` naming what to change.
* **Exact resume.** ``get_state()`` / ``set_state()`` carry everything that determines every
  env's future (all envs' states, done flags and any RNG that draws initial states).
* **Errors.** An exception inside an env (here or in a worker process), a malformed observation
  or a non-finite value is raised as :class:`grpo_marl.errors.EnvError` naming the env, the vector
  index and the episode's reset seed.

Observations: vector spaces (Box, Discrete/MultiDiscrete one-hot, MultiBinary) are flattened to
``torch.float32[D]``, zero-padded to the largest agent's ``D``; image spaces (a uint8 Box of rank
3, shared by every agent) stay ``torch.uint8[H, W, C]`` and are converted to float only inside the
policy's encoder. ``rewards`` are ``torch.float32``; ``terminated``, ``truncated``, ``alive``,
``env_done`` and ``action_mask`` ``torch.bool``; ``state`` ``torch.float32``. Actions:
``torch.int64[E, A]`` (discrete) or ``torch.float32[E, A, k]`` (Box); rows of done envs and of
agents that are not alive are ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from grpo_marl.errors import UserInputError


class SnapshotUnsupported(UserInputError):
    """This vector env cannot snapshot/restore its envs (e.g. async workers of plain Gymnasium
    envs); the message names the setting to change."""


Index = Tensor | np.ndarray | Sequence[int]


def _as_tensor(x: Tensor | np.ndarray) -> Tensor:
    """A numpy array as a tensor sharing its memory (a tensor as it is)."""
    return x if isinstance(x, Tensor) else torch.from_numpy(x)


def canonical_device(device: torch.device | str) -> torch.device:
    """``device`` as a tensor on it reports it (``cuda`` -> ``cuda:0``), so that two names of one
    device compare equal and a record already there is never copied."""
    d = torch.device(device)
    if str(d) == "cuda":  # no index: the current CUDA device
        return torch.device("cuda", torch.cuda.current_device())
    return d


def host_actions(actions: Tensor | np.ndarray) -> np.ndarray:
    """Actions handed to a numpy vector env, as the numpy array it computes with: a CPU tensor's
    own memory (no copy), a device tensor copied to the host once."""
    if isinstance(actions, Tensor):
        try:
            return actions.numpy()  # a CPU tensor outside autograd: its memory, nothing else checked
        except (RuntimeError, TypeError):  # on a device, or requiring grad
            return actions.detach().cpu().numpy()
    return np.asarray(actions)


@dataclass
class Step:
    """One reset/step of ``E`` envs (or of the reset subset), agent axis ``A``; every field a
    tensor on the vector env's device (dtypes in the module docstring).

    obs: ``[E, A, *obs_shape]`` (``layout.obs_dtype``); for a done env the final observation.
    rewards / terminated / truncated: ``[E, A]`` of the step just taken (zeros at reset).
    alive: ``[E, A]`` the agent acts on ``obs`` at the next step.
    env_done: ``[E]`` the env's episode is over (every agent finished).
    action_mask: ``[E, A, K]`` bool where the env hands out masks, else None.
    state: ``[E, S]`` float32 global state (``env.state()``) when the vec env was built with
    ``with_state=True``, else None.
    """

    obs: Tensor
    rewards: Tensor
    terminated: Tensor
    truncated: Tensor
    alive: Tensor
    env_done: Tensor
    action_mask: Tensor | None = None
    state: Tensor | None = None
    #: the numpy record this one was made from without a copy (:meth:`HostStep.to_step`), so
    #: :meth:`numpy` on a numpy env's record costs nothing; never copied to derived records
    _host: tuple[HostStep, tuple[Tensor | None, ...]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    @classmethod
    def _of(cls, fields: Iterable[Any]) -> Step:
        """A record of the eight fields in declaration order (None for an absent optional one)."""
        return cls(*fields)

    def __getstate__(self) -> dict[str, Any]:
        # a pickled or deep-copied record no longer shares memory with the arrays it came from
        return {**self.__dict__, "_host": None}

    @property
    def device(self) -> torch.device:
        return self.obs.device

    def _index(self, idx: Index) -> Tensor:
        if isinstance(idx, Tensor):
            return idx.to(device=self.device, dtype=torch.long)
        return torch.as_tensor(np.asarray(idx, dtype=np.int64), device=self.device)

    def rows(self, idx: Index) -> Step:
        """The sub-record of envs ``idx`` (a copy)."""
        i = self._index(idx)
        return Step._of(None if x is None else x[i] for x in self._fields())

    def copy(self) -> Step:
        """An independent copy (no tensor shared with this record). A numpy env's record is copied
        as numpy (cheaper on small arrays) and stays one."""
        host = self._own_host()
        if host is not None:
            return host.copy().to_step()
        return Step._of(None if x is None else x.clone() for x in self._fields())

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Step:
        """This record on ``device`` (itself when it is there already: no copy)."""
        device = canonical_device(device)
        if self.obs.device == device:
            return self

        return Step._of(None if x is None else x.to(device, non_blocking=non_blocking) for x in self._fields())

    def numpy(self) -> HostStep:
        """The record as numpy arrays (sharing a CPU record's memory; a device record copied to the
        host): for code outside the hot loops that computes in numpy (tests, tools, a numpy env's
        own bookkeeping). A numpy env's record gives back the arrays it was made from."""
        host = self._own_host()
        if host is not None:
            return host

        return HostStep._of(None if x is None else x.detach().cpu().numpy() for x in self._fields())

    def _own_host(self) -> HostStep | None:
        """The numpy record whose memory this one's fields are (None: not made by
        :meth:`HostStep.to_step`, or a field reassigned since)."""
        if self._host is not None:
            host, made = self._host
            if all(a is b for a, b in zip(made, self._fields(), strict=True)):  # no field reassigned since
                return host
        return None

    def _fields(self) -> tuple[Tensor | None, ...]:
        return (
            self.obs,
            self.rewards,
            self.terminated,
            self.truncated,
            self.alive,
            self.env_done,
            self.action_mask,
            self.state,
        )

    def put(self, idx: Index, other: Step) -> None:
        """Write ``other``'s rows into rows ``idx`` of this record (in place). Between two numpy
        env records the write is done in numpy, on the same memory."""
        mine, theirs = self._own_host(), other._own_host()
        if mine is not None and theirs is not None:
            mine.put(idx.cpu().numpy() if isinstance(idx, Tensor) else idx, theirs)
            return
        i = self._index(idx)
        for mine_x, theirs_x in zip(self._fields(), other.to(self.device)._fields(), strict=True):
            if mine_x is not None and theirs_x is not None:  # the optional fields both records have
                mine_x[i] = theirs_x

    @staticmethod
    def observed(
        obs: Tensor | np.ndarray, env_done: Tensor | np.ndarray, state: Tensor | np.ndarray | None = None
    ) -> Step:
        """The record of envs that have just been reset or restored, or are read without stepping:
        ``obs`` [E, A, ...] and ``env_done`` [E], no reward or end flag, every agent of a running
        env alive (what the ports' ``reset`` and ``observations`` hand out). Numpy arrays (a numpy
        env's own) become tensors sharing their memory; tensors stay on their device."""
        if isinstance(obs, np.ndarray) and isinstance(env_done, np.ndarray):
            # a numpy env's record: built in numpy (a few cheap allocations), converted once
            n, a = obs.shape[:2]
            return HostStep(
                obs=obs,
                rewards=np.zeros((n, a), np.float32),
                terminated=np.zeros((n, a), bool),
                truncated=np.zeros((n, a), bool),
                alive=np.repeat(~env_done[:, None], a, axis=1),
                env_done=env_done,
                state=None if state is None else np.asarray(state),
            ).to_step()
        obs_t, done_t = _as_tensor(obs), _as_tensor(env_done)
        n, a = obs_t.shape[:2]
        dev = obs_t.device
        return Step(
            obs=obs_t,
            rewards=torch.zeros((n, a), dtype=torch.float32, device=dev),
            terminated=torch.zeros((n, a), dtype=torch.bool, device=dev),
            truncated=torch.zeros((n, a), dtype=torch.bool, device=dev),
            alive=(~done_t)[:, None].expand(n, a).clone(),
            env_done=done_t,
            state=None if state is None else _as_tensor(state),
        )

    @staticmethod
    def cat(parts: Sequence[Step]) -> Step:
        """Concatenate along the env axis."""
        if len(parts) == 1:
            return parts[0]
        columns = zip(*(p._fields() for p in parts), strict=True)
        return Step._of(None if col[0] is None else torch.cat([_req(x) for x in col]) for col in columns)


def _req(x: Any) -> Any:
    assert x is not None, "every part of a record has the same optional fields"
    return x


@dataclass
class HostStep:
    """The numpy record a numpy vector env fills (drivers, worker processes, ports): the fields of
    :class:`Step` as numpy arrays (``np.float32`` / ``np.bool_`` / ``np.uint8``). It never crosses
    the :class:`VecEnv` boundary: :meth:`to_step` makes the :class:`Step` of it, once per
    reset/step, without copying (``torch.from_numpy``), so the arrays must be fresh ones the env
    does not write into afterwards."""

    obs: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    alive: np.ndarray
    env_done: np.ndarray
    action_mask: np.ndarray | None = None
    state: np.ndarray | None = None

    def to_step(self) -> Step:
        """The :class:`Step` of these arrays (CPU tensors sharing their memory; its
        :meth:`Step.numpy` gives these arrays back)."""
        step = Step(
            obs=torch.from_numpy(self.obs),
            rewards=torch.from_numpy(self.rewards),
            terminated=torch.from_numpy(self.terminated),
            truncated=torch.from_numpy(self.truncated),
            alive=torch.from_numpy(self.alive),
            env_done=torch.from_numpy(self.env_done),
            action_mask=None if self.action_mask is None else torch.from_numpy(self.action_mask),
            state=None if self.state is None else torch.from_numpy(self.state),
        )
        step._host = (self, step._fields())
        return step

    @classmethod
    def _of(cls, fields: Iterable[Any]) -> HostStep:
        """A record of the eight fields in declaration order (None for an absent optional one)."""
        return cls(*fields)

    def _fields(self) -> tuple[np.ndarray | None, ...]:
        return (
            self.obs,
            self.rewards,
            self.terminated,
            self.truncated,
            self.alive,
            self.env_done,
            self.action_mask,
            self.state,
        )

    def rows(self, idx: np.ndarray | Sequence[int]) -> HostStep:
        """The sub-record of envs ``idx``."""
        i = np.asarray(idx, dtype=np.int64)
        return HostStep._of(None if x is None else x[i] for x in self._fields())

    def copy(self) -> HostStep:
        return self.rows(np.arange(len(self.env_done)))

    def put(self, idx: np.ndarray | Sequence[int], other: HostStep) -> None:
        """Write ``other``'s rows into rows ``idx`` of this record (in place)."""
        i = np.asarray(idx, dtype=np.int64)
        for mine, theirs in zip(self._fields(), other._fields(), strict=True):
            if mine is not None and theirs is not None:  # the optional fields both records have
                mine[i] = theirs

    @staticmethod
    def cat(parts: Sequence[HostStep]) -> HostStep:
        """Concatenate along the env axis (worker slices -> one record)."""
        if len(parts) == 1:
            return parts[0]
        columns = zip(*(p._fields() for p in parts), strict=True)
        return HostStep._of(None if col[0] is None else np.concatenate([_req(x) for x in col]) for col in columns)


@dataclass(frozen=True)
class Layout:
    """What the arrays of a vector env look like (the same for every env of it).

    agents: agent names (``("agent",)`` for Gymnasium). observation_spaces / action_spaces: the
    raw per-agent spaces. obs_shape / obs_dtype: per-agent observation in the arrays (see the
    module docstring). obs_dims: flattened length of each agent's own observation (vector spaces;
    the rest of ``obs_shape`` is padding). n_actions: discrete action count per agent (0 for Box);
    action_dims: 1 (discrete) or the Box size; max_actions: width of ``action_mask``;
    continuous: Box actions; has_action_mask: the env hands out masks; state_dim: ``env.state()``
    length (0 without a global state).
    """

    agents: tuple[str, ...]
    observation_spaces: tuple[Any, ...]
    action_spaces: tuple[Any, ...]
    obs_shape: tuple[int, ...]
    obs_dtype: Any
    obs_dims: tuple[int, ...]
    n_actions: tuple[int, ...]
    action_dims: tuple[int, ...]
    max_actions: int
    continuous: bool
    has_action_mask: bool = False
    state_dim: int = 0

    @property
    def num_agents(self) -> int:
        return len(self.agents)

    @property
    def is_image(self) -> bool:
        return len(self.obs_shape) == 3

    @property
    def obs_torch_dtype(self) -> torch.dtype:
        """``obs_dtype`` as the dtype of :attr:`Step.obs`."""
        return torch.uint8 if self.obs_dtype == np.uint8 else torch.float32

    def action_array(self, num_envs: int, device: torch.device | str = "cpu") -> Tensor:
        """A zero action tensor of the right shape and dtype for ``num_envs`` envs."""
        if self.continuous:
            return torch.zeros((num_envs, self.num_agents, max(self.action_dims)), dtype=torch.float32, device=device)
        return torch.zeros((num_envs, self.num_agents), dtype=torch.int64, device=device)

    def blank(self, num_envs: int, with_state: bool = False) -> HostStep:
        """A numpy record of ``num_envs`` done envs (zeros, nothing alive), for numpy envs to fill."""
        n, a = num_envs, self.num_agents
        return HostStep(
            obs=np.zeros((n, a, *self.obs_shape), self.obs_dtype),
            rewards=np.zeros((n, a), np.float32),
            terminated=np.zeros((n, a), bool),
            truncated=np.zeros((n, a), bool),
            alive=np.zeros((n, a), bool),
            env_done=np.ones(n, bool),
            action_mask=np.zeros((n, a, max(self.max_actions, 1)), bool) if self.has_action_mask else None,
            state=np.zeros((n, self.state_dim), np.float32) if with_state else None,
        )


def layout_of(
    agents: Sequence[str],
    observation_spaces: Sequence[Any],
    action_spaces: Sequence[Any],
    has_action_mask: bool = False,
    state_dim: int = 0,
) -> Layout:
    """Build the :class:`Layout` of per-agent spaces (checks they can share one array)."""
    from gymnasium import spaces

    from grpo_marl.vec.spaces import flat_obs_dim, is_image_space, obs_part

    obs_parts = [obs_part(s) for s in observation_spaces]
    if all(is_image_space(s) for s in obs_parts):
        shapes = {tuple(int(d) for d in s.shape) for s in obs_parts}
        if len(shapes) != 1:
            raise UserInputError(f"image observations of different shapes {sorted(shapes)} cannot share one array")
        obs_shape = shapes.pop()
        obs_dtype: Any = np.uint8
        obs_dims = tuple(int(np.prod(obs_shape)) for _ in obs_parts)
    else:
        obs_dims = tuple(flat_obs_dim(s) for s in obs_parts)
        obs_shape = (max(obs_dims),)
        obs_dtype = np.float32
    n_actions: list[int] = []
    action_dims: list[int] = []
    for agent, sp in zip(agents, action_spaces, strict=True):
        if isinstance(sp, spaces.Discrete):
            n_actions.append(int(sp.n))
            action_dims.append(1)
        elif isinstance(sp, spaces.Box):
            n_actions.append(0)
            action_dims.append(int(np.prod(sp.shape)))
        else:
            from grpo_marl.errors import UnsupportedSpaceError

            raise UnsupportedSpaceError(
                f"action space {sp} of agent {agent!r} is not supported; supported: Discrete and Box"
            )
    continuous = any(n == 0 for n in n_actions)
    if continuous and any(n > 0 for n in n_actions):
        from grpo_marl.errors import UnsupportedSpaceError

        raise UnsupportedSpaceError("mixing discrete and continuous action spaces in one env is not supported")
    return Layout(
        agents=tuple(agents),
        observation_spaces=tuple(observation_spaces),
        action_spaces=tuple(action_spaces),
        obs_shape=obs_shape,
        obs_dtype=obs_dtype,
        obs_dims=obs_dims,
        n_actions=tuple(n_actions),
        action_dims=tuple(action_dims),
        max_actions=0 if continuous else max(n_actions),
        continuous=continuous,
        has_action_mask=has_action_mask,
        state_dim=int(state_dim),
    )


class VecEnv:
    """Base of every vector env (see the module docstring for the contract).

    Subclasses set ``num_envs``, ``layout``, ``name``, ``max_episode_steps`` and
    ``supports_snapshot`` and implement ``reset``/``step``; snapshot support is optional. A
    torch env sets ``device`` (where its tensors live) and ``backend = "torch"``; the defaults
    describe a numpy env, whose records are CPU tensors over its arrays.
    """

    num_envs: int
    layout: Layout
    #: where every tensor of this env's records (and the actions it takes) lives
    device: torch.device = torch.device("cpu")
    #: what the env computes with: ``"numpy"`` (it converts at its boundary) or ``"torch"``
    backend: str = "numpy"
    name: str = "env"
    max_episode_steps: int | None = None
    supports_snapshot: bool = False
    with_state: bool = False

    @property
    def agents(self) -> tuple[str, ...]:
        return self.layout.agents

    def reset(self, seeds: Sequence[int], indices: Sequence[int] | None = None) -> Step:
        """Reset envs ``indices`` (all when None) with ``seeds`` (one per reset env) and return
        their first step (rows in ``indices`` order)."""
        raise NotImplementedError

    def step(self, actions: Tensor) -> Step:
        """Step every env that is not done with ``actions`` (a tensor on :attr:`device`; see the
        module docstring for shapes); returns the record of all ``E`` envs."""
        raise NotImplementedError

    def snapshot(self, indices: Sequence[int]) -> list[Any]:
        raise SnapshotUnsupported(self._no_snapshot())

    def restore(self, indices: Sequence[int], snaps: Sequence[Any]) -> None:
        raise SnapshotUnsupported(self._no_snapshot())

    def _no_snapshot(self) -> str:
        return (
            f"{type(self).__name__} (env {self.name!r}) cannot snapshot or restore its envs; "
            "set vec.vectorization=sync for state groups, streaming rollouts or exact resume"
        )

    def get_state(self) -> Any:
        """Everything that determines every env's future (exact resume)."""
        return self.snapshot(list(range(self.num_envs)))

    def set_state(self, state: Any) -> None:
        self.restore(list(range(self.num_envs)), state)

    def close(self) -> None:
        pass

    def __enter__(self) -> VecEnv:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
