"""The Python API, next to the CLI: ``fit`` trains a run, ``load`` brings back its policy.

    import grpo_marl
    result = grpo_marl.fit(env="cartpole", total_steps=50_000, seed=2)   # same config as the CLI
    print(result.summary["eval/return_mean"], result.run_dir)
    policy = grpo_marl.load(result.run_dir)
    action = policy.act(obs)                  # numpy in, numpy out (a dict per agent for PettingZoo)

``fit`` composes the same Hydra config the CLI does (``grpo_marl/conf`` + the env's tuned
defaults + your overrides), validates it the same way and writes the same run directory.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpo_marl.errors import UserInputError


@dataclass
class FitResult:
    """What a finished :func:`fit` returns: the ``summary.json`` content and the run directory."""

    summary: dict[str, Any]
    run_dir: Path

    def load(self, device: str = "cpu") -> TrainedPolicy:
        return load(self.run_dir, device=device)


def _override_list(env: str, overrides: Mapping[str, Any]) -> list[str]:
    """``{"algo": "ppo", "algo.lr": 1e-3, "vec": {"num_envs": 8}}`` -> Hydra's ``key=value`` list."""
    out = [f"env={env}"]

    def add(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping) and prefix not in ("env_kwargs",):
            for k, v in value.items():
                add(f"{prefix}.{k}", v)
            return
        if isinstance(value, Mapping) or isinstance(value, (list, tuple)):
            import json

            text = json.dumps(value)
        elif value is None:
            text = "null"
        elif isinstance(value, bool):
            text = str(value).lower()
        else:
            text = str(value)
        key = prefix if prefix != "env_kwargs" or not value else f"+{prefix}"
        out.append(f"{key}={text}")

    for key, value in overrides.items():
        add(key.replace("__", "."), value)
    return out


def fit(env: str = "cartpole", *, run_dir: str | Path | None = None, **overrides: Any) -> FitResult:
    """Train ``env`` with the CLI's configuration plus ``overrides`` and return the summary.

    Overrides are config keys: ``algo="ppo"``, ``total_steps=50_000``, dotted keys through a dict
    (``**{"algo.lr": 1e-3}``) or nested dicts (``algo={"lr": 1e-3}``), or ``algo__lr=1e-3``.
    ``run_dir`` defaults to ``runs/<env>/<algo>_seed<seed>_<time>`` like the CLI. Configuration
    mistakes raise :class:`grpo_marl.errors.UserInputError` before anything is built.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict

    from grpo_marl.config import _safe
    from grpo_marl.train import run

    args = _override_list(env, overrides)
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    conf_dir = str(Path(__file__).resolve().parent / "conf")
    with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
        try:
            cfg = compose(config_name="config", overrides=args)
        except Exception as exc:  # Hydra's own errors for unknown keys / options
            raise UserInputError(f"invalid overrides {args[1:]}: {exc}") from exc
    with open_dict(cfg):
        cfg.pop("hydra", None)
    if run_dir is None:
        stamp = time.strftime("%Y%m%d_%H%M%S") + f"_{time.time_ns() % 1_000_000:06d}"
        algo = (
            str(overrides.get("algo", cfg.algo.name)) if isinstance(overrides.get("algo"), str) else str(cfg.algo.name)
        )
        run_dir = Path("runs") / _safe(env) / f"{algo}_seed{cfg.seed}_{stamp}"
    run_dir = Path(run_dir)
    summary = run(cfg, args, run_dir)
    return FitResult(summary=summary, run_dir=run_dir)


class TrainedPolicy:
    """A trained control policy, for use outside the trainer (numpy in, numpy out).

    Single-agent envs: ``act(obs)`` takes one observation (or a batch ``[N, ...]``) and returns
    the action(s). PettingZoo envs: ``act({agent: obs})`` returns ``{agent: action}`` for the
    agents given (others are absent, e.g. agents that already left the episode).
    """

    def __init__(self, policy: Any, layout: Any, cfg: Any, device: torch.device) -> None:
        from grpo_marl.vec.spaces import obs_writer

        self.policy = policy
        self.layout = layout
        self.cfg = cfg
        self.device = device
        self.agents = layout.agents
        self.multi_agent = cfg.get("env_kind", "gymnasium") == "pettingzoo"
        self._writers = [obs_writer(space) for space in layout.observation_spaces]

    def _encode(self, observations: list[list[Any]]) -> np.ndarray:
        lay = self.layout
        out = np.zeros((len(observations), lay.num_agents, *lay.obs_shape), lay.obs_dtype)
        for i, row in enumerate(observations):
            for j, o in enumerate(row):
                if o is not None:
                    self._writers[j](o, out[i, j])
        return out

    @torch.no_grad()
    def act(self, obs: Any, deterministic: bool = True) -> Any:
        if self.multi_agent:
            if not isinstance(obs, Mapping):
                raise UserInputError(
                    f"this policy controls agents {list(self.agents)}: pass a dict agent -> observation"
                )
            unknown = sorted(set(obs) - set(self.agents))
            if unknown:
                raise UserInputError(f"unknown agents {unknown}; this policy controls {list(self.agents)}")
            x = self._encode([[obs.get(a) for a in self.agents]])
            actions = self._act(x, deterministic)[0]
            return {a: actions[j] for j, a in enumerate(self.agents) if a in obs}
        arr = np.asarray(obs)
        space = self.layout.observation_spaces[0]
        single = arr.shape == tuple(space.shape)
        batch = [arr] if single else list(arr)
        actions = self._act(self._encode([[o] for o in batch]), deterministic)[:, 0]
        return actions[0] if single else actions

    def _act(self, x: np.ndarray, deterministic: bool) -> np.ndarray:
        actions, _ = self.policy.act(torch.as_tensor(x, device=self.device), None, deterministic=deterministic)
        return self.policy.to_env(actions)


def load(run_dir: str | Path, device: str = "cpu") -> TrainedPolicy:
    """The policy of a run directory (its last checkpoint), ready to ``act`` on numpy inputs."""
    from grpo_marl.evaluate import load_run

    cfg, task, _ = load_run(run_dir, device=device)
    if cfg.get("env_kind", "gymnasium") == "text":
        raise UserInputError(
            f"{run_dir} is a text run: its model is a Hugging Face directory, load it with "
            "transformers' AutoModelForCausalLM.from_pretrained(<run>/model)"
        )
    policy = TrainedPolicy(task.policy, task.vec.layout, cfg, torch.device(device))
    task.close()
    return policy
