"""Data parallelism under torchrun: one process per rank, DistributedDataParallel for the gradients.

``torchrun --nproc_per_node=N -m grpo_marl.train env=...`` runs N copies of the trainer. Each rank
collects its own rollouts with its own seeds and trains on them; DDP averages the gradients, so
every rank takes the same optimizer step and the weights stay identical. Single-process runs never
touch ``torch.distributed`` (every helper here is a no-op for them).

Semantics (documented in the README): ``total_steps`` and the batch sizes in the config are
*global*. Each rank collects ``1/N`` of them (:func:`rank_config` divides ``algo.num_groups`` for
GRPO, ``algo.n_envs`` for PPO/MAPPO/IPPO — each algorithm declares its ``split_keys`` — and
``total_steps``), so N ranks do the same amount of work per
update as one process and finish in ~1/N of the collection time; env steps are summed over ranks
and metrics averaged, so logs read the same at any N. Only rank 0 writes files.

Why DDP wraps the *loss* rather than the policy: the Task protocol scores actions with
``task.log_prob(policy, mb)``, which calls policy methods (``log_prob``,
``completion_logprobs``, ``preprocess`` for PPO's critic) rather than ``forward``, and DDP only
arms its gradient hooks inside its own ``forward``. :class:`DataParallel` therefore wraps one
module that owns every trained module and whose ``forward`` is the algorithm's whole loss
(``algo.loss(mb)`` -> ``task.log_prob`` -> the policy): DDP sees all parameters, its hooks fire in
``backward`` and overlap the all-reduce with the backward pass, and no Task or algorithm needs
to know it runs distributed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from omegaconf import DictConfig, OmegaConf, open_dict
from torch import nn

if TYPE_CHECKING:
    from torch.nn.parallel import DistributedDataParallel

#: Environment variable: a directory where every rank writes ``rank<r>.json`` with a hash of its
#: trained parameters at the end of a run (tests use it to check that ranks stayed identical).
PARAM_HASH_ENV = "GRPO_MARL_DEBUG_PARAM_HASH"

#: Rank ``r`` seeds its collector and sampling RNGs with ``seed + SEED_STRIDE * r``.
SEED_STRIDE = 1000


@dataclass
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str = ""

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def env_world_size() -> int:
    """World size torchrun announced (1 outside torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def env_rank() -> int:
    return int(os.environ.get("RANK", "0") or 0)


def choose_backend(requested: str = "auto") -> str:
    """``auto``: gloo for CPU tensors plus NCCL for CUDA tensors when CUDA exists (one process
    group serves CPU metrics and GPU gradients), plain gloo otherwise. ``GRPO_MARL_BACKEND``
    overrides the config."""
    requested = os.environ.get("GRPO_MARL_BACKEND", requested) or "auto"
    if requested != "auto":
        return requested
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def init(backend: str = "auto") -> DistContext:
    """Join the process group torchrun set up (env:// rendezvous); single process otherwise.

    Idempotent: ``train.py`` calls it before the trainer (to share rank 0's run dir) and the
    trainer calls it again.
    """
    world = env_world_size()
    if world <= 1:
        return DistContext()
    import torch.distributed as tdist

    local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    if not tdist.is_initialized():
        backend = choose_backend(backend)
        if "nccl" in backend and local_rank < torch.cuda.device_count():
            torch.cuda.set_device(local_rank)  # NCCL needs each rank on its own device
        timeout = timedelta(seconds=float(os.environ.get("GRPO_MARL_DIST_TIMEOUT", "1800")))
        tdist.init_process_group(backend=backend, timeout=timeout)
    return DistContext(tdist.get_rank(), tdist.get_world_size(), local_rank, str(tdist.get_backend()))


def shutdown() -> None:
    """Destroy the process group (avoids torch's exit warning); no-op when none exists."""
    if env_world_size() > 1:
        import torch.distributed as tdist

        if tdist.is_initialized():
            tdist.destroy_process_group()


def rank_device(requested: torch.device, ctx: DistContext) -> torch.device:
    """Rank ``r`` of a CUDA run uses GPU ``LOCAL_RANK``; CPU runs stay on the CPU."""
    if requested.type != "cuda" or not ctx.enabled:
        return requested
    count = torch.cuda.device_count()
    if ctx.local_rank >= count:
        raise RuntimeError(
            f"torchrun started {ctx.local_rank + 1}+ processes on this node but only {count} GPU(s) "
            "are visible; use --nproc_per_node <= the GPU count, or device=cpu"
        )
    return torch.device("cuda", ctx.local_rank)


def _coll_device(ctx: DistContext) -> torch.device:
    """Device of the small bookkeeping collectives: CPU whenever gloo is in the group."""
    if "gloo" in ctx.backend or not ctx.backend:
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


# -- per-rank config ------------------------------------------------------------------------------
def split_keys(cfg: DictConfig) -> tuple[str, ...]:
    """Config keys each rank divides by the world size: the *global* batch sizes the algorithm
    declares (``Algorithm.split_keys``)."""
    from grpo_marl.algos import get_algo

    return get_algo(str(cfg.algo.name)).split_keys


def rank_config(cfg: DictConfig, ctx: DistContext, seed_offset: int = 0) -> DictConfig:
    """The config rank ``ctx.rank`` collects with: ``1/N`` of the global batch and of
    ``total_steps``, and its own seed (``seed + 1000 * rank + seed_offset``).

    Rank 0 of a single-process run gets ``cfg`` itself (so N=1 is bit-identical to a plain run).
    ``seed_offset`` moves every rank to fresh streams after a resume with a different N.
    """
    if not ctx.enabled and seed_offset == 0:
        return cfg
    out = cfg.copy()
    with open_dict(out):
        out.seed = int(cfg.seed) + SEED_STRIDE * ctx.rank + int(seed_offset)
        if ctx.enabled:
            out.total_steps = max(1, int(cfg.total_steps) // ctx.world_size)
            for key in split_keys(cfg):
                value = OmegaConf.select(cfg, key)
                if isinstance(value, int) and value > 0:
                    OmegaConf.update(out, key, value // ctx.world_size, merge=False)
    return out


# -- DDP ------------------------------------------------------------------------------------------
class _LossModule(nn.Module):
    """Owns every trained module; ``forward`` is the algorithm's loss on one minibatch.

    ``mb=None`` means this rank has no data this update (e.g. every group had zero reward
    variance) while others do: it still joins the all-reduce, with zero gradients, so the ranks
    stay in lock-step.
    """

    def __init__(self, modules: dict[str, nn.Module], loss_fn: Callable[..., dict[str, torch.Tensor]]) -> None:
        super().__init__()
        self.trained = nn.ModuleDict(modules)
        self.loss_fn = loss_fn

    def forward(self, mb: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
        if mb is None:
            params = [p for p in self.parameters() if p.requires_grad]
            zero = torch.stack([(p * 0.0).sum().float() for p in params]).sum()
            return {"loss": zero}
        return self.loss_fn(mb)


class DataParallel:
    """Calls the algorithm's loss through DistributedDataParallel when running under torchrun,
    directly otherwise. See the module docstring for why the loss (not the policy) is wrapped."""

    def __init__(
        self,
        modules: dict[str, nn.Module],
        loss_fn: Callable[..., dict[str, torch.Tensor]],
        ctx: DistContext,
        device: torch.device,
        find_unused_parameters: bool = False,
    ) -> None:
        self.ctx = ctx
        self.loss_fn = loss_fn
        self.module = _LossModule(modules, loss_fn)
        self.ddp: DistributedDataParallel | None = None
        if ctx.enabled:
            import inspect

            from torch.nn.parallel import DistributedDataParallel as DDP

            # Buffers (observation statistics) are averaged after each update instead
            # (sync_buffers): broadcasting rank 0's at every forward would change the normaliser
            # under rank r's stored behaviour log-probs mid-update. (torch >= 2.13 renamed the flag.)
            device_ids = [device.index] if device.type == "cuda" else None
            if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters:
                self.ddp = DDP(
                    self.module,
                    device_ids=device_ids,
                    find_unused_parameters=find_unused_parameters,
                    forward_sync_buffers=False,
                )
            else:
                self.ddp = DDP(
                    self.module,
                    device_ids=device_ids,
                    find_unused_parameters=find_unused_parameters,
                    broadcast_buffers=False,
                )

    def loss(self, mb: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
        if self.ddp is not None:
            return self.ddp(mb)
        if mb is None:
            raise ValueError("a single-process run has no empty-rank minibatches")
        return self.loss_fn(mb)

    def no_sync(self) -> contextlib.AbstractContextManager:
        """Accumulate gradients locally (no all-reduce) inside this context: every backward of a
        minibatch's micro-batches but the last, so each rank joins one all-reduce per step."""
        return self.ddp.no_sync() if self.ddp is not None else contextlib.nullcontext()

    def sync_buffers(self) -> None:
        """Average floating-point buffers (running observation statistics) over ranks, so every
        rank normalises the next rollouts identically."""
        if not self.ctx.enabled:
            return
        bufs = [b for b in self.module.buffers() if b.is_floating_point()]
        if not bufs:
            return
        import torch.distributed as tdist

        for b in bufs:  # few, tiny tensors; one collective each keeps dtypes (float64 counts) exact
            tdist.all_reduce(b.data)
            b.data /= self.ctx.world_size


def broadcast_modules(modules: Iterable[nn.Module | None], ctx: DistContext) -> None:
    """Start every rank from rank 0's weights and floating buffers (the policy, the trained
    modules and frozen copies such as GRPO's reference, which was made before any broadcast)."""
    if not ctx.enabled:
        return
    import torch.distributed as tdist

    for m in modules:
        if not isinstance(m, nn.Module):
            continue
        for t in list(m.parameters()) + [b for b in m.buffers() if b.is_floating_point()]:
            tdist.broadcast(t.data, src=0)


# -- small collectives ----------------------------------------------------------------------------
def sum_int(value: int, ctx: DistContext) -> int:
    if not ctx.enabled:
        return int(value)
    import torch.distributed as tdist

    t = torch.tensor([int(value)], dtype=torch.int64, device=_coll_device(ctx))
    tdist.all_reduce(t)
    return int(t.item())


def gather_ints(value: int, ctx: DistContext) -> list[int]:
    """``value`` of every rank, in rank order."""
    if not ctx.enabled:
        return [int(value)]
    import torch.distributed as tdist

    t = torch.tensor([int(value)], dtype=torch.int64, device=_coll_device(ctx))
    out = [torch.zeros_like(t) for _ in range(ctx.world_size)]
    tdist.all_gather(out, t)
    return [int(x.item()) for x in out]


def mean_scalar(total: float, count: float, ctx: DistContext) -> float:
    """``sum(total) / sum(count)`` over ranks (e.g. an epoch's mean approx_kl)."""
    if ctx.enabled:
        import torch.distributed as tdist

        t = torch.tensor([float(total), float(count)], dtype=torch.float64, device=_coll_device(ctx))
        tdist.all_reduce(t)
        total, count = t.tolist()
    return total / max(count, 1e-12)


def any_flag(flag: bool, ctx: DistContext) -> bool:
    if not ctx.enabled:
        return bool(flag)
    import torch.distributed as tdist

    t = torch.tensor([1.0 if flag else 0.0], device=_coll_device(ctx))
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    return bool(t.item() > 0)


def first_error(error: BaseException | None, ctx: DistContext) -> tuple[int, str] | None:
    """Agree on whether any rank failed; returns ``(rank, one-line error)`` of the first that did
    (:func:`grpo_marl.errors.one_line`, as that rank records it in ``summary.json``).

    Collection errors (an env worker crashing, a NaN observation) happen on one rank; without
    this, the others would wait in the next collective until the timeout. One tiny all-reduce per
    update in the common case; the messages travel only when something failed.
    """
    from grpo_marl.errors import one_line

    if not ctx.enabled:
        return None if error is None else (ctx.rank, one_line(error))
    if not any_flag(error is not None, ctx):
        return None
    import torch.distributed as tdist

    msgs: list[Any] = [None] * ctx.world_size
    tdist.all_gather_object(msgs, None if error is None else one_line(error))
    for r, m in enumerate(msgs):
        if m is not None:
            return r, m
    return None


def barrier_on_failure(ctx: DistContext) -> None:
    """Best-effort barrier for ranks that stop on a shared error, so rank 0 finishes writing
    ``summary.json`` before torchrun tears the job down at the first rank's exit."""
    if not ctx.enabled:
        return
    import torch.distributed as tdist

    try:
        if tdist.is_initialized():
            tdist.barrier()
    except Exception:  # a rank already gone: nothing left to wait for
        pass


def broadcast_object(obj: Any, ctx: DistContext) -> Any:
    """Rank 0's ``obj`` on every rank (e.g. the run directory Hydra made on rank 0)."""
    if not ctx.enabled:
        return obj
    import torch.distributed as tdist

    box = [obj if ctx.is_main else None]
    tdist.broadcast_object_list(box, src=0)
    return box[0]


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def gather_to_main(obj: Any, ctx: DistContext) -> list[Any] | None:
    """Every rank's ``obj`` as a list on rank 0 (None elsewhere); ``[obj]`` in a single process.

    Used for checkpoints: each rank's collector RNG and env state differ, and an exact resume
    with the same N gives each rank its own back.
    """
    if not ctx.enabled:
        return [obj]
    import torch.distributed as tdist

    out: list[Any] | None = [None] * ctx.world_size if ctx.is_main else None
    tdist.gather_object(_to_cpu(obj), out, dst=0)
    return out


def mean_metrics(metrics: dict[str, float], ctx: DistContext) -> dict[str, float]:
    """Average metrics over ranks (keys present on every rank; rank-local extras pass through)."""
    if not ctx.enabled:
        return metrics
    import torch.distributed as tdist

    keys = sorted(metrics)
    gathered: list[Any] = [None] * ctx.world_size
    tdist.all_gather_object(gathered, keys)
    common = sorted(set.intersection(*(set(k) for k in gathered)))
    if not common:
        return metrics
    t = torch.tensor([float(metrics[k]) for k in common], dtype=torch.float64, device=_coll_device(ctx))
    tdist.all_reduce(t)
    t /= ctx.world_size
    out = dict(metrics)
    out.update({k: float(v) for k, v in zip(common, t.tolist())})
    return out


# -- debugging ------------------------------------------------------------------------------------
def param_hash(modules: Iterable[nn.Module]) -> str:
    """SHA-256 of every parameter's bytes, in module order (identical weights <=> equal hash)."""
    h = hashlib.sha256()
    for m in modules:
        for name, p in m.named_parameters():
            h.update(name.encode())
            h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def dump_param_hash(modules: Iterable[nn.Module], ctx: DistContext, extra: dict[str, Any]) -> None:
    """If ``GRPO_MARL_DEBUG_PARAM_HASH`` names a directory, write ``rank<r>.json`` there."""
    target = os.environ.get(PARAM_HASH_ENV)
    if not target:
        return
    path = Path(target)
    path.mkdir(parents=True, exist_ok=True)
    record = {"rank": ctx.rank, "world_size": ctx.world_size, "param_hash": param_hash(modules), **extra}
    (path / f"rank{ctx.rank}.json").write_text(json.dumps(record) + "\n")
