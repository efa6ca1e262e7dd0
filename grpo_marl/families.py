"""Env families: everything the framework does differently for a kind of environment, in one object.

An :class:`EnvFamily` says how to build a family's vector env and its Task, whether its envs are
multi-agent, which pip extra it needs, the torch thread default, DDP's unused-parameter flag, the
``autocast=auto`` rule, whether videos can be recorded, and which algorithms, group modes,
vectorizations and rollout layouts it supports. The rest of the framework asks the family
(``get_family(spec.kind)``) instead of comparing ``spec.kind`` with strings, so a new family (a
user's batched simulator, a JAX or VMAS env) is one subclass and one :func:`register_family` call,
from user code or a ``grpo_marl.families`` entry point, with no framework file edited.

``gymnasium``, ``pettingzoo`` and ``text`` are the built-in families below.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from grpo_marl.errors import MissingExtraError, UserInputError
from grpo_marl.registry import EnvSpec, Registry

if TYPE_CHECKING:
    import torch
    from omegaconf import DictConfig

    from grpo_marl.groups import GroupMode
    from grpo_marl.tasks.base import Task
    from grpo_marl.vec.base import VecEnv

__all__ = [
    "FAMILIES",
    "EnvFamily",
    "GymnasiumFamily",
    "PettingZooFamily",
    "TextFamily",
    "family_of",
    "get_family",
    "register_family",
]

#: Every ``vec.vectorization`` the framework knows (a family may support fewer).
VECTORIZATIONS = ("auto", "native", "sync", "async")


class EnvFamily:
    """Base of every env family; the class attributes are its capabilities (override as needed).

    The defaults describe a single-agent, vectorized family trained by GRPO (and PPO) with the
    control Task (:class:`grpo_marl.tasks.control.ControlTask`, whose vector env comes from
    :meth:`make_vec`), so a user family usually overrides ``name`` and :meth:`make_vec` only.
    """

    #: the name envs give as ``register_env(..., kind=name)``
    name: ClassVar[str] = ""
    #: one env of the family and many, for messages ("a single-agent Gymnasium env")
    noun: ClassVar[str] = "an env"
    plural: ClassVar[str] = "envs"
    #: every agent of an env is a row; agent group modes and centralized critics apply
    multi_agent: ClassVar[bool] = False
    #: envs are stepped as a vector env of ``vec.num_envs`` copies (GRPO/PPO derive that width)
    vectorized: ClassVar[bool] = True
    #: ``(module, pip extra)`` pairs the family needs beyond the base install
    extras: ClassVar[tuple[tuple[str, str], ...]] = ()
    #: torch threads when ``threads`` is 0 (0 = torch's default). Small MLPs on small batches:
    #: intra-op threading costs more than it saves (60 us vs 0.4-2 ms per forward on 2 cores)
    default_threads: ClassVar[int] = 1
    #: DDP ``find_unused_parameters`` under ``distributed.find_unused_parameters=auto``
    find_unused_parameters: ClassVar[bool] = False
    #: ``autocast=auto`` is bf16 on a CUDA device that supports it (LLM policies)
    bf16_autocast: ClassVar[bool] = False
    #: ``evaluate --video`` can render the family's envs
    records_video: ClassVar[bool] = False
    #: algorithms that train the family (``algo.name``)
    algos: ClassVar[tuple[str, ...]] = ("grpo", "ppo")
    #: its vector envs snapshot and restore envs (``state`` group modes branch from snapshots)
    snapshots: ClassVar[bool] = True
    #: ``vec.vectorization`` values the family supports
    vectorizations: ClassVar[tuple[str, ...]] = VECTORIZATIONS
    #: ``algo.rollout=stream`` (streaming seed groups) is supported
    streams: ClassVar[bool] = False
    #: state groups (env snapshots) also work over worker processes (``vec.vectorization=async``)
    async_snapshots: ClassVar[bool] = True
    #: GRPO runs exactly one env per group member (``vec.num_envs = num_groups x group_size``)
    one_env_per_member: ClassVar[bool] = False
    #: ``"module:Class"`` of the Task (imported lazily: a text Task pulls in transformers)
    task: ClassVar[str] = "grpo_marl.tasks.control:ControlTask"

    def trains(self, algo: str) -> bool:
        """Whether ``algo.name=algo`` can train this family."""
        return algo in self.algos

    def group_mode_error(self, mode: GroupMode) -> str | None:
        """What ``mode`` needs that this family lacks (``"multi-agent"``, ``"snapshots"``), or None.

        Decided by capabilities, so a group mode registered from user code is accepted by every
        family that offers what it declares; a family with other limits overrides this."""
        if mode.multi_agent and not self.multi_agent:
            return "multi-agent"
        if mode.snapshots and not self.snapshots:
            return "snapshots"
        return None

    @property
    def group_modes(self) -> tuple[str, ...]:
        """The registered ``algo.group_mode`` values this family trains (in registration order)."""
        from grpo_marl.groups import GROUP_MODES

        GROUP_MODES.names()  # loads the entry points
        return tuple(name for name, mode in GROUP_MODES.items() if self.group_mode_error(mode) is None)

    def check_extras(self, cfg: DictConfig, spec: EnvSpec) -> None:
        """Raise :class:`MissingExtraError` with the ``pip install`` command when a module the
        family (or an option of ``cfg``) needs is not installed; called before anything is built."""
        self._require(spec, list(self.extras), f"{self.name} env")

    def _require(self, spec: EnvSpec, needs: list[tuple[str, str]], what: str) -> None:
        missing = [(module, extra) for module, extra in needs if not _installed(module)]
        if missing:
            modules = ", ".join(module for module, _ in missing)
            extra = missing[0][1]
            raise MissingExtraError(
                f"env {spec.name!r} ({what}) needs {modules}, which is not installed; install the {extra!r} extra: "
                f"pip install 'grpo_marl[{extra}]' (from a clone: pip install -e '.[{extra}]')"
            )

    def task_class(self, spec: EnvSpec) -> type[Task]:
        module, _, cls = self.task.partition(":")
        try:
            return getattr(importlib.import_module(module), cls)
        except ModuleNotFoundError as exc:
            extra = next((e for m, e in self.extras if m == exc.name), None)
            if extra is None:
                raise
            raise MissingExtraError(
                f"env {spec.name!r} ({self.name} env) needs {exc.name}, which is not installed; "
                f"pip install 'grpo_marl[{extra}]' (from a clone: pip install -e '.[{extra}]')"
            ) from exc

    def make_task(
        self, cfg: DictConfig, spec: EnvSpec, device: torch.device, collector: str, with_state: bool = False
    ) -> Task:
        """The trainer's Task for ``spec`` (``with_state``: a centralized critic reads the env's state)."""
        return self.task_class(spec)(
            cfg, spec, device, collector=collector, **({"with_state": True} if with_state else {})
        )  # type: ignore[call-arg]

    def prepare_spec(self, spec: EnvSpec, cfg: DictConfig) -> EnvSpec:
        """The spec the control Task builds envs from (a family may wrap the factory)."""
        return spec

    def make_vec(
        self,
        spec: EnvSpec,
        num_envs: int,
        env_kwargs: dict[str, Any],
        vectorization: str,
        *,
        with_state: bool,
        num_workers: int,
    ) -> VecEnv:
        """``num_envs`` envs of ``spec`` as one vector env (called by :func:`grpo_marl.vec.make_vec_env`
        after it has checked the arguments and tried the spec's own ``vector_factory``)."""
        raise UserInputError(f"env {spec.name!r} of kind {spec.kind!r} has no vector env")

    def recognises(self, env: object) -> bool:
        """Whether ``env`` (what a factory returned) is one of this family's envs."""
        return False

    def grpo_errors(self, cfg: DictConfig) -> list[str]:
        """The family's rules on GRPO's group and rollout keys (one message per problem, naming the key)."""
        from grpo_marl.settings import int_or_none

        a, errors = cfg.algo, []
        from grpo_marl.groups import GROUP_MODES

        mode = a.group_mode
        gm = GROUP_MODES.find(str(mode))
        why = self.group_mode_error(gm) if gm is not None else None
        if why is not None:
            if why == "multi-agent":
                errors.append(
                    f"algo.group_mode={mode} needs a multi-agent env; single-agent envs use "
                    + " or ".join(self.group_modes)
                )
            else:
                errors.append(
                    f"algo.group_mode={mode} is not supported by env {cfg.env!r} ({self.noun}); "
                    f"choose one of {', '.join(self.group_modes)}"
                )
        vectorization = cfg.vec.vectorization
        if gm is not None and gm.snapshots and vectorization == "async" and not self.async_snapshots:
            errors.append(f"algo.group_mode={mode} needs env snapshots: use vec.vectorization=sync or auto")
        if a.rollout == "stream":
            if not self.streams or gm is None or not gm.streams:
                errors.append(
                    f"algo.rollout=stream streams seed groups of single-agent envs (here group_mode={mode}, "
                    f"env kind {self.name}); use algo.rollout=batch"
                )
            elif vectorization == "async":
                errors.append(
                    "algo.rollout=stream starts members from env snapshots: use vec.vectorization=sync or auto"
                )
        if self.one_env_per_member:
            groups, size, n = int_or_none(a.num_groups), int_or_none(a.group_size), int_or_none(cfg.vec.num_envs)
            if groups and size and n and n != groups * size:
                errors.append(
                    f"vec.num_envs={n} does not fit algo.num_groups={groups} x algo.group_size={size} = "
                    f"{groups * size} (GRPO runs one env per group member); leave vec.num_envs=0 to derive it"
                )
        return errors

    def text_errors(self, cfg: DictConfig) -> list[str]:
        """The family's rules on the ``model`` and ``text`` sections (those of a text family: model
        paths, prompt files, extras); called by :meth:`grpo_marl.settings.ModelSettings.errors`."""
        return []


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module stubbed out
        return False


def _is_pettingzoo_env(env: object) -> bool:
    """A PettingZoo Parallel or AEC env, without importing pettingzoo when nothing did yet."""
    import sys

    if "pettingzoo" not in sys.modules:
        return False
    from pettingzoo import AECEnv, ParallelEnv

    inner = env
    for _ in range(16):  # wrappers (SuperSuit, OrderEnforcing) keep the class in .env / .unwrapped
        if isinstance(inner, (ParallelEnv, AECEnv)):
            return True
        inner = getattr(inner, "env", None)
        if inner is None:
            break
    return isinstance(getattr(env, "unwrapped", None), (ParallelEnv, AECEnv))


class GymnasiumFamily(EnvFamily):
    """Single-agent Gymnasium envs: batched numpy ports where one exists, else drivers over copies
    (in-process or one worker process per env)."""

    name = "gymnasium"
    noun = "a single-agent Gymnasium env"
    plural = "single-agent Gymnasium envs"
    records_video = True
    streams = True
    async_snapshots = False
    one_env_per_member = True

    def recognises(self, env: object) -> bool:
        import gymnasium

        return isinstance(env, gymnasium.Env)

    def make_vec(
        self,
        spec: EnvSpec,
        num_envs: int,
        env_kwargs: dict[str, Any],
        vectorization: str,
        *,
        with_state: bool,
        num_workers: int,
    ) -> VecEnv:
        from grpo_marl.vec import factory
        from grpo_marl.vec.drivers import GymDriver

        port = factory.port_vec(spec.name, spec.gym_id, env_kwargs, num_envs, vectorization, with_state=with_state)
        if port is not None:
            return port
        env_fn = functools.partial(_checked_gym_env, spec, env_kwargs)
        # One process per env: a Gymnasium env that is worth a worker is worth a whole core.
        return factory.driver_vec(
            GymDriver, env_fn, spec.name, num_envs, vectorization, with_state=with_state, async_workers=num_envs
        )


def _checked_gym_env(spec: EnvSpec, env_kwargs: dict[str, Any]) -> Any:
    """``spec``'s env, refused with what to do when it is a PettingZoo env (a factory without
    ``grpo_marl_kind``): stepped as a Gymnasium env it would fail on a ``<bound method>`` space."""
    env = spec.make(**env_kwargs)
    if _is_pettingzoo_env(env):
        env.close()
        raise UserInputError(
            f"env {spec.name!r}: the factory returned a PettingZoo env ({type(env).__name__}) but is registered as a "
            "Gymnasium env; set grpo_marl_kind = 'pettingzoo' on the factory function (or register_env(..., "
            "kind='pettingzoo'))"
        )
    return env


class PettingZooFamily(EnvFamily):
    """Multi-agent PettingZoo Parallel (or AEC, converted) envs: batched ports of the MPE envs,
    else drivers over copies, in worker processes when there are spare cores and enough envs."""

    name = "pettingzoo"
    noun = "a multi-agent PettingZoo env"
    plural = "multi-agent PettingZoo envs"
    multi_agent = True
    # Multi-agent policies skip agent-groups absent from a minibatch (unused parameters).
    find_unused_parameters = True
    records_video = True
    algos = ("grpo", "mappo", "ippo")

    def recognises(self, env: object) -> bool:
        return _is_pettingzoo_env(env)

    def check_extras(self, cfg: DictConfig, spec: EnvSpec) -> None:
        # butterfly/sisl families and SuperSuit preprocessing need the marl extra
        from grpo_marl.marl import preprocess

        section = cfg.env_preprocess
        absent = preprocess.missing_modules(spec.name, section)
        if absent:
            raise MissingExtraError(preprocess.missing_extra_message(spec.name, absent))

    def prepare_spec(self, spec: EnvSpec, cfg: DictConfig) -> EnvSpec:
        from grpo_marl.tasks.control import with_preprocessing

        return with_preprocessing(spec, cfg)

    def make_vec(
        self,
        spec: EnvSpec,
        num_envs: int,
        env_kwargs: dict[str, Any],
        vectorization: str,
        *,
        with_state: bool,
        num_workers: int,
    ) -> VecEnv:
        from grpo_marl.marl.envs import MARL_ENVS
        from grpo_marl.vec import factory
        from grpo_marl.vec.drivers import PettingZooDriver

        info = MARL_ENVS.get(spec.name)
        mpe2 = info is not None and info.source == "mpe2"
        port = factory.port_vec(
            spec.name,
            info.target if mpe2 else None,  # type: ignore[union-attr]
            {**info.defaults, **env_kwargs} if mpe2 else env_kwargs,  # type: ignore[union-attr]
            num_envs,
            vectorization,
            with_state=with_state,
        )
        if port is not None:
            return port
        env_fn = functools.partial(parallel_env, functools.partial(spec.make, **env_kwargs))
        auto = factory.resolve_workers(num_workers, num_envs) if vectorization == "auto" else 0
        return factory.driver_vec(
            PettingZooDriver,
            env_fn,
            spec.name,
            num_envs,
            vectorization,
            with_state=with_state,
            async_workers=factory.resolve_workers(num_workers, num_envs, cpus=num_envs + 1),
            auto_workers=auto,
        )


def parallel_env(env_fn: Any) -> Any:
    """Registered PettingZoo factories may return AEC envs; drivers need the Parallel API."""
    from pettingzoo import AECEnv

    env = env_fn()
    if isinstance(env, AECEnv):
        from pettingzoo.utils.conversions import aec_to_parallel

        env = aec_to_parallel(env)
    return env


class TextFamily(EnvFamily):
    """Text envs: prompts answered by a causal LM (its own Task; no vector env)."""

    name = "text"
    noun = "a text env"
    plural = "text envs"
    vectorized = False
    extras = (("transformers", "text"), ("tokenizers", "text"))
    default_threads = 0  # the LLM's matmuls use every core
    bf16_autocast = True
    algos = ("grpo",)
    #: state groups branch from prefixes of the sampled completions: a prefix (prompt + the first t
    #: tokens) is the state, its KV cache the snapshot (:meth:`grpo_marl.policies.llm.LLMPolicy.branch`)
    snapshots = True
    task = "grpo_marl.tasks.text:TextTask"
    #: ``"module:function"`` of the rules on the model/text sections and prompt files (imported
    #: lazily, as the Task: they live with the text envs, whose keyword arguments they check)
    text_rules: ClassVar[str] = "envs.text:text_config_errors"

    def check_extras(self, cfg: DictConfig, spec: EnvSpec) -> None:
        self._require(spec, list(self.extras), "text env")
        if cfg.model.lora.enabled:
            self._require(spec, [("peft", "lora")], "model.lora.enabled=true")

    def text_errors(self, cfg: DictConfig) -> list[str]:
        module, _, name = self.text_rules.partition(":")
        rules: Callable[[DictConfig], list[str]] = getattr(importlib.import_module(module), name)
        return rules(cfg)


def _family_entry_point(name: str, obj: Any) -> None:
    """A ``grpo_marl.families`` entry point: an :class:`EnvFamily` subclass or instance, or a hook
    that registers families when called."""
    if isinstance(obj, type) and issubclass(obj, EnvFamily):
        register_family(obj())
    elif isinstance(obj, EnvFamily):
        register_family(obj)
    elif callable(obj):
        obj()
    else:
        raise TypeError(f"entry point {name!r} is neither an EnvFamily nor a callable")


#: Every env family, by name (``EnvSpec.kind``).
FAMILIES: Registry[EnvFamily] = Registry(
    "env family", entry_point_group="grpo_marl.families", on_entry_point=_family_entry_point
)


def register_family(family: EnvFamily, *, overwrite: bool = False) -> EnvFamily:
    """Make ``family`` available to ``register_env(..., kind=family.name)`` (from user code too)."""
    if not family.name:
        raise ValueError(f"{type(family).__name__}: an env family needs a name")
    return FAMILIES.register(family.name, family, overwrite=overwrite)


def get_family(name: str) -> EnvFamily:
    """The family registered as ``name`` (an unknown name raises with the closest known one)."""
    return FAMILIES.get(name)


def family_of(cfg: DictConfig) -> EnvFamily:
    """The family of a resolved config's env (``env_kind``, written by config resolution)."""
    return get_family(str(cfg.get("env_kind", "gymnasium")))


for _family in (GymnasiumFamily(), PettingZooFamily(), TextFamily()):
    register_family(_family)
