"""The training loop: collect -> prepare -> epochs x minibatches -> step -> log -> eval -> checkpoint.

The trainer knows environments only through a Task (``grpo_marl.tasks``) and algorithms only
through their config and loss (``grpo_marl.algos``). It owns what every run shares: seeding, the
optimizer and LR schedule, gradient clipping, non-finite guards, periodic evaluation and the
threshold clock, atomic checkpoints with exact resume, and the run directory's files.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from grpo_marl import distributed as dist
from grpo_marl import stopping
from grpo_marl.algos import get_algo
from grpo_marl.batch import Batch
from grpo_marl.checkpoint import atomic_save, checkpoint_path, load_checkpoint, rng_state, set_rng_state
from grpo_marl.config import unreachable_threshold
from grpo_marl.errors import NonFiniteError, RemoteRankError, TrainingStopped
from grpo_marl.families import FAMILIES, family_of, get_family
from grpo_marl.logging import RunLogger
from grpo_marl.registry import get_spec
from grpo_marl.tasks import make_task

#: Failures that end a run "cleanly": summary.json says failed, the last checkpoint is kept.
STOP_ERRORS = (TrainingStopped,)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def autocast_dtype(autocast: str, device: torch.device, kind: str) -> torch.dtype | None:
    """The ``autocast`` setting as a dtype (None = off).

    ``auto`` is bf16 for LLM policies (env families with ``bf16_autocast``: ``text``) on a CUDA
    device that supports it, and off otherwise (``kind`` names the env family). LLM weights stay float32 (``model.dtype=auto``) because Adam's steps at
    fine-tuning learning rates (~1e-5 of a weight) are below bf16's resolution (2^-8 relative) and
    round away: on one H200, SmolLM2-135M on arith_chat with bf16 weights went from 0.29 to only
    0.44 held-out accuracy in 5,760 completions, with float32 weights + bf16 autocast to 0.80 in
    2,560. On CPUs autocast stays off: bf16 matmuls are slow without AMX.
    """
    if autocast == "bf16":
        return torch.bfloat16
    family = FAMILIES.find(kind)
    llm = family is not None and family.bf16_autocast
    if autocast == "auto" and llm and device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return None


def merge_terms(parts: list[tuple[dict[str, torch.Tensor], float]]) -> dict[str, torch.Tensor]:
    """One minibatch's loss terms from its micro-batches' (each with its share of the loss
    weight): ``loss*`` terms are sums over rows and add up, ``*_max`` terms take the largest,
    and the rest are weighted means, merged by share."""
    if len(parts) == 1:
        return parts[0][0]
    out: dict[str, torch.Tensor] = {}
    for name in parts[0][0]:
        values = [terms[name] for terms, _ in parts]
        if name.startswith("loss"):
            out[name] = torch.stack(values).sum()
        elif name.endswith("_max"):
            out[name] = torch.stack(values).max()
        else:
            out[name] = sum(v * share for v, (_, share) in zip(values, parts))  # type: ignore[assignment]
    return out


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


def budget_note(total: int, per_update: tuple[int, str, bool] | None, world: int = 1) -> str | None:
    """One line for a ``total_steps`` below one update's collection (``per_update``: a
    collector's ``update_steps()``, on one of ``world`` ranks), else None. Updates are never cut
    short, so such a run silently did a whole update (``pz:sisl/pursuit-v5 total_steps=3000``: 64
    envs x 500-step episodes = 32,000 steps). Episode collectors know only a bound (episodes may
    end early), and the note says so."""
    if per_update is None:
        return None
    steps, how, exact = per_update
    steps *= world
    if world > 1:
        how += f" on each of {world} ranks"
    if total >= steps:
        return None
    if exact:
        return (
            f"note: total_steps={total:,} is less than one update's collection ({how} = {steps:,} env steps); "
            f"the run will do one update of {steps:,} steps"
        )
    return (
        f"note: total_steps={total:,} is less than one update can collect (up to {steps:,} env steps: {how}); "
        f"updates are never cut short, so the run does at least one whole update, of up to {steps:,} steps"
    )


def peak_rss_mb() -> float:
    """Peak resident memory of this process and of its finished children (worker processes of
    the vector env), in MB: what a run needs of the machine, reported in every summary."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024.0  # KiB on Linux


