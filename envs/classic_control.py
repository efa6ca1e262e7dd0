"""Gymnasium classic control under short names, with tuned per-algorithm defaults.

Defaults live in ``envs/conf/<name>.yaml`` (sections ``common``, ``grpo``, ``ppo``) so tuning is a
data change; thresholds are the usual "solved" levels used by the benchmarks.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from grpo_marl.registry import register_env

_CONF = Path(__file__).parent / "conf"

CLASSIC = {
    # name: (gymnasium id, solve threshold)
    "cartpole": ("CartPole-v1", 475.0),
    "acrobot": ("Acrobot-v1", -100.0),
    "pendulum": ("Pendulum-v1", -250.0),
    "mountaincar_continuous": ("MountainCarContinuous-v0", 90.0),
}


def _defaults(name: str) -> dict:
    path = _CONF / f"{name}.yaml"
    return yaml.safe_load(path.read_text()) if path.exists() else {}


for _name, (_gym_id, _threshold) in CLASSIC.items():
    register_env(
        _name,
        kind="gymnasium",
        gym_id=_gym_id,
        threshold=_threshold,
        defaults=_defaults(_name),
        description=f"Gymnasium {_gym_id}",
    )
