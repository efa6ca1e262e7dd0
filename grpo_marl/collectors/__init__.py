"""Collectors: play a vector env with the policy and hand the trainer a Batch.

* :class:`~grpo_marl.collectors.episodes.EpisodeCollector`: GRPO's episode groups (``seed``,
  ``agent``, ``seed_agent``), all started together (``algo.rollout=batch``);
* :class:`~grpo_marl.collectors.states.StateGroupCollector`: its subclass for group modes that
  branch from env snapshots (``state``); :func:`episode_collector` picks one by the mode;
* :class:`~grpo_marl.collectors.stream.StreamingCollector`: seed groups whose slots restart at
  once (``algo.rollout=stream``);
* :class:`~grpo_marl.collectors.steps.StepCollector`: PPO's fixed horizon of streaming steps;
* :func:`~grpo_marl.collectors.evaluate.evaluate_policy`: the one evaluation loop.

An algorithm names its collector (``Algorithm.collector``); :func:`make_collector` builds it.
"""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig

from grpo_marl.collectors.base import Collector, HostToDevice
from grpo_marl.collectors.episodes import EpisodeCollector
from grpo_marl.collectors.evaluate import evaluate_policy
from grpo_marl.collectors.states import StateGroupCollector
from grpo_marl.collectors.steps import StepCollector
from grpo_marl.collectors.stream import StreamingCollector
from grpo_marl.errors import UserInputError
from grpo_marl.groups import AgentGroups, group_mode
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
    if str(a.rollout) == "stream":
        if not group_mode(str(a.group_mode)).streams:
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
    return episode_collector(
        vec,
        groups,
        num_groups=int(a.num_groups),
        group_size=int(a.group_size),
        mode=str(a.group_mode),
        max_steps=max_steps,
        branch_horizon=int(a.branch_horizon),
        state_reset_frac=float(a.state_reset_frac),
        device=dev,
        seed=seed,
        env_name=env_name,
    )


def episode_collector(
    vec: VecEnv,
    groups: AgentGroups,
    num_groups: int,
    group_size: int,
    *,
    mode: str = "seed",
    branch_horizon: int = 0,
    state_reset_frac: float = 0.25,
    **kwargs: Any,
) -> EpisodeCollector:
    """The episode collector of group mode ``mode``: :class:`StateGroupCollector` for a mode that
    starts members from snapshots (``state``), else :class:`EpisodeCollector`. ``kwargs`` are the
    collectors' common arguments (``device``, ``seed``, ``max_steps``, ``env_name``, ``host``)."""
    if group_mode(mode).snapshots:
        return StateGroupCollector(
            vec,
            groups,
            num_groups,
            group_size,
            mode=mode,
            branch_horizon=branch_horizon,
            state_reset_frac=state_reset_frac,
            **kwargs,
        )
    return EpisodeCollector(vec, groups, num_groups, group_size, mode=mode, **kwargs)


__all__ = [
    "COLLECTORS",
    "Collector",
    "EpisodeCollector",
    "StateGroupCollector",
    "HostToDevice",
    "StepCollector",
    "StreamingCollector",
    "ActingPolicy",
    "episode_collector",
    "evaluate_policy",
    "make_collector",
]
