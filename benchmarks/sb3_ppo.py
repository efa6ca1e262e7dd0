"""Stable-Baselines3 PPO with rl-baselines3-zoo hyperparameters: the external peer.

Writes the same files as a grpo_marl run (``metrics.jsonl`` with periodic ``eval/*`` lines and
``time/wall_s``, and ``summary.json``) so the benchmark report treats both alike. Evaluation is
*our* greedy evaluation: the same vector env class, the same 20 reset seeds and the same cadence
in env steps, with SB3's ``predict(deterministic=True)`` as the actor. It runs in
``_on_rollout_start`` (i.e. after the previous update, like our trainer's post-update eval) and
counts toward wall-clock just as ours does. SB3 is imported lazily (optional extra ``bench``)::

    python -m benchmarks.sb3_ppo --env cartpole --seed 1 --run-dir runs/sb3/cartpole_1 \
        --eval-every 2500 --total-steps 100000
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

# rl-baselines3-zoo 2.x hyperparams/ppo.yml (entries copied verbatim; "lin_X" = linear from X to 0).
ZOO_PPO: dict[str, dict[str, Any]] = {
    "CartPole-v1": dict(
        n_envs=8,
        n_timesteps=1e5,
        policy="MlpPolicy",
        n_steps=32,
        batch_size=256,
        gae_lambda=0.8,
        gamma=0.98,
        n_epochs=20,
        ent_coef=0.0,
        learning_rate="lin_0.001",
        clip_range="lin_0.2",
    ),
    "Acrobot-v1": dict(
        normalize=True,
        n_envs=16,
        n_timesteps=1e6,
        policy="MlpPolicy",
        n_steps=256,
        gae_lambda=0.94,
        gamma=0.99,
        n_epochs=4,
        ent_coef=0.0,
    ),
    "Pendulum-v1": dict(
        n_envs=4,
        n_timesteps=1e5,
        policy="MlpPolicy",
        n_steps=1024,
        gae_lambda=0.95,
        gamma=0.9,
        n_epochs=10,
        ent_coef=0.0,
        learning_rate=1e-3,
        clip_range=0.2,
        use_sde=True,
        sde_sample_freq=4,
    ),
    "MountainCarContinuous-v0": dict(
        normalize=True,
        n_envs=1,
        n_timesteps=20000,
        policy="MlpPolicy",
        batch_size=256,
        n_steps=8,
        gamma=0.9999,
        learning_rate=7.77e-05,
        ent_coef=0.00429,
        clip_range=0.1,
        n_epochs=10,
        gae_lambda=0.9,
        max_grad_norm=5,
        vf_coef=0.19,
        use_sde=True,
        policy_kwargs="dict(log_std_init=-3.29, ortho_init=False)",
    ),
}


def _schedule(value: Any) -> Any:
    """rl-zoo's ``lin_X`` strings become SB3 schedules (functions of progress_remaining)."""
    if isinstance(value, str) and value.startswith("lin_"):
        start = float(value[4:])
        return lambda progress_remaining: progress_remaining * start
    return value


def zoo_kwargs(gym_id: str) -> tuple[dict[str, Any], int, bool, int]:
    """``(PPO kwargs, n_envs, normalize, zoo n_timesteps)`` for a Gymnasium id."""
    if gym_id not in ZOO_PPO:
        raise KeyError(f"no rl-zoo PPO hyperparameters recorded for {gym_id!r}; add them to ZOO_PPO")
    hp = dict(ZOO_PPO[gym_id])
    n_envs = int(hp.pop("n_envs", 1))
    normalize = bool(hp.pop("normalize", False))
    n_timesteps = int(hp.pop("n_timesteps"))
    policy = hp.pop("policy")
    if "policy_kwargs" in hp and isinstance(hp["policy_kwargs"], str):
        hp["policy_kwargs"] = eval(hp["policy_kwargs"], {"dict": dict})  # zoo stores them as code
    for key in ("learning_rate", "clip_range"):
        if key in hp:
            hp[key] = _schedule(hp[key])
    hp["policy"] = policy
    return hp, n_envs, normalize, n_timesteps


