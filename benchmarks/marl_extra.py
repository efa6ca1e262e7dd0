"""References and trained-policy evaluation for the butterfly/sisl families (issue 13).

Every figure goes through the one evaluation loop (:func:`grpo_marl.collectors.evaluate_policy`,
mean per-agent episode return on the env's own reward scale) on the same seeds
(``1_000_000 + i``), with the env built exactly as training builds it (tuned defaults and
``env_preprocess``):

* ``cooperative_pong``: uniform random; a scripted tracker that moves each paddle toward the
  ball's height (it reads the ball and paddle positions from the game, as a scripted policy may);
* ``knights_archers_zombies`` (vector obs, 900 cycles, 10 zombies): uniform random;
* ``multiwalker``: doing nothing (zero torques), uniform random torques; for these and trained
  policies also the package's x displacement (Box2D world units, from its start position).

``python -m benchmarks.marl_extra refs`` writes ``results/marl_extra/references.json``;
``python -m benchmarks.marl_extra eval RUN_DIR [episodes]`` evaluates a trained run (with the
displacement for multiwalker) and prints one JSON line.
``python -m benchmarks.marl_extra speed [env ...]`` measures env steps/s of one env with its tuned
preprocessing, built two ways in the same run on the same seeds and actions: SuperSuit's wrappers
on PettingZoo's Parallel env (what the SuperSuit docs show, and what this framework did before)
against :func:`grpo_marl.marl.preprocess.apply` (per-frame wrappers on the AEC env, one lean
conversion), plus the bare Parallel env without preprocessing.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from torch import Tensor

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "marl_extra"


def _games(vec: Any) -> list[Any]:
    """The raw game objects of an in-process vector env (driver envs -> raw_env -> game)."""
    return [env.unwrapped for env in vec.driver.envs]


class PongTracker:
    """Each paddle moves toward the ball's height (1 = up, 2 = down, 0 = stay)."""

    def __init__(self, vec: Any, groups: Any, tol: float = 4.0) -> None:
        self.vec, self.groups, self.tol = vec, groups, tol

    @torch.no_grad()
    def act(self, obs: Tensor, action_mask: Tensor | None = None, deterministic: bool = True) -> tuple[Tensor, Tensor]:
        out = np.zeros(obs.shape[:2], np.int64)
        for i, raw in enumerate(_games(self.vec)):
            game = raw.env
            by = game.ball._rect.centery
            for j, paddle in enumerate((game.p0, game.p1)):
                top = min(r.top for r in paddle.rects)
                bottom = max(r.bottom for r in paddle.rects)
                centre = (top + bottom) / 2
                out[i, j] = 1 if by < centre - self.tol else (2 if by > centre + self.tol else 0)
        actions = torch.as_tensor(out)
        return actions, torch.zeros(actions.shape)

    def to_env(self, actions: Tensor) -> np.ndarray:
        return actions.cpu().numpy()


class Continuous:
    """Zero torques (``mode="zero"``) or uniform random ones in the action box."""

    def __init__(self, groups: Any, width: int, mode: str, seed: int = 0) -> None:
        self.groups, self.width, self.mode = groups, width, mode
        self.rng = np.random.default_rng(seed)

    @torch.no_grad()
    def act(self, obs: Tensor, action_mask: Tensor | None = None, deterministic: bool = True) -> tuple[Tensor, Tensor]:
        shape = (*obs.shape[:2], self.width)
        a = np.zeros(shape, np.float32) if self.mode == "zero" else self.rng.uniform(-1, 1, shape).astype(np.float32)
        return torch.as_tensor(a), torch.zeros(shape[:2])

    def to_env(self, actions: Tensor) -> np.ndarray:
        return actions.cpu().numpy()


