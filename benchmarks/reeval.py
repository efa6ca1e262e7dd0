"""Re-evaluate a suite's final policies with many greedy episodes.

A suite's periodic evaluations use few episodes so they stay cheap; their standard error on
simple_spread (per-agent return std ~3.7) is ~0.5 at 50 episodes, as large as the gaps the
targets ask about. This loads every run's final checkpoint (``<out>/<suite>/runs/<env>/<algo>/
seed<k>/checkpoints/last.pt``), runs the same greedy evaluation as the end of training on fresh
seeds (``python -m grpo_marl.evaluate``), writes ``eval.json`` per run and one table::

    python -m benchmarks.reeval --suite marl --episodes 1000 --envs simple_spread simple_speaker_listener
    python -m benchmarks.reeval --suite marl --episodes 200 --envs pursuit

The table (``<out>/<suite>/final_eval.md``, from ``final_eval.json``; one section per distinct
command, a rerun replaces its own) gives per env and algorithm the per-seed means, their mean +-
std over seeds, and the standard error of one run's mean (median over runs).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def reevaluate(out: Path, suite: str, envs: list[str] | None, episodes: int, seed_offset: int) -> dict:
    """``{env: {algo: [(seed, eval dict), ...]}}`` for every run with a final checkpoint."""
    from grpo_marl.evaluate import main as evaluate

    results: dict[str, dict[str, list[tuple[int, dict]]]] = {}
    root = out / suite / "runs"
    for env_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        if envs and env_dir.name not in envs:
            continue
        for algo_dir in sorted(p for p in env_dir.iterdir() if p.is_dir()):
            for run in sorted(algo_dir.glob("seed*")):
                if not (run / "checkpoints" / "last.pt").exists() or not (run / "summary.json").exists():
                    continue
                res = evaluate([f"run={run}", f"episodes={episodes}", f"seed_offset={seed_offset}"])
                results.setdefault(env_dir.name, {}).setdefault(algo_dir.name, []).append(
                    (int(run.name.removeprefix("seed")), res)
                )
    return results


def table(results: dict, episodes: int, command: str) -> str:
    lines = [
        f"## Final greedy evaluation, {episodes} episodes per run",
        "",
        f"`{command}`: the final checkpoint of every run, greedy, fresh seeds. Mean per-agent episode "
        "return for multi-agent envs (the env's own reward scale). SE: standard error of one run's mean "
        "(episode std / sqrt(episodes)), median over runs.",
        "",
        "| env | algo | per seed | mean +- std over seeds | SE of one run |",
        "|---|---|---|---|---|",
    ]
    for env, algos in results.items():
        for algo, runs in algos.items():
            means = [r["eval/return_mean"] for _, r in sorted(runs, key=lambda x: x[0])]
            per = ", ".join(f"s{s}: {r['eval/return_mean']:.2f}" for s, r in sorted(runs, key=lambda x: x[0]))
            mu = sum(means) / len(means)
            sd = math.sqrt(sum((m - mu) ** 2 for m in means) / len(means))
            ses = sorted(r["eval/return_std"] / math.sqrt(r["eval/episodes"]) for _, r in runs)
            lines.append(f"| {env} | {algo} | {per} | {mu:.2f} +- {sd:.2f} | {ses[len(ses) // 2]:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description="re-evaluate a suite's final policies with many episodes")
    p.add_argument("--suite", default="marl")
    p.add_argument("--envs", nargs="*", default=None)
    p.add_argument("--episodes", type=int, default=1000)
    p.add_argument("--seed-offset", type=int, default=2000, help="eval seeds: 1e6 + 1000*seed + offset + i")
    p.add_argument("--out", type=Path, default=REPO / "results")
    a = p.parse_args(argv)
    results = reevaluate(a.out, a.suite, a.envs, a.episodes, a.seed_offset)
    if not results:
        raise SystemExit(f"no finished runs with a final checkpoint under {a.out / a.suite / 'runs'}")
    cmd = "python -m benchmarks.reeval --suite {} --episodes {}{}".format(
        a.suite, a.episodes, f" --envs {' '.join(a.envs)}" if a.envs else ""
    )
    # Invocations accumulate (e.g. many episodes on fast envs, fewer on slow ones): final_eval.json
    # keeps each command's results, rerunning a command replaces its own; the table shows them all.
    store_path = a.out / a.suite / "final_eval.json"
    store = json.loads(store_path.read_text()) if store_path.exists() else {}
    store[cmd] = {
        "episodes": a.episodes,
        "results": {
            env: {algo: [[s, r] for s, r in runs] for algo, runs in algos.items()} for env, algos in results.items()
        },
    }
    store_path.write_text(json.dumps(store, indent=2) + "\n")
    text = "\n".join(table(v["results"], v["episodes"], c) for c, v in store.items())
    (a.out / a.suite / "final_eval.md").write_text(text)
    print(text, flush=True)
    return text


if __name__ == "__main__":
    main()
