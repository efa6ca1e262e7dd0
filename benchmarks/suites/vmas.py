"""``vmas``: our GRPO / MAPPO / IPPO against BenchMARL's MAPPO and IPPO on five VMAS tasks.

Ours go through the CLI (``env=<task> algo=grpo|mappo|ippo``); BenchMARL's through
``benchmarks/benchmarl_runner.py``, run by the python of BenchMARL's own virtualenv
(``.peers/benchmarl/``, made by the harness on first use: ``torch==2.13.0``, then
``benchmarl==1.5.2 vmas==1.5.2``, which bring torchrl and their own torch; ``$BENCHMARL_VENV``
names another one), so the project's torch pin is untouched. Both sides get, per task:

- the same task parameters: the ``env_kwargs`` our config resolves for the env (BenchMARL 1.5.2's
  task YAML values, ``max_steps`` 100 included, continuous actions), resolved here and passed to
  BenchMARL as JSON, replacing its task config;
- the same frame budget (frames = env steps summed over the vectorized envs, as BenchMARL counts
  them) and the same evaluation: every ``EVAL_EVERY`` frames, ``EVAL_EPISODES`` episodes,
  deterministic actions (BenchMARL's ``evaluation_deterministic_actions``; our greedy
  evaluation), the metric the mean over episodes of the per-agent mean episode return (BenchMARL's
  ``eval/agents/reward/episode_reward_mean``);
- 3 seeds (``--seeds 3``).

BenchMARL runs its published (fine-tuned) VMAS configuration (gamma 0.9, lr 5e-5, MLP 256-256
Tanh for actor and critic, shared parameters, 45 minibatch iterations over each batch) with the
batch scaled down by 10 for this 2-core CPU: 6,000 frames per batch from 60 envs x 100 steps,
minibatches of 400 frames (published: 60,000 from 600 envs, 4,096), so the same 675 gradient steps
per batch. The threshold of each task is BenchMARL MAPPO's median final return over seeds
(``Suite.threshold_from``); the table reports frames and wall seconds to it for every algorithm.

Budgets, measured here on 7 Dec 2026 (2 cores, one torch thread per job): a BenchMARL batch of
6,000 frames takes ~1-4 s to collect and ~20 s for its 675 minibatch steps, so BenchMARL trains
at 250-290 frames/s per job (one job alone: balance 255, navigation 288, sampling 255, wheel 272
with MAPPO, transport 162 with IPPO while other users' jobs ran; two jobs side by side: balance
267, transport 275 with MAPPO), plus ~8 s of startup. 75 jobs (5 tasks x 5 algorithms x 3 seeds)
in 60-75 minutes at ``--jobs 2`` leave ~2 minutes per job on average. **36,000 frames per run (6
BenchMARL batches), an evaluation every 6,000 frames of 50 episodes**: ~2.5-3 minutes per BenchMARL
job (30 jobs: ~80 job-minutes), leaving ~40-60 job-minutes for our 45 jobs (~1 minute each, i.e.
at least ~600 frames/s: raise ``FRAMES`` if ours are faster than that). 36,000 frames is 0.36% of
BenchMARL's published 10M-frame budget: the suite compares early learning and throughput, not
converged returns. ``--smoke``: 2,400 frames, an evaluation every 1,200, BenchMARL batches of
1,200 frames (12 envs, minibatches of 80): about a minute per BenchMARL job (~55 s measured, two
side by side).
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

import benchmarks.suites.marl  # noqa: F401  (registers our mappo / ippo runners)
from benchmarks.peer_venv import PeerVenv
from benchmarks.runners import Job, register_runner
from benchmarks.suites import EnvEntry, Suite, register_suite

REPO = Path(__file__).resolve().parents[2]
RUNNER_SCRIPT = REPO / "benchmarks" / "benchmarl_runner.py"

#: BenchMARL's own virtualenv: the project's torch pin first, then the peer's pins
BENCHMARL = PeerVenv(
    name="benchmarl",
    env_var="BENCHMARL_VENV",
    first=("torch==2.13.0",),
    packages=("benchmarl==1.5.2", "vmas==1.5.2"),
    modules=("benchmarl", "vmas", "torchrl"),
)

FRAMES = 36_000  # per run, every algorithm
EVAL_EVERY = 6_000  # frames; a multiple of BenchMARL's batch
EVAL_EPISODES = 50
#: BenchMARL's batch: frames per batch, vectorized envs (x max_steps 100), minibatch frames
BATCH = {"frames_per_batch": 6_000, "n_envs": 60, "minibatch_size": 400}
SMOKE_FRAMES, SMOKE_EVAL_EVERY = 2_400, 1_200
SMOKE_BATCH = {"frames_per_batch": 1_200, "n_envs": 12, "minibatch_size": 80}

ALGOS = ["grpo", "mappo", "ippo", "benchmarl_mappo", "benchmarl_ippo"]


@functools.cache
def _resolved_env_kwargs(env: str) -> str:
    from omegaconf import OmegaConf

    from grpo_marl.config import compose, resolve_config

    overrides = [f"env={env}", "algo=grpo"]  # env_kwargs do not depend on the algorithm
    cfg = resolve_config(compose(overrides), overrides)
    return json.dumps(OmegaConf.to_container(cfg.env_kwargs, resolve=True) or {}, sort_keys=True)


def our_env_kwargs(env: str) -> dict[str, Any]:
    """The ``env_kwargs`` our config resolves for ``env`` (what ``python -m grpo_marl.train
    env=<env>`` builds the task with): BenchMARL gets exactly these."""
    return json.loads(_resolved_env_kwargs(env))


def scenario(env: str) -> str:
    """The VMAS scenario of our env name: ``balance`` -> ``balance``, ``vmas:flocking`` -> ``flocking``."""
    return env.split(":", 1)[1] if env.startswith("vmas:") else env


def benchmarl_command(job: Job, algo: str) -> list[str]:
    """The peer venv's python on ``benchmarks/benchmarl_runner.py`` with this job's task, task
    parameters (resolved here, from our config), budget and evaluation."""
    batch = SMOKE_BATCH if job.smoke else BATCH
    frames = job.total_steps or FRAMES
    try:
        task_kwargs = our_env_kwargs(job.entry.env)
    except Exception as exc:  # the job fails with the reason in its log; the other jobs still run
        line = f"error: could not resolve our env_kwargs for env={job.entry.env}: {type(exc).__name__}: {exc}"
        return [sys.executable, "-c", f"import sys; print({line.splitlines()[0]!r}, file=sys.stderr); sys.exit(1)"]
    return [
        str(BENCHMARL.python),
        str(RUNNER_SCRIPT),
        "--task",
        scenario(job.entry.env),
        "--env",
        job.entry.env,
        "--algo",
        algo,
        "--task-kwargs",
        json.dumps(task_kwargs, sort_keys=True),
        "--seed",
        str(job.seed),
        "--run-dir",
        str(job.run_dir),
        "--max-frames",
        str(frames),
        "--frames-per-batch",
        str(batch["frames_per_batch"]),
        "--n-envs",
        str(batch["n_envs"]),
        "--minibatch-size",
        str(batch["minibatch_size"]),
        "--eval-every",
        str(job.eval_every),
        "--eval-episodes",
        str(job.suite.eval_episodes),
    ]


def prepare_benchmarl() -> str | None:
    """BenchMARL's virtualenv, made on first use; why it cannot be made, or None."""
    return BENCHMARL.ensure()


