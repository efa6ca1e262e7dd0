"""Snapshot/restore of single envs, for every env kind: the capability behind ``state`` groups,
streaming rollouts and exact resume.

A snapshot must copy *everything* that determines the env's future: the physical state, step
counters (``TimeLimit._elapsed_steps``, mpe2's ``steps``) and the env's RNG. ``copy.deepcopy`` of
a whole env is not a safe default: EzPickle envs (all of mpe2, PettingZoo) rebuild themselves from
their constructor arguments and lose their state, and render surfaces do not copy. So:

* envs that know how to snapshot themselves (:class:`SelfSnapshotting`, e.g. the mpe2 driver)
  are asked to;
* Gymnasium envs: wrapper counters per wrapper depth plus the unwrapped env's data attributes
  (a registered hook per env class where the generic copy is not enough);
* other PettingZoo envs: the object graph is pickled with EzPickle bypassed (restoring yields a
  new env object, which is why :func:`restore_env` returns the env to keep using).
"""

from __future__ import annotations

import copy
import io
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class SelfSnapshotting(Protocol):
    """An env that copies its own state exactly (``restore`` leaves the snapshot reusable)."""

    def snapshot(self) -> Any: ...

    def restore(self, snap: Any) -> None: ...


# Attributes that are rendering/IO handles, never part of the dynamics state.
_SKIP_ATTRS = frozenset(
    {
        "screen",
        "clock",
        "surf",
        "viewer",
        "window",
        "render_mode",
        "spec",
        "metadata",
        "isopen",
        "observation_space",
        "action_space",
        "_np_random_seed",
    }
)
_PLAIN_TYPES = (np.ndarray, np.generic, int, float, bool, str, type(None), tuple, list, dict, np.random.Generator)

SnapshotHook = tuple[Callable[[Any], Any], Callable[[Any, Any], None]]
_HOOKS: dict[type, SnapshotHook] = {}

# PassiveEnvChecker's flags travel with the data its first-step check compares against
# (gymnasium >= 1.2); restoring ``checked_step`` alone makes that check unpack a stale ``None``.
_WRAPPER_ATTRS = (
    "_elapsed_steps",
    "_has_reset",
    "checked_reset",
    "checked_step",
    "checked_data_reuse",
    "_previous_data",
)


def register_snapshot_hook(
    env_cls: type, get_state: Callable[[Any], Any], set_state: Callable[[Any, Any], None]
) -> None:
    """Teach :func:`snapshot_env` how to copy the state of ``env_cls`` (the *unwrapped* class)."""
    _HOOKS[env_cls] = (get_state, set_state)


def _generic_get(env: Any) -> dict[str, Any]:
    return {k: copy.deepcopy(v) for k, v in vars(env).items() if k not in _SKIP_ATTRS and isinstance(v, _PLAIN_TYPES)}


def _generic_set(env: Any, state: dict[str, Any]) -> None:
    for key, value in state.items():
        setattr(env, key, copy.deepcopy(value))


def wrapper_chain(env: Any) -> list[Any]:
    """``[env, env.env, ..., unwrapped]`` of a Gymnasium wrapper stack."""
    from gymnasium import Wrapper

    chain = [env]
    while isinstance(chain[-1], Wrapper):
        chain.append(chain[-1].env)
    return chain


@dataclass
class GymSnapshot:
    cls: type
    wrappers: list[dict[str, Any]]
    base: Any


@dataclass
class PickledSnapshot:
    """A whole-env snapshot as bytes; restoring yields a *new* env object."""

    blob: bytes
    global_np_state: dict[str, Any] | tuple[Any, ...]


def _rebuild(cls: type[Any], state: dict[str, Any]) -> Any:
    obj = cls.__new__(cls)  # type: ignore[call-overload]  # cls may define its own __new__
    obj.__dict__.update(state)
    return obj


class _StatePickler(pickle.Pickler):
    """Pickles object *state*: EzPickle instances by ``__dict__`` instead of constructor args,
    and rendering handles (pygame surfaces/fonts/clocks) as ``None``."""

    def reducer_override(self, obj: Any) -> Any:
        mod = type(obj).__module__ or ""
        if mod.startswith("pygame"):
            return (type(None), ())
        from gymnasium.utils import EzPickle

        if isinstance(obj, EzPickle) and hasattr(obj, "__dict__"):
            return (_rebuild, (type(obj), obj.__dict__))
        return NotImplemented


def snapshot_env(env: Any) -> Any:
    """An independent copy of everything that determines ``env``'s future."""
    import gymnasium as gym

    if isinstance(env, SelfSnapshotting):
        return env.snapshot()
    if isinstance(env, gym.Env):
        chain = wrapper_chain(env)
        base = chain[-1]
        wrappers = [{a: copy.deepcopy(w.__dict__[a]) for a in _WRAPPER_ATTRS if a in w.__dict__} for w in chain[:-1]]
        get_state, _ = _HOOKS.get(type(base), (_generic_get, _generic_set))
        return GymSnapshot(type(base), wrappers, get_state(base))
    buf = io.BytesIO()
    _StatePickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(env)
    return PickledSnapshot(blob=buf.getvalue(), global_np_state=np.random.get_state())


def restore_env(env: Any, snap: Any) -> Any:
    """Put ``env`` into the state of ``snap``; returns the env to keep using (the same object,
    except for pickled snapshots, which rebuild it). The snapshot stays reusable."""
    if isinstance(snap, PickledSnapshot):
        np.random.set_state(snap.global_np_state)
        return pickle.loads(snap.blob)
    if isinstance(snap, GymSnapshot):
        chain = wrapper_chain(env)
        base = chain[-1]
        if type(base) is not snap.cls:
            raise TypeError(f"cannot restore a snapshot of {snap.cls.__name__} into {type(base).__name__}")
        if len(chain) - 1 != len(snap.wrappers):
            raise ValueError("snapshot was taken with a different wrapper stack")
        for wrapper, attrs in zip(chain[:-1], snap.wrappers, strict=True):
            for key, value in attrs.items():
                setattr(wrapper, key, copy.deepcopy(value))
        _, set_state = _HOOKS.get(type(base), (_generic_get, _generic_set))
        set_state(base, snap.base)
        return env
    if isinstance(env, SelfSnapshotting):
        env.restore(snap)
        return env
    raise TypeError(f"cannot restore a {type(snap).__name__} into {type(env).__name__}")
