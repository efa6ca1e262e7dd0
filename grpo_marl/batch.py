"""The rollout batch every collector produces and every algorithm consumes.

All per-step tensors are laid out ``[B, T, ...]``: B rollouts (group members are contiguous, so
``[B, T] -> [groups, G, T]`` is a reshape) and T steps or tokens, with ``mask[B, T]`` marking the
valid ones. Keeping the rollout axis lets sequence-level losses (GRPO aggregation, GSPO) and
group-relative advantages work on the same storage that step-level minibatching flattens.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass
class Batch:
    data: dict[str, Tensor]
    group_size: int
    metrics: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in ("mask", "rewards", "logp"):
            if key not in self.data:
                raise KeyError(f"Batch needs a {key!r} tensor")
        b = self.mask.shape[0]
        if b % self.group_size:
            raise ValueError(f"{b} rollouts do not split into groups of {self.group_size}")

    # -- views -----------------------------------------------------------------------------
    @property
    def mask(self) -> Tensor:
        return self.data["mask"]

    @property
    def rewards(self) -> Tensor:
        return self.data["rewards"]

    @property
    def num_rollouts(self) -> int:
        return self.mask.shape[0]

    @property
    def num_groups(self) -> int:
        return self.num_rollouts // self.group_size

    @property
    def num_steps(self) -> int:
        return int(self.mask.sum().item())

    def grouped(self, key: str) -> Tensor:
        """``[B, T, ...] -> [groups, G, T, ...]`` view of one tensor."""
        x = self.data[key]
        return x.reshape(self.num_groups, self.group_size, *x.shape[1:])

    def __getitem__(self, key: str) -> Tensor:
        return self.data[key]

    def __setitem__(self, key: str, value: Tensor) -> None:
        self.data[key] = value

    def __contains__(self, key: str) -> bool:
        return key in self.data

    # -- transforms ------------------------------------------------------------------------
    def select_groups(self, keep: Tensor) -> Batch:
        """Keep only the groups where ``keep[groups]`` is true (e.g. drop zero-variance groups)."""
        rows = keep.repeat_interleave(self.group_size)
        return Batch({k: v[rows] for k, v in self.data.items()}, self.group_size, dict(self.metrics))

    @staticmethod
    def cat(batches: list[Batch]) -> Batch:
        """Concatenate along the rollout axis, right-padding the time axis (mask False)."""
        if len(batches) == 1:
            return batches[0]
        g = batches[0].group_size
        t_max = max(b.mask.shape[1] for b in batches)
        out: dict[str, Tensor] = {}
        for key in batches[0].data:
            parts = []
            for b in batches:
                x = b.data[key]
                if x.dim() >= 2 and x.shape[1] < t_max:
                    pad = x.new_zeros((x.shape[0], t_max - x.shape[1], *x.shape[2:]))
                    x = torch.cat([x, pad], 1)
                parts.append(x)
            out[key] = torch.cat(parts, 0)
        return Batch(out, g, dict(batches[-1].metrics))

    def flatten(self, keys: list[str]) -> dict[str, Tensor]:
        """The valid steps of ``keys`` as flat ``[M, ...]`` tensors (step-level minibatching)."""
        m = self.mask
        return {k: self.data[k][m] for k in keys}


def minibatch_indices(
    n: int, num_minibatches: int, generator: torch.Generator | None = None, device: torch.device | None = None
) -> Iterator[Tensor]:
    """Shuffled index chunks covering ``range(n)`` once (sizes differ by at most one)."""
    perm = torch.randperm(n, generator=generator)
    if device is not None:
        perm = perm.to(device)
    yield from torch.chunk(perm, max(1, min(num_minibatches, n)))
