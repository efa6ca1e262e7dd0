"""Collector throughput on mpe2 simple_spread: joint env steps per second.

Compares mpe2's own ``parallel_env`` (single process, random actions: the reference speed), the
lock-step :class:`~grpo_marl.marl.vector.MarlVecEnv` with 0..W worker processes (random
actions), and the full GRPO episode collector (policy forward + sampling + storage) at the
same widths. Writes a markdown table.

    python benchmarks/marl_speed.py --envs 128 --workers 0 1 2 --out benchmarks/results/marl_speed.md

The machine is shared: the figures are only comparable within one invocation.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo_marl.marl.envs import make_parallel_env
from grpo_marl.marl.groups import AgentGroups
from grpo_marl.marl.policy import MultiAgentPolicy
from grpo_marl.marl.references import RandomPolicy
from grpo_marl.marl.rollout import MarlEpisodeCollector
from grpo_marl.marl.vector import MarlVecEnv


def mpe2_reference(env: str, seconds: float) -> float:
    """mpe2's own parallel env (aec_to_parallel), one process, random actions."""
    e = make_parallel_env(env, fast=False)
    rng = np.random.default_rng(0)
    n, ep = 0, 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        e.reset(seed=ep)
        ep += 1
        while e.agents:
            e.step({a: int(rng.integers(e.action_space(a).n)) for a in e.agents})
            n += 1
    return n / (time.perf_counter() - start)


def vec_random(env: str, num_envs: int, workers: int, episodes: int) -> float:
    vec = MarlVecEnv(functools.partial(make_parallel_env, env), num_envs, num_workers=workers)
    policy = RandomPolicy(0)
    n = 0
    start = time.perf_counter()
    for k in range(episodes):
        step = vec.reset([k * num_envs + i for i in range(num_envs)])
        while not step.env_done.all():
            live = int((~step.env_done).sum())
            step = vec.step(policy(step))
            n += live
    out = n / (time.perf_counter() - start)
    vec.close()
    return out


def collector(env: str, num_envs: int, workers: int, collections: int) -> float:
    fn = functools.partial(make_parallel_env, env)
    groups = AgentGroups.from_env(fn())
    vec = MarlVecEnv(fn, num_envs, num_workers=workers)
    col = MarlEpisodeCollector(vec, groups, num_envs // 8, 8)
    policy = MultiAgentPolicy(groups)
    col.collect(policy)  # warm-up
    steps0 = col.total_env_steps
    start = time.perf_counter()
    for _ in range(collections):
        col.collect(policy)
    out = (col.total_env_steps - steps0) / (time.perf_counter() - start)
    vec.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="simple_spread")
    p.add_argument("--envs", type=int, default=128, help="vector width (a multiple of 8)")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--episodes", type=int, default=4, help="episodes per env for the random-action runs")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    rows = [("mpe2 parallel_env, 1 process, random actions", mpe2_reference(args.env, 5.0))]
    for w in args.workers:
        rows.append((f"MarlVecEnv x{args.envs}, {w} workers, random actions", vec_random(args.env, args.envs, w, args.episodes)))
    for w in args.workers:
        rows.append((f"GRPO collector x{args.envs}, {w} workers, MLP policy", collector(args.env, args.envs, w, args.episodes)))
    lines = [f"# Collector speed on {args.env} (joint env steps / s)", "", "| setup | env steps/s |", "|---|---:|"]
    lines += [f"| {name} | {sps:,.0f} |" for name, sps in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
