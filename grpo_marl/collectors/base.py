"""What every collector shares: preallocated ``[T, E, A, ...]`` storage, host-to-device copies,
non-finite checks, the env-step counter and resumable state.

Collectors play a :class:`~grpo_marl.vec.base.VecEnv` with a policy and hand the trainer a
:class:`~grpo_marl.batch.Batch` of rollout rows ``[B, T, ...]``: one row per (env episode, agent),
arranged so that the members of each GRPO group are contiguous (see :mod:`grpo_marl.groups`).
The hot loop does one batched policy call and one vector step per time step, writing into
storage allocated once; there is no per-env Python work.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from grpo_marl.batch import Batch
from grpo_marl.errors import NonFiniteError
from grpo_marl.policies.base import Policy
from grpo_marl.vec.base import Step, VecEnv


class HostToDevice:
    """Host array -> device tensor without a host-side synchronisation in the hot loop.

    On CUDA the array is staged in one reused pinned buffer and copied with ``non_blocking``
    (a pageable ``as_tensor(..., device=cuda)`` waits for the copy, and for every kernel queued
    before it). A CUDA event guards the buffer: it is rewritten only once its last copy finished.
    Elsewhere this is exactly ``torch.as_tensor(array, device=device)``.
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._buf: Tensor | None = None
        self._event: Any = None

    def __call__(self, array: np.ndarray) -> Tensor:
        if self.device.type != "cuda":
            return torch.as_tensor(array, device=self.device)
        src = torch.from_numpy(np.ascontiguousarray(array))
        if self._buf is None or self._buf.shape != src.shape or self._buf.dtype != src.dtype:
            self._buf = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
            self._event = None
        if self._event is not None:
            self._event.synchronize()
        self._buf.copy_(src)
        out = self._buf.to(self.device, non_blocking=True)
        self._event = torch.cuda.Event()
        self._event.record()
        return out


class Storage:
    """``[T, E, A, ...]`` buffers: policy outputs on the device, env outputs on the host."""

    def __init__(self, horizon: int, vec: VecEnv, policy: Policy, device: torch.device, extra: Sequence[str] = ()):
        lay = vec.layout
        t, e, a = horizon, vec.num_envs, lay.num_agents
        obs_dtype = torch.uint8 if lay.obs_dtype == np.uint8 else torch.float32
        self.obs = torch.zeros((t, e, a, *lay.obs_shape), dtype=obs_dtype, device=device)
        self.actions = torch.zeros((t, e, a, *policy.action_shape()), dtype=policy.action_dtype, device=device)
        self.logp = torch.zeros((t, e, a), dtype=torch.float32, device=device)
        self.rewards = np.zeros((t, e, a), np.float32)
        self.alive = np.zeros((t, e, a), bool)
        self.action_mask = np.zeros((t, e, a, max(lay.max_actions, 1)), bool) if lay.has_action_mask else None
        self.extra = {k: np.zeros((t, e, a), bool) for k in extra}
        self.state = np.zeros((t, e, lay.state_dim), np.float32) if vec.with_state else None

    @property
    def capacity(self) -> int:
        return int(self.logp.shape[0])

    def grow(self) -> None:
        """Double the time axis (envs without an episode limit; rare, so a copy is fine)."""
        for name, value in vars(self).items():
            if isinstance(value, Tensor):
                setattr(self, name, torch.cat([value, value.new_zeros(value.shape)]))
            elif isinstance(value, np.ndarray):
                setattr(self, name, np.concatenate([value, np.zeros_like(value)]))
        self.extra = {k: np.concatenate([v, np.zeros_like(v)]) for k, v in self.extra.items()}


class Collector:
    """Base of the collectors: counters, finite checks and the resumable state they share."""

    vec: VecEnv
    device: torch.device
    env_name: str

    def __init__(self, vec: VecEnv, device: torch.device | str, seed: int, env_name: str) -> None:
        self.vec = vec
        self.device = torch.device(device)
        self.rng = np.random.default_rng(seed)
        # the noise of actions sampled on the host (grpo_marl/policies/host.py): its own stream,
        # so the reset seeds drawn from ``rng`` do not depend on how many actions were sampled
        self.action_rng = np.random.default_rng([seed, 1])
        self.env_name = env_name
        self.total_env_steps = 0
        self.env_seeds = np.full(vec.num_envs, -1, dtype=np.int64)  # reset seed of each env's episode
        self.to_device = HostToDevice(self.device)
        self.has_mask = vec.layout.has_action_mask

    def collect(self, policy: Policy) -> Batch:
        raise NotImplementedError

    def update_steps(self) -> tuple[int, str, bool] | None:
        """Env steps one collection takes, as ``(steps, how, exact)``: ``how`` says where the
        number comes from (``"8 envs x 32 steps"``), ``exact`` whether it is the number or only
        its bound (whole episodes end early). None: no bound is known."""
        return None

    # -- helpers -----------------------------------------------------------------------------------
    def new_seeds(self, n: int) -> np.ndarray:
        return self.rng.integers(0, 2**31 - 1, size=n)

    def reset(self, seeds: np.ndarray, indices: np.ndarray | None = None) -> Step:
        if indices is None:
            self.env_seeds[:] = seeds
        else:
            self.env_seeds[indices] = seeds
        step = self.vec.reset([int(s) for s in seeds], None if indices is None else [int(i) for i in indices])
        self.check(step, "reset", indices)
        return step

    def check(self, step: Step, during: str, rows: np.ndarray | None = None) -> None:
        """Stop on a NaN/inf observation or reward, naming the env, vector index and reset seed."""
        obs_ok = True if step.obs.dtype == np.uint8 else bool(np.isfinite(step.obs).all())
        if obs_ok and bool(np.isfinite(step.rewards).all()):
            return
        flat_obs = step.obs.reshape(len(step.obs), -1)
        bad_obs = np.zeros(len(step.obs), bool) if step.obs.dtype == np.uint8 else ~np.isfinite(flat_obs).all(1)
        bad = np.flatnonzero(bad_obs | ~np.isfinite(step.rewards).all(1))
        k = int(bad[0])
        index = k if rows is None else int(rows[k])
        what = "observation" if bad_obs[k] else "reward"
        seed = int(self.env_seeds[index])
        raise NonFiniteError(
            f"env {self.env_name!r} returned a non-finite {what} (NaN or inf) during {during} "
            f"(vector index {index}, reset seed {seed if seed >= 0 else 'none'}); check the env's dynamics"
        )

    def act(self, policy: Policy, step: Step) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """Device observation (and mask) of ``step`` and the policy's actions/log-probs on it."""
        obs_t = self.to_device(step.obs)
        mask_t = None
        if self.has_mask and step.action_mask is not None:
            mask_t = torch.as_tensor(step.action_mask, device=self.device)
        actions, logp = policy.act(obs_t, mask_t)
        return obs_t, actions, logp, mask_t

    # -- resume ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "rng": self.rng.bit_generator.state,
            "action_rng": self.action_rng.bit_generator.state,
            "total_env_steps": self.total_env_steps,
            "env_seeds": self.env_seeds.copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        if "action_rng" in state:  # checkpoints written before host sampling existed lack it
            self.action_rng.bit_generator.state = state["action_rng"]
        self.total_env_steps = int(state["total_env_steps"])
        self.env_seeds = np.asarray(state["env_seeds"], dtype=np.int64).copy()


