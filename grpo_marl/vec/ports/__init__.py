"""Batched numpy ports of envs whose Python-object versions are too slow for GRPO.

Each port is one array program over all envs (and agents) that reproduces the original env's
observations, rewards, terminations, truncations and reset distribution exactly for the same
per-env seeds (tested against the originals), and implements the :class:`grpo_marl.vec.base.VecEnv`
contract directly, snapshots included.

:data:`PORTS` maps the original env id (Gymnasium id, or mpe2 module name) to a :class:`Port`; it
is the one :class:`~grpo_marl.registry.Registry` type of every extension point, so a user's port
is added with :func:`register_port` or a ``grpo_marl.ports`` entry point (whose object is the
class) exactly like a built-in. Every class is built as
``Class(num_envs, *, max_episode_steps=None, with_state=False, **env_kwargs)`` and refuses env
kwargs it does not implement with a message naming them.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from grpo_marl.registry import Registry

__all__ = ["PORTS", "Port", "port_class", "register_port"]


@dataclass(frozen=True)
class Port:
    """One port: its class (or ``"module:Class"``, imported when first used, so listing the ports
    imports none of them) and whether ``vec.vectorization=auto`` picks it. ``auto=False`` keeps
    a port to ``vec.vectorization=native`` (one not yet checked against the original env step for
    step); ``sync``/``async`` always keep the original envs, for cross-checks."""

    target: str | type[Any]
    auto: bool = True

    def load(self) -> type[Any] | None:
        """The class, or None when its module is not there (a trimmed install)."""
        if not isinstance(self.target, str):
            return self.target
        module, _, name = self.target.partition(":")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ModuleNotFoundError, AttributeError):
            return None
        return cls if isinstance(cls, type) else None


def _entry_point(name: str, obj: Any) -> None:
    register_port(name, obj)


#: Every port by the original env's id.
PORTS: Registry[Port] = Registry("port", entry_point_group="grpo_marl.ports", on_entry_point=_entry_point)


def register_port(env_id: str, target: str | type[Any], *, auto: bool = True, overwrite: bool = False) -> Port:
    """Make ``target`` (a :class:`~grpo_marl.vec.base.VecEnv` class, or ``"module:Class"``) the
    batched implementation of env id ``env_id``: ``vec.vectorization=native`` uses it, and
    ``auto`` too unless ``auto=False``."""
    return PORTS.register(env_id, Port(target, auto=auto), overwrite=overwrite)


def port_class(env_id: str, *, auto: bool = False) -> type[Any] | None:
    """The port class for ``env_id`` (with ``auto``: only one ``vec.vectorization=auto`` picks), or
    None when there is none."""
    port = PORTS.find(env_id)
    if port is None or (auto and not port.auto):
        return None
    return port.load()


for _env_id, _target in {
    "CartPole-v1": "grpo_marl.vec.ports.classic:CartPoleVec",
    "CartPole-v0": "grpo_marl.vec.ports.classic:CartPoleV0Vec",
    "Acrobot-v1": "grpo_marl.vec.ports.classic:AcrobotVec",
    "Pendulum-v1": "grpo_marl.vec.ports.classic:PendulumVec",
    "MountainCar-v0": "grpo_marl.vec.ports.classic:MountainCarVec",
    "MountainCarContinuous-v0": "grpo_marl.vec.ports.classic:MountainCarContinuousVec",
    "simple_spread_v3": "grpo_marl.vec.ports.mpe:SimpleSpreadVec",
    "simple_speaker_listener_v4": "grpo_marl.vec.ports.mpe:SimpleSpeakerListenerVec",
    "simple_reference_v3": "grpo_marl.vec.ports.mpe:SimpleReferenceVec",
}.items():
    register_port(_env_id, _target)  # every shipped port is checked against its original: auto
