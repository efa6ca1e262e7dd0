"""Environment registry: the only way the trainer learns about environments.

An environment is registered under a short name with a *kind* (``gymnasium``, ``pettingzoo`` or
``text``), a factory, per-env config defaults (tuned hyperparameters) and an optional solve
threshold. Three ways to reach an env without editing the framework:

* ``grpo_marl.register_env("my_env", factory, kind="gymnasium")`` from Python;
* the ``grpo_marl.envs`` entry-point group of an installed package (each entry point is a
  callable that registers its envs when loaded, or a factory registered under the entry's name);
* ``env=package.module:factory`` on the CLI, ``env=gym:ID`` for any Gymnasium id, or
  ``env=pz:<namespace>/<name>-v<N>`` for any PettingZoo id (AEC-only ids included, converted with
  ``aec_to_parallel``; turn-based games are refused, they cannot step all agents at once).

Built-in envs live in the top-level ``envs`` package and are imported lazily on first lookup so
``import grpo_marl`` stays cheap (no transformers/pettingzoo import until needed).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from grpo_marl.errors import MissingExtraError, UnknownEnvError, UserInputError

__all__ = ["EnvSpec", "UnknownEnvError", "get_spec", "list_envs", "make_env", "register_env"]

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
        try:
            return self.factory(**kwargs)
        except TypeError as exc:
            # A misspelt or unsupported ``env_kwargs`` key reaches the env's constructor as an
            # unexpected keyword: name the config key instead of surfacing a bare TypeError.
            if kwargs and "keyword argument" in str(exc):
                raise UserInputError(
                    f"env {self.name!r} rejected env_kwargs {sorted(kwargs)}: {exc}; "
                    "remove or correct the env_kwargs key"
                ) from exc
            raise


_REGISTRY: dict[str, EnvSpec] = {}
_BUILTINS_LOADED = False
_ENTRY_POINTS_LOADED = False


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
    if name.startswith("pz:"):
        return _pz_spec(name)
    if ":" in name:
        return _import_spec(name)
    import difflib

    close = difflib.get_close_matches(name, [n for n in _REGISTRY if not _is_alias(n)], n=1)
    hint = f" Did you mean {close[0]}?" if close else ""
    raise UnknownEnvError(f"unknown env {name!r}.{hint} {_known_names()}")


def _known_names() -> str:
    # Version aliases (pursuit_v5 beside pursuit) would double a long list: show the short names.
    names = sorted(n for n in _REGISTRY if not _is_alias(n))
    return (
        f"Known envs: {', '.join(names)} (plus versioned aliases such as pursuit_v5). "
        "Use env=gym:<Gymnasium id> for any Gymnasium env, env=pz:<namespace>/<name>-v<N> for any PettingZoo "
        "env, env=package.module:factory for your own factory, or grpo_marl.register_env(...)."
    )


def _is_alias(name: str) -> bool:
    import re

    if "/" in name:
        return True
    base = re.sub(r"_v\d+$", "", name)
    return base != name and base in _REGISTRY


def _gym_spec(name: str) -> EnvSpec:
    import gymnasium as gym

    gym_id = name[len("gym:") :]
    try:
        gym_spec = gym.spec(gym_id)
    except Exception as exc:  # gymnasium raises NameNotFound / VersionNotFound / etc.
        namespace = gym_id.split("/", 1)[0] if "/" in gym_id else None
        if namespace in GYM_NAMESPACE_PACKAGES:
            package = GYM_NAMESPACE_PACKAGES[namespace]
            raise MissingExtraError(
                f"env {name!r}: Gymnasium's {namespace} envs are registered by the {package} package, which is not "
                f"installed; pip install {package}"
            ) from exc
        raise UnknownEnvError(f"env {name!r}: Gymnasium has no id {gym_id!r} ({exc})") from exc
    _check_gym_dependencies(name, str(gym_spec.entry_point))
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


#: Gymnasium id namespaces whose envs another package registers -> that package.
GYM_NAMESPACE_PACKAGES = {"ALE": "ale-py"}
#: Gymnasium env families (``gymnasium.envs.<family>``) -> the install command of their dependencies.
GYM_FAMILY_INSTALL = {
    "box2d": 'pip install -e ".[box2d]" (or pip install "grpo_marl[box2d]")',
    "mujoco": 'pip install "gymnasium[mujoco]"',
}


def _check_gym_dependencies(name: str, entry_point: str) -> None:
    """Import the env's module (cheap, nothing is built) so a missing dependency (Box2D, MuJoCo, ...)
    stops the run before anything is built, with this project's install command rather than a
    traceback from inside the first ``gym.make``."""
    module_name = entry_point.partition(":")[0]
    if not module_name or not module_name.startswith("gymnasium.envs."):
        return  # a third-party entry point: importing it may have side effects; gym.make reports
    from gymnasium.error import DependencyNotInstalled

    try:
        importlib.import_module(module_name)
    except (DependencyNotInstalled, ImportError) as exc:
        family = module_name.split(".")[2]
        install = GYM_FAMILY_INSTALL.get(family, f'pip install "gymnasium[{family}]"')
        reason = str(exc).split(",")[0].strip() or type(exc).__name__
        raise MissingExtraError(f"env {name!r} needs Gymnasium's {family} dependencies ({reason}): {install}") from exc


def _pz_family_install(family: str) -> str:
    if family in ("butterfly", "sisl"):
        from grpo_marl.marl.preprocess import EXTRA

        return f'pip install -e ".[{EXTRA}]" (or pip install "grpo_marl[{EXTRA}]")'
    return f"pip install 'pettingzoo[{family}]'"


def _pz_spec(name: str) -> EnvSpec:
    """``pz:<namespace>/<name>-v<N>`` (or ``pz:aec:<id>``): any PettingZoo id, as a Parallel env."""
    import functools

    import pettingzoo
    from pettingzoo.env_registry.exceptions import (
        NameNotFound,
        NamespaceNotFound,
        VersionNotFound,
    )

    env_id = name[len("pz:") :]
    force_aec = env_id.startswith("aec:")
    env_id = env_id[len("aec:") :] if force_aec else env_id
    missing = (NameNotFound, NamespaceNotFound, VersionNotFound)
    try:
        pz_spec = pettingzoo.spec("parallel", env_id)
        parallel = not force_aec
    except missing:
        try:
            pz_spec = pettingzoo.spec("aec", env_id)
        except missing as exc:
            raise UnknownEnvError(
                f"env {name!r}: PettingZoo has no id {env_id!r}; ids look like pz:sisl/pursuit-v5 "
                "(list them with: python -c 'import pettingzoo; pettingzoo.pprint_registry()')"
            ) from exc
        parallel = False
    # Importing the env's module builds nothing, and a missing dependency (pymunk, Box2D, the ALE)
    # stops here with the install command instead of inside the first env constructor.
    module_name, _, _ = str(pz_spec.entry_point).partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        family = env_id.split("/", 1)[0]
        raise MissingExtraError(
            f"env {name!r} needs PettingZoo's {family} dependencies ({exc}): {_pz_family_install(family)}"
        ) from exc
    if not parallel:
        # aec_to_parallel needs every agent to act in every step; turn-based games cannot.
        metadata_ = getattr(getattr(module, "raw_env", None), "metadata", None) or {}
        if not metadata_.get("is_parallelizable", False):
            raise UserInputError(
                f"env {name!r} is a turn-based game (agents act one at a time), so it cannot be stepped as a "
                "parallel env; grpo_marl trains simultaneous-move envs (e.g. pz:sisl/pursuit-v5, simple_spread)"
            )
    from grpo_marl.marl.envs import make_parallel_env

    target = f"pz:aec:{env_id}" if force_aec else f"pz:{env_id}"
    return register_env(
        name,
        functools.partial(make_parallel_env, target),
        kind="pettingzoo",
        description=f"PettingZoo {env_id}" + ("" if parallel else " (AEC, via aec_to_parallel)"),
    )


def _import_spec(name: str) -> EnvSpec:
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise UnknownEnvError(f"env {name!r}: cannot import module {module_name!r}. {_known_names()}") from exc
        raise UserInputError(
            f"env {name!r}: module {module_name!r} imports {exc.name!r}, which is not installed ({exc}); "
            f"install it (pip install {exc.name}) or fix the import"
        ) from exc
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
