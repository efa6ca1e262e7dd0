"""Task glue for single-agent Gymnasium envs: vector env + MLP policy + collector + evaluation."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch
from omegaconf import DictConfig
from torch import Tensor

from grpo_marl.batch import Batch
from grpo_marl.tasks.base import CollectorTask
from grpo_marl.policies.mlp import MLPPolicy
from grpo_marl.registry import EnvSpec
from grpo_marl.rollout import EpisodeCollector, evaluate_policy
from grpo_marl.rollout_stream import StreamingEpisodeCollector
from grpo_marl.vector import VecEnv, make_vec_env

# name -> factory(task, cfg) building a collector; PPO registers its step collector here.
COLLECTORS: dict[str, Callable[["GymTask", DictConfig], Any]] = {}


def register_collector(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        COLLECTORS[name] = fn
        return fn

    return decorator


@register_collector("episodes")
def _episode_collector(task: "GymTask", cfg: DictConfig) -> EpisodeCollector | StreamingEpisodeCollector:
    a = cfg.algo
    if str(a.get("rollout", "batch")) == "stream":
        return StreamingEpisodeCollector(
            task.vec,
            num_groups=int(a.num_groups),
            group_size=int(a.group_size),
            device=task.device,
            seed=int(cfg.seed),
            max_steps=cfg.vec.max_steps,
            env_name=str(cfg.env),
        )
    return EpisodeCollector(
        task.vec,
        num_groups=int(a.num_groups),
        group_size=int(a.group_size),
        mode=str(a.group_mode),
        device=task.device,
        seed=int(cfg.seed),
        max_steps=cfg.vec.max_steps,
        branch_horizon=int(a.get("branch_horizon", 0)),
        state_reset_frac=float(a.get("state_reset_frac", 0.25)),
        env_name=str(cfg.env),
    )


class GymTask(CollectorTask):
    """Everything env-specific the trainer needs for a single-agent Gymnasium env."""

    minibatch_by = "step"
    input_keys = ("obs", "actions")

    def __init__(self, cfg: DictConfig, spec: EnvSpec, device: torch.device, collector: str = "episodes") -> None:
        self.cfg = cfg
        self.spec = spec
        self.device = device
        self.env_kwargs = dict(cfg.env_kwargs or {})
        self.vec: VecEnv = make_vec_env(spec, int(cfg.vec.num_envs), self.env_kwargs, str(cfg.vec.vectorization))
        p = cfg.policy
        self.policy = MLPPolicy(
            self.vec.single_observation_space,
            self.vec.single_action_space,
            hidden=tuple(p.hidden),
            activation=str(p.activation),
            log_std_init=float(p.log_std_init),
            normalize_obs=bool(p.normalize_obs),
        ).to(device)
        if collector not in COLLECTORS:
            raise ValueError(f"unknown collector {collector!r}; registered: {sorted(COLLECTORS)}")
        self.collector = COLLECTORS[collector](self, cfg)
        self._eval_vec: VecEnv | None = None

    @property
    def env_steps(self) -> int:
        return int(self.collector.total_env_steps)

    def set_env_steps(self, steps: int) -> None:
        self.collector.total_env_steps = int(steps)

    def collect(self, policy: MLPPolicy) -> Batch:
        return self.collector.collect(policy)

    def log_prob(self, policy: MLPPolicy, mb: dict[str, Tensor], need_entropy: bool = True) -> tuple[Tensor, Tensor | None]:
        logp, entropy = policy.log_prob(mb["obs"], mb["actions"])
        return logp, entropy if need_entropy else None

    def end_update(self, batch: Batch) -> None:
        """Update observation statistics *after* the update, so old and new log-probs of this
        batch were computed with the same normaliser (the surrogate ratio stays exact)."""
        if self.policy.obs_norm is not None:
            self.policy.obs_norm.update(batch["obs"][batch.mask])

    def evaluate(self, policy: MLPPolicy, episodes: int, seed_offset: int = 0) -> dict[str, float]:
        if self._eval_vec is None or self._eval_vec.num_envs != episodes:
            if self._eval_vec is not None:
                self._eval_vec.close()
            self._eval_vec = make_vec_env(self.spec, episodes, self.env_kwargs, str(self.cfg.vec.vectorization))
        seeds = 1_000_000 + 1000 * int(self.cfg.seed) + seed_offset + np.arange(episodes)
        returns = evaluate_policy(
            policy, self._eval_vec, seeds, self.device, deterministic=bool(self.cfg.eval.deterministic)
        )
        return {
            "eval/return_mean": float(returns.mean()),
            "eval/return_std": float(returns.std()),
            "eval/return_min": float(returns.min()),
            "eval/return_max": float(returns.max()),
            "eval/episodes": float(episodes),
        }
