"""grpo_marl: critic-free, group-relative RL (GRPO) for Gymnasium, PettingZoo and text envs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from grpo_marl.advantages import (
    discounted_returns,
    gae,
    group_advantages,
    outcome_advantages,
    return_to_go_advantages,
    zero_std_groups,
)
from grpo_marl.registry import EnvSpec, UnknownEnvError, get_spec, list_envs, make_env, register_env
from grpo_marl.settings import register_configs

# The YAML files of grpo_marl/conf build on the settings dataclasses (Hydra's ConfigStore): stored
# on import, so composing them works from every entry point (CLI, fit, benchmarks, tests).
register_configs()

if TYPE_CHECKING:
    from pathlib import Path

    from grpo_marl.api import FitResult, TrainedPolicy


def fit(env: str = "cartpole", **kwargs: Any) -> FitResult:
    """Train ``env`` from Python (see :func:`grpo_marl.api.fit`); imported lazily to keep
    ``import grpo_marl`` cheap."""
    from grpo_marl.api import fit as _fit

    return _fit(env, **kwargs)


def load(run_dir: str | Path, device: str = "cpu") -> TrainedPolicy:
    """The trained policy of a run directory (see :func:`grpo_marl.api.load`)."""
    from grpo_marl.api import load as _load

    return _load(run_dir, device=device)


__version__ = "0.1.0"

__all__ = [
    "EnvSpec",
    "UnknownEnvError",
    "discounted_returns",
    "fit",
    "load",
    "gae",
    "get_spec",
    "group_advantages",
    "list_envs",
    "make_env",
    "outcome_advantages",
    "register_env",
    "return_to_go_advantages",
    "zero_std_groups",
]