class Displacement:
    """Wraps a policy; records the multiwalker package's x at each step of each env's episode."""

    def __init__(self, policy: Any, vec: Any) -> None:
        self.policy, self.vec, self.groups = policy, vec, policy.groups
        self.start = np.full(vec.num_envs, np.nan)
        self.last = np.full(vec.num_envs, np.nan)

    def act(self, obs: Tensor, action_mask: Tensor | None = None, deterministic: bool = True) -> tuple[Tensor, Tensor]:
        for i, raw in enumerate(_games(self.vec)):
            package = getattr(raw.env, "package", None)
            if package is not None and raw.env.walkers and raw.env.walkers[0].hull is not None:
                x = float(package.position.x)
                if np.isnan(self.start[i]):
                    self.start[i] = x
                self.last[i] = x
        return self.policy.act(obs, action_mask, deterministic)

    def to_env(self, actions: Tensor) -> np.ndarray:
        return self.policy.to_env(actions)

    def result(self) -> dict[str, float]:
        d = self.last - self.start
        return {"displacement_mean": float(np.nanmean(d)), "displacement_std": float(np.nanstd(d))}


def _cfg(env: str) -> Any:
    import envs.multiagent  # noqa: F401
    from grpo_marl.registry import get_spec
    from grpo_marl.settings import reference

    cfg = reference("grpo")  # every key at its default
    cfg.env = env
    common = (get_spec(env).defaults or {}).get("common", {})
    if "env_preprocess" in common:
        cfg = OmegaConf.merge(cfg, {"env_preprocess": common["env_preprocess"]})
    return cfg


def _vec(env: str, n: int) -> tuple[Any, Any]:
    from grpo_marl.groups import AgentGroups
    from grpo_marl.registry import get_spec
    from grpo_marl.tasks.control import with_preprocessing
    from grpo_marl.vec import make_vec_env

    cfg = _cfg(env)
    vec = make_vec_env(with_preprocessing(get_spec(env), cfg), n, {}, "sync")
    return vec, AgentGroups.from_layout(vec.layout)


def _evaluate(policy: Any, vec: Any) -> dict[str, float]:
    from grpo_marl.collectors import evaluate_policy

    seeds = (1_000_000 + np.arange(vec.num_envs)).tolist()
    started = time.perf_counter()
    out = evaluate_policy(policy, vec, seeds, deterministic=True)
    out["seconds"] = time.perf_counter() - started
    return out


def references(only: list[str] | None = None) -> dict[str, Any]:
    from grpo_marl.marl.references import RandomPolicy

    path = OUT / "references.json"
    results: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    plan = [
        ("cooperative_pong", "random", 10),
        ("cooperative_pong", "scripted_tracker", 3),
        ("knights_archers_zombies", "random", 8),
        ("multiwalker", "do_nothing", 8),
        ("multiwalker", "random", 8),
        ("pistonball", "random", 2),
    ]
    for env, kind, n in plan:
        if only and env not in only:
            continue
        vec, groups = _vec(env, n)
        if kind == "random" and env not in ("multiwalker", "pistonball"):
            policy: Any = RandomPolicy(groups, seed=0)
        elif kind == "scripted_tracker":
            policy = PongTracker(vec, groups)
        else:
            policy = Continuous(groups, max(vec.layout.action_dims), "zero" if kind == "do_nothing" else "random")
        probe = Displacement(policy, vec) if env == "multiwalker" else None
        out = _evaluate(probe or policy, vec)
        row = {"return_mean": out["eval/return_mean"], "return_std": out["eval/return_std"], "episodes": n}
        row["length_mean"] = out["eval/length_mean"]
        if probe is not None:
            row.update(probe.result())
        results[f"{env}/{kind}"] = row
        print(env, kind, json.dumps(row), flush=True)
        vec.close()
    OUT.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    return results


def evaluate_run(run_dir: str, episodes: int = 8) -> dict[str, Any]:
    from grpo_marl.evaluate import load_run

    cfg, task, ckpt = load_run(run_dir)
    vec = task._make_vec(episodes, with_state=False)
    probe = Displacement(task.policy, vec) if str(cfg.env) == "multiwalker" else None
    out = _evaluate(probe or task.policy, vec)
    row = {
        "run": run_dir,
        "env": str(cfg.env),
        "algo": str(cfg.algo.name),
        "env_steps": int(ckpt["counters"]["env_steps"]),
        "return_mean": out["eval/return_mean"],
        "return_std": out["eval/return_std"],
        "length_mean": out["eval/length_mean"],
        "episodes": episodes,
    }
    if probe is not None:
        row.update(probe.result())
    vec.close()
    task.close()
    print(json.dumps(row), flush=True)
    return row


