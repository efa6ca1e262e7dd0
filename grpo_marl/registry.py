"""Environment registry: the only way the trainer learns about environments.

An environment is registered under a short name with a *kind* (``gymnasium``, ``pettingzoo`` or
``text``), a factory, per-env config defaults (tuned hyperparameters) and an optional solve
threshold. Three ways to reach an env without editing the framework:

* ``grpo_marl.register_env("my_env", factory, kind="gymnasium")`` from Python;
* the ``grpo_marl.envs`` entry-point group of an installed package (each entry point is a
  callable that registers its envs when loaded, or a factory registered under the entry's name);
* ``env=package.module:factory`` on the CLI, ``env=gym:ID`` for any Gymnasium id, or
  ``env=pz:<namespace>/<name>-v<N>`` for any PettingZoo id (AEC-only ids included, converted with
  ``aec_to_parallel``; turn-based games are refused, they cannot step all agents at once);
  ``vmas:<scenario>`` for any VMAS scenario. ``gym:``, ``pz:`` and ``vmas:`` are *env prefixes*
  (:data:`ENV_PREFIXES`): a name ``prefix:rest`` whose prefix is registered goes to that
  prefix's resolver, before ``module:factory`` is tried. A package adds its own with
  :func:`register_env_prefix` or a ``grpo_marl.env_prefixes`` entry point (the resolver).

Built-in envs live in the top-level ``envs`` package and are imported lazily on first lookup so
``import grpo_marl`` stays cheap (no transformers/pettingzoo import until needed).
"""

from __future__ import annotations

import difflib
import importlib
import os
import warnings
from collections.abc import Callable, ItemsView, Iterator, Mapping, Sequence, ValuesView
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Generic, TypeVar

from grpo_marl.errors import MissingExtraError, UnknownEnvError, UserInputError

__all__ = [
    "ENVS",
    "EnvSpec",
    "Registry",
    "UnknownEnvError",
    "get_spec",
    "ENV_PREFIXES",
    "list_envs",
    "load_defaults",
    "make_env",
    "register_env",
    "register_env_prefix",
]

BUILTIN_MODULES = ("envs.classic_control", "envs.multiagent", "envs.text")
ENTRY_POINT_GROUP = "grpo_marl.envs"

T = TypeVar("T")


