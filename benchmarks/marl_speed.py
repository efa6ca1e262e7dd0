"""Collector throughput on mpe2 simple_spread: joint env steps per second.

Compares mpe2's own ``parallel_env`` (single process, random actions: the reference speed), the
vector env of :func:`grpo_marl.vec.make_vec_env` over the mpe2 driver with 0 (in-process) .. W
worker processes and, where one exists, the batched numpy port (random actions), and the full
GRPO episode collector (policy forward + sampling + storage) at the same widths. Writes a
markdown table.

    python benchmarks/marl_speed.py --envs 128 --workers 0 1 2 --out benchmarks/results/marl_speed.md

The machine is shared: the figures are only comparable within one invocation.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grpo_marl.collectors import EpisodeCollector
from grpo_marl.errors import UserInputError
from grpo_marl.groups import AgentGroups
from grpo_marl.marl.envs import make_parallel_env
from grpo_marl.marl.references import RandomPolicy
from grpo_marl.policies.mlp import ActorPolicy
from grpo_marl.registry import get_spec
from grpo_marl.vec import VecEnv, make_vec_env


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


def make_vec(env: str, num_envs: int, workers: int | None) -> VecEnv:
    """mpe2 driver in-process (``workers=0``) or in ``workers`` processes; ``None``: the batched port."""
    if workers is None:
        return make_vec_env(get_spec(env), num_envs, vectorization="native")
    vectorization = "async" if workers > 0 else "sync"
    return make_vec_env(get_spec(env), num_envs, vectorization=vectorization, num_workers=workers)


def vec_random(env: str, num_envs: int, workers: int | None, episodes: int) -> float:
    vec = make_vec(env, num_envs, workers)
    policy = RandomPolicy(AgentGroups.from_layout(vec.layout), 0)
    n = 0
    start = time.perf_counter()
    for k in range(episodes):
        step = vec.reset([k * num_envs + i for i in range(num_envs)])
        while not step.env_done.all():
            live = int((~step.env_done).sum())
            mask = None if step.action_mask is None else torch.as_tensor(step.action_mask)
            actions, _ = policy.act(torch.as_tensor(step.obs), mask)
            step = vec.step(policy.to_env(actions))
            n += live
    out = n / (time.perf_counter() - start)
    vec.close()
    return out


def collector(env: str, num_envs: int, workers: int | None, collections: int) -> float:
    vec = make_vec(env, num_envs, workers)
    groups = AgentGroups.from_layout(vec.layout)
    col = EpisodeCollector(vec, groups, num_envs // 8, 8, env_name=env)
    policy = ActorPolicy(groups)
    col.collect(policy)  # warm-up
    steps0 = col.total_env_steps
    start = time.perf_counter()
    for _ in range(collections):
        col.collect(policy)
    out = (col.total_env_steps - steps0) / (time.perf_counter() - start)
    vec.close()
    return out


def has_port(env: str) -> bool:
    try:
        make_vec(env, 1, None).close()
    except UserInputError:
        return False
    return True


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
    widths: list[tuple[str, int | None]] = [(f"{w} workers", w) for w in args.workers]
    if has_port(args.env):
        widths.append(("batched numpy port", None))
    for label, w in widths:
        rows.append(
            (f"vector env x{args.envs}, {label}, random actions", vec_random(args.env, args.envs, w, args.episodes))
        )
    for label, w in widths:
        rows.append(
            (f"GRPO collector x{args.envs}, {label}, MLP policy", collector(args.env, args.envs, w, args.episodes))
        )
    lines = [f"# Collector speed on {args.env} (joint env steps / s)", "", "| setup | env steps/s |", "|---|---:|"]
    lines += [f"| {name} | {sps:,.0f} |" for name, sps in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
