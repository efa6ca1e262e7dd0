"""GRPO groups for multi-agent rollouts: which agent-trajectories are compared with which.

A multi-agent collection runs ``E = S * G`` envs (``S`` seed-groups of ``G`` envs reset from the
same joint initial state; seed-group members are contiguous envs) with ``A`` agents each. Every
(env, agent) pair is one *rollout*, numbered ``r = e * A + a``. A grouping picks sets of rollouts
whose returns are comparable:

* ``seed``: the same agent across the ``G`` copies of one initial state -> ``S * A`` groups of
  ``G``. Works for every reward structure, including a team reward shared by all agents.
* ``agent``: the members of one agent-group inside one episode -> ``E * n_groups`` groups of
  ``|group|``. Needs *individual* rewards: with a team reward every member of the group has the
  same return, every group has zero variance, and the advantage is 0 everywhere (no signal).
  Members also start from different positions, so the comparison is noisier than ``seed``.
* ``seed_agent`` (the product): an agent-group's members across the ``G`` copies ->
  ``S * n_groups`` groups of ``G * |group|``. A larger baseline; with a team reward it carries the
  same signal as ``seed`` (between copies), diluted by duplicate members.

Agent-groups of different sizes give groups of different sizes; shorter groups are padded with
``-1`` (an invalid member that holds no steps) so that every group has the same width and the
Batch stays a plain ``[groups * width, T]`` reshape.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from grpo_marl.marl.groups import AgentGroups

GROUPINGS: tuple[str, ...] = ("seed", "agent", "seed_agent")


def arrange_groups(
    grouping: str,
    num_seed_groups: int,
    group_size: int,
    groups: AgentGroups,
) -> np.ndarray:
    """Rollout ids ``[num_grpo_groups, width]`` (``-1`` = padding) for one collection.

    Args:
        grouping: one of :data:`GROUPINGS`.
        num_seed_groups: ``S``, seed-groups per collection.
        group_size: ``G``, envs per seed-group (1 is fine for ``agent``).
        groups: the env's agent-groups (agent order = rollout order within an env).
    """
    if grouping not in GROUPINGS:
        raise ValueError(f"unknown marl grouping {grouping!r}; choose one of {', '.join(GROUPINGS)}")
    n_agents = len(groups.agents)
    pos = {a: i for i, a in enumerate(groups.agents)}
    slots = {g: [pos[a] for a in spec.agents] for g, spec in groups.specs.items()}
    rows: list[list[int]] = []
    if grouping == "seed":
        for s in range(num_seed_groups):
            for a in range(n_agents):
                rows.append([(s * group_size + m) * n_agents + a for m in range(group_size)])
    elif grouping == "agent":
        for e in range(num_seed_groups * group_size):
            for g in groups.names:
                rows.append([e * n_agents + a for a in slots[g]])
    else:
        for s in range(num_seed_groups):
            for g in groups.names:
                rows.append(
                    [(s * group_size + m) * n_agents + a for m in range(group_size) for a in slots[g]]
                )
    width = max(len(r) for r in rows)
    out = np.full((len(rows), width), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def team_reward_fraction(rewards: Tensor, mask: Tensor, tol: float = 1e-8) -> float:
    """Fraction of (env, step) pairs whose alive agents all got the same reward.

    ``rewards``/``mask`` are ``[E, A, T]``. 1.0 means a pure team reward, where the ``agent``
    grouping carries no signal (see the module docstring).
    """
    inf = torch.tensor(float("inf"), dtype=rewards.dtype)
    hi = torch.where(mask, rewards, -inf).amax(1)
    lo = torch.where(mask, rewards, inf).amin(1)
    any_alive = mask.any(1)
    if not bool(any_alive.any()):
        return 0.0
    equal = (hi - lo) <= tol
    return float(equal[any_alive].float().mean())


def agent_group_returns(
    returns: Tensor, member_ids: np.ndarray
) -> tuple[Tensor, Tensor]:
    """Gather per-rollout returns ``[E * A]`` into ``[groups, width]`` plus the validity mask."""
    ids = torch.as_tensor(member_ids)
    valid = ids >= 0
    gathered = returns[ids.clamp(min=0)]
    return torch.where(valid, gathered, torch.zeros_like(gathered)), valid


def agent_group_advantages(
    returns: Tensor,
    grouping: str,
    num_seed_groups: int,
    group_size: int,
    groups: AgentGroups,
    scale: str = "group",
    eps: float = 1e-6,
) -> Tensor:
    """Outcome advantages of every rollout (``returns[E * A]``, rollout ``e * A + a``) under
    ``grouping``; returns ``[E * A]`` in rollout order. Built on ``group_advantages`` so the
    multi-agent path normalizes exactly like the single-agent one."""
    from grpo_marl.advantages import group_advantages

    ids = arrange_groups(grouping, num_seed_groups, group_size, groups)
    grouped, valid = agent_group_returns(returns, ids)
    adv = group_advantages(grouped, scale=scale, eps=eps, mask=valid)
    out = torch.zeros_like(returns, dtype=adv.dtype)
    flat_ids = torch.as_tensor(ids).reshape(-1)
    keep = flat_ids >= 0
    out[flat_ids[keep]] = adv.reshape(-1)[keep]
    return out
