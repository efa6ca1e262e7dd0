"""The one evaluation loop: greedy (by default) episodes, one per seed, for every env kind."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from grpo_marl import stopping
from grpo_marl.collectors.base import env_actions, episode_metrics
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
    (:mod:`grpo_marl.policies.host`) when the env computes in numpy; ``host=False``, and a torch
    env (``vec.backend == "torch"``), keep them in torch on the env's device."""
    if len(seeds) != vec.num_envs:
        raise ValueError(f"evaluation needs one seed per env ({vec.num_envs}), got {len(seeds)}")
    step = vec.reset([int(s) for s in seeds])
    n, a = vec.num_envs, vec.layout.num_agents
    # accumulated where the env's records live: a torch env on an accelerator is never read back per step
    returns = torch.zeros((n, a), dtype=torch.float64, device=vec.device)
    lengths = torch.zeros(n, dtype=torch.long, device=vec.device)
    cap = max_steps or vec.max_episode_steps or 100_000
    on_host = deterministic and host and vec.backend == "numpy"  # a torch env's records stay tensors
    make_host = getattr(policy, "host_actor", None) if on_host else None
    host_actor = make_host() if make_host is not None else None
    if host_actor is not None:  # numpy views of the CPU records and accumulators
        returns_v, lengths_v = returns.numpy(), lengths.numpy()
        for _ in range(cap):
            rec = step.numpy()  # a numpy env's own arrays: free
            if rec.env_done.all():
                break
            stopping.check()  # a signal abandons the evaluation here (grpo_marl.stopping)
            lengths_v += ~rec.env_done
            step = vec.step(torch.from_numpy(host_actor.greedy(rec.obs, rec.action_mask)))
            returns_v += step.numpy().rewards
    else:
        dev = torch.device(device)
        for _ in range(cap):
            if bool(step.env_done.all()):
                break
            stopping.check()
            mask = None if step.action_mask is None else step.action_mask.to(dev)
            actions, _ = policy.act(step.obs.to(dev), mask, deterministic=deterministic)
            lengths += ~step.env_done
            step = vec.step(env_actions(policy, actions, vec.device))
            returns += step.rewards
    out = episode_metrics(returns.cpu(), lengths.cpu(), vec.agents, groups or policy.groups, "eval")
    out["eval/episodes"] = float(n)
    return out
