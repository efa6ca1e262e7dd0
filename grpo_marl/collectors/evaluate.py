"""The one evaluation loop: greedy (by default) episodes, one per seed, for every env kind."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from grpo_marl import stopping
from grpo_marl.collectors.base import episode_metrics
from grpo_marl.groups import AgentGroups
from grpo_marl.policies.base import ActingPolicy
from grpo_marl.vec.base import VecEnv


@torch.inference_mode()  # no autograd bookkeeping at all: nothing computed here is trained on
def evaluate_policy(
    policy: ActingPolicy,
    vec: VecEnv,
    seeds: Sequence[int],
    device: torch.device | str = "cpu",
    deterministic: bool = True,
    max_steps: int | None = None,
    groups: AgentGroups | None = None,
    host: bool = True,
) -> dict[str, float]:
    """Play the first episode of every env of ``vec`` (env ``i`` reset with ``seeds[i]``) and
    return ``eval/...`` metrics: the mean per-agent episode return and its spread over episodes,
    plus per-group and per-agent means for multi-agent envs.

    Greedy evaluations of a policy that offers ``host_actor()`` (an MLP actor on the CPU) run it
    as numpy, several times cheaper per step than a torch call on a few dozen rows
    (:mod:`grpo_marl.policies.host`); ``host=False`` keeps them in torch."""
    if len(seeds) != vec.num_envs:
        raise ValueError(f"evaluation needs one seed per env ({vec.num_envs}), got {len(seeds)}")
    step = vec.reset([int(s) for s in seeds])
    n, a = vec.num_envs, vec.layout.num_agents
    returns = np.zeros((n, a), dtype=np.float64)
    lengths = np.zeros(n, dtype=np.int64)
    cap = max_steps or vec.max_episode_steps or 100_000
    make_host = getattr(policy, "host_actor", None) if deterministic and host else None
    host_actor = make_host() if make_host is not None else None
    for _ in range(cap):
        if step.env_done.all():
            break
        stopping.check()  # a signal abandons the evaluation here (grpo_marl.stopping)
        if host_actor is not None:
            lengths += ~step.env_done
            step = vec.step(host_actor.greedy(step.obs, step.action_mask))
            returns += step.rewards
            continue
        mask = None if step.action_mask is None else torch.as_tensor(step.action_mask, device=device)
        actions, _ = policy.act(torch.as_tensor(step.obs, device=device), mask, deterministic=deterministic)
        lengths += ~step.env_done
        step = vec.step(policy.to_env(actions))
        returns += step.rewards
    out = episode_metrics(
        torch.as_tensor(returns), torch.as_tensor(lengths), vec.agents, groups or policy.groups, "eval"
    )
    out["eval/episodes"] = float(n)
    return out
