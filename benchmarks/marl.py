"""Benchmark suite ``marl``: GRPO vs IPPO vs MAPPO on the shipped multi-agent tasks, with the
random-policy and (simple_spread) scripted greedy-assignment references.

Every training run goes through the CLI (``python -m grpo_marl.train``) with the env's tuned
defaults, so the table measures what a user gets. The reported figure is the **mean per-agent
episode return** of the final greedy evaluation (the sum of one agent's rewards over an episode,
averaged over agents and evaluation episodes), on the env's own reward scale: mpe2 defaults
(simple_spread: ``local_ratio=0.5``, N=3, 25 steps — each agent's reward is half the team's
negative summed landmark distance plus half its own collision penalty) and PettingZoo defaults
for pursuit (except the shrunk 8x8 map).

    python benchmarks/marl.py --tasks simple_spread --algos grpo mappo ippo --seeds 1 2 3 \
        --out benchmarks/results/marl.md
    python benchmarks/marl.py --references-only --out benchmarks/results/marl_refs.md

Runs of one invocation share the CPU sequentially (``--parallel`` runs several at once).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# algorithm label -> CLI overrides
ALGOS: dict[str, list[str]] = {
    "grpo": ["algo=grpo"],
    "mappo": ["algo=mappo"],
    "ippo": ["algo=ippo"],
}
TASKS = ("simple_spread", "simple_speaker_listener", "pursuit")
# pursuit runs a few hundred steps/s per process: fewer reference episodes
REF_EPISODES_CAP = {"pursuit": 100}


def references(task: str, episodes: int, seed: int = 10_000) -> dict[str, dict[str, Any]]:
    """Random-policy (and for simple_spread scripted) mean per-agent returns: one episode per env
    of one vector env, through the one evaluation loop (grpo_marl.collectors.evaluate_policy)."""
    from grpo_marl.collectors import evaluate_policy
    from grpo_marl.groups import AgentGroups
    from grpo_marl.marl.references import GreedyLandmarkPolicy, RandomPolicy
    from grpo_marl.registry import get_spec
    from grpo_marl.vec import make_vec_env

    vec = make_vec_env(get_spec(task), episodes, num_workers=0)
    groups = AgentGroups.from_layout(vec.layout)
    seeds = list(range(seed, seed + episodes))
    policies: dict[str, Any] = {"random": RandomPolicy(groups, 0)}
    if task == "simple_spread":
        policies["scripted greedy assignment"] = GreedyLandmarkPolicy(groups)
        policies["scripted optimal assignment"] = GreedyLandmarkPolicy(groups, assignment="optimal")
    try:
        return {name: _reference_row(evaluate_policy(pol, vec, seeds), groups) for name, pol in policies.items()}
    finally:
        vec.close()


def _reference_row(metrics: dict[str, float], groups: Any) -> dict[str, Any]:
    """The table's fields from evaluate_policy's ``eval/...`` metrics."""
    per_group = {g: metrics.get(f"eval/return_mean/{g}", metrics["eval/return_mean"]) for g in groups.names}
    return {
        "return_mean": metrics["eval/return_mean"],
        "return_std": metrics["eval/return_std"],
        "per_group": per_group,
        "per_agent": {a: metrics.get(f"eval/agent_return/{a}", metrics["eval/return_mean"]) for a in groups.agents},
        "episodes": int(metrics["eval/episodes"]),
    }


def train(task: str, algo: str, seed: int, run_root: Path, extra: list[str]) -> dict[str, Any]:
    run_dir = run_root / f"{task}_{algo}_seed{seed}"
    cmd = [
        sys.executable,
        "-m",
        "grpo_marl.train",
        f"env={task}",
        *ALGOS[algo],
        f"seed={seed}",
        "log.progress=false",
        f"hydra.run.dir={run_dir}",
        *extra,
    ]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": (proc.stdout + proc.stderr)[-2000:], "wall_seconds": time.perf_counter() - start}
    return json.loads((run_dir / "summary.json").read_text())


def curves(run_dirs: list[Path]) -> str:
    """Periodic greedy evals of finished or running runs side by side, by env steps: the
    equal-env-steps comparison (eval.every_steps must match across the runs)."""
    table: dict[int, dict[str, str]] = {}
    names = []
    for run in run_dirs:
        name = run.name
        names.append(name)
        for line in (run / "metrics.jsonl").read_text().splitlines():
            rec = json.loads(line)
            if "eval/return_mean" in rec:
                step = int(rec["step"])
                bucket = round(step / 50_000) * 50_000  # runs log at slightly different steps
                wall = rec.get("time/wall_s")
                cell = f"{rec['eval/return_mean']:.2f}" + (f" ({wall / 60:.0f} min)" if wall else "")
                table.setdefault(bucket, {})[name] = cell
    lines = ["| env steps | " + " | ".join(names) + " |", "|---:|" + "---:|" * len(names)]
    for step in sorted(table):
        lines.append(f"| {step:,} | " + " | ".join(table[step].get(n, "") for n in names) + " |")
    return "\n".join(lines) + "\n"


def _fmt(values: list[float]) -> str:
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=list(TASKS))
    p.add_argument("--algos", nargs="+", default=list(ALGOS), choices=list(ALGOS))
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--ref-episodes", type=int, default=1000)
    p.add_argument("--references-only", action="store_true")
    p.add_argument(
        "--curves",
        nargs="+",
        type=Path,
        default=None,
        help="only print the periodic-eval table of these run directories",
    )
    p.add_argument("--parallel", type=int, default=1, help="training runs at once")
    p.add_argument("--runs", type=Path, default=ROOT / "runs" / "bench_marl")
    p.add_argument("--out", type=Path, default=None, help="markdown table path (a .json lands beside it)")
    p.add_argument("overrides", nargs="*", help="extra CLI overrides for every training run (key=value)")
    args = p.parse_args()
    if args.curves:
        text = curves(args.curves)
        print(text)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text)
        return

    results: dict[str, Any] = {"references": {}, "runs": {}}
    lines = ["# marl benchmark: mean per-agent episode return (final greedy eval)", ""]
    lines.append("| task | policy | return | per group | env steps | wall s |")
    lines.append("|---|---|---:|---|---:|---:|")
    for task in args.tasks:
        refs = references(task, min(args.ref_episodes, REF_EPISODES_CAP.get(task, args.ref_episodes)))
        results["references"][task] = refs
        for name, r in refs.items():
            groups = ", ".join(f"{g} {v:.2f}" for g, v in r.get("per_group", {}).items())
            lines.append(f"| {task} | {name} ({r['episodes']} ep) | {r['return_mean']:.2f} | {groups} | | |")
        if args.references_only:
            continue
        jobs = [(task, algo, seed) for algo in args.algos for seed in args.seeds]
        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            summaries = list(pool.map(lambda j: train(*j, args.runs, args.overrides), jobs))
        for (t, algo, seed), s in zip(jobs, summaries, strict=True):
            results["runs"][f"{t}/{algo}/{seed}"] = s
        for algo in args.algos:
            runs = [s for (t, a, _), s in zip(jobs, summaries, strict=True) if a == algo and "error" not in s]
            failed = sum(1 for (t, a, _), s in zip(jobs, summaries, strict=True) if a == algo and "error" in s)
            rets = [s["eval/return_mean"] for s in runs]
            group_names = sorted({g for s in runs for g in s.get("per_group_return", {})})
            groups = ", ".join(f"{g} {_fmt([s['per_group_return'][g] for s in runs])}" for g in group_names)
            steps = _fmt([float(s["env_steps"]) for s in runs]).split(" ")[0] if runs else "n/a"
            wall = _fmt([s["wall_seconds"] for s in runs]).split(" ")[0] if runs else "n/a"
            label = f"{algo} ({len(runs)} seeds{', ' + str(failed) + ' failed' if failed else ''})"
            lines.append(f"| {task} | {label} | {_fmt(rets)} | {groups} | {steps} | {wall} |")
    lines += [
        "",
        "Return = sum of one agent's rewards over an episode, averaged over agents and episodes;",
        "mpe2 default reward scale (simple_spread: local_ratio=0.5, N=3, 25 steps).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(results, indent=2, default=float))


if __name__ == "__main__":
    main()
