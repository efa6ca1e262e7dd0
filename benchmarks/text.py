"""Text suite: our GRPO vs TRL's GRPOTrainer on the same tiny model, task and batch.

Both sides train the same locally built tiny causal LM (one HF model dir, built once, nothing
downloaded) on single-digit addition with the same prompts per step, group size, completion
length, learning rate, loss aggregation (``dapo``: token mean), group-std scaling, no KL, one
optimizer step per batch and a constant LR. Each side runs in its own subprocess (clean peak
memory) pinned to the same number of torch threads, and reports:

* step time (median seconds per optimizer step, evaluations excluded),
* completions/s and completion tokens/s over the training time (evaluations excluded),
* peak resident memory of the process (``ru_maxrss``),
* accuracy vs wall-clock: greedy accuracy on all 100 prompts every ``--eval-every`` steps, with
  the *same* evaluation code (our greedy KV-cache decoder) applied to each side's model; its
  time is excluded from the wall-clock axis on both sides.

    python -m benchmarks.text --steps 200 --prompts 8 --group-size 8 --max-new-tokens 4 \
        --out benchmarks/results/text

TRL is an optional extra (``pip install -e ".[bench]"``), imported only by its worker; without it the
report has our side only. The machine may be shared: compare figures within one invocation.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def greedy_accuracy(model: Any, tokenizer: Any, max_new_tokens: int) -> float:
    """Greedy accuracy on all 100 single-digit sums, with our decoder (same for both sides)."""
    import torch

    from envs.text.tasks import arithmetic_task
    from grpo_marl.policies.llm import LLMPolicy

    task = arithmetic_task()
    was_training = model.training
    pol = LLMPolicy(model, tokenizer)
    ids, mask = pol.encode_prompts(list(task.eval.prompts))
    with torch.no_grad():
        gen = pol.generate(ids, mask, max_new_tokens=max_new_tokens, greedy=True)
    model.train(was_training)
    texts = pol.decode(gen.completion_ids, gen.completion_mask)
    _, _, acc = task.score(list(task.eval.prompts), texts, list(task.eval.answers))
    return float(acc.mean())


# ----------------------------------------------------------------------------- workers


def worker_ours(a: argparse.Namespace) -> dict[str, Any]:
    """Our trainer via the same code path as the CLI (Hydra compose + grpo_marl.train.run)."""
    from hydra import compose, initialize_config_dir

    import grpo_marl.config  # noqa: F401  (registers the ${safe:} resolver)
    from grpo_marl.train import run

    per_step = a.prompts * a.group_size
    run_dir = Path(a.out) / "ours_run"
    overrides = [
        "env=arithmetic",
        f"model.path={a.model}",
        f"seed={a.seed}",
        f"threads={a.threads}",
        f"algo.num_groups={a.prompts}",
        f"algo.group_size={a.group_size}",
        f"algo.lr={a.lr}",
        "algo.aggregation=dapo",
        "algo.scale=group",
        "algo.beta=0",
        "algo.epochs=1",
        "algo.minibatches=1",
        "algo.lr_schedule=constant",
        "algo.max_grad_norm=1.0",
        f"text.max_new_tokens={a.max_new_tokens}",
        f"total_steps={per_step * a.steps}",
        f"eval.every_steps={per_step * a.eval_every}",
        "log.every=1",
        "log.tensorboard=false",
        "log.progress=false",
        "checkpoint.every=0",
        "model.save=false",
        "text.log_completions_every=0",
    ]
    with initialize_config_dir(config_dir=str(REPO / "grpo_marl" / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    # Process CPU time per update (collect start -> end of the optimizer step): unlike wall time
    # it does not depend on what else the (shared) machine is running.
    from grpo_marl.tasks.text import TextTask

    cpu: list[float] = []
    orig_collect, orig_end = TextTask.collect, TextTask.end_update
    start = [0.0]

    def collect(self: Any, policy: Any) -> Any:
        start[0] = time.process_time()
        return orig_collect(self, policy)

    def end_update(self: Any, batch: Any) -> None:
        orig_end(self, batch)
        cpu.append(time.process_time() - start[0])

    TextTask.collect, TextTask.end_update = collect, end_update  # type: ignore[method-assign]
    run(cfg, overrides, run_dir)
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "train/updates" in r]
    # time/wall_s includes evaluations; take per-update durations from the trainer's own clocks.
    step_times = [per_step / r["time/collect_sps"] + r["time/update_s"] for r in steps]
    train_time = sum(step_times)
    tokens = sum(r["rollout/completion_tokens"] for r in steps)
    curve, elapsed = [], 0.0
    for r in records:
        if "train/updates" in r:
            elapsed += per_step / r["time/collect_sps"] + r["time/update_s"]
        if "eval/accuracy" in r and "train/updates" in r:
            curve.append({"step": int(r["train/updates"]), "wall_s": elapsed, "accuracy": r["eval/accuracy"]})
    return {
        "framework": "grpo_marl",
        "cpu_step_time_s": statistics.median(cpu),
        "cpu_completions_per_s": per_step * len(cpu) / sum(cpu),
        "steps": len(steps),
        "step_time_s": statistics.median(step_times),
        "completions_per_s": per_step * len(steps) / train_time,
        "tokens_per_s": tokens / train_time,
        "train_time_s": train_time,
        "peak_rss_mb": _peak_rss_mb(),
        "curve": curve,
        "final_accuracy": curve[-1]["accuracy"] if curve else None,
    }


def worker_trl(a: argparse.Namespace) -> dict[str, Any]:
    """TRL's GRPOTrainer with the matching settings (``benchmarks.trl_runner``'s config, dataset
    and reward, shared with the ``text`` suite's ``trl_grpo`` runner); timing and eval from a callback."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.trl_runner import StepClock, build_trainer, grpo_config
    from envs.text.tasks import arithmetic_task

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    args = grpo_config(
        output_dir=Path(a.out) / "trl_run",
        prompts=a.prompts,
        group_size=a.group_size,
        max_new_tokens=a.max_new_tokens,
        lr=a.lr,
        updates=a.steps,
        seed=a.seed,
        aggregation="dapo",
        scale="group",
        beta=0.0,
        epochs=1,
        minibatches=1,
        max_grad_norm=1.0,
        adam_eps=1e-5,
    )
    curve: list[dict[str, float]] = []

    def on_update(step: int, seconds: float, model_: Any, control: Any) -> None:
        if step % a.eval_every == 0 or step == a.steps:
            acc = greedy_accuracy(model_ if model_ is not None else trainer.model, tok, a.max_new_tokens)
            curve.append({"step": step, "wall_s": sum(clock.step_times), "accuracy": acc})

    clock = StepClock.make(1, on_update)
    trainer, reward = build_trainer(model, tok, arithmetic_task(), args, [clock])
    trainer.train()
    per_step = a.prompts * a.group_size
    train_time = sum(clock.step_times)
    return {
        "framework": "trl",
        "cpu_step_time_s": statistics.median(clock.cpu_times),
        "cpu_completions_per_s": per_step * len(clock.cpu_times) / sum(clock.cpu_times),
        "steps": len(clock.step_times),
        "step_time_s": statistics.median(clock.step_times),
        "completions_per_s": per_step * len(clock.step_times) / train_time,
        "tokens_per_s": reward.tokens / train_time,
        "train_time_s": train_time,
        "peak_rss_mb": _peak_rss_mb(),
        "curve": curve,
        "final_accuracy": curve[-1]["accuracy"] if curve else None,
    }


