"""Group collectors for single-agent vector envs (the GRPO data path).

``seed`` groups: G envs reset with the same seed start from the same state; each runs one episode
with the current policy. ``state`` groups: G envs restored from one snapshot of a state visited
in the previous collection; each branch runs ``branch_horizon`` steps (or to the episode's end).
Snapshots come from the previous collection's own trajectories, so branching costs no extra
"trunk" steps and, over iterations, start states move through the whole episode.

The hot loop does one batched policy call and one vector-env step per time step, writing into
storage preallocated as ``[T, N, ...]`` (no per-env Python work except for the few snapshots).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from grpo_marl.batch import Batch
from grpo_marl.policies.mlp import MLPPolicy
from grpo_marl.vector import VecEnv


class NonFiniteError(RuntimeError):
    """An observation, reward or loss was NaN/inf: training stops, the last checkpoint is kept."""


class HostToDevice:
    """Host array -> device tensor without a host-side synchronisation in the hot loop.

    On CUDA the array is staged in one reused pinned buffer and copied with ``non_blocking``
    (a pageable ``as_tensor(..., device=cuda)`` waits for the copy, and for every kernel queued
    before it). A CUDA event guards the buffer: it is rewritten only once its last copy finished,
    which in the collector is already true (the action's ``.cpu()`` of the previous step waited).
    Elsewhere this is exactly ``torch.as_tensor(array, device=device)``.
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._buf: torch.Tensor | None = None
        self._event: Any = None

    def __call__(self, array: np.ndarray) -> torch.Tensor:
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


class EpisodeCollector:
    """Collects ``num_groups x group_size`` rollouts per call. See the module docstring."""

    def __init__(
        self,
        vec: VecEnv,
        num_groups: int,
        group_size: int,
        mode: str = "seed",
        device: torch.device | str = "cpu",
        seed: int = 0,
        max_steps: int | None = None,
        branch_horizon: int = 0,
        state_reset_frac: float = 0.25,
        env_name: str = "env",
    ) -> None:
        if mode not in ("seed", "state"):
            raise ValueError(f"group_mode must be 'seed' or 'state' for single-agent envs, got {mode!r}")
        if vec.num_envs != num_groups * group_size:
            raise ValueError(f"vector env has {vec.num_envs} envs, need num_groups*group_size")
        if mode == "state" and not vec.supports_snapshot:
            raise ValueError(
                f"group_mode=state needs env snapshots, which {type(vec).__name__} cannot take; "
                "set env.vectorization=sync"
            )
        self.vec = vec
        self.num_groups = num_groups
        self.group_size = group_size
        self.mode = mode
        self.device = torch.device(device)
        self.rng = np.random.default_rng(seed)
        self.env_name = env_name
        cap = max_steps or vec.max_episode_steps
        if cap is None:
            raise ValueError("the env has no max_episode_steps; set env.max_steps")
        self.max_steps = int(cap)
        self.horizon = int(branch_horizon) if (mode == "state" and branch_horizon) else self.max_steps
        self.state_reset_frac = state_reset_frac
        self.archive: list[tuple[Any, np.ndarray]] = []
        self.prev_len = float(min(self.max_steps, 50))
        self.total_env_steps = 0
        self._storage: dict[str, torch.Tensor] | None = None
        self._to_device = HostToDevice(self.device)

    # -- storage ---------------------------------------------------------------------------
    def _alloc(self, policy: MLPPolicy) -> dict[str, torch.Tensor]:
        if self._storage is None:
            n, t = self.vec.num_envs, self.horizon
            obs_shape = self.vec.single_observation_space.shape
            act_shape = policy.action_shape()
            act_dtype = torch.long if policy.kind == "categorical" else torch.float32
            self._storage = {
                "obs": torch.zeros((t, n, *obs_shape), dtype=torch.float32, device=self.device),
                "actions": torch.zeros((t, n, *act_shape), dtype=act_dtype, device=self.device),
                "logp": torch.zeros((t, n), dtype=torch.float32, device=self.device),
                "rewards": np.zeros((t, n), dtype=np.float32),
                "mask": np.zeros((t, n), dtype=bool),
            }
        return self._storage

    # -- collection ------------------------------------------------------------------------
    def _start(self) -> tuple[np.ndarray, np.ndarray]:
        """Reset all envs (members share a seed) and restore archived states into some groups."""
        g, n = self.group_size, self.vec.num_envs
        seeds = self.rng.integers(0, 2**31 - 1, size=self.num_groups)
        obs = self.vec.reset(np.repeat(seeds, g))
        from_reset = np.ones(self.num_groups, dtype=bool)
        if self.mode == "state" and self.archive:
            n_restore = int(round(self.num_groups * (1.0 - self.state_reset_frac)))
            picks = self.rng.integers(0, len(self.archive), size=n_restore)
            for grp, k in zip(range(n_restore), picks):
                snap, snap_obs = self.archive[k]
                members = np.arange(grp * g, (grp + 1) * g)
                self.vec.restore(members, snap)
                obs[members] = snap_obs
                from_reset[grp] = False
        return obs, from_reset

    @torch.no_grad()
    def collect(self, policy: MLPPolicy) -> Batch:
        t0 = time.perf_counter()
        st = self._alloc(policy)
        obs, from_reset = self._start()
        n, g = self.vec.num_envs, self.group_size
        alive = np.ones(n, dtype=bool)
        st["mask"][:] = False
        st["rewards"][:] = 0.0
        # State mode: each group's leader offers one snapshot at a random time of this rollout.
        snap_at = (
            self.rng.integers(1, max(2, int(self.prev_len)), size=self.num_groups)
            if self.mode == "state"
            else None
        )
        new_archive: list[tuple[Any, np.ndarray]] = []
        t = 0
        while t < self.horizon and alive.any():
            if not np.isfinite(obs).all():
                bad = np.flatnonzero(~np.isfinite(obs).all(axis=tuple(range(1, obs.ndim))))
                raise NonFiniteError(
                    f"non-finite observation from env {self.env_name!r} (vector indices {bad.tolist()}) "
                    f"at step {t} of the rollout"
                )
            obs_t = self._to_device(obs)
            action, logp = policy.act(obs_t)
            st["obs"][t] = obs_t
            st["actions"][t] = action
            st["logp"][t] = logp
            st["mask"][t] = alive
            out = self.vec.step(policy.to_env(action))
            st["rewards"][t] = out.reward
            alive = alive & ~(out.terminated | out.truncated)
            obs = out.obs
            t += 1
            if snap_at is not None:
                for grp in np.flatnonzero(snap_at == t):
                    leader = grp * g
                    if alive[leader]:
                        new_archive.append((self.vec.snapshot(leader), obs[leader].copy()))
        if self.mode == "state" and new_archive:
            self.archive = new_archive
        if not np.isfinite(st["rewards"][:t]).all():
            raise NonFiniteError(f"non-finite reward from env {self.env_name!r}")

        mask = torch.as_tensor(st["mask"][:t].T.copy(), device=self.device)
        rewards = torch.as_tensor(st["rewards"][:t].T.copy(), device=self.device) * mask
        steps = int(mask.sum())
        # Env steps count the transitions of real episodes (what sample efficiency means); the
        # vector env also stepped finished slots, which `rollout/vector_utilization` reports.
        self.total_env_steps += steps
        lengths = mask.sum(1).float()
        self.prev_len = float(lengths.mean())
        returns = rewards.sum(1)
        data = {
            "obs": st["obs"][:t].transpose(0, 1).contiguous(),
            "actions": st["actions"][:t].transpose(0, 1).contiguous(),
            "logp": st["logp"][:t].transpose(0, 1).contiguous(),
            "rewards": rewards,
            "mask": mask,
        }
        # Whole episodes: started from a reset and ended (not cut by the branch horizon).
        full = torch.as_tensor(np.repeat(from_reset, g) & ~alive, device=self.device)
        metrics = {
            "rollout/steps": float(steps),
            "rollout/length_mean": float(lengths.mean()),
            "rollout/vector_utilization": steps / max(t * n, 1),
            "rollout/rollout_return_mean": float(returns.mean()),
            "time/collect_s": time.perf_counter() - t0,
        }
        if bool(full.any()):
            ep = returns[full]
            metrics.update(
                {
                    "rollout/return_mean": float(ep.mean()),
                    "rollout/return_std": float(ep.std(unbiased=False)),
                    "rollout/return_min": float(ep.min()),
                    "rollout/return_max": float(ep.max()),
                }
            )
        if self.mode == "state":
            metrics["rollout/frac_restored_groups"] = float((~from_reset).mean())
        return Batch(data, group_size=g, metrics=metrics)

    # -- resume ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "rng": self.rng.bit_generator.state,
            "archive": self.archive,
            "prev_len": self.prev_len,
            "total_env_steps": self.total_env_steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.archive = state["archive"]
        self.prev_len = state["prev_len"]
        self.total_env_steps = state["total_env_steps"]


@torch.no_grad()
def evaluate_policy(
    policy: MLPPolicy,
    vec: VecEnv,
    seeds: np.ndarray,
    device: torch.device | str = "cpu",
    deterministic: bool = True,
    max_steps: int | None = None,
) -> np.ndarray:
    """Return of the first episode of every env in ``vec`` (one per seed), greedy by default."""
    obs = vec.reset(seeds)
    n = vec.num_envs
    returns = np.zeros(n, dtype=np.float64)
    alive = np.ones(n, dtype=bool)
    cap = max_steps or vec.max_episode_steps or 10_000
    for _ in range(cap):
        action, _ = policy.act(torch.as_tensor(obs, device=device), deterministic=deterministic)
        out = vec.step(policy.to_env(action))
        returns += out.reward * alive
        alive &= ~(out.terminated | out.truncated)
        obs = out.obs
        if not alive.any():
            break
    return returns
