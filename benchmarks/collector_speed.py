"""Collector throughput vs a bare loop on the same vector env and batch size.

The bare loop is the floor a collector cannot beat: ``policy.act`` (one batched MLP forward +
sampling) and ``vec.step`` per vector step, nothing stored. Against it we time

* GRPO's :class:`~grpo_marl.collectors.EpisodeCollector` (one episode per env, ``seed`` groups),
* GRPO's :class:`~grpo_marl.collectors.StreamingCollector` (``algo.rollout=stream``:
  slots that finish start the next group's members at once), and
* PPO's :class:`~grpo_marl.collectors.StepCollector` (``n_steps`` per env, streaming),

each returning the :class:`~grpo_marl.batch.Batch` the trainer consumes. Every env is timed
under each ``--vectorizations`` in the same run: ``auto`` (the batched numpy port where one
exists) and ``sync`` (the original Gymnasium envs stepped one by one), so the port's gain shows
as a same-run ratio. Env steps/s counts the
transitions the collector hands to training; GRPO's episode collector also steps finished slots
until the longest episode of the batch ends (its ``vector utilization`` is reported), so its
*vector* steps/s is shown too. One torch thread, as in training::

    python -m benchmarks.collector_speed --envs cartpole acrobot pendulum mountaincar_continuous \
        --num-envs 64 --out results/collector_speed.md
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from grpo_marl.collectors import EpisodeCollector, StepCollector, StreamingCollector
from grpo_marl.groups import AgentGroups
from grpo_marl.policies.mlp import ActorPolicy
from grpo_marl.registry import get_spec
from grpo_marl.vec import make_vec_env


def bare_loop(vec, policy: ActorPolicy, steps: int) -> float:
    """Vector steps/s x num_envs of act + step (+ resetting finished envs) only: the records are
    tensors on the env's device, handed to the policy as they are."""
    step = vec.reset(list(range(vec.num_envs)))
    obs = step.obs
    t0 = time.perf_counter()
    with torch.no_grad():
        for k in range(steps):
            action, _ = policy.act(obs)
            step = vec.step(policy.env_actions(action))
            obs = step.obs
            if bool(step.env_done.any()):
                done = step.env_done.nonzero()[:, 0].tolist()
                obs = obs.clone()
                obs[done] = vec.reset([k] * len(done), done).obs
    return steps * vec.num_envs / (time.perf_counter() - t0)


def time_collector(collect, min_seconds: float) -> tuple[float, float, float]:
    """(env steps/s, vector steps/s, utilization) over repeated calls for at least min_seconds."""
    collect()  # warm-up (allocation)
    steps = vsteps = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < min_seconds:
        batch = collect()
        steps += int(batch.mask.sum())
        vsteps += batch.mask.numel()
    dt = time.perf_counter() - t0
    return steps / dt, vsteps / dt, steps / max(vsteps, 1)


def measure(
    env: str, num_envs: int, group_size: int, n_steps: int, seconds: float, vectorization: str = "auto"
) -> dict[str, float]:
    spec = get_spec(env)
    vec = make_vec_env(spec, num_envs, vectorization=vectorization)
    groups = AgentGroups.from_layout(vec.layout)
    policy = ActorPolicy(groups, hidden=(64, 64))
    out = {"env": env, "vector": type(vec).__name__, "num_envs": num_envs}
    bare_steps = max(50, n_steps)
    bare_loop(vec, policy, 20)
    t0 = time.perf_counter()
    rates = []
    while time.perf_counter() - t0 < seconds:
        rates.append(bare_loop(vec, policy, bare_steps))
    out["bare_sps"] = float(np.median(rates))
    grpo = EpisodeCollector(vec, groups, num_groups=num_envs // group_size, group_size=group_size, seed=0)
    out["grpo_sps"], out["grpo_vector_sps"], out["grpo_utilization"] = time_collector(
        lambda: grpo.collect(policy), seconds
    )
    stream = StreamingCollector(vec, groups, num_groups=num_envs // group_size, group_size=group_size, seed=0)
    out["stream_sps"], _, _ = time_collector(lambda: stream.collect(policy), seconds)
    ppo = StepCollector(vec, groups, n_steps=n_steps, seed=0)
    out["ppo_sps"], _, _ = time_collector(lambda: ppo.collect(policy), seconds)
    vec.close()
    return out


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description="collector throughput vs a bare act+step loop")
    p.add_argument("--envs", nargs="*", default=["cartpole", "acrobot", "pendulum", "mountaincar_continuous"])
    p.add_argument(
        "--vectorizations", nargs="*", default=["auto", "sync"], help="vec.vectorization values timed per env"
    )
    p.add_argument("--num-envs", type=int, default=64, help="vector width (GRPO default: 8 groups x 8)")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--n-steps", type=int, default=128, help="PPO collector steps per env per call")
    p.add_argument("--seconds", type=float, default=3.0, help="timing window per measurement")
    p.add_argument("--out", type=Path, default=None, help="also write the markdown table here")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    rows = [measure(e, a.num_envs, a.group_size, a.n_steps, a.seconds, v) for e in a.envs for v in a.vectorizations]
    first: dict[str, float] = {}
    for r in rows:  # GRPO episode collector relative to the env's first vectorization (same run)
        r["vs_first"] = r["grpo_sps"] / first.setdefault(r["env"], r["grpo_sps"])
    lines = [
        f"Collector throughput, {a.num_envs} envs, MLP 64x64, 1 torch thread (env steps/s handed to training).",
        "",
        f"GRPO x: the episode collector's env steps/s relative to `{a.vectorizations[0]}` on the same env.",
        "",
        "| env | vector env | bare act+step | GRPO episode collector | (vector steps/s, utilization) "
        "| GRPO streaming collector | PPO step collector | GRPO x |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['env']} | {r['vector']} | {r['bare_sps']:,.0f} | {r['grpo_sps']:,.0f} "
            f"({r['grpo_sps'] / r['bare_sps']:.0%} of bare) | {r['grpo_vector_sps']:,.0f}, "
            f"{r['grpo_utilization']:.0%} | {r['stream_sps']:,.0f} ({r['stream_sps'] / r['bare_sps']:.0%} of bare) "
            f"| {r['ppo_sps']:,.0f} ({r['ppo_sps'] / r['bare_sps']:.0%} of bare) | {r['vs_first']:.2f}x |"
        )
    text = "\n".join(lines) + "\n"
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text)
    print(text, flush=True)
    return text


if __name__ == "__main__":
    main()