def rollout_storage_bytes(collector: Collector, policy: Policy, minibatch_rows: int | None = None) -> dict[str, int]:
    """Estimated bytes of one collection's arrays (what grows with envs x horizon x obs size).

    ``storage``: the ``[T, E, A, ...]`` buffers (observations in their own dtype, actions,
    log-probs, rewards, masks, global state); ``peak``: what is alive at once while a batch is
    built and trained on (episode collectors: storage + rollout rows + the flat minibatch source,
    3x; the fixed-horizon collector also keeps final observations, 4x), plus the image encoder's
    activations on one minibatch of ``minibatch_rows`` steps (default: the whole batch). ``T`` is
    the collector's horizon (the episode limit, or ``n_steps``).
    """
    vec = collector.vec
    lay = vec.layout
    horizon = getattr(collector, "n_steps", None) or getattr(collector, "max_steps", None) or 64
    t, e, a = int(horizon), vec.num_envs, lay.num_agents
    obs_item = int(np.prod(lay.obs_shape)) * np.dtype(lay.obs_dtype).itemsize
    act_item = 8 if not lay.continuous else 4 * max(lay.action_dims)
    per_agent = obs_item + act_item + 4 + 4 + 1 + (max(lay.max_actions, 1) if lay.has_action_mask else 0)
    state_item = 4 * lay.state_dim * (a if vec.with_state else 0)  # broadcast to every agent's row
    storage = t * e * (a * per_agent + state_item)
    copies = 4 if hasattr(collector, "n_steps") else 3
    activations = 0
    if lay.is_image and getattr(policy, "_cnn", False):
        h, w, c = lay.obs_shape
        h1, w1 = (h - 8) // 4 + 1, (w - 8) // 4 + 1
        h2, w2 = (h1 - 4) // 2 + 1, (w1 - 4) // 2 + 1
        h3, w3 = h2 - 2, w2 - 2
        per_row = 4 * 2 * (h * w * c + 32 * h1 * w1 + 64 * h2 * w2 + 64 * h3 * w3 + 512)
        rows = min(t * e * a, minibatch_rows or t * e * a)
        activations = per_row * rows
    return {"storage": storage, "peak": copies * storage + activations, "horizon": t, "obs_bytes": obs_item}


def rows_of(x: np.ndarray | Tensor, device: torch.device) -> Tensor:
    """``[T, E, A, ...]`` -> rollout-major ``[E * A, T, ...]`` (rollout ``e * A + a``)."""
    src = x if isinstance(x, Tensor) else torch.from_numpy(np.ascontiguousarray(x))
    n_t, n_e, n_a = src.shape[:3]
    out = src.movedim(0, 2).reshape(n_e * n_a, n_t, *src.shape[3:]).to(device).contiguous()
    # Storage is reused by the next collection: the batch must never be a view of it.
    return out.clone() if out.untyped_storage().data_ptr() == src.untyped_storage().data_ptr() else out


def episode_metrics(
    returns: Tensor, lengths: Tensor, agents: Sequence[str], groups: Any, prefix: str
) -> dict[str, float]:
    """Return statistics of whole episodes: ``returns[N, A]`` per agent (mean over agents is the
    episode's score), per agent-group and per agent when there is more than one agent."""
    per_ep = returns.mean(1)
    out = {
        f"{prefix}/return_mean": float(per_ep.mean()),
        f"{prefix}/return_std": float(per_ep.std(unbiased=False)) if len(per_ep) > 1 else 0.0,
        f"{prefix}/return_min": float(per_ep.min()),
        f"{prefix}/return_max": float(per_ep.max()),
        f"{prefix}/length_mean": float(lengths.float().mean()),
    }
    if len(agents) > 1:
        for g, spec in groups.specs.items():
            cols = [list(agents).index(a) for a in spec.agents]
            out[f"{prefix}/return_mean/{g}"] = float(returns[:, cols].mean())
        for i, a in enumerate(agents):
            out[f"{prefix}/agent_return/{a}"] = float(returns[:, i].mean())
    return out
