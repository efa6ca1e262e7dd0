"""Gymnasium classic control under short names, with tuned per-algorithm defaults.

Defaults live in ``envs/conf/<name>.yaml`` (sections ``common``, ``grpo``, ``ppo``) so tuning is a
data change; thresholds are the usual "solved" levels used by the benchmarks.
"""

from __future__ import annotations

from envs import CONF_DIR
from grpo_marl.registry import register_env

CLASSIC = {
    # name: (gymnasium id, solve threshold)
    "cartpole": ("CartPole-v1", 475.0),
    "acrobot": ("Acrobot-v1", -100.0),
    "pendulum": ("Pendulum-v1", -250.0),
    "mountaincar_continuous": ("MountainCarContinuous-v0", 90.0),
}


for _name, (_gym_id, _threshold) in CLASSIC.items():
    register_env(
        _name,
        kind="gymnasium",
        gym_id=_gym_id,
        threshold=_threshold,
        defaults=CONF_DIR / f"{_name}.yaml",
        description=f"Gymnasium {_gym_id}",
    )
