"""BenchMARL's MAPPO / IPPO on a VMAS task: the external peer of the ``vmas`` suite.

Run with the *peer* virtualenv's python (BenchMARL pulls torchrl and its own torch; the harness
makes that venv, ``benchmarks/suites/vmas.py``), never with the project's: this script imports
neither ``grpo_marl`` nor ``benchmarks`` and receives everything on its command line, the task
parameters as JSON (the ``env_kwargs`` our config resolves for the same env)::

    .peers/benchmarl/bin/python benchmarks/benchmarl_runner.py --task balance --algo mappo \
        --task-kwargs '{"max_steps": 100, "n_agents": 4, "continuous_actions": true}' \
        --seed 1 --run-dir runs/balance_mappo_1 --max-frames 60000 --frames-per-batch 6000 \
        --n-envs 60 --eval-every 12000 --eval-episodes 20

It builds a BenchMARL ``Experiment``: the task ``vmas/<task>`` with exactly the given parameters
(BenchMARL's own task YAML is recorded next to them in ``config.json``, not merged in), the
algorithm's default config (BenchMARL's ``algorithm=<algo>`` YAML), BenchMARL's MLP for actor
and critic (``layers/mlp``: 256-256, Tanh) and the experiment settings of BenchMARL's published
VMAS configuration (its fine-tuned VMAS config: gamma 0.9, lr 5e-5,
Adam eps 1e-6, grad-norm clip 5, shared policy parameters, continuous actions, 45 minibatch
iterations per batch) with the batch scaled by the caller (``--frames-per-batch``, ``--n-envs``,
``--minibatch-size``), evaluation every ``--eval-every`` frames on ``--eval-episodes`` episodes
with deterministic actions (BenchMARL's default), rendering off, csv logger plus marl-eval JSON,
CPU, one torch thread.

It writes, in ``--run-dir``, what every runner of the harness writes (``benchmarks/runners.py``):
``metrics.jsonl`` (one line per BenchMARL evaluation: ``step`` = total frames, one per env per
step as BenchMARL counts them, ``eval/return_mean`` = the mean over episodes of the per-agent mean
episode return, which is what BenchMARL logs as ``eval/agents/reward/episode_reward_mean``, plus
``time/wall_s``, ``time/eval_s``, ``time/train_s``) and ``summary.json``; BenchMARL's own output
(csv scalars, the marl-eval JSON) stays under ``<run-dir>/benchmarl/``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Any

#: BenchMARL's published (fine-tuned) VMAS experiment settings, the ones
#: that do not depend on the machine. Batch size, env count, minibatch size, frame budget and the
#: evaluation cadence are the caller's (scaled for the CPU it runs on).
FINE_TUNED_VMAS = {
    "share_policy_params": True,
    "prefer_continuous_actions": True,
    "gamma": 0.9,
    "lr": 5e-5,
    "clip_grad_norm": True,
    "clip_grad_val": 5,
    "on_policy_n_minibatch_iters": 45,
}


def _episode_returns(experiment: Any, rollouts: list[Any]) -> list[float]:
    """Per-episode return, averaged over agents and groups, as BenchMARL's logger computes it
    (``Logger.log_evaluation``): each rollout cut at its first global done, the group's reward
    summed over time and averaged over its agents, then averaged over groups."""
    logger = experiment.logger
    out = []
    for r in rollouts:
        done = logger._get_global_done(r).squeeze(-1)
        index = done.nonzero(as_tuple=True)[0]
        if index.numel() > 0:
            r = r[: int(index[0]) + 1]
        per_group = [float(logger._get_reward(group, r).sum(0).mean()) for group in experiment.group_map]
        out.append(sum(per_group) / len(per_group))
    return out


try:  # this module is imported by the project's tests, where BenchMARL is not installed
    from benchmarl.experiment.callback import Callback
except ImportError:
    Callback = object  # type: ignore[assignment,misc]


class Clock(Callback):  # type: ignore[misc,valid-type]
    """Our ``metrics.jsonl``, one line per BenchMARL evaluation, with our trainer's clocks: the
    wall clock at the end of the update before the evaluation, and the evaluations before it.
    (Module level: BenchMARL pickles its callbacks with the experiment's config.)"""

    def __init__(self, metrics_path: Path) -> None:
        super().__init__()
        self.metrics_path = metrics_path
        self.state: dict[str, Any] = {
            "start": None,
            "update_end": None,
            "eval_s": 0.0,
            "last": None,
            "last_eval_s": 0.0,
        }

    def __getstate__(self) -> dict[str, Any]:  # the experiment it points to is not ours to pickle
        return {"metrics_path": self.metrics_path, "state": self.state, "experiment": None}

    def on_train_end(self, training_td: Any, group: str) -> None:
        self.state["update_end"] = time.perf_counter()

    def on_evaluation_end(self, rollouts: list[Any]) -> None:
        now = time.perf_counter()
        state = self.state
        before = state["update_end"] if state["update_end"] is not None else now
        wall = before - state["start"]
        returns = _episode_returns(self.experiment, rollouts)
        n = len(returns)
        mean = sum(returns) / n
        std = math.sqrt(sum((x - mean) ** 2 for x in returns) / n)
        record = {
            "step": int(self.experiment.total_frames),
            "eval/return_mean": mean,
            "eval/return_std": std,
            "eval/return_min": min(returns),
            "eval/return_max": max(returns),
            "eval/episodes": n,
            "time/wall_s": wall,
            "time/eval_s": state["eval_s"],
            "time/train_s": wall - state["eval_s"],
        }
        state["last_eval_s"] = now - before
        state["eval_s"] += now - before
        state["last"] = record
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(record) + "\n")


