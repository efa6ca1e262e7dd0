"""Joint env steps per second: the batched numpy ports vs the envs they port, in the same run.

One function per env family returns table rows; ``main`` runs every family and writes a
markdown table (default ``results/ports_speed.md``). Each row times the original (Gymnasium or
mpe2 envs stepped one at a time in a Python loop over ``E`` envs, the way a single-process
collector steps them) and the port (one array program over the same ``E`` envs), with random
actions and whole episodes including resets, alternating the two over ``--rounds`` rounds and
keeping each side's median. A joint step is one step of one env (all its agents).

    python benchmarks/ports_speed.py --envs 128 --out results/ports_speed.md

The machine may be shared: only the ratios within one invocation are comparable.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

Row = dict[str, object]


def _median_pair(ref: Callable[[], float], port: Callable[[], float], rounds: int) -> tuple[float, float]:
    """Alternate the two timings ``rounds`` times (so load changes hit both) and take medians."""
    a, b = [], []
    for _ in range(rounds):
        a.append(ref())
        b.append(port())
    return statistics.median(a), statistics.median(b)


# -- classic control ----------------------------------------------------------------------------
def classic_rows(num_envs: int, rounds: int, seconds: float) -> list[Row]:
    """Classic-control ports (Acrobot, Pendulum, MountainCar): rows are added by their owner."""
    return []


# -- MPE ----------------------------------------------------------------------------------------
MPE_CASES = [
    ("simple_spread_v3", False),
    ("simple_spread_v3", True),
    ("simple_speaker_listener_v4", False),
    ("simple_reference_v3", False),
]


def _mpe2_loop(name: str, continuous: bool, num_envs: int, seconds: float, seed0: int) -> float:
    """mpe2's own ``parallel_env``, ``num_envs`` of them stepped in a Python loop (random actions)."""
    from pettingzoo.utils.env_logger import EnvLogger

    EnvLogger.suppress_output()
    module = importlib.import_module(f"mpe2.{name}")
    envs = [module.parallel_env(continuous_actions=continuous) for _ in range(num_envs)]
    rng = np.random.default_rng(seed0)
    spaces = {a: envs[0].action_space(a) for a in envs[0].possible_agents}
    n, ep = 0, 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or ep == 0:
        for i, env in enumerate(envs):
            env.reset(seed=seed0 + ep * num_envs + i)
        ep += 1
        live = list(envs)
        while live:
            for env in live:
                if continuous:
                    act = {a: rng.random(spaces[a].shape, dtype=np.float32) for a in env.agents}
                else:
                    act = {a: int(rng.integers(spaces[a].n)) for a in env.agents}
                env.step(act)
                n += 1
            live = [env for env in live if env.agents]
    return n / (time.perf_counter() - start)


def _mpe_port_loop(name: str, continuous: bool, num_envs: int, seconds: float, seed0: int) -> float:
    """The batched port over the same envs (one random action array per step)."""
    from grpo_marl.vec.ports import port_class

    vec = port_class(name)(num_envs, continuous_actions=continuous)
    lay = vec.layout
    rng = np.random.default_rng(seed0)
    n, ep = 0, 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds or ep == 0:
        step = vec.reset([seed0 + ep * num_envs + i for i in range(num_envs)])
        ep += 1
        while not step.env_done.all():
            if continuous:
                act = rng.random((num_envs, lay.num_agents, max(lay.action_dims)), dtype=np.float32)
            else:
                act = rng.integers(0, np.asarray(lay.n_actions), (num_envs, lay.num_agents))
            live = int((~step.env_done).sum())
            step = vec.step(act)
            n += live
    return n / (time.perf_counter() - start)


def mpe_rows(num_envs: int, rounds: int, seconds: float) -> list[Row]:
    """Batched mpe2 ports vs mpe2's ``parallel_env`` stepped in a loop over ``num_envs`` envs."""
    rows: list[Row] = []
    for name, continuous in MPE_CASES:
        ref, port = _median_pair(
            lambda name=name, continuous=continuous: _mpe2_loop(name, continuous, num_envs, seconds, 0),
            lambda name=name, continuous=continuous: _mpe_port_loop(name, continuous, num_envs, seconds, 0),
            rounds,
        )
        rows.append(
            {
                "family": "mpe",
                "env": name,
                "actions": "continuous" if continuous else "discrete",
                "envs": num_envs,
                "reference": "mpe2 parallel_env, Python loop",
                "ref_sps": ref,
                "port_sps": port,
            }
        )
        print(f"{name} {'cont' if continuous else 'disc'}: mpe2 {ref:,.0f}/s, port {port:,.0f}/s, {port / ref:.0f}x")
    return rows


# -- table --------------------------------------------------------------------------------------
def render(rows: list[Row], args: argparse.Namespace) -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    command = f"python benchmarks/ports_speed.py --envs {args.envs} --rounds {args.rounds} --seconds {args.seconds}"
    machine = (
        f"{os.cpu_count()} CPU cores, {platform.processor() or platform.machine()}, Python "
        f"{platform.python_version()}, numpy {np.__version__}; 1-min load average at the end {load:.1f} "
        "(the machine is shared; compare ratios within this table only)"
    )
    method = (
        f"Random actions, whole episodes with resets, one process; medians of {args.rounds} alternating "
        f"rounds of >= {args.seconds:g} s each side. A joint step is one step of one env (all its agents)."
    )
    lines = [
        "# Batched ports: joint env steps per second",
        "",
        f"Command: `{command}`  ",
        f"Machine: {machine}.",
        "",
        method,
        "",
        "| family | env | actions | E | reference | reference steps/s | port steps/s | port / reference |",
        "|---|---|---|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        ref, port = float(r["ref_sps"]), float(r["port_sps"])  # type: ignore[arg-type]
        lines.append(
            f"| {r['family']} | {r['env']} | {r['actions']} | {r['envs']} | {r['reference']} | "
            f"{ref:,.0f} | {port:,.0f} | {port / ref:.0f}x |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0, help="minimum seconds per timing")
    parser.add_argument("--families", nargs="+", default=["classic", "mpe"], choices=["classic", "mpe"])
    parser.add_argument("--out", default="results/ports_speed.md")
    args = parser.parse_args(argv)
    rows: list[Row] = []
    if "classic" in args.families:
        rows += classic_rows(args.envs, args.rounds, args.seconds)
    if "mpe" in args.families:
        rows += mpe_rows(args.envs, args.rounds, args.seconds)
    text = render(rows, args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
