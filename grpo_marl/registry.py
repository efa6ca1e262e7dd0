"""Environment registry: the only way the trainer learns about environments.

An environment is registered under a short name with a *kind* (``gymnasium``, ``pettingzoo`` or
``text``), a factory, per-env config defaults (tuned hyperparameters) and an optional solve
threshold. Three ways to reach an env without editing the framework:

* ``grpo_marl.register_env("my_env", factory, kind="gymnasium")`` from Python;
* the ``grpo_marl.envs`` entry-point group of an installed package (each entry point is a
  callable that registers its envs when loaded, or a factory registered under the entry's name);
* ``env=package.module:factory`` on the CLI, or ``env=gym:ID`` for any Gymnasium id.

Built-in envs live in the top-level ``envs`` package and are imported lazily on first lookup so
``import grpo_marl`` stays cheap (no transformers/pettingzoo import until needed).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable

KINDS = ("gymnasium", "pettingzoo", "text")
BUILTIN_MODULES = ("envs.classic_control", "envs.multiagent", "envs.text")
ENTRY_POINT_GROUP = "grpo_marl.envs"


@dataclass
class EnvSpec:
    """Everything the framework knows about one registered environment."""

    name: str
    factory: Callable[..., Any]
    kind: str = "gymnasium"
    defaults: dict[str, Any] = field(default_factory=dict)
    threshold: float | None = None
    description: str = ""
    gym_id: str | None = None  # set when the factory is plain gymnasium.make(gym_id)
    vector_factory: Callable[..., Any] | None = None  # optional natively vectorized constructor

    def make(self, **kwargs: Any) -> Any:
        return self.factory(**kwargs)


_REGISTRY: dict[str, EnvSpec] = {}
_BUILTINS_LOADED = False
_ENTRY_POINTS_LOADED = False


class UnknownEnvError(KeyError):
    """Raised for an env name that is neither registered nor a ``gym:``/``module:factory`` ref."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0])


def register_env(
    name: str,
    factory: Callable[..., Any] | None = None,
    *,
    kind: str = "gymnasium",
    defaults: dict[str, Any] | None = None,
    threshold: float | None = None,
    description: str = "",
    gym_id: str | None = None,
    vector_factory: Callable[..., Any] | None = None,
    overwrite: bool = False,
) -> EnvSpec:
    """Register an environment under ``name``.

    ``factory(**env_kwargs)`` must return a Gymnasium env (kind ``gymnasium``), a PettingZoo
    Parallel/AEC env (``pettingzoo``) or a text env (``text``). ``defaults`` are config overrides
    (e.g. ``{"algo": {"group_size": 8}, "total_steps": 100_000}``) applied *under* the user's
    command-line overrides, so tuned values never beat an explicit choice.
    """
    if kind not in KINDS:
        raise ValueError(f"register_env({name!r}): kind must be one of {KINDS}, got {kind!r}")
    if factory is None and gym_id is None:
        raise ValueError(f"register_env({name!r}): give a factory or a gym_id")
    if name in _REGISTRY and not overwrite:
        existing = _REGISTRY[name]
        if existing.factory is factory and existing.gym_id == gym_id:
            return existing
        raise ValueError(f"env {name!r} is already registered; pass overwrite=True to replace it")
    if factory is None:
        factory = _gym_factory(gym_id)  # type: ignore[arg-type]
    spec = EnvSpec(
        name=name,
        factory=factory,
        kind=kind,
        defaults=dict(defaults or {}),
        threshold=threshold,
        description=description,
        gym_id=gym_id,
        vector_factory=vector_factory,
    )
    _REGISTRY[name] = spec
    return spec


def _gym_factory(gym_id: str) -> Callable[..., Any]:
    def make(**kwargs: Any) -> Any:
        import gymnasium as gym

        return gym.make(gym_id, **kwargs)

    make.__name__ = f"make_{gym_id}"
    return make


def _load_builtins() -> None:
    global _BUILTINS_LOADED
    if _BUILTINS_LOADED:
        return
    _BUILTINS_LOADED = True
    for module in BUILTIN_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            # Only tolerate the built-in module itself being absent (e.g. a trimmed install);
            # a missing dependency *inside* it is a real error the user must see.
            if exc.name != module and not module.startswith(str(exc.name)):
                raise


def _load_entry_points() -> None:
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        obj = ep.load()
        if ep.name in _REGISTRY:
            continue
        before = set(_REGISTRY)
        if callable(obj):
            try:
                result = obj()
            except TypeError:
                result = None
            if set(_REGISTRY) == before:
                # Not a registration hook: treat the entry point as a gymnasium factory.
                register_env(ep.name, obj, kind=getattr(result, "grpo_marl_kind", "gymnasium"))


def list_envs() -> list[str]:
    """Names of every registered env (built-ins and entry points included), sorted."""
    _load_builtins()
    _load_entry_points()
    return sorted(_REGISTRY)


def get_spec(name: str) -> EnvSpec:
    """Resolve ``name`` to an :class:`EnvSpec`.

    Accepts a registered short name, ``gym:ID`` for any Gymnasium id, or ``package.module:factory``.
    Unknown names raise :class:`UnknownEnvError` listing every known name.
    """
    if name in _REGISTRY:
        return _REGISTRY[name]
    _load_builtins()
    if name in _REGISTRY:
        return _REGISTRY[name]
    _load_entry_points()
    if name in _REGISTRY:
        return _REGISTRY[name]
    if name.startswith("gym:"):
        return _gym_spec(name)
    if ":" in name:
        return _import_spec(name)
    known = ", ".join(sorted(_REGISTRY))
    raise UnknownEnvError(
        f"unknown env {name!r}. Known envs: {known}. "
        "Use env=gym:<Gymnasium id> for any Gymnasium env, env=package.module:factory for your own "
        "factory, or grpo_marl.register_env(...)."
    )


def _gym_spec(name: str) -> EnvSpec:
    import gymnasium as gym

    gym_id = name[len("gym:") :]
    try:
        gym.spec(gym_id)
    except Exception as exc:  # gymnasium raises NameNotFound / VersionNotFound / etc.
        raise UnknownEnvError(f"env {name!r}: Gymnasium has no id {gym_id!r} ({exc})") from exc
    # Reuse the tuned defaults of a built-in alias of the same id, if there is one.
    for spec in _REGISTRY.values():
        if spec.gym_id == gym_id:
            return register_env(
                name,
                spec.factory,
                kind=spec.kind,
                defaults=spec.defaults,
                threshold=spec.threshold,
                gym_id=gym_id,
                vector_factory=spec.vector_factory,
            )
    threshold = gym.spec(gym_id).reward_threshold
    return register_env(name, kind="gymnasium", gym_id=gym_id, threshold=threshold)


def _import_spec(name: str) -> EnvSpec:
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise UnknownEnvError(f"env {name!r}: cannot import module {module_name!r} ({exc})") from exc
    try:
        factory = getattr(module, attr)
    except AttributeError as exc:
        raise UnknownEnvError(f"env {name!r}: module {module_name!r} has no attribute {attr!r}") from exc
    if not callable(factory):
        raise UnknownEnvError(f"env {name!r}: {attr!r} is not callable")
    kind = getattr(factory, "grpo_marl_kind", "gymnasium")
    return register_env(
        name,
        factory,
        kind=kind,
        defaults=getattr(factory, "grpo_marl_defaults", None),
        threshold=getattr(factory, "grpo_marl_threshold", None),
    )


def make_env(name: str, **kwargs: Any) -> Any:
    """Build one environment instance by registered name (see :func:`get_spec`)."""
    return get_spec(name).make(**kwargs)
