"""Steps/s of the batched numpy ports against the original envs' own vector env, same run.

One function per env family returns its table rows; each row times the port and the reference
on the same machine, back to back, at the same vector width, with the same pre-drawn uniform
random actions (drawing them is outside the timed loop). Both keep every env busy: the
reference autoresets (Gymnasium's ``SyncVectorEnv``), the port is reset by the loop as a
streaming collector does (``reset(seeds, indices)`` of the envs that finished), and resets are
inside the timed loop for both. Steps/s counts env transitions (vector steps x envs)::

    python -m benchmarks.ports_speed --num-envs 64 --out results/ports_speed.md
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

CLASSIC = ("Acrobot-v1", "Pendulum-v1", "MountainCar-v0", "MountainCarContinuous-v0")


@dataclass
class Row:
    env: str
    port: str
    port_sps: float
    reference: str
    reference_sps: float


def _rate(step: Callable[[int], None], num_envs: int, seconds: float) -> float:
    """Env steps/s of ``step(t)`` called for at least ``seconds`` (after a short warm-up);
    the best of three windows, so a stray pause on a shared machine does not count."""
    for t in range(20):
        step(t)
    best = 0.0
    for _ in range(3):
        n, t0 = 0, time.perf_counter()
        while True:
            for _ in range(50):
                step(n)
                n += 1
            dt = time.perf_counter() - t0
            if dt >= seconds / 3:
                break
        best = max(best, n * num_envs / dt)
    return best


def _random_actions(space: Any, num_envs: int, count: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``count`` batches of uniform random actions, ``[E]`` (Discrete) or ``[E, k]`` (Box)."""
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        return list(rng.integers(0, int(space.n), (count, num_envs)))
    low, high = space.low.astype(np.float64), space.high.astype(np.float64)
    return list(rng.uniform(low, high, (count, num_envs, *space.shape)).astype(np.float32))


def _time_port(vec: Any, actions: list[np.ndarray], seconds: float) -> float:
    E = vec.num_envs
    vec.reset(list(range(E)))
    shaped = [a[:, None] if a.ndim == 1 else a[:, None, :] for a in actions]
    next_seed = [E]

    def step(t: int) -> None:
        done = vec.step(shaped[t % len(shaped)]).env_done
        if done.any():
            idx = np.flatnonzero(done)
            vec.reset(list(range(next_seed[0], next_seed[0] + len(idx))), idx)
            next_seed[0] += len(idx)

    return _rate(step, E, seconds)


def classic_rows(num_envs: int, seconds: float) -> list[Row]:
    """Gymnasium classic control: the ports of :mod:`grpo_marl.vec.ports.classic` vs
    ``gymnasium.vector.SyncVectorEnv`` of ``gym.make(id)`` (what the sync path steps)."""
    import gymnasium as gym

    from grpo_marl.vec.ports import port_class

    rows = []
    for env_id in CLASSIC:
        cls = port_class(env_id)
        rng = np.random.default_rng(0)
        ref = gym.vector.SyncVectorEnv([lambda env_id=env_id: gym.make(env_id) for _ in range(num_envs)])
        actions = _random_actions(ref.single_action_space, num_envs, 256, rng)
        ref.reset(seed=list(range(num_envs)))
        ref_sps = _rate(lambda t, ref=ref, acts=actions: ref.step(acts[t % len(acts)]), num_envs, seconds)
        ref.close()
        port_sps = _time_port(cls(num_envs), actions, seconds)
        rows.append(Row(env_id, cls.__name__, port_sps, "gymnasium SyncVectorEnv", ref_sps))
    return rows


# -- MPE (mpe2 scenarios) -------------------------------------------------------------------------
MPE = (
    ("simple_spread_v3", False),
    ("simple_spread_v3", True),
    ("simple_speaker_listener_v4", False),
    ("simple_reference_v3", False),
)