class Registry(Generic[T]):
    """One name -> object table: the convention of every extension point (envs, env families,
    losses, aggregations, algorithms), so user code and installed plugins extend each the same way.

    Reading it like a dict (``name in LOSSES``, ``LOSSES[name]``, iteration) sees only what is
    registered so far; :meth:`get`, :meth:`find` and :meth:`names` first import the built-in ``modules`` and then
    the ``entry_point_group`` of installed packages (each once), so a lookup sees everything a
    plain name can reach. A plugin that fails to import is named in a warning and recorded in
    :attr:`broken`; it never breaks a lookup of something else, and a lookup of its own name says
    why it is missing. Validation reads :meth:`names` at validation time, so what user code
    registers is accepted exactly like a built-in.
    """

    def __init__(
        self,
        what: str,
        *,
        modules: Sequence[str] = (),
        entry_point_group: str | None = None,
        on_entry_point: Callable[[str, Any], None] | None = None,
        error: type[Exception] = UserInputError,
    ) -> None:
        self.what = what
        self.modules = tuple(modules)
        self.entry_point_group = entry_point_group
        self.error = error
        self._on_entry_point = on_entry_point
        self._items: dict[str, T] = {}
        self.modules_loaded = not self.modules
        self.entry_points_loaded = entry_point_group is None
        #: entry-point name -> why it failed to load (shown in the error when it is asked for)
        self.broken: dict[str, str] = {}

    # -- dict view (no loading) ----------------------------------------------------------------
    def __getitem__(self, name: str) -> T:
        return self._items[name]

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def items(self) -> ItemsView[str, T]:
        return self._items.items()

    def values(self) -> ValuesView[T]:
        return self._items.values()

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    # -- registration ----------------------------------------------------------------------------
    def register(self, name: str, obj: T, *, overwrite: bool = False) -> T:
        """Add ``obj`` under ``name``; a different object under a taken name needs ``overwrite``."""
        existing = self._items.get(name)
        if existing is not None and existing is not obj and not overwrite:
            raise ValueError(f"{self.what} {name!r} is already registered ({_describe(existing)})")
        self._items[name] = obj
        return obj

    def pop(self, name: str, default: T | None = None) -> T | None:
        """Remove ``name`` (tests undo their registrations with it)."""
        return self._items.pop(name, default)

    def state(self) -> tuple[dict[str, T], bool, bool, dict[str, str]]:
        """Everything registered and loaded so far, for :meth:`restore` (test sandboxes)."""
        return dict(self._items), self.modules_loaded, self.entry_points_loaded, dict(self.broken)

    def restore(self, state: tuple[dict[str, T], bool, bool, dict[str, str]]) -> None:
        items, self.modules_loaded, self.entry_points_loaded, broken = state
        self._items.clear()
        self._items.update(items)
        self.broken.clear()
        self.broken.update(broken)

    # -- lookup ------------------------------------------------------------------------------------
    def find(self, name: str) -> T | None:
        """``name``'s object, loading built-ins and then entry points until it appears; else None."""
        if name in self._items:
            return self._items[name]
        self.load_modules()
        if name in self._items:
            return self._items[name]
        self.load_entry_points()
        return self._items.get(name)

    def get(self, name: str) -> T:
        """``name``'s object (loading as :meth:`find` does); an unknown name raises :attr:`error`
        with the closest name and the list. Unlike ``dict.get`` it never returns None."""
        found = self.find(name)
        if found is None:
            raise self.error(self.unknown_message(name))
        return found

    def names(self) -> list[str]:
        """Every registered name (built-ins and entry points loaded), sorted."""
        self.load_modules()
        self.load_entry_points()
        return sorted(self._items)

    def suggestion(self, name: str, candidates: Sequence[str] | None = None) -> str:
        """`` Did you mean X?`` for the closest of ``candidates`` (default: every name), or ''."""
        pool = list(self._items) if candidates is None else list(candidates)
        close = difflib.get_close_matches(name, pool, n=1)
        return f" Did you mean {close[0]}?" if close else ""

    def broken_note(self, name: str) -> str:
        """Why ``name`` may be missing: its own plugin failed, or which plugins did ('' if none)."""
        if name in self.broken:
            return f" The {self.what} {name!r} comes from a plugin that failed to load: {self.broken[name]}."
        if self.broken:
            return f" Plugins that failed to load: {'; '.join(f'{k} ({v})' for k, v in self.broken.items())}."
        return ""

    def unknown_message(self, name: str) -> str:
        return (
            f"unknown {self.what} {name!r}; registered: {', '.join(sorted(self._items))}.{self.suggestion(name)}"
            + self.broken_note(name)
        )

    # -- loading -----------------------------------------------------------------------------------
    def load_modules(self) -> None:
        if self.modules_loaded:
            return
        self.modules_loaded = True
        for module in self.modules:
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as exc:
                # Only tolerate the built-in module itself being absent (e.g. a trimmed install);
                # a missing dependency *inside* it is a real error the user must see.
                if exc.name != module and not module.startswith(str(exc.name)):
                    raise

    def load_entry_points(self) -> None:
        if self.entry_points_loaded or self.entry_point_group is None:
            return
        self.entry_points_loaded = True
        for ep in metadata.entry_points(group=self.entry_point_group):
            if ep.name in self._items:
                continue
            try:
                obj = ep.load()
                if self._on_entry_point is None:
                    self.register(ep.name, obj)
                else:
                    self._on_entry_point(ep.name, obj)
            except Exception as exc:  # a third-party plugin: never let it break another lookup
                why = f"{ep.value}: {type(exc).__name__}: {exc}"
                self.broken[ep.name] = why
                warnings.warn(
                    f"grpo_marl: the {self.entry_point_group} entry point {ep.name!r} failed to load and is skipped "
                    f"({why})",
                    RuntimeWarning,
                    stacklevel=3,
                )


def _describe(obj: object) -> str:
    return getattr(obj, "__qualname__", None) or type(obj).__name__


@dataclass
class EnvSpec:
    """Everything the framework knows about one registered environment.

    ``kind`` names its :class:`grpo_marl.families.EnvFamily` (``gymnasium``, ``pettingzoo``,
    ``text`` or a family user code registered); everything kind-specific goes through that object.
    """

    name: str
    factory: Callable[..., Any] | None
    kind: str = "gymnasium"
    defaults: dict[str, Any] = field(default_factory=dict)
    threshold: float | None = None
    description: str = ""
    gym_id: str | None = None  # set when the factory is plain gymnasium.make(gym_id)
    #: ``vector_factory(num_envs, *, with_state, **env_kwargs) -> VecEnv``: a batched implementation
    #: that ``vec.vectorization=auto|native`` uses instead of ``num_envs`` copies of ``factory``
    vector_factory: Callable[..., Any] | None = None

    def make(self, **kwargs: Any) -> Any:
        if self.factory is None:
            raise UserInputError(
                f"env {self.name!r} has only a vector_factory (no single-env factory); "
                "use vec.vectorization=auto or native"
            )
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


