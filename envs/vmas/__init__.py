"""The ``vmas`` env family: VMAS's torch-vectorized multi-agent scenarios (the ``vmas`` extra).

It plugs in through the framework's public seams only, as a user's package would (no framework
file names it): the family object (:class:`VmasFamily`, a ``grpo_marl.families`` entry point), the
env registrations (:func:`register_envs`, a ``grpo_marl.envs`` entry point), the ``vmas:`` env
prefix (:func:`resolve`, a ``grpo_marl.env_prefixes`` entry point) and the tensor vector-env
contract (:class:`envs.vmas.vec.VmasVec`, VMAS's own batched envs, on the CPU or a GPU).

Names:

* ``env=vmas:<scenario>``: any VMAS scenario (``vmas:balance``, ``vmas:navigation``,
  ``vmas:simple_spread`` ...), with BenchMARL's task values as its defaults where BenchMARL has
  that task (``envs/conf/vmas/<task>.yaml``), else the scenario's own defaults and 100 steps;
* short names for BenchMARL's VMAS task set (``balance``, ``navigation``, ``sampling``,
  ``transport``, ``wheel``, ``dispersion``, ...), except those whose name is taken by the mpe2
  ports of the ``pettingzoo`` family (``simple_spread`` ...): those are ``vmas:simple_spread``.

``env_kwargs`` are the scenario's keyword arguments plus ``max_steps`` (the episode limit; VMAS
truncates there), ``continuous_actions`` (BenchMARL's default, true; false gives VMAS's
``Discrete(5)`` moves) and ``device`` (``auto``: the run's device, so on CUDA the rollout never
leaves the GPU). A key the scenario does not use is refused, naming it.

Returns are VMAS's rewards per agent (most BenchMARL tasks give every agent the team reward, so
``seed`` groups carry the signal there; ``navigation`` and ``sampling`` with ``shared_rew=false``
also give ``agent`` groups one).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grpo_marl.errors import MissingExtraError, UnknownEnvError
from grpo_marl.families import EnvFamily
from grpo_marl.registry import ENVS, EnvSpec, register_env

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from grpo_marl.vec.base import VecEnv

__all__ = ["BENCHMARL_TASKS", "VmasFamily", "make_task", "register_envs", "resolve"]

FAMILY = "vmas"
CONF_DIR = Path(__file__).resolve().parent.parent / "conf" / "vmas"

#: BenchMARL 1.5.2's VMAS tasks (each has ``envs/conf/vmas/<task>.yaml``)
BENCHMARL_TASKS: tuple[str, ...] = tuple(sorted(p.stem for p in CONF_DIR.glob("[!_]*.yaml")))

#: ``env_kwargs`` that are the family's, not the scenario's
_OWN_KEYS = ("max_steps", "continuous_actions", "device")


def _scenarios() -> list[str]:
    import vmas

    return sorted({*vmas.scenarios, *vmas.mpe_scenarios, *getattr(vmas, "debug_scenarios", [])})


def make_task(scenario: str, **env_kwargs: Any) -> Any:
    """A ``vmas`` env's factory: one :class:`~envs.vmas.vec.VmasTask` (``env_kwargs`` split into
    the family's own keys and the scenario's)."""
    from envs.vmas.vec import VmasTask

    own = {k: env_kwargs.pop(k) for k in _OWN_KEYS if k in env_kwargs}
    return VmasTask(scenario=scenario, kwargs=env_kwargs, **own)


class VmasFamily(EnvFamily):
    """VMAS scenarios: multi-agent, batched in torch on one device, snapshots by in-batch copies."""

    name = FAMILY
    noun = "a VMAS multi-agent scenario"
    plural = "VMAS scenarios"
    multi_agent = True
    find_unused_parameters = True
    extras = (("vmas", "vmas"),)
    algos = ("grpo", "mappo", "ippo")
    snapshots = True
    vectorizations = ("auto", "native")  # one VMAS batch: there are no per-env objects to drive
    one_env_per_member = True

    def prepare_spec(self, spec: EnvSpec, cfg: DictConfig) -> EnvSpec:
        """``env_kwargs.device=auto`` follows the run's ``device`` (the policy's)."""
        from grpo_marl.trainer import resolve_device

        device = str(resolve_device(str(cfg.device)))
        assert spec.factory is not None
        factory = spec.factory

        def make(**env_kwargs: Any) -> Any:
            task = factory(**env_kwargs)
            return dataclasses.replace(task, device=device) if task.device == "auto" else task

        return dataclasses.replace(spec, factory=make)

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
        from envs.vmas.vec import VmasVec

        return VmasVec(spec.make(**env_kwargs), num_envs, with_state=with_state, name=spec.name)

    def recognises(self, env: object) -> bool:
        from envs.vmas.vec import VmasTask

        return isinstance(env, VmasTask)


def _defaults(task: str) -> Path:
    path = CONF_DIR / f"{task}.yaml"
    return path if path.is_file() else CONF_DIR / "_vmas.yaml"


def _register(name: str, scenario: str) -> EnvSpec:
    return register_env(
        name,
        functools.partial(make_task, scenario),
        kind=FAMILY,
        defaults=_defaults(scenario),
        description=f"VMAS scenario {scenario}" + (" (BenchMARL task values)" if scenario in BENCHMARL_TASKS else ""),
        overwrite=True,
    )


def register_envs() -> None:
    """Register the short names of BenchMARL's VMAS tasks (the ``grpo_marl.envs`` entry point);
    importing vmas is left to the run, so listing envs stays cheap without the extra."""
    for task in BENCHMARL_TASKS:
        if task not in ENVS:
            _register(task, task)


def resolve(name: str) -> EnvSpec:
    """``vmas:<scenario>`` (the ``grpo_marl.env_prefixes`` entry point)."""
    scenario = name.partition(":")[2]
    if not scenario:
        raise UnknownEnvError(f"env {name!r}: name a VMAS scenario, e.g. env=vmas:balance")
    try:
        known = _scenarios()
    except ModuleNotFoundError:
        known = None
    if known is not None and scenario not in known:
        import difflib

        close = difflib.get_close_matches(scenario, known, n=1)
        hint = f" (did you mean vmas:{close[0]}?)" if close else ""
        raise UnknownEnvError(f"env {name!r}: VMAS has no scenario {scenario!r}{hint}; scenarios: {', '.join(known)}")
    if known is None and scenario not in BENCHMARL_TASKS:
        raise MissingExtraError(
            f"env {name!r} needs vmas, which is not installed; install the 'vmas' extra: pip install 'grpo_marl[vmas]' "
            "(from a clone: pip install -e '.[vmas]')"
        )
    return _register(name, scenario)