def run(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(max(1, a.threads))
    import benchmarl
    from benchmarl.algorithms import IppoConfig, MappoConfig
    from benchmarl.environments import VmasTask
    from benchmarl.environments.vmas.common import VmasClass
    from benchmarl.experiment import Experiment, ExperimentConfig
    from benchmarl.models.mlp import MlpConfig

    run_dir: Path = a.run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    out_dir = run_dir / "benchmarl"
    out_dir.mkdir(exist_ok=True)

    task_kwargs = dict(json.loads(a.task_kwargs))
    continuous = bool(task_kwargs.pop("continuous_actions", True))
    if "max_steps" not in task_kwargs:
        raise ValueError("the task kwargs need max_steps (BenchMARL's VMAS tasks are bounded by it)")
    name = a.task.upper()
    try:
        enum = VmasTask[name]
        task = enum.get_task(config=dict(task_kwargs))
        try:
            yaml_config = enum.get_from_yaml().config
        except Exception:  # a task without a YAML in this BenchMARL version
            yaml_config = None
    except KeyError:  # any other VMAS scenario: the same class, by name
        task, yaml_config = VmasClass(name=name, config=dict(task_kwargs)), None

    algorithm = {"mappo": MappoConfig, "ippo": IppoConfig}[a.algo].get_from_yaml()
    model = MlpConfig.get_from_yaml()
    critic_model = MlpConfig.get_from_yaml()

    cfg = ExperimentConfig.get_from_yaml()
    for key, value in FINE_TUNED_VMAS.items():
        setattr(cfg, key, value)
    cfg.prefer_continuous_actions = continuous
    if a.lr is not None:
        cfg.lr = a.lr
    if a.gamma is not None:
        cfg.gamma = a.gamma
    cfg.sampling_device = cfg.train_device = cfg.buffer_device = "cpu"
    cfg.max_n_iters = None
    cfg.max_n_frames = a.max_frames
    cfg.on_policy_collected_frames_per_batch = a.frames_per_batch
    cfg.on_policy_n_envs_per_worker = a.n_envs
    cfg.on_policy_minibatch_size = a.minibatch_size
    if a.minibatch_iters is not None:
        cfg.on_policy_n_minibatch_iters = a.minibatch_iters
    cfg.evaluation = True
    cfg.evaluation_interval = a.eval_every
    cfg.evaluation_episodes = a.eval_episodes
    cfg.evaluation_deterministic_actions = True
    cfg.render = False
    cfg.loggers = ["csv"]
    cfg.create_json = True
    cfg.save_folder = str(out_dir)
    cfg.checkpoint_interval = 0
    cfg.checkpoint_at_end = False

    metrics_path = run_dir / "metrics.jsonl"
    metrics_path.write_text("")
    clock = Clock(metrics_path)
    state = clock.state

    experiment = Experiment(
        task=task,
        algorithm_config=algorithm,
        model_config=model,
        critic_model_config=critic_model,
        seed=a.seed,
        config=cfg,
        callbacks=[clock],
    )
    versions = {"benchmarl": benchmarl.__version__, "torch": torch.__version__}
    for module in ("torchrl", "tensordict", "vmas"):
        try:
            versions[module] = __import__(module).__version__
        except Exception:
            versions[module] = None
    (run_dir / "config.json").write_text(
        json.dumps(
            {
                "runner": "benchmarl",
                "env": a.env or a.task,
                "task": f"vmas/{a.task}",
                "algo": a.algo,
                "seed": a.seed,
                "task_kwargs": task_kwargs,
                "continuous_actions": continuous,
                "benchmarl_task_yaml": yaml_config,
                "task_kwargs_differ_from_benchmarl_yaml": None
                if yaml_config is None
                else sorted(k for k in set(task_kwargs) | set(yaml_config) if task_kwargs.get(k) != yaml_config.get(k)),
                "experiment": {k: v for k, v in vars(cfg).items() if not k.startswith("_")},
                "algorithm": vars(algorithm),
                "model": {k: str(v) for k, v in vars(model).items()},
                "versions": versions,
                "benchmarl_output": str(experiment.folder_name),
            },
            indent=2,
            default=str,
        )
        + "\n"
    )
    state["start"] = time.perf_counter()
    experiment.run()
    wall = time.perf_counter() - state["start"]
    last = state["last"]
    if last is None:
        raise RuntimeError("BenchMARL ran no evaluation (evaluation_interval larger than max_n_frames?)")
    frames = int(experiment.total_frames)
    if last["step"] == frames:  # the last evaluation is the final one: out of the run's wall clock, as ours
        wall = last["time/wall_s"]
    summary = {
        "env": a.env or a.task,
        "algo": f"benchmarl_{a.algo}",
        "seed": a.seed,
        "status": "completed",
        **{k: last[k] for k in ("eval/return_mean", "eval/return_std", "eval/return_min", "eval/return_max")},
        "eval/episodes": last["eval/episodes"],
        "final_eval_step": last["step"],
        "env_steps": frames,
        "wall_seconds": wall,
        "env_steps_per_s": frames / wall if wall > 0 else None,
        "threshold": None,
        "steps_to_threshold": None,
        "time_to_threshold_s": None,
        "eval_seconds": state["eval_s"] - (state["last_eval_s"] if last["step"] == frames else 0.0),
        "train_time_to_threshold_s": None,
        "updates": int(experiment.n_iters_performed),
        "benchmarl_output": str(Path(experiment.folder_name).relative_to(run_dir)),
        "versions": versions,
    }
    _write_summary(run_dir, summary)
    return summary


def _write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    tmp = run_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2, default=float) + "\n")
    tmp.replace(run_dir / "summary.json")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", required=True, help="VMAS scenario (balance, navigation, ...)")
    p.add_argument("--env", default=None, help="our env name, for summary.json (default: --task)")
    p.add_argument("--algo", required=True, choices=["mappo", "ippo"])
    p.add_argument("--task-kwargs", required=True, help="JSON object: the task's parameters (our env_kwargs)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--max-frames", type=int, required=True)
    p.add_argument("--frames-per-batch", type=int, required=True)
    p.add_argument("--n-envs", type=int, required=True, help="vectorized VMAS envs collecting each batch")
    p.add_argument("--minibatch-size", type=int, default=400)
    p.add_argument("--minibatch-iters", type=int, default=None, help="default: 45 (BenchMARL's VMAS config)")
    p.add_argument("--eval-every", type=int, required=True, help="frames; a multiple of --frames-per-batch")
    p.add_argument("--eval-episodes", type=int, default=20)
    p.add_argument("--lr", type=float, default=None, help="default: 5e-5 (BenchMARL's VMAS config)")
    p.add_argument("--gamma", type=float, default=None, help="default: 0.9 (BenchMARL's VMAS config)")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    problems = []
    if a.frames_per_batch % a.n_envs:
        problems.append(f"--frames-per-batch {a.frames_per_batch} is not a multiple of --n-envs {a.n_envs}")
    if a.eval_every % a.frames_per_batch:
        problems.append(f"--eval-every {a.eval_every} is not a multiple of --frames-per-batch {a.frames_per_batch}")
    if a.max_frames % a.eval_every:
        problems.append(f"--max-frames {a.max_frames} is not a multiple of --eval-every {a.eval_every}")
    if problems:
        p.error("; ".join(problems))
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    try:
        s = run(a)
    except ModuleNotFoundError as exc:
        print(
            f"error: {exc.name} is not installed in {sys.executable}'s environment: run this script with "
            "the BenchMARL peer venv's python (benchmarl==1.5.2 vmas==1.5.2)",
            file=sys.stderr,
            flush=True,
        )
        return 1
    except Exception as exc:
        traceback.print_exc()
        _write_summary(a.run_dir, {"status": "failed", "error": f"{type(exc).__name__}: {exc}"})
        print(f"error: BenchMARL {a.algo} on vmas/{a.task}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    print(
        f"env={s['env']} algo={s['algo']} seed={a.seed} | final eval return {s['eval/return_mean']:.3f} +- "
        f"{s['eval/return_std']:.3f} | frames {s['env_steps']}, wall {s['wall_seconds']:.1f} s, "
        f"{s['env_steps_per_s']:.0f} frames/s",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
