"""What every collector shares: preallocated ``[T, E, A, ...]`` storage, the one move of each
step record onto the policy's device, non-finite checks, the env-step counter and resumable state.

Collectors play a :class:`~grpo_marl.vec.base.VecEnv` with a policy and hand the trainer a
:class:`~grpo_marl.batch.Batch` of rollout rows ``[B, T, ...]``: one row per (env episode, agent),
arranged so that the members of each GRPO group are contiguous (see :mod:`grpo_marl.groups`).
The hot loop does one batched policy call and one vector step per time step, writing into
storage allocated once; there is no per-env Python work.

Storage is torch tensors on the collector's (the policy's) device, all of it. A vector env's
records are tensors on *its* device (:mod:`grpo_marl.vec.base`): when both devices are the same
(a numpy env and a CPU policy, a torch env and a policy on its GPU) a record is used as it is, with
no copy; otherwise it is moved once per step (:meth:`Collector.to_collector`), and the actions
once back (:meth:`Collector.env_actions`). For a numpy env on the CPU, the episode collector's
host-actor loop and the step collector's bookkeeping read the records' own arrays
(:meth:`Step.numpy` gives them back for free) and write the same tensors through numpy views,
which keeps their per-step cost that of numpy on small arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from grpo_marl.batch import Batch
from grpo_marl.errors import NonFiniteError
from grpo_marl.policies.base import ActingPolicy, Policy
from grpo_marl.vec.base import Step, VecEnv, canonical_device


class HostToDevice:
    """Host array -> device tensor without a host-side synchronisation in the hot loop.

    On CUDA the array is staged in one reused pinned buffer and copied with ``non_blocking``
    (a pageable ``as_tensor(..., device=cuda)`` waits for the copy, and for every kernel queued
    before it). A CUDA event guards the buffer: it is rewritten only once its last copy finished.
    Elsewhere this is exactly ``torch.as_tensor(array, device=device)``. The collectors use one
    per field of a step record when a CPU vector env feeds a CUDA policy.
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._buf: Tensor | None = None
        self._event: Any = None

    def __call__(self, array: np.ndarray | Tensor) -> Tensor:
        if self.device.type != "cuda":
            return torch.as_tensor(array, device=self.device)
        if isinstance(array, Tensor) and array.device.type == "cuda":
            return array.to(self.device)
        src = array.contiguous() if isinstance(array, Tensor) else torch.from_numpy(np.ascontiguousarray(array))
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


def env_actions(policy: ActingPolicy, actions: Tensor, device: torch.device) -> Tensor:
    """``policy``'s ``actions`` as :meth:`VecEnv.step` takes them, on the env's ``device``.

    A trained actor converts them in torch (``ActorPolicy.env_actions``: Box actions clipped), so
    an env on the policy's device gets them with no copy at all; a policy that only offers the
    numpy ``to_env`` (scripted references, benchmark peers) goes through it."""
    convert = getattr(policy, "env_actions", None)
    out = convert(actions) if convert is not None else torch.as_tensor(policy.to_env(actions))
    return out.to(device)


class Storage:
    """``[T, E, A, ...]`` buffers of one collection, every one a tensor on the collector's device."""

    def __init__(self, horizon: int, vec: VecEnv, policy: Policy, device: torch.device, extra: Sequence[str] = ()):
        lay = vec.layout
        t, e, a = horizon, vec.num_envs, lay.num_agents
        self.obs = torch.zeros((t, e, a, *lay.obs_shape), dtype=lay.obs_torch_dtype, device=device)
        self.actions = torch.zeros((t, e, a, *policy.action_shape()), dtype=policy.action_dtype, device=device)
        self.logp = torch.zeros((t, e, a), dtype=torch.float32, device=device)
        self.rewards = torch.zeros((t, e, a), dtype=torch.float32, device=device)
        self.alive = torch.zeros((t, e, a), dtype=torch.bool, device=device)
        self.action_mask = (
            torch.zeros((t, e, a, max(lay.max_actions, 1)), dtype=torch.bool, device=device)
            if lay.has_action_mask
            else None
        )
        self.extra = {k: torch.zeros((t, e, a), dtype=torch.bool, device=device) for k in extra}
        self.state = torch.zeros((t, e, lay.state_dim), dtype=torch.float32, device=device) if vec.with_state else None

    @property
    def capacity(self) -> int:
        return int(self.logp.shape[0])

    def grow(self) -> None:
        """Double the time axis (envs without an episode limit; rare, so a copy is fine)."""
        for name, value in vars(self).items():
            if isinstance(value, Tensor):
                setattr(self, name, torch.cat([value, value.new_zeros(value.shape)]))
        self.extra = {k: torch.cat([v, v.new_zeros(v.shape)]) for k, v in self.extra.items()}