class Trainer:
    """Train one configured run; ``fit()`` returns the summary written to ``summary.json``."""

    #: Set (to the signal number) by the CLI's SIGINT/SIGTERM handler: ``fit()`` stops at the next
    #: update boundary, saves a checkpoint and returns a summary with ``status: interrupted``.
    stop_requested: int | None = None

    def __init__(self, cfg: DictConfig, run_dir: str | Path, resume: bool = False) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.ctx = dist.init(str(cfg.distributed.backend))
        self.is_main = self.ctx.rank == 0
        threads = int(cfg.threads)
        if threads <= 0:
            # The env family's default: one thread for control (small MLPs on small batches),
            # torch's own for LLM policies (see EnvFamily.default_threads).
            threads = family_of(cfg).default_threads
        if threads > 0:
            torch.set_num_threads(threads)
        seed_everything(int(cfg.seed) + 1000 * self.ctx.rank)
        self.device = dist.rank_device(resolve_device(str(cfg.device)), self.ctx)
        self.spec = get_spec(str(cfg.env))
        algo_cls = get_algo(str(cfg.algo.name))
        # Under torchrun each rank collects 1/N of the global batch with its own seeds
        # (distributed.rank_config); a single process gets ``cfg`` itself.
        self.local_cfg = dist.rank_config(cfg, self.ctx)
        self.task = make_task(
            self.local_cfg,
            self.spec,
            self.device,
            collector=algo_cls.collector,
            with_state=algo_cls.needs_state(self.local_cfg),
        )
        self.algo = algo_cls(self.local_cfg.algo, self.task, self.device)
        self.modules: dict[str, nn.Module] = {"policy": self.task.policy, **self.algo.modules()}
        self.params = [p for m in self.modules.values() for p in m.parameters() if p.requires_grad]
        dist.broadcast_modules([*self.modules.values(), self.algo.reference()], self.ctx)
        find_unused = cfg.distributed.find_unused_parameters
        if find_unused == "auto":
            find_unused = get_family(self.spec.kind).find_unused_parameters
        self.dp = dist.DataParallel(self.modules, self.algo.loss, self.ctx, self.device, bool(find_unused))
        self._autocast_dtype = autocast_dtype(str(cfg.autocast), self.device, self.spec.kind)
        # Fused Adam (one kernel over all parameters) where every parameter allows it: for the
        # small control MLPs the per-tensor Python loop of the default implementation was ~15% of
        # a minibatch step on the CPU.
        fused = bool(self.params) and all(
            p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in self.params
        )
        self.optimizer = torch.optim.Adam(
            self.params, lr=float(cfg.algo.lr), eps=float(cfg.algo.adam_eps), fused=fused or None
        )
        self.threshold = cfg.train.threshold
        self.updates = 0
        self.wall_offset = 0.0
        self.next_eval = int(cfg.eval.every_steps) if int(cfg.eval.every_steps) > 0 else None
        self.steps_to_threshold: int | None = None
        self.time_to_threshold: float | None = None
        # Seconds spent in periodic evaluations (a measurement, not training): logged so that
        # time-to-threshold can be compared with a peer's with the evaluation cadence factored out.
        self.eval_seconds = 0.0
        self.train_time_to_threshold: float | None = None
        self.last_eval: dict[str, float] = {}
        self.final_logged_at: int | None = None  # env steps of the final evaluation in the logs
        # The last update's record when a signal abandoned the evaluation it was waiting for (it is
        # logged, with that evaluation redone, on resume), and whether an evaluation was due there.
        self.pending_record: dict[str, float] | None = None
        self.pending_eval = False
        self._steps = 0  # global env steps after the last update (no collective needed to read)
        resume_step = None
        if self.is_main and not resume:
            note = budget_note(int(cfg.total_steps), self.task.update_steps(), self.ctx.world_size)
            if note:
                print(note, file=sys.stderr, flush=True)
            late = unreachable_threshold(cfg)  # only an env's default gets here: a user's is refused
            if late:
                print(f"note: {late.replace('but', 'is the env default, but', 1)}", file=sys.stderr, flush=True)
        if resume:
            # On the CPU: RNG states must stay CPU tensors; load_state_dict copies weights to the device.
            resume_step = self._restore(load_checkpoint(checkpoint_path(self.run_dir), "cpu"))
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
        self.task.attach_run(self.run_dir, self.logger, self.is_main)

    # -- steps -----------------------------------------------------------------------------
    @property
    def env_steps(self) -> int:
        """Env steps over all ranks (a collective under torchrun: every rank must ask together)."""
        return dist.sum_int(self.task.env_steps, self.ctx)

    def _amp(self) -> contextlib.AbstractContextManager:
        """``autocast=bf16``: bfloat16 autocast around rollouts and the loss (mixed precision for
        LLM policies kept in float32; log-softmax and losses stay float32 under autocast)."""
        if self._autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self._autocast_dtype)

    def _collect(self) -> Batch:
        """``algo.collect()``; under torchrun, a failure on any rank stops every rank with the
        failing rank's message (instead of the others waiting in the next collective)."""
        error: BaseException | None = None
        batch = None
        try:
            with self._amp():
                batch = self.algo.collect()
        except Exception as exc:  # any failure: the other ranks must hear of it, not hang
            if not self.ctx.enabled:
                raise
            error = exc
        first = dist.first_error(error, self.ctx)
        if first is not None:
            if error is not None:
                raise error
            rank, message = first
            raise RemoteRankError(
                f"stopping because another rank failed: rank {rank}: {message}", origin_rank=rank, origin_error=message
            )
        assert batch is not None  # no rank failed, so this rank's collect() returned
        return batch

    def _optimize(self, data: dict[str, torch.Tensor] | None) -> dict[str, float]:
        """Epochs x minibatches of the algorithm's loss. ``data=None``: nothing to learn from
        here (only reached under torchrun, when other ranks do have data: this rank then joins
        every gradient all-reduce with zeros so all ranks take the same steps)."""
        a = self.cfg.algo
        n = 0 if data is None else next(iter(data.values())).shape[0]
        k = max(1, min(int(a.minibatches), n))
        if self.ctx.enabled:
            # Every rank must run the same number of minibatch steps (one all-reduce each).
            sizes = [m for m in dist.gather_ints(n, self.ctx) if m > 0]
            k = max(1, min([int(a.minibatches), *sizes]))
        self.algo.set_minibatches(k)
        max_norm = float(a.max_grad_norm)
        target_kl = a.target_kl
        sums: dict[str, torch.Tensor] = {}
        count = 0
        epochs_done = 0
        for _ in range(int(a.epochs)):
            epoch_kl = []
            chunks = self.algo.minibatch_indices(data, k) if data is not None else [None] * k
            for idx in chunks:
                mb = None
                if data is not None and idx is not None:
                    idx = idx.to(self.device)
                    # index_select: the same rows as value[idx], ~5x cheaper than advanced indexing
                    mb = {key: value.index_select(0, idx) for key, value in data.items()}
                self.optimizer.zero_grad(set_to_none=True)
                pieces = self.algo.micro_batches(mb) if mb is not None else [(None, 1.0)]
                parts: list[tuple[dict[str, torch.Tensor], float]] = []
                bad_loss = False
                for j, (piece, share) in enumerate(pieces):
                    # Gradients of all pieces accumulate; only the last backward all-reduces.
                    with self.dp.no_sync() if j < len(pieces) - 1 else contextlib.nullcontext():
                        with self._amp():
                            terms = self.dp.loss(piece)
                        loss = terms["loss"]
                        bad = mb is not None and not bool(torch.isfinite(loss))
                        if bad and not self.ctx.enabled:
                            raise self._non_finite(terms)
                        bad_loss = bad_loss or bad
                        loss.backward()
                    parts.append(({name: v.detach() for name, v in terms.items()}, share))
                terms = merge_terms(parts)
                if max_norm > 0:
                    grad_norm = nn.utils.clip_grad_norm_(self.params, max_norm)
                else:
                    grad_norm = torch.norm(torch.stack([p.grad.norm() for p in self.params if p.grad is not None]))
                if self.ctx.enabled and not bool(torch.isfinite(grad_norm)):
                    # A NaN on any rank reaches every rank through the all-reduce: all stop together.
                    raise self._non_finite(terms if bad_loss else None)
                self.optimizer.step()
                if mb is None:
                    continue
                terms["grad_norm"] = grad_norm.detach()
                for name, v in terms.items():
                    sums[name] = sums.get(name, 0.0) + v.float()
                count += 1
                epoch_kl.append(terms.get("approx_kl", torch.zeros((), device=self.device)))
            epochs_done += 1
            if target_kl is not None:
                kl_sum = float(torch.stack(epoch_kl).sum()) if epoch_kl else 0.0
                if dist.mean_scalar(kl_sum, len(epoch_kl), self.ctx) > float(target_kl):
                    break
        # Free the gradients until the next update: nothing reads them after the last step, and
        # they are a full copy of the parameters (540 MB for a 135M-parameter model) that would
        # otherwise sit through sampling and evaluation, where the run's peak memory is reached.
        self.optimizer.zero_grad(set_to_none=True)
        out = {f"train/{name}": float(v) / count for name, v in sums.items()}
        out["train/epochs"] = float(epochs_done)
        return out

    def _non_finite(self, terms: dict[str, torch.Tensor] | None) -> NonFiniteError:
        if terms is None:
            detail = "on another rank"
        else:
            detail = "(" + ", ".join(f"{name}={float(v.detach()):.4g}" for name, v in terms.items()) + ")"
        return NonFiniteError(
            f"loss became non-finite at update {self.updates + 1} {detail}; "
            "lower algo.lr, set algo.max_grad_norm, or check the env's rewards"
        )

    def _evaluate(self, episodes: int, seed_offset: int = 0) -> dict[str, float]:
        for m in self.modules.values():
            m.eval()
        try:
            return self.task.evaluate(self.task.policy, episodes, seed_offset=seed_offset)
        finally:
            for m in self.modules.values():
                m.train()

    def _periodic_eval(self, steps: int, start: float, train_s: float) -> dict[str, float]:
        """One periodic evaluation on rank 0: its metrics (and the threshold's first crossing);
        its seconds go to ``eval_seconds``, not to the training clock."""
        t_eval = time.perf_counter()
        rng = rng_state()
        try:
            with stopping.phase("evaluate"), self._amp():
                self.last_eval = self._evaluate(int(self.cfg.eval.episodes))
        except stopping.Abandoned:
            set_rng_state(rng)  # the checkpoint resumes where the evaluation began
            raise
        self.eval_seconds += time.perf_counter() - t_eval
        return {**self.last_eval, **self._check_threshold(self.last_eval, steps, start, train_s)}

    def _check_threshold(
        self, evaluation: dict[str, float], steps: int, start: float, train_s: float
    ) -> dict[str, float]:
        """Record the threshold's first crossing by ``evaluation`` (at ``steps``); returns the
        ``eval/threshold_reached`` marker when this is it."""
        if (
            self.threshold is not None
            and self.steps_to_threshold is None
            and evaluation[self.task.threshold_metric] >= float(self.threshold)
        ):
            self.steps_to_threshold = steps
            self.time_to_threshold = time.perf_counter() - start
            self.train_time_to_threshold = train_s
            return {"eval/threshold_reached": 1.0}
        return {}

    def fit(self) -> dict[str, Any]:
        """Train until ``total_steps`` env steps (or the threshold, if asked); return the summary.

        One evaluation per step in the logs: the update that reaches ``total_steps`` is logged
        together with the final evaluation, as one record (each step once in ``metrics.jsonl``,
        each key once per step in TensorBoard), and a periodic evaluation due at that update is
        not run: the final evaluation (``eval.final_episodes``) stands in for it, threshold check
        included. A run stopped by ``train.stop_on_threshold`` keeps the periodic evaluation that
        stopped it on its curve; its final evaluation goes to ``summary.json`` only.
        """
        cfg = self.cfg
        total = int(cfg.total_steps)
        start = time.perf_counter() - self.wall_offset
        status = "completed"
        self._steps = self.env_steps
        pending: dict[str, float] | None = None  # the last update's record, logged with the final evaluation
        final_due = False  # a periodic evaluation was due at the last update: the final one replaces it
        train_s = 0.0
        if self.pending_record is not None:  # resumed after a signal abandoned an evaluation
            pending, final_due = dict(self.pending_record), self.pending_eval
            self.pending_record, self.pending_eval = None, False
        try:
            if pending is not None and self._steps < total:
                # the periodic evaluation the signal abandoned, redone before training on
                if final_due and self.is_main:
                    try:
                        pending.update(self._periodic_eval(self._steps, start, self.wall_offset - self.eval_seconds))
                    except stopping.Abandoned:
                        self.pending_record, self.pending_eval = pending, True
                        pending = None
                if pending is not None:
                    self.logger.log(self._steps, pending)
                pending, final_due = None, False
            if bool(cfg.eval.at_start) and self.updates == 0 and self.is_main:
                # the untrained policy's figure, on the curve at step 0 (a resumed run has it)
                try:
                    first = self._periodic_eval(self._steps, start, 0.0)
                except stopping.Abandoned:
                    first = None
                wall = time.perf_counter() - start
                clocks = {
                    "time/wall_s": wall,
                    "time/eval_s": self.eval_seconds,
                    "time/train_s": wall - self.eval_seconds,
                }
                if first is not None:
                    self.logger.log(self._steps, {**first, **clocks})
            # reached before this call (at the start, or by the run this one resumes)
            done = dist.any_flag(bool(cfg.train.stop_on_threshold) and self.steps_to_threshold is not None, self.ctx)
            if done:
                status = "threshold_reached"
            while self._steps < total and not done:
                t_update = time.perf_counter()
                steps_before = self._steps
                for group in self.optimizer.param_groups:
                    group["lr"] = float(cfg.algo.lr) * lr_factor(str(cfg.algo.lr_schedule), steps_before / total)
                stopping.enter("collect")
                batch = self._collect()
                t_collected = time.perf_counter()
                stopping.enter("update")
                with self._amp():
                    data, metrics = self.algo.prepare(batch)
                metrics.update(batch.metrics)
                # Under torchrun, skip only when no rank has data (ranks must step together).
                if not dist.any_flag(data is not None, self.ctx):
                    metrics["train/skipped_updates"] = 1.0
                else:
                    metrics.update(self._optimize(data))
                self.task.end_update(batch)
                self.dp.sync_buffers()
                self.algo.after_update()
                self.updates += 1
                steps = self._steps = self.env_steps
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
                # Averaged over ranks; speeds are already of the whole job (global steps / time).
                metrics = dist.mean_metrics(metrics, self.ctx)
                # Evaluation runs on rank 0 only, so its clock is not averaged over ranks.
                train_s = now - start - self.eval_seconds  # this update's end, evaluations excluded
                metrics["time/eval_s"] = self.eval_seconds
                metrics["time/train_s"] = train_s
                ending = steps >= total
                if self.next_eval is not None and steps >= self.next_eval:
                    while self.next_eval <= steps:
                        self.next_eval += int(cfg.eval.every_steps)
                    final_due = ending
                    if self.is_main and not ending:
                        try:
                            metrics.update(self._periodic_eval(steps, start, train_s))
                        except stopping.Abandoned:
                            # logged on resume with the evaluation redone (one record per step)
                            self.pending_record, self.pending_eval = dict(metrics), True
                if ending:
                    pending = metrics
                elif self.pending_record is not None:
                    pass
                elif self.updates % int(cfg.log.every) == 0 or "eval/return_mean" in metrics:
                    self.logger.log(steps, metrics)
                stop = bool(cfg.train.stop_on_threshold) and self.steps_to_threshold is not None
                stop = dist.any_flag(stop, self.ctx)
                every = int(cfg.checkpoint.every)
                # (the last update is saved after the final evaluation, with its record logged)
                if every > 0 and self.updates % every == 0 and not stop and not ending:
                    with stopping.phase("checkpoint"):
                        self.save(time.perf_counter() - start)
                if stop:
                    status = "threshold_reached"
                    break
                if dist.any_flag(self.stop_requested is not None, self.ctx):
                    status = "interrupted"
                    break
        except STOP_ERRORS as exc:
            self.logger.close()
            self._write_summary({"status": "failed", "error": str(exc), "env_steps": self._steps})
            raise
        wall = time.perf_counter() - start
        final: dict[str, Any] = {}
        record = dict(pending or {})
        if status == "interrupted" and pending is not None:
            # stopped at the last update, before its final evaluation: resume runs it and logs both
            self.pending_record, self.pending_eval = dict(pending), final_due
            pending, record = None, {}
        if self.is_main and status != "interrupted":
            rng = rng_state()
            try:
                with stopping.phase("final_evaluate"), self._amp():
                    final = self._evaluate(int(cfg.eval.final_episodes or cfg.eval.episodes), seed_offset=500)
            except stopping.Abandoned:
                set_rng_state(rng)
                status = "interrupted"
                self.pending_record, self.pending_eval = dict(pending or {}), final_due
                pending, record = None, {}
            record.update(final)
            if final_due and final:
                record.update(self._check_threshold(final, self._steps, start, train_s))
                if bool(cfg.train.stop_on_threshold) and self.steps_to_threshold is not None:
                    status = "threshold_reached"
        # Logged unless this step already shows an evaluation: the periodic one that stopped the
        # run at its threshold (the final one then goes to summary.json only), or the final one of
        # the run this one resumed with nothing left to train.
        if pending is not None or (record and status != "threshold_reached" and self.final_logged_at != self._steps):
            self.logger.log(self._steps, record)
        if final:
            self.final_logged_at = self._steps
        with stopping.phase("checkpoint"):
            self.save(wall)
        artifacts: dict[str, Any] = {}
        if status != "interrupted":
            with stopping.phase("save_model"):
                artifacts = self.task.finish(self.run_dir, self.is_main)
        if self.stop_requested is not None:
            status = "interrupted"  # a signal during the last checkpoint or the model: it was finished
        self.logger.close()
        dist.dump_param_hash(self.modules.values(), self.ctx, {"updates": self.updates, "env_steps": self._steps})
        summary = {
            "env": str(cfg.env),
            "algo": str(cfg.algo.name),
            "seed": int(cfg.seed),
            "status": status,
            **({"phase": stopping.stopped_in() or "update"} if status == "interrupted" else {}),
            **final,
            "env_steps": self._steps,
            "updates": self.updates,
            "wall_seconds": wall,
            "threshold": None if self.threshold is None else float(self.threshold),
            "steps_to_threshold": self.steps_to_threshold,
            "time_to_threshold_s": self.time_to_threshold,
            "eval_seconds": self.eval_seconds,
            "train_time_to_threshold_s": self.train_time_to_threshold,
            "peak_rss_mb": peak_rss_mb(),
            "world_size": self.ctx.world_size,
            **self.task.summary_extra(),
            **artifacts,
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
        """Atomic checkpoint by rank 0. Under torchrun every rank must call it: each rank's
        collector/algorithm state and RNGs (its own streams) are gathered into the file, so a
        resume with the same N is exact per rank; weights and optimizer are identical on all."""
        local = {"task": self.task.state_dict(), "algo": self.algo.state_dict(), "rng": rng_state()}
        per_rank = dist.gather_to_main(local, self.ctx)
        if not self.is_main:
            return
        state = {
            "modules": {name: m.state_dict() for name, m in self.modules.items()},
            "optimizer": self.optimizer.state_dict(),
            "algo": local["algo"],
            "task": local["task"],
            "rng": local["rng"],
            "counters": {
                "updates": self.updates,
                "env_steps": self._steps,
                "wall_seconds": wall_seconds,
                "next_eval": self.next_eval,
                "steps_to_threshold": self.steps_to_threshold,
                "time_to_threshold": self.time_to_threshold,
                "eval_seconds": self.eval_seconds,
                "train_time_to_threshold": self.train_time_to_threshold,
                "world_size": self.ctx.world_size,
                "final_logged_at": self.final_logged_at,
                "pending_record": self.pending_record,
                "pending_eval": self.pending_eval,
            },
            "config": OmegaConf.to_container(self.cfg, resolve=True),
        }
        if self.ctx.enabled:
            state["ranks"] = per_rank
        atomic_save(state, checkpoint_path(self.run_dir), keep_previous=True)

    def _restore(self, state: dict[str, Any]) -> int:
        """Weights, optimizer and counters from ``state``; per-rank streams when N is unchanged.

        With a different number of ranks the per-rank batch (and so the collectors' shapes)
        differs: every rank then starts fresh collectors with its own seed and takes an equal
        share of the env steps done so far; the algorithm state is rank 0's.
        """
        for name, m in self.modules.items():
            m.load_state_dict(state["modules"][name])
        self.optimizer.load_state_dict(state["optimizer"])
        c = state["counters"]
        saved_world = int(c.get("world_size", 1))
        if saved_world == self.ctx.world_size:
            mine = state["ranks"][self.ctx.rank] if self.ctx.enabled else state
            self.algo.load_state_dict(mine["algo"])
            self.task.load_state_dict(mine["task"])
            set_rng_state(mine["rng"])
        else:
            self.algo.load_state_dict(state["algo"])
            done, world = int(c["env_steps"]), self.ctx.world_size
            self.task.set_env_steps(done // world + (done % world if self.is_main else 0))
            seed_everything(int(self.cfg.seed) + 1000 * self.ctx.rank + 7919 * int(c["updates"]))
        self.updates = c["updates"]
        self.wall_offset = c["wall_seconds"]
        self.next_eval = c["next_eval"]
        self.steps_to_threshold = c["steps_to_threshold"]
        self.time_to_threshold = c["time_to_threshold"]
        self.eval_seconds = float(c.get("eval_seconds", 0.0))  # checkpoints written before it was kept
        self.train_time_to_threshold = c.get("train_time_to_threshold")
        self.final_logged_at = c.get("final_logged_at")
        self.pending_record = c.get("pending_record")
        self.pending_eval = bool(c.get("pending_eval", False))
        return int(c["env_steps"])

    def close(self) -> None:
        self.task.close()
        self.logger.close()
