"""VMAS env steps/s: bare VMAS vs the same scenario through grpo_marl's vector env (``VmasVec``).

    python -m benchmarks.vmas_speed                          # the suite's five tasks, 600 envs
    python -m benchmarks.vmas_speed --envs balance --num-envs 60 600 --device cpu

Both loops step the same VMAS batch with the same uniform random actions (drawn once per step as
one ``[E, A, k]`` tensor; the bare loop hands VMAS its per-agent views of it, as the adapter does)
for ``--steps`` steps, resetting the whole batch when every env is done (BenchMARL's VMAS tasks
all end at ``max_steps``: every episode has the same length). The bare loop calls
``env.step`` / ``env.reset``; ours calls ``VmasVec.step`` / ``VmasVec.reset`` with per-env seeds,
which also freezes finished envs, stacks observations and rewards into ``[E, A, ...]`` and builds
the contract's record. Repeats alternate bare/ours and the table shows the best of each (the
least disturbed by other processes). Writes ``results/vmas/speed.md`` and ``speed.json``.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path
from typing import Any

import torch

TASKS = ("balance", "navigation", "sampling", "transport", "wheel")


def _task_kwargs(task: str) -> dict[str, Any]:
    from grpo_marl.registry import get_spec

    return dict(get_spec(task).defaults["common"]["env_kwargs"])


def bare(task: str, num_envs: int, steps: int, device: str) -> float:
    """Env steps/s of a plain VMAS loop."""
    import vmas

    kw = _task_kwargs(task)
    max_steps, continuous = int(kw.pop("max_steps")), bool(kw.pop("continuous_actions"))
    env = vmas.make_env(task, num_envs=num_envs, device=device, continuous_actions=continuous, max_steps=max_steps,
                        terminated_truncated=True, clamp_actions=True, seed=0, **kw)  # fmt: skip
    dims = [int(s.shape[0]) for s in env.action_space]
    g = torch.Generator(device=device).manual_seed(0)
    env.reset()
    t0 = time.perf_counter()
    for _ in range(steps):
        a = torch.rand((num_envs, len(dims), max(dims)), generator=g, device=device) * 2 - 1
        _, _, terminated, truncated, _ = env.step([a[:, i, :d] for i, d in enumerate(dims)])
        if bool((terminated | truncated).all()):
            env.reset()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return num_envs * steps / (time.perf_counter() - t0)


def ours(task: str, num_envs: int, steps: int, device: str) -> float:
    """Env steps/s of the same loop through :class:`envs.vmas.vec.VmasVec`."""
    from envs.vmas import make_task
    from envs.vmas.vec import VmasVec

    vec = VmasVec(make_task(task, **{**_task_kwargs(task), "device": device}), num_envs)
    k = max(vec.layout.action_dims)
    g = torch.Generator(device=device).manual_seed(0)
    seeds = iter(range(10**9))
    vec.reset([next(seeds) for _ in range(num_envs)])
    t0 = time.perf_counter()
    for _ in range(steps):
        a = torch.rand((num_envs, vec.layout.num_agents, k), generator=g, device=device) * 2 - 1
        s = vec.step(a)
        if bool(s.env_done.all()):
            vec.reset([next(seeds) for _ in range(num_envs)])
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return num_envs * steps / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--envs", nargs="*", default=list(TASKS))
    p.add_argument("--num-envs", nargs="*", type=int, default=[600])
    p.add_argument("--steps", type=int, default=300, help="steps per measurement (3 episodes of 100)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("results/vmas"))
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    warnings.simplefilter("ignore")
    rows = []
    for task in a.envs:
        for n in a.num_envs:
            b, o = [], []
            for _ in range(a.repeats):
                b.append(bare(task, n, a.steps, a.device))
                o.append(ours(task, n, a.steps, a.device))
            row = {"env": task, "num_envs": n, "bare_sps": max(b), "ours_sps": max(o), "ratio": max(o) / max(b)}
            rows.append(row)
            print(f"{task:>10} E={n:5d}  bare {row['bare_sps']:9.0f}  ours {row['ours_sps']:9.0f}  "
                  f"ours/bare {row['ratio']:.3f}", flush=True)  # fmt: skip
    a.out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name() if a.device.startswith("cuda") else f"CPU, {a.threads} torch thread(s)"
    lines = [
        f"# VMAS env steps/s: bare VMAS vs grpo_marl's VmasVec ({device})",
        "",
        f"`python -m benchmarks.vmas_speed --envs {' '.join(a.envs)} --num-envs {' '.join(map(str, a.num_envs))} "
        f"--steps {a.steps} --repeats {a.repeats} --device {a.device}`; best of {a.repeats} alternating runs each.",
        "",
        "| env | envs | bare VMAS steps/s | ours steps/s | ours / bare |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['env']} | {r['num_envs']} | {r['bare_sps']:,.0f} | {r['ours_sps']:,.0f} | {r['ratio']:.3f} |"
        for r in rows
    ]
    (a.out / "speed.md").write_text("\n".join(lines) + "\n")
    (a.out / "speed.json").write_text(json.dumps({"device": device, "rows": rows}, indent=1))
    print(f"wrote {a.out / 'speed.md'}")


if __name__ == "__main__":
    main()