def run(
    env: str,
    seed: int,
    run_dir: Path,
    eval_every: int,
    eval_episodes: int,
    total_steps: int | None,
    threshold: float | None,
    stop_on_threshold: bool = False,
) -> dict[str, Any]:
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    from grpo_marl.collectors import evaluate_policy
    from grpo_marl.groups import AgentGroups
    from grpo_marl.registry import get_spec
    from grpo_marl.vec import make_vec_env

    torch.set_num_threads(1)  # same as grpo_marl's control default: fair per-core comparison
    spec = get_spec(env)
    if spec.gym_id is None:
        raise ValueError(f"env {env!r} is not a plain Gymnasium id; SB3 PPO needs one")
    hp, n_envs, normalize, zoo_steps = zoo_kwargs(spec.gym_id)
    total = int(total_steps or zoo_steps)
    threshold = spec.threshold if threshold is None else threshold
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(
        json.dumps(
            {
                "env": env,
                "gym_id": spec.gym_id,
                "seed": seed,
                "n_envs": n_envs,
                "normalize": normalize,
                "total_steps": total,
                "eval_every": eval_every,
                "eval_episodes": eval_episodes,
                "hyperparameters": {k: (v if not callable(v) else "schedule") for k, v in ZOO_PPO[spec.gym_id].items()},
            },
            indent=2,
            default=str,
        )
    )

    train_env = DummyVecEnv([lambda: Monitor(spec.make()) for _ in range(n_envs)])
    train_env.seed(seed)
    if normalize:
        train_env = VecNormalize(train_env, gamma=float(hp.get("gamma", 0.99)))
    model = PPO(env=train_env, seed=seed, device="cpu", verbose=0, **hp)
    eval_vec = make_vec_env(spec, eval_episodes)
    metrics_path = run_dir / "metrics.jsonl"
    metrics_path.write_text("")

    class _Greedy:
        """SB3's model behind the interface grpo_marl's one evaluation loop drives."""

        groups = AgentGroups.from_layout(eval_vec.layout)

        def act(self, obs: torch.Tensor, mask: Any = None, deterministic: bool = True) -> tuple[Any, None]:
            x = obs[:, 0].numpy()
            x = train_env.normalize_obs(x) if normalize else x
            action, _ = model.predict(x, deterministic=deterministic)
            return torch.as_tensor(np.asarray(action))[:, None], None

        def to_env(self, actions: torch.Tensor) -> np.ndarray:
            return actions.numpy()

    def evaluate(seed_offset: int = 0) -> dict[str, float]:
        # Same seeds and the same evaluation loop as grpo_marl's own runs (ControlTask.evaluate).
        seeds = 1_000_000 + 1000 * seed + seed_offset + np.arange(eval_episodes)
        out = evaluate_policy(_Greedy(), eval_vec, seeds.tolist(), "cpu", deterministic=True)
        return {
            k: out[k]
            for k in ("eval/return_mean", "eval/return_std", "eval/return_min", "eval/return_max", "eval/episodes")
        }

    def log(step: int, record: dict[str, float]) -> None:
        with open(metrics_path, "a") as f:
            f.write(json.dumps({"step": int(step), **record}) + "\n")

    state: dict[str, Any] = {
        "next_eval": eval_every,
        "steps_to_threshold": None,
        "time_to_threshold": None,
        "train_time_to_threshold": None,
        "eval_s": 0.0,  # periodic evaluations, kept out of the training clock as grpo_marl's trainer does
    }

    def periodic_eval(steps: int) -> None:
        t_eval = time.perf_counter()
        wall = t_eval - state["start"]
        # as the trainer logs them: the clocks at the end of the update, before this evaluation
        record = {"time/wall_s": wall, "time/eval_s": state["eval_s"], "time/train_s": wall - state["eval_s"]}
        result = evaluate()
        state["eval_s"] += time.perf_counter() - t_eval
        record.update(result)
        if threshold is not None and state["steps_to_threshold"] is None and result["eval/return_mean"] >= threshold:
            state["steps_to_threshold"] = steps
            state["time_to_threshold"] = time.perf_counter() - state["start"]
            state["train_time_to_threshold"] = record["time/train_s"]
            record["eval/threshold_reached"] = 1.0
        log(steps, record)

    class EvalCallback(BaseCallback):
        def _on_training_start(self) -> None:
            state["start"] = time.perf_counter()

        def _on_rollout_start(self) -> None:
            steps = self.num_timesteps
            if eval_every <= 0 or steps < state["next_eval"]:
                return
            while state["next_eval"] <= steps:
                state["next_eval"] += eval_every
            periodic_eval(steps)

        def _on_step(self) -> bool:
            return not (stop_on_threshold and state["steps_to_threshold"] is not None)

    model.learn(total_timesteps=total, callback=EvalCallback())
    wall = time.perf_counter() - state["start"]
    # The last update's eval (our trainer evaluates after every update that crosses the cadence).
    steps = int(model.num_timesteps)
    if eval_every > 0 and steps >= state["next_eval"]:
        periodic_eval(steps)
        wall = time.perf_counter() - state["start"]
    final = evaluate(seed_offset=500)
    log(steps, final)
    summary = {
        "env": env,
        "algo": "sb3_ppo",
        "seed": seed,
        "status": "threshold_reached" if stop_on_threshold and state["steps_to_threshold"] else "completed",
        **final,
        "env_steps": steps,
        "wall_seconds": wall,
        "threshold": None if threshold is None else float(threshold),
        "steps_to_threshold": state["steps_to_threshold"],
        "time_to_threshold_s": state["time_to_threshold"],
        "eval_seconds": state["eval_s"],
        "train_time_to_threshold_s": state["train_time_to_threshold"],
    }
    tmp = run_dir / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2, default=float) + "\n")
    tmp.replace(run_dir / "summary.json")
    train_env.close()
    eval_vec.close()
    return summary


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--env", required=True, help="registered env name (e.g. cartpole)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--eval-every", type=int, default=10_000, help="greedy eval cadence in env steps")
    p.add_argument("--eval-episodes", type=int, default=20)
    p.add_argument("--total-steps", type=int, default=None, help="default: the zoo's n_timesteps")
    p.add_argument("--threshold", type=float, default=None, help="default: the env's registered threshold")
    p.add_argument("--stop-on-threshold", action="store_true")
    a = p.parse_args(argv)
    s = run(a.env, a.seed, a.run_dir, a.eval_every, a.eval_episodes, a.total_steps, a.threshold, a.stop_on_threshold)
    ttt = s["time_to_threshold_s"]
    print(
        f"env={a.env} algo=sb3_ppo seed={a.seed} | final eval return {s['eval/return_mean']:.2f} +- "
        f"{s['eval/return_std']:.2f} | env steps {s['env_steps']}, wall {s['wall_seconds']:.1f} s"
        + (f" | threshold at {s['steps_to_threshold']} steps / {ttt:.1f} s" if ttt is not None else ""),
        flush=True,
    )


if __name__ == "__main__":
    main()
