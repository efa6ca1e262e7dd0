"""Training throughput on one GPU: classic control with thousands of envs, simple_spread, and the
text env with a ~0.5B-parameter Qwen2-architecture model (random weights, built from a config:
nothing is downloaded). Reports env steps/s, tokens/s and peak GPU memory as a markdown table.

Every case is a real training run through :class:`grpo_marl.trainer.Trainer` (collect -> GRPO
update -> ...) for a few updates, so the figures include the policy on the GPU, the loss and the
optimizer, not just env stepping. The whole script is sized to finish in < 8 minutes on one GPU
(an H100/H200-class card); ``--cpu-smoke`` runs the same cases at tiny sizes on the CPU (tests
use it, so the script cannot rot)::

    python -m benchmarks.gpu_throughput                     # GPU, writes benchmarks/results/gpu_throughput.md
    python -m benchmarks.gpu_throughput --cpu-smoke --out /tmp/smoke.md
    python -m benchmarks.gpu_throughput --only cartpole_native,text_qwen2_0.5b_bf16

Columns: ``env steps/s`` is end-to-end (env steps of the run / training wall time, updates
included); ``collect steps/s`` is the median over updates (after the first) of steps per second
of collection alone. For text, one env step is one completion; ``gen tokens/s`` counts completion
tokens sampled per second of generation and ``train tokens/s`` completion tokens per second of
the update (reference-free GRPO: one forward + backward over prompt + completion).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = ROOT / "grpo_marl" / "conf"

#: Qwen2-0.5B's architecture (hidden 896, 24 layers, 14 query / 2 KV heads, SwiGLU 4864, vocab
#: 151,936, tied embeddings): 494M parameters. The tokenizer is the task's character tokenizer;
#: ids past it are never sampled (LLMPolicy masks them), so random weights still give valid text.
QWEN2_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151_936,
    max_position_embeddings=1024,
    tie_word_embeddings=True,
)
QWEN2_TINY = dict(  # --cpu-smoke: same code path, toy size
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    max_position_embeddings=128,
    tie_word_embeddings=True,
)


@dataclass
class Case:
    name: str
    kind: str
    overrides: list[str]
    smoke: list[str]
    notes: str = ""
    needs_model: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


COMMON = [
    "log.progress=false",
    "log.tensorboard=false",
    "log.every=1",
    "checkpoint.every=0",
    "eval.every_steps=0",
    "train.stop_on_threshold=false",  # no periodic evaluations here (arithmetic stops at its threshold)
]

CASES: list[Case] = [
    Case(
        "cartpole_native",
        "gymnasium",
        # 512 groups x 8 = 4096 envs in the batched numpy CartPole port; episodes grow to 500
        # steps as it learns (up to 2M steps per update).
        [
            "env=cartpole",
            "algo.num_groups=512",
            "algo.group_size=8",
            "algo.minibatches=8",
            "total_steps=3000000",
            "eval.episodes=64",
        ],
        [
            "env=cartpole",
            "algo.num_groups=8",
            "algo.group_size=4",
            "algo.minibatches=2",
            "total_steps=1500",
            "eval.episodes=2",
        ],
        "4096 envs, native numpy vector env",
    ),
    Case(
        "pendulum_sync",
        "gymnasium",
        # 128 groups x 8 = 1024 Pendulum envs in the batched numpy port (200 steps per episode).
        ["env=pendulum", "algo.num_groups=128", "algo.group_size=8", "total_steps=1000000", "eval.episodes=16"],
        ["env=pendulum", "algo.num_groups=2", "algo.group_size=2", "total_steps=800", "eval.episodes=2"],
        "1024 envs, batched numpy port",
    ),
    Case(
        "acrobot_async",
        "gymnasium",
        # One worker process per env (AsyncVectorEnv): the CPU-bound-env layout, policy on the GPU.
        [
            "env=acrobot",
            "vec.vectorization=async",
            "algo.num_groups=8",
            "algo.group_size=8",
            "total_steps=200000",
            "eval.episodes=8",
        ],
        [
            "env=acrobot",
            "vec.vectorization=async",
            "algo.num_groups=2",
            "algo.group_size=2",
            "total_steps=1000",
            "eval.episodes=2",
            "vec.max_steps=100",
        ],
        "64 envs, AsyncVectorEnv (64 processes)",
    ),
    Case(
        "simple_spread",
        "pettingzoo",
        # 64 groups x 8 = 512 simple_spread envs (3 agents, 25 steps) in the batched numpy MPE port.
        ["env=simple_spread", "algo.num_groups=64", "algo.group_size=8", "total_steps=150000", "eval.episodes=16"],
        [
            "env=simple_spread",
            "algo.num_groups=2",
            "algo.group_size=2",
            "total_steps=200",
            "eval.episodes=2",
            "marl.num_workers=0",
        ],
        "512 envs x 3 agents, batched numpy MPE",
    ),
    Case(
        "text_qwen2_0.5b_bf16",
        "text",
        # 32 prompts x 8 completions of up to 64 tokens; bf16 weights.
        # 4 minibatches of 64 sequences: [64, 65, 151936] float32 logits are 2.5 GB per copy.
        [
            "env=arithmetic",
            "algo.num_groups=32",
            "algo.group_size=8",
            "total_steps=1024",
            "text.max_new_tokens=64",
            "text.eval_prompts=32",
            "eval.episodes=32",
            "model.save=false",
            "model.dtype=bfloat16",
            "algo.lr=1e-5",
            "algo.minibatches=4",
        ],
        [
            "env=arithmetic",
            "algo.num_groups=2",
            "algo.group_size=2",
            "total_steps=8",
            "text.max_new_tokens=8",
            "text.eval_prompts=4",
            "eval.episodes=4",
            "model.save=false",
            "model.dtype=float32",
        ],
        "Qwen2 arch, 494M params, random init, bf16 weights",
        needs_model=True,
    ),
    Case(
        "text_qwen2_0.5b_fp32_autocast",
        "text",
        # Same, with float32 master weights + Adam state and bf16 autocast (mixed precision).
        [
            "env=arithmetic",
            "algo.num_groups=32",
            "algo.group_size=8",
            "total_steps=1024",
            "text.max_new_tokens=64",
            "text.eval_prompts=32",
            "eval.episodes=32",
            "model.save=false",
            "model.dtype=float32",
            "autocast=bf16",
            "algo.lr=1e-5",
            "algo.minibatches=4",
        ],
        [
            "env=arithmetic",
            "algo.num_groups=2",
            "algo.group_size=2",
            "total_steps=8",
            "text.max_new_tokens=8",
            "text.eval_prompts=4",
            "eval.episodes=4",
            "model.save=false",
            "model.dtype=float32",
            "autocast=bf16",
        ],
        "Qwen2 arch, 494M params, fp32 weights + bf16 autocast",
        needs_model=True,
    ),
]


def build_qwen2_dir(path: Path, alphabet: str, smoke: bool) -> Path:
    """Write a randomly initialised Qwen2 model + the task's char tokenizer as an HF model dir."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_marl.tiny_lm import build_char_tokenizer

    arch = QWEN2_TINY if smoke else QWEN2_05B
    tok = build_char_tokenizer(alphabet, model_max_length=arch["max_position_embeddings"])
    config = Qwen2Config(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **arch
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
    if not smoke:
        model = model.to(torch.bfloat16)  # half the bytes to write; loading casts to model.dtype
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    n_params = sum(p.numel() for p in model.parameters())
    (path / "n_params.json").write_text(json.dumps({"n_params": n_params}))
    return path


def _compose(overrides: list[str]) -> Any:
    from hydra import compose, initialize_config_dir

    import grpo_marl.config  # noqa: F401  (registers the ${safe:} resolver)

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def run_case(case: Case, smoke: bool, device: str, workdir: Path, model_dir: Path | None) -> dict[str, Any]:
    import torch

    from grpo_marl.config import resolve_config
    from grpo_marl.trainer import Trainer

    overrides = [*(case.smoke if smoke else case.overrides), *COMMON, f"device={device}"]
    if model_dir is not None:
        overrides.append(f"model.path={model_dir}")
    cfg = resolve_config(_compose(overrides), overrides)
    run_dir = workdir / case.name
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    trainer = Trainer(cfg, run_dir)
    setup_s = time.perf_counter() - t0
    try:
        summary = trainer.fit()
        n_params = sum(p.numel() for p in trainer.task.policy.parameters())
        n_envs = int(getattr(getattr(trainer.task, "vec", None), "num_envs", 0) or 0)
    finally:
        trainer.close()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    updates = [r for r in records if "time/collect_sps" in r]
    steady = updates[1:] or updates
    row: dict[str, Any] = {
        "case": case.name,
        "kind": case.kind,
        "notes": case.notes,
        "envs": n_envs or int(cfg.algo.num_groups) * int(cfg.algo.group_size),
        "params": n_params,
        "updates": int(summary["updates"]),
        "env_steps": int(summary["env_steps"]),
        "wall_s": float(summary["wall_seconds"]),
        "setup_s": setup_s,
        "env_steps_per_s": summary["env_steps"] / max(summary["wall_seconds"], 1e-9),
        "collect_steps_per_s": statistics.median(r["time/collect_sps"] for r in steady) if steady else float("nan"),
        "eval_return": summary.get("eval/return_mean"),
        "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    }
    if case.kind == "text":
        gen_tokens = sum(r.get("rollout/completion_tokens", 0.0) for r in steady)
        gen_s = sum(r.get("time/generate_s", 0.0) for r in steady)
        upd_s = sum(r.get("time/update_s", 0.0) for r in steady)
        row["gen_tokens_per_s"] = gen_tokens / max(gen_s, 1e-9)
        row["train_tokens_per_s"] = gen_tokens / max(upd_s, 1e-9)
    return row


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != value:
            return "-"
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def markdown(rows: list[dict[str, Any]], header: str) -> str:
    lines = [
        header,
        "",
        "| case | envs | params | updates | env steps | env steps/s | collect steps/s | gen tokens/s | train tokens/s | peak GPU mem (GiB) | wall (s) | notes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            "| "
            + " | ".join(
                [
                    r["case"],
                    _fmt(r["envs"]),
                    f"{r['params'] / 1e6:.1f}M" if r["params"] >= 1e6 else _fmt(r["params"]),
                    _fmt(r["updates"]),
                    _fmt(r["env_steps"]),
                    _fmt(r["env_steps_per_s"]),
                    _fmt(r["collect_steps_per_s"]),
                    _fmt(r.get("gen_tokens_per_s")),
                    _fmt(r.get("train_tokens_per_s")),
                    _fmt(r["peak_gpu_gib"], 2),
                    _fmt(r["wall_s"], 1),
                    r["notes"],
                ]
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on the CPU (used by the tests)")
    p.add_argument("--only", default="", help="comma-separated case names (default: all)")
    p.add_argument("--out", default=None, help="markdown output (default benchmarks/results/gpu_throughput.md)")
    p.add_argument("--json", default=None, help="also write the rows as JSON here")
    p.add_argument("--workdir", default=None, help="run dirs (default: a temporary dir, removed)")
    args = p.parse_args(argv)

    import torch

    smoke = bool(args.cpu_smoke)
    if not smoke and not torch.cuda.is_available():
        sys.exit("error: no CUDA GPU here; run with --cpu-smoke for the tiny CPU version")
    device = "cpu" if smoke else "cuda"
    wanted = {n for n in args.only.split(",") if n}
    cases = [c for c in CASES if not wanted or c.name in wanted]
    unknown = wanted - {c.name for c in CASES}
    if unknown:
        sys.exit(f"error: unknown case(s) {sorted(unknown)}; choose from {[c.name for c in CASES]}")

    tmp = tempfile.TemporaryDirectory(prefix="gpu_throughput_") if args.workdir is None else None
    workdir = Path(args.workdir or tmp.name)  # type: ignore[union-attr]
    rows: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    try:
        model_dir: Path | None = None
        for case in cases:
            if case.needs_model and model_dir is None:
                from envs.text import make_text_env

                alphabet = make_text_env("arithmetic").task.alphabet
                t0 = time.perf_counter()
                model_dir = build_qwen2_dir(workdir / "qwen2_random", alphabet, smoke)
                print(f"[gpu_throughput] built random Qwen2 model dir in {time.perf_counter() - t0:.1f} s", flush=True)
            print(f"[gpu_throughput] {case.name} ...", flush=True)
            row = run_case(case, smoke, device, workdir, model_dir if case.needs_model else None)
            rows.append(row)
            print(
                f"[gpu_throughput] {case.name}: {row['env_steps_per_s']:,.0f} env steps/s, "
                f"{row['wall_s']:.1f} s, peak GPU {_fmt(row['peak_gpu_gib'], 2)} GiB",
                flush=True,
            )
    finally:
        if tmp is not None:
            tmp.cleanup()
    total = time.perf_counter() - t_start
    gpu = torch.cuda.get_device_name(0) if not smoke else "CPU (--cpu-smoke, tiny sizes)"
    header = (
        f"## GRPO training throughput on {gpu}\n\n"
        f"torch {torch.__version__}; whole script {total:.0f} s. Generated by `python -m benchmarks.gpu_throughput"
        f"{' --cpu-smoke' if smoke else ''}`."
    )
    text = markdown(rows, header)
    print(text)
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / "gpu_throughput.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2, default=float))
    return rows


if __name__ == "__main__":
    main()
