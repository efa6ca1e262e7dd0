"""``make_vec_env``: the one place that picks a vector env for an env spec and a vectorization.

``vec.vectorization``:

* ``native``: one numpy array program over all envs (a batched port from
  :mod:`grpo_marl.vec.ports`; CartPole's is ``CartPoleVec``, cheaper per step than Gymnasium's
  ``CartPoleVectorEnv``, which :class:`grpo_marl.vec.native.NativeCartPoleVec` still wraps);
* ``sync``: every env in this process, stepped one by one (any Gymnasium or PettingZoo env);
* ``async``: envs in worker processes (for envs whose step costs more than the pipe traffic);
* ``auto``: ``native`` where an implementation exists, else ``sync`` — for PettingZoo, worker
  processes when there are spare cores and enough envs (:func:`resolve_workers`).
"""

from __future__ import annotations

import functools
import os
from typing import Any

from grpo_marl.errors import UserInputError
from grpo_marl.registry import EnvSpec
from grpo_marl.vec.base import VecEnv
from grpo_marl.vec.drivers import Driver, GymDriver, PettingZooDriver
from grpo_marl.vec.local import LocalVec
from grpo_marl.vec.workers import WorkerVec

VECTORIZATIONS = ("auto", "native", "sync", "async")

#: Ports that ``auto`` picks (each checked step for step against the original env in the tests);
#: ``vec.vectorization=sync`` (or ``async``) keeps the original Gymnasium / mpe2 envs for cross-checks.
AUTO_PORTS: frozenset[str] = frozenset(
    {
        "Acrobot-v1",
        "Pendulum-v1",
        "MountainCar-v0",
        "MountainCarContinuous-v0",
        "simple_spread_v3",
        "simple_speaker_listener_v4",
        "simple_reference_v3",
    }
)


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


def _make_driver(kind: str, env_fn: Any, name: str, with_state: bool, n: int, offset: int) -> Driver:
    cls = PettingZooDriver if kind == "pettingzoo" else GymDriver
    return cls(env_fn, n, name=name, offset=offset, with_state=with_state)


def _port_target(spec: EnvSpec, env_kwargs: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """The id a port would implement for ``spec`` and the kwargs it gets (shipped defaults merged)."""
    if spec.kind == "gymnasium":
        return spec.gym_id, env_kwargs
    if spec.kind == "pettingzoo":
        from grpo_marl.marl.envs import MARL_ENVS

        info = MARL_ENVS.get(spec.name)
        if info is not None and info.source == "mpe2":
            return info.target, {**info.defaults, **env_kwargs}
    return None, env_kwargs


def make_vec_env(
    spec: EnvSpec,
    num_envs: int,
    env_kwargs: dict[str, Any] | None = None,
    vectorization: str = "auto",
    *,
    with_state: bool = False,
    num_workers: int = -1,
) -> VecEnv:
    """A :class:`~grpo_marl.vec.base.VecEnv` of ``num_envs`` copies of ``spec``'s env."""
    from grpo_marl.vec.ports import port_class

    env_kwargs = dict(env_kwargs or {})
    if vectorization not in VECTORIZATIONS:
        raise UserInputError(f"vec.vectorization={vectorization!r}: choose one of {', '.join(VECTORIZATIONS)}")
    if num_envs < 1:
        raise UserInputError(f"env {spec.name!r}: a vector env needs num_envs >= 1, got {num_envs}")
    if spec.kind not in ("gymnasium", "pettingzoo"):
        raise UserInputError(f"env {spec.name!r} of kind {spec.kind!r} has no vector env")
    target, port_kwargs = _port_target(spec, env_kwargs)
    rendering = bool(env_kwargs.get("render_mode"))
    if vectorization in ("auto", "native") and not rendering:
        if spec.kind == "gymnasium" and target in ("CartPole-v1", "CartPole-v0"):
            from grpo_marl.vec.ports.classic import CartPoleVec

            # env_kwargs.max_episode_steps overrides the registered limit, as gym.make's does
            limit = int(env_kwargs.pop("max_episode_steps", None) or (200 if target == "CartPole-v0" else 500))
            vec = CartPoleVec(num_envs, max_episode_steps=limit, with_state=with_state, **env_kwargs)
            vec.name = target
            return vec
        port = port_class(target) if target else None
        if port is not None and (vectorization == "native" or target in AUTO_PORTS):
            return port(num_envs, with_state=with_state, **port_kwargs)
    if vectorization == "native":
        raise UserInputError(
            f"env {spec.name!r} has no native (batched numpy) implementation; set vec.vectorization=sync or async"
        )
    env_fn = functools.partial(spec.make, **env_kwargs)
    if spec.kind == "pettingzoo":
        env_fn = functools.partial(_parallel_env, env_fn)
    factory = functools.partial(_make_driver, spec.kind, env_fn, spec.name, with_state)
    if vectorization == "async":
        workers = num_envs if spec.kind == "gymnasium" else resolve_workers(num_workers, num_envs, cpus=num_envs + 1)
        return WorkerVec(factory, num_envs, max(1, workers), name=spec.name, with_state=with_state)
    if spec.kind == "pettingzoo" and vectorization == "auto":
        workers = resolve_workers(num_workers, num_envs)
        if workers > 0:
            return WorkerVec(factory, num_envs, workers, name=spec.name, with_state=with_state)
    return LocalVec(factory(num_envs, 0))


def _parallel_env(env_fn: Any) -> Any:
    """Registered PettingZoo factories may return AEC envs; drivers need the Parallel API."""
    from pettingzoo import AECEnv

    env = env_fn()
    if isinstance(env, AECEnv):
        from pettingzoo.utils.conversions import aec_to_parallel

        env = aec_to_parallel(env)
    return env