WORKERS = {"ours": worker_ours, "trl": worker_trl}


# ----------------------------------------------------------------------------- driver


def build_model(out: Path, seed: int) -> Path:
    from envs.text.tasks import arithmetic_task
    from grpo_marl.tiny_lm import TinyLMConfig, make_tiny_lm

    return make_tiny_lm(out / "model", TinyLMConfig(alphabet=arithmetic_task().alphabet), seed=seed)


def write_report(results: list[dict[str, Any]], a: argparse.Namespace, out: Path) -> str:
    lines = [
        f"# text suite: single-digit addition, {a.prompts} prompts x {a.group_size} completions, "
        f"{a.max_new_tokens} new tokens, {a.steps} steps, lr {a.lr}, {a.threads} thread(s)",
        "",
        "| framework | step time (s) | completions/s | tokens/s | CPU s/step | completions per CPU-s | peak RSS (MB) "
        "| train time (s) | final greedy accuracy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['framework']} | failed: {r['error']} | | | | | | | |")
            continue
        lines.append(
            f"| {r['framework']} | {r['step_time_s']:.4f} | {r['completions_per_s']:.0f} | {r['tokens_per_s']:.0f} "
            f"| {r['cpu_step_time_s']:.4f} | {r['cpu_completions_per_s']:.0f} "
            f"| {r['peak_rss_mb']:.0f} | {r['train_time_s']:.1f} | {r['final_accuracy']} |"
        )
    ok = [r for r in results if "error" not in r]
    by = {r["framework"]: r for r in ok}
    if "grpo_marl" in by and "trl" in by:
        ratio = by["grpo_marl"]["completions_per_s"] / by["trl"]["completions_per_s"]
        cpu_ratio = by["grpo_marl"]["cpu_completions_per_s"] / by["trl"]["cpu_completions_per_s"]
        lines += [
            "",
            f"completions/s ratio (ours / TRL): **{ratio:.2f}x** wall-clock, **{cpu_ratio:.2f}x** per CPU-second",
        ]
    lines += ["", "Accuracy vs training wall-clock (evaluations excluded):", ""]
    for r in ok:
        pts = ", ".join(f"{p['wall_s']:.1f}s: {p['accuracy']:.2f}" for p in r["curve"])
        lines.append(f"- {r['framework']}: {pts}")
    text = "\n".join(lines) + "\n"
    (out / "table.md").write_text(text)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for r in ok:
            ax.plot(
                [p["wall_s"] for p in r["curve"]], [p["accuracy"] for p in r["curve"]], marker="o", label=r["framework"]
            )
        ax.set_xlabel("training wall-clock (s)")
        ax.set_ylabel("greedy accuracy (100 prompts)")
        ax.set_ylim(0, 1)
        ax.legend()
        ax.set_title("single-digit addition, same tiny model")
        fig.tight_layout()
        fig.savefig(out / "accuracy_vs_wall.png", dpi=100)
    except ImportError:
        pass
    return text


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--prompts", type=int, default=8, help="prompts (groups) per step")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--eval-every", type=int, default=50, help="steps between greedy evaluations")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--frameworks", nargs="+", default=["ours", "trl"], choices=sorted(WORKERS))
    p.add_argument("--out", default="benchmarks/results/text")
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.worker:
        res = WORKERS[a.worker](a)
        (out / f"{a.worker}.json").write_text(json.dumps(res, indent=2))
        return
    model = build_model(out, a.seed)
    results = []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    for fw in a.frameworks:
        argv_w = [sys.executable, "-m", "benchmarks.text", "--worker", fw, "--model", str(model)]
        argv_w += [
            f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items() if k not in ("worker", "model", "frameworks")
        ]
        print(f"[text bench] running {fw} ...", flush=True)
        proc = subprocess.run(argv_w, cwd=REPO, env=env, capture_output=True, text=True)
        res_path = out / f"{fw}.json"
        if proc.returncode != 0 or not res_path.exists():
            err = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            if fw == "trl" and "No module named 'trl'" in proc.stderr:
                err = "trl not installed (optional extra)"
            results.append({"framework": "grpo_marl" if fw == "ours" else fw, "error": err})
            (out / f"{fw}.log").write_text(proc.stdout + proc.stderr)
            continue
        results.append(json.loads(res_path.read_text()))
    print(write_report(results, a, out))


if __name__ == "__main__":
    main()
