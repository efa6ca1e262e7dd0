"""The training loop: collect -> prepare -> epochs x minibatches -> step -> log -> eval -> checkpoint.

The trainer knows environments only through a Task (``grpo_marl.tasks``) and algorithms only
through their config and loss (``grpo_marl.algos``). It owns what every run shares: seeding, the
optimizer and LR schedule, gradient clipping, non-finite guards, periodic evaluation and the
threshold clock, atomic checkpoints with exact resume, and the run directory's files.
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from grpo_marl import distributed as dist
from grpo_marl.algos import ALGOS, _load_builtin_algos
from grpo_marl.batch import minibatch_indices
from grpo_marl.checkpoint import atomic_save, checkpoint_path, load_checkpoint, rng_state, set_rng_state
from grpo_marl.logging import RunLogger
from grpo_marl.registry import get_spec
from grpo_marl.rollout import NonFiniteError
from grpo_marl.tasks import make_task


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def lr_factor(schedule: str, progress: float) -> float:
    """LR multiplier at training progress in [0, 1] (by env steps, so resume needs no state)."""
    progress = min(max(progress, 0.0), 1.0)
    if schedule == "linear":
        return max(1.0 - progress, 0.0)
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0


class Trainer:
    """Train one configured run; ``fit()`` returns the summary written to ``summary.json``."""

    def __init__(self, cfg: DictConfig, run_dir: str | Path, resume: bool = False) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.ctx = dist.init()
        self.is_main = self.ctx.rank == 0
        threads = int(cfg.get("threads", 0) or 0)
        if threads <= 0 and cfg.get("env_kind", "gymnasium") != "text":
            # Small MLPs on small batches: intra-op threading costs more than it saves (measured
            # 60 us vs 0.4-2 ms per forward on 2 cores), so control tasks default to one thread.
            threads = 1
        if threads > 0:
            torch.set_num_threads(threads)
        seed_everything(int(cfg.seed) + 1000 * self.ctx.rank)
        self.device = resolve_device(str(cfg.device))
        if self.device.type == "cuda" and self.ctx.world_size > 1:
            self.device = torch.device("cuda", self.ctx.local_rank)
        self.spec = get_spec(str(cfg.env))
        _load_builtin_algos()
        algo_cls = ALGOS[str(cfg.algo.name)]
        self.task = make_task(cfg, self.spec, self.device, collector=algo_cls.collector)
        attach = getattr(self.task, "attach_run_dir", None)  # tasks that write run files (text)
        if callable(attach):
            attach(self.run_dir, self.is_main)
        self.algo = algo_cls(cfg.algo, self.task, self.device)
        self.modules: dict[str, nn.Module] = {"policy": self.task.policy, **self.algo.modules()}
        self.params = [p for m in self.modules.values() for p in m.parameters() if p.requires_grad]
        dist.broadcast_parameters(self.modules.values(), self.ctx)
        self.optimizer = torch.optim.Adam(
            self.params, lr=float(cfg.algo.lr), eps=float(cfg.algo.get("adam_eps", 1e-5))
        )
        self.threshold = cfg.train.threshold
        self.updates = 0
        self.wall_offset = 0.0
        self.next_eval = int(cfg.eval.every_steps) if int(cfg.eval.every_steps) > 0 else None
        self.steps_to_threshold: int | None = None
        self.time_to_threshold: float | None = None
        self.last_eval: dict[str, float] = {}
        resume_step = None
        if resume:
            resume_step = self._restore(load_checkpoint(checkpoint_path(self.run_dir), self.device))
        self.logger = RunLogger(
            self.run_dir,
            total_steps=int(cfg.total_steps),
            tensorboard=bool(cfg.log.tensorboard),
            progress=bool(cfg.log.progress),
            resume_step=resume_step,
            enabled=self.is_main,
        )
        if self.is_main and not resume:
            (self.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))

    # -- steps -----------------------------------------------------------------------------
    @property
    def env_steps(self) -> int:
        return dist.sum_int(self.task.env_steps, self.ctx)

    def _optimize(self, data: dict[str, torch.Tensor]) -> dict[str, float]:
        a = self.cfg.algo
        n = next(iter(data.values())).shape[0]
        k = max(1, min(int(a.minibatches), n))
        max_norm = float(a.get("max_grad_norm", 0.0) or 0.0)
        target_kl = a.get("target_kl")
        sums: dict[str, torch.Tensor] = {}
        count = 0
        epochs_done = 0
        for _ in range(int(a.epochs)):
            epoch_kl = []
            for idx in minibatch_indices(n, k):
                idx = idx.to(self.device)
                mb = {key: value[idx] for key, value in data.items()}
                terms = self.algo.loss(mb, weight_scale=float(k))
                loss = terms["loss"]
                if not torch.isfinite(loss):
                    detail = ", ".join(f"{name}={float(v):.4g}" for name, v in terms.items())
                    raise NonFiniteError(
                        f"loss became non-finite at update {self.updates + 1} ({detail}); "
                        "lower algo.lr, set algo.max_grad_norm, or check the env's rewards"
                    )
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                dist.average_gradients(self.params, self.ctx)
                if max_norm > 0:
                    grad_norm = nn.utils.clip_grad_norm_(self.params, max_norm)
                else:
                    grad_norm = torch.norm(torch.stack([p.grad.norm() for p in self.params if p.grad is not None]))
                self.optimizer.step()
                terms = {name: v.detach() for name, v in terms.items()}
                terms["grad_norm"] = grad_norm.detach()
                for name, v in terms.items():
                    sums[name] = sums.get(name, 0.0) + v.float()
                count += 1
                epoch_kl.append(terms.get("approx_kl", torch.zeros(())))
            epochs_done += 1
            if target_kl is not None and float(torch.stack(epoch_kl).mean()) > float(target_kl):
                break
        out = {f"train/{name}": float(v) / count for name, v in sums.items()}
        out["train/epochs"] = float(epochs_done)
        return out

    def _evaluate(self, episodes: int, seed_offset: int = 0) -> dict[str, float]:
        for m in self.modules.values():
            m.eval()
        try:
            return self.task.evaluate(self.task.policy, episodes, seed_offset=seed_offset)
        finally:
            for m in self.modules.values():
                m.train()

    def fit(self) -> dict[str, Any]:
        """Train until ``total_steps`` env steps (or the threshold, if asked); return the summary."""
        cfg = self.cfg
        total = int(cfg.total_steps)
        start = time.perf_counter() - self.wall_offset
        status = "completed"
        try:
            while self.env_steps < total:
                t_update = time.perf_counter()
                steps_before = self.env_steps
                for group in self.optimizer.param_groups:
                    group["lr"] = float(cfg.algo.lr) * lr_factor(str(cfg.algo.lr_schedule), steps_before / total)
                batch = self.algo.collect()
                t_collected = time.perf_counter()
                data, metrics = self.algo.prepare(batch)
                metrics.update(batch.metrics)
                if data is None:
                    metrics["train/skipped_updates"] = 1.0
                else:
                    metrics.update(self._optimize(data))
                self.task.end_update(batch)
                self.algo.after_update()
                self.updates += 1
                steps = self.env_steps
                now = time.perf_counter()
                metrics.update(
                    {
                        "train/lr": self.optimizer.param_groups[0]["lr"],
                        "train/updates": float(self.updates),
                        "time/sps": (steps - steps_before) / max(now - t_update, 1e-9),
                        "time/collect_sps": (steps - steps_before) / max(t_collected - t_update, 1e-9),
                        "time/update_s": now - t_collected,
                        "time/wall_s": now - start,
                    }
                )
                metrics = dist.mean_metrics(metrics, self.ctx)
                if self.next_eval is not None and steps >= self.next_eval:
                    while self.next_eval <= steps:
                        self.next_eval += int(cfg.eval.every_steps)
                    if self.is_main:
                        self.last_eval = self._evaluate(int(cfg.eval.episodes))
                        metrics.update(self.last_eval)
                        if (
                            self.threshold is not None
                            and self.steps_to_threshold is None
                            and self.last_eval[getattr(self.task, "threshold_metric", "eval/return_mean")]
                            >= float(self.threshold)
                        ):
                            self.steps_to_threshold = steps
                            self.time_to_threshold = time.perf_counter() - start
                            metrics["eval/threshold_reached"] = 1.0
                if self.updates % int(cfg.log.every) == 0 or "eval/return_mean" in metrics:
                    self.logger.log(steps, metrics)
                stop = bool(cfg.train.stop_on_threshold) and self.steps_to_threshold is not None
                stop = dist.any_flag(stop, self.ctx)
                every = int(cfg.checkpoint.every)
                if every > 0 and self.updates % every == 0 and not stop:
                    self.save(time.perf_counter() - start)
                if stop:
                    status = "threshold_reached"
                    break
        except NonFiniteError as exc:
            self.logger.close()
            self._write_summary({"status": "failed", "error": str(exc), "env_steps": self.env_steps})
            raise
        wall = time.perf_counter() - start
        self.save(wall)
        final = {}
        if self.is_main:
            final = self._evaluate(int(cfg.eval.episodes), seed_offset=500)
            self.logger.log(self.env_steps, final)
        self.logger.close()
        summary = {
            "env": str(cfg.env),
            "algo": str(cfg.algo.name),
            "seed": int(cfg.seed),
            "status": status,
            **final,
            "env_steps": self.env_steps,
            "updates": self.updates,
            "wall_seconds": wall,
            "threshold": None if self.threshold is None else float(self.threshold),
            "steps_to_threshold": self.steps_to_threshold,
            "time_to_threshold_s": self.time_to_threshold,
            "world_size": self.ctx.world_size,
            **getattr(self.task, "summary_extra", lambda: {})(),
        }
        self._write_summary(summary)
        return summary

    def _write_summary(self, summary: dict[str, Any]) -> None:
        if not self.is_main:
            return
        path = self.run_dir / "summary.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(summary, indent=2, default=float) + "\n")
        tmp.replace(path)

    # -- checkpoints -----------------------------------------------------------------------
    def save(self, wall_seconds: float) -> None:
        if not self.is_main:
            return
        state = {
            "modules": {name: m.state_dict() for name, m in self.modules.items()},
            "optimizer": self.optimizer.state_dict(),
            "algo": self.algo.state_dict(),
            "task": self.task.state_dict(),
            "rng": rng_state(),
            "counters": {
                "updates": self.updates,
                "env_steps": self.env_steps,
                "wall_seconds": wall_seconds,
                "next_eval": self.next_eval,
                "steps_to_threshold": self.steps_to_threshold,
                "time_to_threshold": self.time_to_threshold,
                "world_size": self.ctx.world_size,
            },
            "config": OmegaConf.to_container(self.cfg, resolve=True),
        }
        atomic_save(state, checkpoint_path(self.run_dir))

    def _restore(self, state: dict[str, Any]) -> int:
        for name, m in self.modules.items():
            m.load_state_dict(state["modules"][name])
        self.optimizer.load_state_dict(state["optimizer"])
        self.algo.load_state_dict(state["algo"])
        c = state["counters"]
        self.task.load_state_dict(state["task"])
        if c.get("world_size", 1) == self.ctx.world_size:
            set_rng_state(state["rng"])
        else:
            # A different number of ranks: weights, optimizer and counters carry over; each rank
            # takes an equal share of the steps done so far and a fresh, rank-specific RNG stream.
            self.task.set_env_steps(int(c["env_steps"]) // self.ctx.world_size)
            seed_everything(int(self.cfg.seed) + 1000 * self.ctx.rank + 7919 * int(c["updates"]))
        self.updates = c["updates"]
        self.wall_offset = c["wall_seconds"]
        self.next_eval = c["next_eval"]
        self.steps_to_threshold = c["steps_to_threshold"]
        self.time_to_threshold = c["time_to_threshold"]
        return int(c["env_steps"])

    def close(self) -> None:
        self.task.close()
        self.logger.close()
