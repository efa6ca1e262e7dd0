"""Collectors: play a vector env with the policy and hand the trainer a Batch.

* :class:`~grpo_marl.collectors.episodes.EpisodeCollector`: GRPO's episode groups (``seed``,
  ``state``, ``agent``, ``seed_agent``), all started together (``algo.rollout=batch``);
* :class:`~grpo_marl.collectors.stream.StreamingCollector`: seed groups whose slots restart at
  once (``algo.rollout=stream``);
* :class:`~grpo_marl.collectors.steps.StepCollector`: PPO's fixed horizon of streaming steps;
* :func:`~grpo_marl.collectors.evaluate.evaluate_policy`: the one evaluation loop.

An algorithm names its collector (``Algorithm.collector``); :func:`make_collector` builds it.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from grpo_marl.collectors.base import Collector, HostToDevice
from grpo_marl.collectors.episodes import EpisodeCollector
from grpo_marl.collectors.evaluate import evaluate_policy
from grpo_marl.collectors.steps import StepCollector
from grpo_marl.collectors.stream import StreamingCollector
from grpo_marl.errors import UserInputError
from grpo_marl.groups import AgentGroups
from grpo_marl.policies.base import ActingPolicy
from grpo_marl.vec.base import VecEnv

COLLECTORS = ("episodes", "steps")


def make_collector(
    name: str, vec: VecEnv, groups: AgentGroups, cfg: DictConfig, device: torch.device | str
) -> Collector:
    """The collector ``name`` (``episodes`` or ``steps``) configured from the run config."""
    a = cfg.algo
    dev, seed, env_name = device, int(cfg.seed), str(cfg.env)
    if name == "steps":
        return StepCollector(vec, groups, n_steps=int(a.n_steps), device=dev, seed=seed, env_name=env_name)
    if name != "episodes":
        raise UserInputError(f"unknown collector {name!r}; choose one of {', '.join(COLLECTORS)}")
    max_steps = cfg.vec.max_steps
    if str(a.get("rollout", "batch")) == "stream":
        if str(a.group_mode) != "seed":
            raise UserInputError(
                f"algo.rollout=stream streams seed groups; algo.group_mode={a.group_mode} needs algo.rollout=batch"
            )
        return StreamingCollector(
            vec,
            groups,
            num_groups=int(a.num_groups),
            group_size=int(a.group_size),
            max_steps=max_steps,
            device=dev,
            seed=seed,
            env_name=env_name,
        )
    return EpisodeCollector(
        vec,
        groups,
        num_groups=int(a.num_groups),
        group_size=int(a.group_size),
        mode=str(a.group_mode),
        max_steps=max_steps,
        branch_horizon=int(a.get("branch_horizon", 0) or 0),
        state_reset_frac=float(a.get("state_reset_frac", 0.25)),
        device=dev,
        seed=seed,
        env_name=env_name,
    )


__all__ = [
    "COLLECTORS",
    "Collector",
    "EpisodeCollector",
    "HostToDevice",
    "StepCollector",
    "StreamingCollector",
    "ActingPolicy",
    "evaluate_policy",
    "make_collector",
]
