"""How each algorithm of a suite is run: one subprocess per (env, algorithm, seed) job.

Every runner must leave in the job's run directory a ``metrics.jsonl`` whose eval lines carry
``step``, the env entry's ``metric`` (``eval/return_mean``; ``eval/accuracy`` for text) and
``time/wall_s``, and (when it finishes) a ``summary.json`` with ``env_steps``, ``wall_seconds``,
``steps_to_threshold``, ``time_to_threshold_s`` and the final metric (``eval/return_mean`` with
``eval/return_std``), plus optional ``throughput/*`` keys: the grpo_marl trainer writes exactly
these, and other runners (SB3 here; TRL in ``benchmarks/suites/text.py``) mimic them. Runners are looked up by algorithm name in
:data:`RUNNERS`; a suite module may :func:`register_runner` its own.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.suites import EnvEntry, Suite


@dataclass
class Job:
    suite: Suite
    entry: EnvEntry
    algo: str
    seed: int
    run_dir: Path
    smoke: bool = False
    stop_on_threshold: bool = False

    @property
    def eval_every(self) -> int:
        return self.entry.smoke_eval_every if self.smoke else self.entry.eval_every

    @property
    def total_steps(self) -> int | None:
        return self.entry.smoke_steps if self.smoke else self.entry.total_steps.get(self.algo)

    @property
    def key(self) -> str:
        return f"{self.entry.env}/{self.algo}/seed{self.seed}"


Runner = Callable[[Job], list[str]]  # job -> argv of the subprocess
RUNNERS: dict[str, Runner] = {}


def register_runner(algo: str) -> Callable[[Runner], Runner]:
    def decorator(fn: Runner) -> Runner:
        RUNNERS[algo] = fn
        return fn

    return decorator


def grpo_marl_command(job: Job, algo: str) -> list[str]:
    """The real CLI (``python -m grpo_marl.train``), so benchmarks exercise what users run."""
    argv = [
        sys.executable,
        "-m",
        "grpo_marl.train",
        f"env={job.entry.env}",
        f"algo={algo}",
        f"seed={job.seed}",
        f"hydra.run.dir={job.run_dir}",
        f"eval.every_steps={job.eval_every}",
        f"eval.episodes={job.suite.eval_episodes}",
        "log.progress=false",
        "log.tensorboard=false",
        "checkpoint.every=0",
    ]
    if job.total_steps:
        argv.append(f"total_steps={job.total_steps}")
    if job.entry.final_episodes and not job.smoke:
        argv.append(f"eval.final_episodes={job.entry.final_episodes}")
    if job.entry.threshold is not None:
        argv.append(f"train.threshold={job.entry.threshold}")
    if job.stop_on_threshold:
        argv.append("train.stop_on_threshold=true")
    argv += list(job.entry.overrides.get(job.algo, []))
    return argv


@register_runner("grpo")
def _grpo(job: Job) -> list[str]:
    return grpo_marl_command(job, "grpo")


@register_runner("ppo")
def _ppo(job: Job) -> list[str]:
    return grpo_marl_command(job, "ppo")


@register_runner("sb3_ppo")
def _sb3_ppo(job: Job) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "benchmarks.sb3_ppo",
        "--env",
        job.entry.env,
        "--seed",
        str(job.seed),
        "--run-dir",
        str(job.run_dir),
        "--eval-every",
        str(job.eval_every),
        "--eval-episodes",
        str(job.suite.eval_episodes),
    ]
    if job.total_steps:
        argv += ["--total-steps", str(job.total_steps)]
    if job.entry.threshold is not None:
        argv += ["--threshold", str(job.entry.threshold)]
    if job.stop_on_threshold:
        argv.append("--stop-on-threshold")
    return argv


def available(algo: str) -> str | None:
    """Why ``algo`` cannot run here (None when it can): SB3 is an optional extra."""
    if algo not in RUNNERS:
        return f"no runner registered for {algo!r} (known: {sorted(RUNNERS)})"
    if algo.startswith("sb3"):
        import importlib.util

        if importlib.util.find_spec("stable_baselines3") is None:
            return "stable-baselines3 is not installed (pip install 'grpo_marl[bench]')"
    return None
