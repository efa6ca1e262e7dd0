"""Data-parallel helpers: a no-op context for single-process runs, ``torch.distributed`` under torchrun.

Every rank collects its own groups (distinct seeds); gradients are averaged across ranks after
``backward``; metrics are averaged and env steps summed, so logs read the same at any world size.
Only rank 0 writes logs and checkpoints.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable

import torch
from torch import nn


@dataclass
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init() -> DistContext:
    """Join the process group torchrun set up (env:// rendezvous); single process otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext()
    import torch.distributed as tdist

    if not tdist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() and os.environ.get("GRPO_MARL_BACKEND") != "gloo" else "gloo"
        tdist.init_process_group(backend=backend)
    return DistContext(tdist.get_rank(), tdist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def _device(ctx: DistContext) -> torch.device:
    import torch.distributed as tdist

    return torch.device("cuda", ctx.local_rank) if tdist.get_backend() == "nccl" else torch.device("cpu")


def broadcast_parameters(modules: Iterable[nn.Module], ctx: DistContext) -> None:
    """Start every rank from rank 0's weights (and buffers, e.g. observation statistics)."""
    if not ctx.enabled:
        return
    import torch.distributed as tdist

    for m in modules:
        for t in list(m.parameters()) + list(m.buffers()):
            tdist.broadcast(t.data, src=0)


def average_gradients(params: list[torch.Tensor], ctx: DistContext) -> None:
    """All-reduce (mean) every gradient in one flat buffer: one collective per minibatch."""
    if not ctx.enabled:
        return
    import torch.distributed as tdist

    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    tdist.all_reduce(flat)
    flat /= ctx.world_size
    offset = 0
    for p, g in zip(params, grads):
        n = g.numel()
        chunk = flat[offset : offset + n].view_as(g)
        if p.grad is None:
            p.grad = chunk.clone()
        else:
            p.grad.copy_(chunk)
        offset += n


def sum_int(value: int, ctx: DistContext) -> int:
    if not ctx.enabled:
        return int(value)
    import torch.distributed as tdist

    t = torch.tensor([float(value)], dtype=torch.float64, device=_device(ctx))
    tdist.all_reduce(t)
    return int(t.item())


def any_flag(flag: bool, ctx: DistContext) -> bool:
    if not ctx.enabled:
        return bool(flag)
    import torch.distributed as tdist

    t = torch.tensor([1.0 if flag else 0.0], device=_device(ctx))
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    return bool(t.item() > 0)


def mean_metrics(metrics: dict[str, float], ctx: DistContext) -> dict[str, float]:
    """Average metrics over ranks (keys present on every rank; rank-local extras pass through)."""
    if not ctx.enabled:
        return metrics
    import torch.distributed as tdist

    keys = sorted(metrics)
    gathered: list[list[str]] = [None] * ctx.world_size  # type: ignore[list-item]
    tdist.all_gather_object(gathered, keys)
    common = sorted(set.intersection(*(set(k) for k in gathered)))
    if not common:
        return metrics
    t = torch.tensor([float(metrics[k]) for k in common], dtype=torch.float64, device=_device(ctx))
    tdist.all_reduce(t)
    t /= ctx.world_size
    out = dict(metrics)
    out.update({k: float(v) for k, v in zip(common, t.tolist())})
    return out
