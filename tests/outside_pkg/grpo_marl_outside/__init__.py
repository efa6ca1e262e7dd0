"""A user's package that extends grpo_marl without editing it (tests/test_outside_pkg.py).

It lives outside ``grpo_marl/`` and reaches the framework only through its public extension
points: a loss variant (CISPO) and a token aggregation, registered by the entry points in
``grpo_marl_outside-0.1.dist-info/entry_points.txt`` (what ``pip install`` of a package declaring
``[project.entry-points."grpo_marl.losses"]`` writes), so ``algo.loss=cispo`` works from the CLI
and ``fit()`` once this directory is on the path.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from grpo_marl.groups import AgentGroups, GroupMode
from grpo_marl.losses import GRPOLoss

__all__ = ["HALVES", "CISPOLoss", "HalfGroups", "row_mean"]


class CISPOLoss(GRPOLoss):
    """CISPO (MiniMax-M1, 2025): REINFORCE weighted by a clipped, detached importance ratio.

    Per token ``objective = sg(clamp(r, 1 - eps_low, 1 + eps_high)) * A * logp``. Unlike the
    clipped surrogate, no token's gradient is dropped: clipping bounds the IS weight instead of
    zeroing the gradient of tokens outside the trust region. At ``r = 1`` its gradient equals the
    GRPO surrogate's. Only the :meth:`policy_objective` hook is overridden.
    """

    def policy_objective(self, logp: Tensor, log_ratio: Tensor, advantages: Tensor) -> Tensor:
        weight = torch.clamp(torch.exp(log_ratio), 1.0 - self.clip_eps_low, 1.0 + self.clip_eps_high).detach()
        return weight * advantages * logp


def row_mean(mask: Tensor, max_len: int | None) -> Tensor:
    """Every row (episode / completion) counts equally, its steps averaged: ``mask / (B * len_b)``.

    (The built-in ``grpo`` mode's weights; registered under another name to prove that a user's
    aggregation is accepted by ``algo.aggregation`` and used by the loss.)"""
    lengths = mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    return mask / (lengths * max(mask.shape[0], 1))


class HalfGroups(GroupMode):
    """Seed groups split in two: the first and second halves of each seed-group's G copies are two
    GRPO groups of G/2 (the same start state, two smaller baselines). A group mode of another shape
    than the three built-in layouts: it overrides :meth:`arrange` only."""

    def arrange(self, num_seed_groups: int, group_size: int, groups: AgentGroups) -> np.ndarray:
        if group_size % 2:
            raise ValueError(f"algo.group_mode={self.name} needs an even algo.group_size, got {group_size}")
        seed_groups = super().arrange(num_seed_groups, group_size, groups)  # [S * A, G]
        return seed_groups.reshape(-1, group_size // 2)


#: registered as ``algo.group_mode=halves`` by the ``grpo_marl.group_modes`` entry point
HALVES = HalfGroups("halves", "each seed group's copies split into two groups of G/2")
