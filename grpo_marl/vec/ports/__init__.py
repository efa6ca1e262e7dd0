"""Batched numpy ports of envs whose Python-object versions are too slow for GRPO.

Each port is one array program over all envs (and agents) that reproduces the original env's
observations, rewards, terminations, truncations and reset distribution exactly for the same
per-env seeds (tested against the originals), and implements the :class:`grpo_marl.vec.base.VecEnv`
contract directly, snapshots included.

``PORTS`` maps the original env id (Gymnasium id, or mpe2 module name) to ``"module:Class"``;
every class is built as ``Class(num_envs, *, max_episode_steps=None, with_state=False, **env_kwargs)``
and refuses env kwargs it does not implement with a message naming them.
"""

from __future__ import annotations

import importlib
from typing import Any

PORTS: dict[str, str] = {
    "CartPole-v1": "grpo_marl.vec.ports.classic:CartPoleVec",
    "CartPole-v0": "grpo_marl.vec.ports.classic:CartPoleV0Vec",
    "Acrobot-v1": "grpo_marl.vec.ports.classic:AcrobotVec",
    "Pendulum-v1": "grpo_marl.vec.ports.classic:PendulumVec",
    "MountainCar-v0": "grpo_marl.vec.ports.classic:MountainCarVec",
    "MountainCarContinuous-v0": "grpo_marl.vec.ports.classic:MountainCarContinuousVec",
    "simple_spread_v3": "grpo_marl.vec.ports.mpe:SimpleSpreadVec",
    "simple_speaker_listener_v4": "grpo_marl.vec.ports.mpe:SimpleSpeakerListenerVec",
    "simple_reference_v3": "grpo_marl.vec.ports.mpe:SimpleReferenceVec",
}


def port_class(env_id: str) -> Any | None:
    """The port class for ``env_id``, or None when there is none (or it is not written yet)."""
    target = PORTS.get(env_id)
    if target is None:
        return None
    module, _, name = target.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ModuleNotFoundError, AttributeError):
        return None