def _env_entry_point(name: str, obj: Any) -> None:
    """A ``grpo_marl.envs`` entry point: a hook that registers envs when called, or a factory
    registered under the entry's name (of the kind its ``grpo_marl_kind`` attribute names)."""
    if not callable(obj):
        raise TypeError(f"entry point {name!r} is not callable")
    before = set(ENVS)
    try:
        result = obj()
    except TypeError:
        result = None
    if set(ENVS) == before:
        # Not a registration hook: treat the entry point as a factory.
        register_env(
            name, obj, kind=str(getattr(result, "grpo_marl_kind", None) or getattr(obj, "grpo_marl_kind", "gymnasium"))
        )


#: Every registered env, by short name.
ENVS: Registry[EnvSpec] = Registry(
    "env",
    modules=BUILTIN_MODULES,
    entry_point_group=ENTRY_POINT_GROUP,
    on_entry_point=_env_entry_point,
    error=UnknownEnvError,
)


#: What ``register_env(defaults=...)`` takes: the sections themselves, or a YAML file holding them.
EnvDefaults = Mapping[str, Any] | str | os.PathLike[str]


def load_defaults(path: str | os.PathLike[str]) -> dict[str, Any]:
    """An env's tuned defaults from a YAML file (sections ``common`` and one per algorithm).

    The one format of tuned defaults: every shipped env has such a file in ``envs/conf/``, and a
    user's env may point ``register_env(defaults=...)`` at one (or give the same sections as a
    dict). A file may start with ``defaults: [other, ...]``, as in Hydra: the named files of the
    same folder are merged first, in order, then the file's own sections on top (values that
    differ only), so the text envs share ``_text.yaml`` instead of repeating it.
    """
    return _load_defaults(Path(path), ())