class Collector:
    """Base of the collectors: counters, finite checks and the resumable state they share."""

    vec: VecEnv
    device: torch.device
    env_name: str

    def __init__(self, vec: VecEnv, device: torch.device | str, seed: int, env_name: str) -> None:
        self.vec = vec
        self.device = canonical_device(device)
        self.rng = np.random.default_rng(seed)
        # the noise of actions sampled on the host (grpo_marl/policies/host.py): its own stream,
        # so the reset seeds drawn from ``rng`` do not depend on how many actions were sampled
        self.action_rng = np.random.default_rng([seed, 1])
        self.env_name = env_name
        self.total_env_steps = 0
        self.env_seeds = np.full(vec.num_envs, -1, dtype=np.int64)  # reset seed of each env's episode
        # one staging buffer per field for a CPU env feeding a CUDA policy (see HostToDevice)
        self._h2d: dict[str, HostToDevice] = {}
        self.has_mask = vec.layout.has_action_mask
        # a numpy env's CPU records are checked as numpy (cheaper on small arrays); a torch env's
        # stay tensors (no numpy conversion on its path)
        self._numpy_check = vec.backend == "numpy" and self.device.type == "cpu"

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
        """Reset envs ``indices`` (all when None) with ``seeds``; their record on the collector's
        device, checked."""
        if indices is None:
            self.env_seeds[:] = seeds
        else:
            self.env_seeds[indices] = seeds
        step = self.vec.reset([int(s) for s in seeds], None if indices is None else [int(i) for i in indices])
        step = self.to_collector(step)
        self.check(step, "reset", indices)
        return step

    def env_step(self, actions: Tensor) -> Step:
        """One vector step with the policy's ``actions`` as the env takes them (see
        :meth:`env_actions`); the record on the collector's device, checked."""
        step = self.to_collector(self.vec.step(actions))
        self.check(step, "step")
        return step

    def env_actions(self, policy: ActingPolicy, actions: Tensor) -> Tensor:
        """``policy``'s sampled ``actions`` as this collector's vector env takes them."""
        return env_actions(policy, actions, self.vec.device)

    def to_collector(self, step: Step) -> Step:
        """``step`` on the collector's device: itself when the env lives there (no copy); from a CPU
        env to a CUDA policy through pinned staging buffers (no host synchronisation); else
        ``Step.to``."""
        if step.device == self.device:
            return step
        if step.device.type != "cpu" or self.device.type != "cuda":
            return step.to(self.device)

        def move(name: str, x: Tensor) -> Tensor:
            if name not in self._h2d:
                self._h2d[name] = HostToDevice(self.device)
            return self._h2d[name](x)

        return Step(
            obs=move("obs", step.obs),
            rewards=move("rewards", step.rewards),
            terminated=move("terminated", step.terminated),
            truncated=move("truncated", step.truncated),
            alive=move("alive", step.alive),
            env_done=move("env_done", step.env_done),
            action_mask=None if step.action_mask is None else move("action_mask", step.action_mask),
            state=None if step.state is None else move("state", step.state),
        )

    def check(self, step: Step, during: str, rows: np.ndarray | None = None) -> None:
        """Stop on a NaN/inf observation or reward, naming the env, vector index and reset seed.

        One reduction (and, on an accelerator, one synchronisation) per record; only when it
        fails are the offending rows looked up."""
        ok: bool
        if step.obs.dtype == torch.uint8:
            ok = bool(torch.isfinite(step.rewards).all())
        elif self._numpy_check:  # numpy on the same memory: cheaper on small arrays
            rec = step.numpy()
            ok = bool(np.isfinite(rec.obs).all()) and bool(np.isfinite(rec.rewards).all())
        else:
            ok = bool(torch.isfinite(step.obs).all() & torch.isfinite(step.rewards).all())
        if ok:
            return
        obs = step.obs.cpu()
        rewards = step.rewards.cpu().numpy()
        n = len(obs)
        flat_obs = obs.reshape(n, -1).numpy()
        bad_obs = np.zeros(n, bool) if obs.dtype == torch.uint8 else ~np.isfinite(flat_obs).all(1)
        bad = np.flatnonzero(bad_obs | ~np.isfinite(rewards).all(1))
        k = int(bad[0])
        index = k if rows is None else int(rows[k])
        what = "observation" if bad_obs[k] else "reward"
        seed = int(self.env_seeds[index])
        raise NonFiniteError(
            f"env {self.env_name!r} returned a non-finite {what} (NaN or inf) during {during} "
            f"(vector index {index}, reset seed {seed if seed >= 0 else 'none'}); check the env's dynamics"
        )

    def act(self, policy: Policy, step: Step) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """Observation (and mask) of ``step`` (a record on the collector's device) and the policy's
        actions/log-probs on it."""
        mask_t = step.action_mask if self.has_mask else None
        actions, logp = policy.act(step.obs, mask_t)
        return step.obs, actions, logp, mask_t

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