@register_runner("benchmarl_mappo", prepare=prepare_benchmarl)
def _benchmarl_mappo(job: Job) -> list[str]:
    return benchmarl_command(job, "mappo")


@register_runner("benchmarl_ippo", prepare=prepare_benchmarl)
def _benchmarl_ippo(job: Job) -> list[str]:
    return benchmarl_command(job, "ippo")


def _entry(env: str, label: str) -> EnvEntry:
    return EnvEntry(
        env,
        label,
        eval_every=EVAL_EVERY,
        total_steps={algo: FRAMES for algo in ALGOS},
        smoke_steps=SMOKE_FRAMES,
        smoke_eval_every=SMOKE_EVAL_EVERY,
        metric_digits=2,
    )


register_suite(
    Suite(
        name="vmas",
        description=(
            "VMAS (BenchMARL 1.5.2 task parameters, 100 steps, continuous actions): our GRPO / MAPPO / IPPO "
            "vs BenchMARL's MAPPO and IPPO at equal frames; threshold = BenchMARL MAPPO's median final return"
        ),
        algos=list(ALGOS),
        envs=[
            _entry("balance", "vmas balance (4 agents)"),
            _entry("navigation", "vmas navigation (3 agents, lidar)"),
            _entry("sampling", "vmas sampling (3 agents, lidar)"),
            _entry("transport", "vmas transport (4 agents, 1 package)"),
            _entry("wheel", "vmas wheel (4 agents)"),
        ],
        target="grpo",
        references=["benchmarl_mappo", "benchmarl_ippo", "mappo", "ippo"],
        references_label="BenchMARL's MAPPO/IPPO and ours",
        eval_episodes=EVAL_EPISODES,
        step_unit="frames",
        threshold_from="benchmarl_mappo",
        needs=("vmas",),
    )
)
