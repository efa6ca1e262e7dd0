"""``make_vec_env``: picks a vector env for an env spec and a vectorization; the env's family
(:mod:`grpo_marl.families`) decides which of the mechanisms below (ports, drivers) it uses.

``vec.vectorization``:

* ``native``: one numpy array program over all envs (the spec's ``vector_factory``, or a batched
  port from :mod:`grpo_marl.vec.ports`; CartPole's is ``CartPoleVec``);
* ``sync``: every env in this process, stepped one by one (any Gymnasium or PettingZoo env);
* ``async``: envs in worker processes (for envs whose step costs more than the pipe traffic);
* ``auto``: ``native`` where an implementation exists, else ``sync`` — for PettingZoo, worker
  processes when there are spare cores and enough envs (:func:`resolve_workers`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

from grpo_marl.errors import UserInputError
from grpo_marl.families import VECTORIZATIONS, get_family
from grpo_marl.registry import EnvSpec
from grpo_marl.vec.base import VecEnv
from grpo_marl.vec.drivers import Driver
from grpo_marl.vec.local import LocalVec
from grpo_marl.vec.workers import WorkerVec


def resolve_workers(requested: int, num_envs: int, cpus: int | None = None) -> int:
    """``-1`` (auto) -> in-process on machines with <= 2 cores or below 16 envs, else one worker
    per core but one (the main process runs the policy), at most one per 8 envs.

    Measured on the 2-core dev machine (simple_spread x128): the in-process collector ran 5,600
    joint steps/s and the 2-worker one 3,200 — with no spare core, workers only add pipe traffic
    and contend with the policy forward.
    """
    if requested >= 0:
        return min(requested, num_envs)
    cpus = (os.cpu_count() or 1) if cpus is None else cpus
    if num_envs < 16 or cpus <= 2:
        return 0
    return max(1, min(cpus - 1, num_envs // 8))


def make_vec_env(
    spec: EnvSpec,
    num_envs: int,
    env_kwargs: dict[str, Any] | None = None,
    vectorization: str = "auto",
    *,
    with_state: bool = False,
    num_workers: int = -1,
) -> VecEnv:
    """A :class:`~grpo_marl.vec.base.VecEnv` of ``num_envs`` copies of ``spec``'s env: the spec's
    own ``vector_factory`` under ``auto``/``native`` (not when rendering), else what its family
    builds (:meth:`grpo_marl.families.EnvFamily.make_vec`)."""
    env_kwargs = dict(env_kwargs or {})
    if vectorization not in VECTORIZATIONS:
        raise UserInputError(f"vec.vectorization={vectorization!r}: choose one of {', '.join(VECTORIZATIONS)}")
    if num_envs < 1:
        raise UserInputError(f"env {spec.name!r}: a vector env needs num_envs >= 1, got {num_envs}")
    family = get_family(spec.kind)
    if vectorization not in family.vectorizations:
        raise UserInputError(
            f"vec.vectorization={vectorization}: env {spec.name!r} ({family.noun}) supports "
            f"{', '.join(family.vectorizations)}"
        )
    if spec.vector_factory is not None and vectorization in ("auto", "native") and not env_kwargs.get("render_mode"):
        vec: VecEnv = spec.vector_factory(num_envs, with_state=with_state, **env_kwargs)
        return vec
    return family.make_vec(spec, num_envs, env_kwargs, vectorization, with_state=with_state, num_workers=num_workers)


def port_vec(
    name: str,
    target: str | None,
    env_kwargs: dict[str, Any],
    num_envs: int,
    vectorization: str,
    *,
    with_state: bool,
) -> VecEnv | None:
    """The batched numpy port of env ``name``'s original id ``target`` when ``vectorization`` picks one (``native``
    always, ``auto`` for ports registered with ``auto=True``; never when rendering), else None; ``native`` without a
    port is refused."""
    from grpo_marl.vec.ports import port_class

    if vectorization in ("auto", "native") and not env_kwargs.get("render_mode"):
        port = port_class(target, auto=vectorization == "auto") if target else None
        if port is not None:
            vec: VecEnv = port(num_envs, with_state=with_state, **env_kwargs)
            return vec
    if vectorization == "native":
        raise UserInputError(
            f"env {name!r} has no native (batched numpy) implementation; set vec.vectorization=sync or async"
        )
    return None


def driver_vec(
    driver: type[Driver],
    env_fn: Callable[[], Any],
    name: str,
    num_envs: int,
    vectorization: str,
    *,
    with_state: bool,
    async_workers: int,
    auto_workers: int = 0,
) -> VecEnv:
    """``num_envs`` envs from ``env_fn`` stepped by ``driver``: in worker processes for ``async``
    (``async_workers`` of them) and for ``auto`` when ``auto_workers`` > 0, else in this process."""
    factory = functools.partial(_make_driver, driver, env_fn, name, with_state)
    if vectorization == "async":
        return WorkerVec(factory, num_envs, max(1, async_workers), name=name, with_state=with_state)
    if vectorization == "auto" and auto_workers > 0:
        return WorkerVec(factory, num_envs, auto_workers, name=name, with_state=with_state)
    return LocalVec(factory(num_envs, 0))


def _make_driver(
    cls: type[Driver], env_fn: Callable[[], Any], name: str, with_state: bool, n: int, offset: int
) -> Driver:
    return cls(env_fn, n, name=name, offset=offset, with_state=with_state)
