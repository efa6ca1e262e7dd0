"""Fixed-horizon streaming step collector (the PPO data path).

Each call steps every env of the vector env ``n_steps`` times with the current policy and returns
one :class:`~grpo_marl.batch.Batch` of ``[num_envs, n_steps]`` transitions (every step valid).
Episodes do not restart at update boundaries: the envs, the last observation and the running
episode returns carry over to the next call, as in SB3/CleanRL, so an episode may span several
updates and the critic bootstraps from the observation after the last step.

The vector env has ``SAME_STEP`` autoreset semantics (see :mod:`grpo_marl.vector`): the
observation returned for a finished env is already the first one of its next episode, and the
true last observation is in ``final_obs``. The batch therefore carries ``terminated``,
``truncated`` and ``final_obs`` per step (for SB3-style truncation bootstrapping) and
``next_obs`` ``[num_envs, ...]`` (the observation after step ``n_steps - 1``).

Resume is exact: :meth:`StepCollector.state_dict` snapshots every env (``vec.snapshot``), the
vector env's own RNG (native CartPole draws reset states from it), the last observation and the
per-env episode accumulators.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from grpo_marl.batch import Batch
from grpo_marl.policies.mlp import MLPPolicy
from grpo_marl.rollout import NonFiniteError
from grpo_marl.tasks.gym import register_collector
from grpo_marl.vector import VecEnv


class StepCollector:
    """``n_steps`` steps of every env per call; env state streams across calls."""

    def __init__(
        self,
        vec: VecEnv,
        n_steps: int,
        device: torch.device | str = "cpu",
        seed: int = 0,
        env_name: str = "env",
        stats_window: int = 100,
    ) -> None:
        if n_steps < 1:
            raise ValueError(f"n_steps must be >= 1, got {n_steps}")
        self.vec = vec
        self.n_steps = int(n_steps)
        self.device = torch.device(device)
        self.seed = int(seed)
        self.env_name = env_name
        n = vec.num_envs
        self.obs: np.ndarray | None = None  # observation the next step acts on (None = not reset yet)
        self.ep_return = np.zeros(n, dtype=np.float64)
        self.ep_length = np.zeros(n, dtype=np.int64)
        # Completed-episode statistics over a sliding window (SB3's ep_info_buffer, 100 episodes).
        self.recent_returns: deque[float] = deque(maxlen=stats_window)
        self.recent_lengths: deque[int] = deque(maxlen=stats_window)
        self.total_env_steps = 0
        self._storage: dict[str, Any] | None = None

    # -- storage ---------------------------------------------------------------------------
    def _alloc(self, policy: MLPPolicy) -> dict[str, Any]:
        if self._storage is None:
            t, n = self.n_steps, self.vec.num_envs
            obs_shape = self.vec.single_observation_space.shape
            act_dtype = torch.long if policy.kind == "categorical" else torch.float32
            self._storage = {
                "obs": torch.zeros((t, n, *obs_shape), dtype=torch.float32, device=self.device),
                "actions": torch.zeros((t, n, *policy.action_shape()), dtype=act_dtype, device=self.device),
                "logp": torch.zeros((t, n), dtype=torch.float32, device=self.device),
                "rewards": np.zeros((t, n), dtype=np.float32),
                "terminated": np.zeros((t, n), dtype=bool),
                "truncated": np.zeros((t, n), dtype=bool),
                "final_obs": np.zeros((t, n, *obs_shape), dtype=np.float32),
            }
        return self._storage

    def _reset(self) -> np.ndarray:
        seeds = np.random.default_rng(self.seed).integers(0, 2**31 - 1, size=self.vec.num_envs)
        return np.asarray(self.vec.reset(seeds), dtype=np.float32)

    # -- collection ------------------------------------------------------------------------
    @torch.no_grad()
    def collect(self, policy: MLPPolicy) -> Batch:
        t0 = time.perf_counter()
        st = self._alloc(policy)
        if self.obs is None:
            self.obs = self._reset()
        obs = self.obs
        st["terminated"][:] = False
        st["truncated"][:] = False
        st["final_obs"][:] = 0.0
        finished_returns: list[float] = []
        finished_lengths: list[int] = []
        for t in range(self.n_steps):
            obs_t = torch.as_tensor(obs, device=self.device)
            action, logp = policy.act(obs_t)
            st["obs"][t] = obs_t
            st["actions"][t] = action
            st["logp"][t] = logp
            out = self.vec.step(policy.to_env(action))
            st["rewards"][t] = out.reward
            self.ep_return += out.reward
            self.ep_length += 1
            done = out.terminated | out.truncated
            if done.any():
                st["terminated"][t] = out.terminated
                st["truncated"][t] = out.truncated
                st["final_obs"][t][done] = out.final_obs[done]
                idx = np.flatnonzero(done)
                finished_returns.extend(self.ep_return[idx].tolist())
                finished_lengths.extend(self.ep_length[idx].tolist())
                self.ep_return[idx] = 0.0
                self.ep_length[idx] = 0
            obs = np.asarray(out.obs, dtype=np.float32)
            if not np.isfinite(obs).all():
                bad = np.flatnonzero(~np.isfinite(obs).reshape(len(obs), -1).all(axis=1))
                raise NonFiniteError(
                    f"non-finite observation from env {self.env_name!r} (vector indices {bad.tolist()})"
                )
        self.obs = obs
        if not np.isfinite(st["rewards"]).all():
            raise NonFiniteError(f"non-finite reward from env {self.env_name!r}")
        n, t = self.vec.num_envs, self.n_steps
        self.total_env_steps += n * t
        self.recent_returns.extend(finished_returns)
        self.recent_lengths.extend(finished_lengths)

        def env_major(x: Any) -> torch.Tensor:
            x = torch.as_tensor(x, device=self.device)
            return x.transpose(0, 1).contiguous()

        data = {
            "obs": env_major(st["obs"]),
            "actions": env_major(st["actions"]),
            "logp": env_major(st["logp"]),
            "rewards": env_major(st["rewards"].copy()),
            "mask": torch.ones((n, t), dtype=torch.bool, device=self.device),
            "terminated": env_major(st["terminated"].copy()),
            "truncated": env_major(st["truncated"].copy()),
            "final_obs": env_major(st["final_obs"].copy()),
            "next_obs": torch.as_tensor(obs.copy(), device=self.device),
        }
        metrics = {
            "rollout/steps": float(n * t),
            "rollout/episodes_finished": float(len(finished_returns)),
            "time/collect_s": time.perf_counter() - t0,
        }
        if self.recent_returns:
            r = np.asarray(self.recent_returns)
            metrics.update(
                {
                    "rollout/return_mean": float(r.mean()),
                    "rollout/return_std": float(r.std()),
                    "rollout/return_min": float(r.min()),
                    "rollout/return_max": float(r.max()),
                    "rollout/length_mean": float(np.mean(self.recent_lengths)),
                }
            )
        # Every env is its own "group" of one: PPO does not compare rollouts.
        return Batch(data, group_size=1, metrics=metrics)

    # -- resume ----------------------------------------------------------------------------
    def _vec_rng(self) -> np.random.Generator | None:
        inner = getattr(self.vec, "env", None)
        rng = getattr(inner, "_np_random", None)
        return rng if isinstance(rng, np.random.Generator) else None

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "total_env_steps": self.total_env_steps,
            "ep_return": self.ep_return.copy(),
            "ep_length": self.ep_length.copy(),
            "recent_returns": list(self.recent_returns),
            "recent_lengths": list(self.recent_lengths),
            "obs": None if self.obs is None else self.obs.copy(),
        }
        if self.obs is not None:
            if not self.vec.supports_snapshot:
                raise RuntimeError(
                    f"exact resume needs env snapshots, which {type(self.vec).__name__} cannot take; "
                    "use vec.vectorization=sync (or auto)"
                )
            state["envs"] = [self.vec.snapshot(i) for i in range(self.vec.num_envs)]
            rng = self._vec_rng()
            state["vec_rng"] = None if rng is None else rng.bit_generator.state
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.total_env_steps = int(state["total_env_steps"])
        self.ep_return = np.asarray(state["ep_return"], dtype=np.float64).copy()
        self.ep_length = np.asarray(state["ep_length"], dtype=np.int64).copy()
        self.recent_returns = deque(state["recent_returns"], maxlen=self.recent_returns.maxlen)
        self.recent_lengths = deque(state["recent_lengths"], maxlen=self.recent_lengths.maxlen)
        if state["obs"] is None:
            self.obs = None
            return
        self._reset()  # initialise wrappers/bookkeeping, then overwrite every env's state
        for i, snap in enumerate(state["envs"]):
            self.vec.restore([i], snap)
        rng = self._vec_rng()
        if rng is not None and state.get("vec_rng") is not None:
            rng.bit_generator.state = state["vec_rng"]
        self.obs = np.asarray(state["obs"], dtype=np.float32).copy()


@register_collector("steps")
def _step_collector(task: Any, cfg: DictConfig) -> StepCollector:
    return StepCollector(
        task.vec,
        n_steps=int(cfg.algo.n_steps),
        device=task.device,
        seed=int(cfg.seed),
        env_name=str(cfg.env),
    )
