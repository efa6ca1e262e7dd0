"""grpo_marl: critic-free, group-relative RL (GRPO) for Gymnasium, PettingZoo and text envs."""

from grpo_marl.advantages import (
    discounted_returns,
    gae,
    group_advantages,
    outcome_advantages,
    return_to_go_advantages,
    zero_std_groups,
)
from grpo_marl.registry import EnvSpec, UnknownEnvError, get_spec, list_envs, make_env, register_env

__version__ = "0.1.0"

__all__ = [
    "EnvSpec",
    "UnknownEnvError",
    "discounted_returns",
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