def _load_defaults(path: Path, seen: tuple[Path, ...]) -> dict[str, Any]:
    import yaml
    from omegaconf import OmegaConf

    if path in seen:
        chain = " -> ".join(p.name for p in (*seen, path))
        raise ValueError(f"env defaults {path}: its defaults list includes itself ({chain})")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ValueError(f"env defaults file {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"env defaults file {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"env defaults file {path} must hold a mapping of sections (common, grpo, ppo, ...)")
    bases = data.pop("defaults", [])
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise ValueError(f"env defaults file {path}: 'defaults' must be a list of file names, e.g. [_text]")
    layers = [_load_defaults(path.parent / f"{base}.yaml", (*seen, path)) for base in bases]
    out = OmegaConf.to_container(OmegaConf.merge(*layers, data) if layers else OmegaConf.create(data))
    assert isinstance(out, dict)
    return {str(k): v for k, v in out.items()}


def register_env(
    name: str,
    factory: Callable[..., Any] | None = None,
    *,
    kind: str = "gymnasium",
    defaults: EnvDefaults | None = None,
    threshold: float | None = None,
    description: str = "",
    gym_id: str | None = None,
    vector_factory: Callable[..., Any] | None = None,
    overwrite: bool = False,
) -> EnvSpec:
    """Register an environment under ``name``.

    ``factory(**env_kwargs)`` must return an env of the family ``kind`` names: a Gymnasium env
    (``gymnasium``), a PettingZoo Parallel/AEC env (``pettingzoo``), a text env (``text``), or
    what a family registered with :func:`grpo_marl.families.register_family` builds.
    ``vector_factory(num_envs, *, with_state, **env_kwargs)`` is a batched implementation that
    ``vec.vectorization=auto|native`` uses (an env may have only this). ``defaults`` are config
    overrides applied *under* the user's config file and command line, so tuned values never beat
    an explicit choice: sections ``common`` (every algorithm) and one per algorithm
    (``{"common": {"total_steps": 100_000}, "grpo": {"algo": {"group_size": 8}}}``), as a dict or
    as the path of a YAML file of the same shape (:func:`load_defaults`, the format of
    ``envs/conf/``). A dict without those sections applies to every algorithm.
    """
    from grpo_marl.families import FAMILIES

    if FAMILIES.find(kind) is None:
        raise ValueError(f"register_env({name!r}): kind must be one of {tuple(FAMILIES.names())}, got {kind!r}")
    if factory is None and gym_id is None and vector_factory is None:
        raise ValueError(f"register_env({name!r}): give a factory, a vector_factory or a gym_id")
    existing = ENVS[name] if name in ENVS else None
    if existing is not None and not overwrite:
        if existing.factory is factory and existing.gym_id == gym_id:
            return existing
        raise ValueError(f"env {name!r} is already registered; pass overwrite=True to replace it")
    if factory is None and gym_id is not None:
        factory = _gym_factory(gym_id)
    spec = EnvSpec(
        name=name,
        factory=factory,
        kind=kind,
        defaults=_defaults_of(defaults),
        threshold=threshold,
        description=description,
        gym_id=gym_id,
        vector_factory=vector_factory,
    )
    return ENVS.register(name, spec, overwrite=True)


def _defaults_of(defaults: EnvDefaults | None) -> dict[str, Any]:
    if defaults is None:
        return {}
    if isinstance(defaults, (str, os.PathLike)):
        return load_defaults(defaults)
    return dict(defaults)


def _gym_factory(gym_id: str) -> Callable[..., Any]:
    def make(**kwargs: Any) -> Any:
        import gymnasium as gym

        return gym.make(gym_id, **kwargs)

    make.__name__ = f"make_{gym_id}"
    return make


def list_envs() -> list[str]:
    """Names of every registered env (built-ins and entry points included), sorted."""
    return ENVS.names()


def get_spec(name: str) -> EnvSpec:
    """Resolve ``name`` to an :class:`EnvSpec`.

    Accepts a registered short name, ``prefix:ID`` for a registered env prefix (``gym:`` any
    Gymnasium id, ``pz:`` any PettingZoo id, ``vmas:`` any VMAS scenario), or
    ``package.module:factory``. Unknown names raise :class:`UnknownEnvError` with the
    closest known name and the list (and, if one failed, the plugin that would have provided it).
    """
    spec = ENVS.find(name)
    if spec is not None:
        return spec
    if ":" in name:
        resolver = ENV_PREFIXES.find(name.partition(":")[0])
        return resolver(name) if resolver is not None else _import_spec(name)
    hint = ENVS.suggestion(name, [n for n in ENVS if not _is_alias(n)])
    raise UnknownEnvError(f"unknown env {name!r}.{hint} {_known_names()}{ENVS.broken_note(name)}")


def _known_names() -> str:
    # Version aliases (pursuit_v5 beside pursuit) would double a long list: show the short names.
    names = sorted(n for n in ENVS if not _is_alias(n))
    return (
        f"Known envs: {', '.join(names)} (plus versioned aliases such as pursuit_v5). "
        "Use env=gym:<Gymnasium id> for any Gymnasium env, env=pz:<namespace>/<name>-v<N> for any PettingZoo "
        "env, env=vmas:<scenario> for any VMAS scenario (the vmas extra), env=package.module:factory for your "
        "own factory, or grpo_marl.register_env(...)."
    )


def _is_alias(name: str) -> bool:
    import re

    if "/" in name:
        return True
    base = re.sub(r"_v\d+$", "", name)
    return base != name and base in ENVS


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
    for spec in ENVS.values():
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
    return register_env(
        name,
        factory,
        kind=getattr(factory, "grpo_marl_kind", "gymnasium"),
        defaults=getattr(factory, "grpo_marl_defaults", None),
        threshold=getattr(factory, "grpo_marl_threshold", None),
    )


#: ``prefix`` -> the resolver of names ``prefix:rest`` (a callable taking the whole name and returning
#: its :class:`EnvSpec`, usually registered on first use with :func:`register_env`).
ENV_PREFIXES: Registry[Callable[[str], EnvSpec]] = Registry(
    "env prefix", modules=BUILTIN_MODULES, entry_point_group="grpo_marl.env_prefixes", error=UnknownEnvError
)


def register_env_prefix(prefix: str, resolver: Callable[[str], EnvSpec], *, overwrite: bool = False) -> None:
    """Resolve env names ``prefix:rest`` with ``resolver(name) -> EnvSpec`` (``vmas:balance``)."""
    if not prefix or ":" in prefix:
        raise ValueError(f"env prefix {prefix!r}: a prefix is a non-empty name without ':'")
    ENV_PREFIXES.register(prefix, resolver, overwrite=overwrite)


register_env_prefix("gym", _gym_spec)
register_env_prefix("pz", _pz_spec)


def make_env(name: str, **kwargs: Any) -> Any:
    """Build one environment instance by registered name (see :func:`get_spec`)."""
    return get_spec(name).make(**kwargs)
