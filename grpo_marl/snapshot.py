"""Snapshot/restore hooks: the capability behind ``state`` groups.

A ``state`` group restores G copies of one visited state and lets each branch continue with the
current policy, so the branches' returns are comparable. That needs an *exact* copy of everything
that determines the future: the physical state, the step counter of the ``TimeLimit`` wrapper and
the env's RNG. ``copy.deepcopy`` of a whole env is not a safe default (EzPickle envs rebuild
themselves from constructor args and lose their state; render surfaces do not copy), so state is
copied explicitly: a hook per env class where needed, and a generic hook for plain-Python
envs (all of Gymnasium's classic control) that copies the unwrapped env's data attributes.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import numpy as np

# Attributes that are rendering/IO handles, never part of the dynamics state.
_SKIP_ATTRS = frozenset(
    {"screen", "clock", "surf", "viewer", "window", "render_mode", "spec", "metadata", "isopen",
     "observation_space", "action_space", "_np_random_seed"}
)
_PLAIN_TYPES = (np.ndarray, np.generic, int, float, bool, str, type(None), tuple, list, dict,
                np.random.Generator)

SnapshotHook = tuple[Callable[[Any], Any], Callable[[Any, Any], None]]
_HOOKS: dict[type, SnapshotHook] = {}


def register_snapshot_hook(
    env_cls: type, get_state: Callable[[Any], Any], set_state: Callable[[Any, Any], None]
) -> None:
    """Teach :func:`snapshot_env` how to copy the state of ``env_cls`` (the *unwrapped* class)."""
    _HOOKS[env_cls] = (get_state, set_state)


def _generic_get(env: Any) -> dict[str, Any]:
    state = {}
    for key, value in vars(env).items():
        if key in _SKIP_ATTRS or not isinstance(value, _PLAIN_TYPES):
            continue
        state[key] = copy.deepcopy(value)
    return state


def _generic_set(env: Any, state: dict[str, Any]) -> None:
    for key, value in state.items():
        setattr(env, key, copy.deepcopy(value))


def _wrapper_chain(env: Any) -> list[Any]:
    chain = []
    while env is not None:
        chain.append(env)
        env = getattr(env, "env", None)
    return chain


# PassiveEnvChecker's flags travel with the data its first-step check compares against
# (gymnasium >= 1.2); restoring ``checked_step`` alone makes that check unpack a stale ``None``.
_WRAPPER_ATTRS = (
    "_elapsed_steps", "_has_reset", "checked_reset", "checked_step", "checked_data_reuse", "_previous_data",
)


def snapshot_env(env: Any) -> dict[str, Any]:
    """Return an independent copy of everything that determines ``env``'s future.

    Works on a wrapped Gymnasium env: wrapper counters (``TimeLimit._elapsed_steps``, reset
    flags) are recorded per wrapper depth, the unwrapped env through its registered hook or the
    generic data-attribute copy.
    """
    chain = _wrapper_chain(env)
    base = chain[-1]
    wrappers = [
        {a: getattr(w, a) for a in _WRAPPER_ATTRS if hasattr(w, a)} for w in chain[:-1]
    ]
    get_state, _ = _HOOKS.get(type(base), (_generic_get, _generic_set))
    return {"cls": type(base), "wrappers": wrappers, "base": get_state(base)}


def restore_env(env: Any, snapshot: dict[str, Any]) -> None:
    """Put ``env`` into the exact state recorded by :func:`snapshot_env` (same env class)."""
    chain = _wrapper_chain(env)
    base = chain[-1]
    if type(base) is not snapshot["cls"]:
        raise TypeError(
            f"cannot restore a snapshot of {snapshot['cls'].__name__} into {type(base).__name__}"
        )
    if len(chain) - 1 != len(snapshot["wrappers"]):
        raise ValueError("snapshot was taken with a different wrapper stack")
    for wrapper, attrs in zip(chain[:-1], snapshot["wrappers"]):
        for key, value in attrs.items():
            setattr(wrapper, key, value)
    _, set_state = _HOOKS.get(type(base), (_generic_get, _generic_set))
    set_state(base, snapshot["base"])