def random_joint_action(env: Any, rng: np.random.Generator) -> dict[str, Any]:
    """A uniform random action for every live agent of a Parallel env (Discrete or Box), drawn
    from ``rng`` so that two builds of one env given the same generator take the same actions."""
    actions: dict[str, Any] = {}
    for agent in env.agents:
        space = env.action_space(agent)
        if hasattr(space, "n"):
            actions[agent] = int(rng.integers(space.n))
        else:
            actions[agent] = rng.uniform(space.low, space.high).astype(space.dtype)
    return actions


def _tuned_preprocess(name: str) -> dict[str, Any] | None:
    """The ``common.env_preprocess`` section of a task's tuned defaults (envs/conf/<name>.yaml)."""
    from envs.multiagent import tuned_defaults
    from grpo_marl.registry import load_defaults

    path = tuned_defaults(name)
    section = load_defaults(path).get("common", {}).get("env_preprocess") if path else None
    return section if isinstance(section, dict) else None


def env_speed(names: list[str] | None = None, seconds: float = 20.0) -> list[dict[str, Any]]:
    """Env steps/s of ``names`` (default: the two image envs), three ways (module docstring)."""
    import warnings

    import supersuit as ss

    from envs import CONF_DIR
    from grpo_marl.marl import preprocess
    from grpo_marl.marl.envs import make_parallel_env

    warnings.filterwarnings("ignore", message=".*without specifying any render mode.*")
    rows = []
    for name in names or ["cooperative_pong", "pistonball"]:
        section = _tuned_preprocess(name)
        if section is None:
            with_preprocessing = sorted(p.stem for p in CONF_DIR.glob("*.yaml") if _tuned_preprocess(p.stem))
            raise SystemExit(
                f"speed: {name!r} has no tuned env_preprocess to compare; choose from {with_preprocessing}"
            )
        settings = preprocess.settings_of(section)

        def supersuit_on_parallel(name: str = name, s: dict[str, Any] = settings) -> Any:
            env = make_parallel_env(name)
            env = ss.color_reduction_v0(env, s["color_reduction"])
            env = ss.dtype_v0(ss.resize_v1(env, *s["resize"], linear_interp=True), np.uint8)
            if s["frame_stack"] > 1:
                return ss.frame_stack_v1(env, s["frame_stack"])
            return ss.reshape_v0(env, (*env.observation_space(env.possible_agents[0]).shape, 1))  # as apply()

        builders = {
            "bare parallel env (no preprocessing)": lambda name=name: make_parallel_env(name),
            "SuperSuit on the Parallel env": supersuit_on_parallel,
            "grpo_marl preprocess.apply": lambda name=name, s=settings: preprocess.apply(make_parallel_env(name), s),
        }
        row: dict[str, Any] = {"env": name, "preprocess": settings, "seconds_each": seconds}
        for label, build in builders.items():
            env = build()
            rng = np.random.default_rng(0)
            env.reset(seed=0)
            steps, episodes, start = 0, 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                env.step(random_joint_action(env, rng))
                steps += 1
                if not env.agents:
                    episodes += 1
                    env.reset(seed=episodes)
            row[label] = round(steps / (time.perf_counter() - start), 1)
            env.close()
        row["speedup"] = round(row["grpo_marl preprocess.apply"] / row["SuperSuit on the Parallel env"], 2)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


if __name__ == "__main__":
    if sys.argv[1] == "refs":
        references(sys.argv[2:] or None)
    elif sys.argv[1] == "speed":
        env_speed(sys.argv[2:] or None)
    else:
        evaluate_run(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 8)