def _mpe_actions(layout: Any, num_envs: int, count: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``count`` batches of uniform random joint actions: ``int64[E, A]`` or ``float32[E, A, k]``."""
    if layout.continuous:
        k = max(layout.action_dims)
        return list(rng.uniform(0.0, 1.0, (count, num_envs, layout.num_agents, k)).astype(np.float32))
    n = np.asarray(layout.n_actions)
    return list(rng.integers(0, n, (count, num_envs, layout.num_agents)))


def _time_mpe2(name: str, continuous: bool, layout: Any, actions: list[np.ndarray], seconds: float) -> float:
    """mpe2's own ``parallel_env``, one per env, stepped in a Python loop (what a single-process
    collector does); an env that finishes is reset at once, inside the timed loop."""
    import importlib

    from pettingzoo.utils.env_logger import EnvLogger

    EnvLogger.suppress_output()
    module = importlib.import_module(f"mpe2.{name}")
    E = actions[0].shape[0]
    envs = [module.parallel_env(continuous_actions=continuous) for _ in range(E)]
    for i, env in enumerate(envs):
        env.reset(seed=i)
    next_seed = [E]
    agents = layout.agents
    dims = layout.action_dims

    def step(t: int) -> None:
        a = actions[t % len(actions)]
        for i, env in enumerate(envs):
            if continuous:
                env.step({ag: a[i, k, : dims[k]] for k, ag in enumerate(agents)})
            else:
                env.step({ag: int(a[i, k]) for k, ag in enumerate(agents)})
            if not env.agents:
                env.reset(seed=next_seed[0])
                next_seed[0] += 1

    return _rate(step, E, seconds)


def _time_mpe_port(vec: Any, actions: list[np.ndarray], seconds: float) -> float:
    E = vec.num_envs
    vec.reset(list(range(E)))
    next_seed = [E]

    def step(t: int) -> None:
        done = vec.step(actions[t % len(actions)]).env_done
        if done.any():
            idx = np.flatnonzero(done)
            vec.reset(list(range(next_seed[0], next_seed[0] + len(idx))), idx)
            next_seed[0] += len(idx)

    return _rate(step, E, seconds)


def mpe_rows(num_envs: int, seconds: float) -> list[Row]:
    """mpe2 scenarios: the ports of :mod:`grpo_marl.vec.ports.mpe` vs mpe2's ``parallel_env``
    stepped in a Python loop over the same number of envs (joint steps: one env, all agents)."""
    from grpo_marl.vec.ports import port_class

    rows = []
    for name, continuous in MPE:
        cls = port_class(name)
        vec = cls(num_envs, continuous_actions=continuous)
        actions = _mpe_actions(vec.layout, num_envs, 256, np.random.default_rng(0))
        ref_sps = _time_mpe2(name, continuous, vec.layout, actions, seconds)
        port_sps = _time_mpe_port(vec, actions, seconds)
        kind = "continuous" if continuous else "discrete"
        rows.append(
            Row(f"{name} ({kind})", cls.__name__, port_sps, f"mpe2 parallel_env x{num_envs}, Python loop", ref_sps)
        )
    return rows


FAMILIES: dict[str, Callable[[int, float], list[Row]]] = {"classic": classic_rows, "mpe": mpe_rows}


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description="batched port steps/s vs the original envs' vector env")
    p.add_argument("--families", nargs="*", default=list(FAMILIES), choices=list(FAMILIES))
    p.add_argument("--num-envs", type=int, default=64)
    p.add_argument("--seconds", type=float, default=3.0, help="timing window per measurement")
    p.add_argument("--out", type=Path, default=Path("results/ports_speed.md"))
    a = p.parse_args(argv)
    load = os.getloadavg()[0]  # a shared machine's load changes absolute rates a lot; ratios less
    rows = [row for fam in a.families for row in FAMILIES[fam](a.num_envs, a.seconds)]
    lines = [
        (
            f"Env steps/s (vector steps x envs), {a.num_envs} envs, uniform random actions, one process "
            f"({platform.machine()}, numpy {np.__version__}); port and reference timed back to back in the "
            f"same run (`python -m benchmarks.ports_speed`); load average {load:.1f} on {os.cpu_count()} CPUs "
            "at the start."
        ),
        "",
        "| env | port | port steps/s | reference | reference steps/s | speedup |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.env} | {r.port} | {r.port_sps:,.0f} | {r.reference} | {r.reference_sps:,.0f} "
            f"| {r.port_sps / r.reference_sps:.1f}x |"
        )
    text = "\n".join(lines) + "\n"
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text)
    print(text, flush=True)
    return text


if __name__ == "__main__":
    main()
