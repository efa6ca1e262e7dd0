"""Configuration: composition, per-env defaults, derived sizes and validation with actionable errors.

The keys, their defaults, types and rules are the dataclasses of :mod:`grpo_marl.settings`; Hydra
composes them with ``conf/config.yaml`` + ``conf/algo/<algo>.yaml`` + the command line
(:func:`compose`). The env's tuned
defaults must sit *between* the files and the command line (they know better than the generic file,
but never better than the user), which Hydra's defaults list cannot express for envs that are not
config files (``env=gym:ID``, ``env=pkg.mod:factory``, envs registered from Python). So
:func:`resolve_config` merges them after composition and re-applies the user's overrides.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf, open_dict

from grpo_marl import settings
from grpo_marl.errors import ConfigError
from grpo_marl.registry import EnvSpec, get_spec
from grpo_marl.settings import int_or_none

__all__ = ["ConfigError", "compose", "resolve_config", "user_override_keys", "validate"]


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", str(name))


if not OmegaConf.has_resolver("safe"):
    OmegaConf.register_new_resolver("safe", _safe)

# Config groups whose *selection* (algo=ppo) must not be re-applied as a value override.
CONFIG_GROUPS = ("algo", "model", "text")


def user_override_keys(overrides: list[str]) -> list[str]:
    """Dotted keys the user set on the command line (group selections and hydra.* excluded)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides=list(overrides))
    keys = []
    for ov in parsed:
        key = ov.key_or_group
        if key in CONFIG_GROUPS or key.startswith("hydra") or ov.is_delete():
            continue
        keys.append(key)
    return keys


def env_defaults(spec: EnvSpec, algo: str) -> dict[str, Any]:
    """The spec's tuned overrides for ``algo``: its ``common`` section, then the algo's own."""
    d = spec.defaults or {}
    if not any(k in d for k in ("common", "grpo", "ppo")) and d:
        return dict(d)  # a flat override dict applies to every algorithm
    merged = OmegaConf.merge(OmegaConf.create(d.get("common", {})), OmegaConf.create(d.get(algo, {})))
    return OmegaConf.to_container(merged)  # type: ignore[return-value]


CONF_DIR = Path(__file__).parent / "conf"
# Sections whose keys are free-form (passed through to a factory or a mapping).
FREE_FORM = ("env_kwargs", "marl.groups")


def group_choices(overrides: list[str]) -> dict[str, str]:
    """The option of each config group the command line names (``algo=ppo`` -> ``{"algo": "ppo"}``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    choices: dict[str, str] = {}
    for ov in OverridesParser.create().parse_overrides(overrides=list(overrides)):
        if ov.key_or_group in CONFIG_GROUPS and not ov.is_delete():
            choices[ov.key_or_group] = str(ov.value())
    return choices


def reference_config(algo: str) -> DictConfig:
    """Every key of a run with algorithm ``algo`` (the dataclasses of :mod:`grpo_marl.settings`):
    what a key on the command line, in a config file or in an env's defaults may name. ``algo``
    is an algorithm name; the shipped ``algo=`` options are named after their algorithm."""
    return _reference_config(algo).copy()


@functools.lru_cache(maxsize=16)
def _reference_config(algo: str) -> DictConfig:
    return settings.reference(algo)


def unknown_keys(cfg: DictConfig, ref: DictConfig, prefix: str = "") -> list[str]:
    """Dotted keys of ``cfg`` that no section declares (e.g. added with ``+algo.grup_size=``)."""
    import difflib

    problems = []
    for key in cfg:
        full = prefix + str(key)
        if full in FREE_FORM or key == "env_kind":
            continue
        if key not in ref:
            close = difflib.get_close_matches(str(key), [str(k) for k in ref], n=1)
            hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
            problems.append(f"unknown key {full}{hint}")
            continue
        sub, ref_sub = cfg._get_node(key), ref._get_node(key)
        if isinstance(sub, DictConfig) and isinstance(ref_sub, DictConfig) and len(ref_sub):
            problems.extend(unknown_keys(sub, ref_sub, prefix=f"{full}."))
    return problems


def check_command_line(args: list[str]) -> list[str]:
    """Problems with the command line's keys and config-group options, before Hydra composes.

    Hydra reports an unknown key as a stack of composition errors (exit 1); this names the key, the
    closest existing one and the options of a config group, so the CLI can exit 2 with one line each.
    """
    import difflib

    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = [a for a in args if "=" in a and not a.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(overrides=overrides)
    except Exception:  # noqa: BLE001  (a syntax error: Hydra's own message says where)
        return []
    problems = []
    choices = {"algo": "grpo", "model": "default", "text": "default"}
    for ov in parsed:
        if ov.key_or_group in CONFIG_GROUPS:
            if ov.is_sweep_override() or ov.is_delete():
                return []  # sweeps over config groups: Hydra checks each job
            option = str(ov.value())
            options = sorted(p.stem for p in (CONF_DIR / ov.key_or_group).glob("*.yaml"))
            if option not in options:
                problems.append(
                    f"{ov.key_or_group}={option} is not a config option; choose one of {', '.join(options)}"
                )
            choices[ov.key_or_group] = option
    if problems:
        return problems
    ref = reference_config(choices["algo"])
    for ov in parsed:
        key = ov.key_or_group
        if key in CONFIG_GROUPS or key.startswith("hydra") or key == "env_kind":
            continue
        if any(key.startswith(f + ".") for f in FREE_FORM):
            if not ov.is_add() and not ov.is_force_add():
                section = next(f for f in FREE_FORM if key.startswith(f + "."))
                problems.append(
                    f"{section} keys are free-form: add {key} with a +, e.g. +{key}={(ov.input_line or '=').split('=', 1)[1]}"
                )
            continue
        if key in FREE_FORM:
            continue
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(ref, parent) if parent else ref
        if isinstance(node, DictConfig) and leaf in node:
            continue
        if parent == "algo" and not len(ref.algo):
            continue  # an algorithm without a settings dataclass: its keys are its own
        if not isinstance(node, DictConfig) or not len(node):
            problems.append(f"unknown key {key}")
            continue
        close = difflib.get_close_matches(leaf, [str(k) for k in node], n=1)
        hint = f" (did you mean {parent + '.' if parent else ''}{close[0]}?)" if close else ""
        problems.append(f"unknown key {key}{hint}")
    return problems


def compose(overrides: list[str], config_name: str = "config", config_dir: Path | None = None) -> DictConfig:
    """Hydra's composition of ``config_name`` in ``config_dir`` (grpo_marl's ``conf`` by default;
    a user's directory is searched first, grpo_marl's after, as Hydra's CLI does) with
    ``overrides``, without the ``hydra`` node. The one composition the CLI's preflight,
    :func:`grpo_marl.fit` and the tests use: a value of the wrong type for its field (OmegaConf's
    ``ValidationError``, ``algo.epochs=1.5``) raises :class:`ConfigError` with the same one-line
    message validation gives; any other composition error is Hydra's, raised as it is."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import ConfigCompositionException

    args = list(overrides)
    if config_dir is not None and Path(config_dir).resolve() != CONF_DIR.resolve():
        args.append(f"hydra.searchpath=[file://{CONF_DIR}]")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir or CONF_DIR), version_base="1.3"):
            cfg = hydra_compose(config_name=config_name, overrides=args)
    except ConfigCompositionException as exc:
        message = type_error_message(exc)
        if message is None:
            raise
        raise ConfigError("invalid configuration:\n  - " + message) from exc
    finally:
        GlobalHydra.instance().clear()
    with open_dict(cfg):
        cfg.pop("hydra", None)
    return cfg


def type_error_message(exc: BaseException) -> str | None:
    """The one-line message for OmegaConf's type error somewhere in ``exc``'s causes (``key=value
    must be ...``), or None when ``exc`` is not one."""
    from omegaconf.errors import ValidationError

    cause: BaseException | None = exc
    while cause is not None and not (isinstance(cause, ValidationError) and getattr(cause, "full_key", None)):
        cause = cause.__cause__
    if cause is None:
        return None
    key = re.sub(r"(\[\d+\])+$", "", str(cause.full_key))
    value = getattr(cause, "value", None)
    leaf = key.rpartition(".")[2]
    owner = getattr(cause, "object_type", None)
    parent = getattr(cause, "parent_node", None)
    if key != cause.full_key and parent is not None:  # an element of a list: the list's section
        owner = OmegaConf.get_type(parent._get_parent())
    spec = None
    if dataclasses.is_dataclass(owner):
        spec = next((f.metadata.get("key") for f in dataclasses.fields(owner) if f.name == leaf), None)
    if spec is None:
        return f"{key}={value}: {str(cause).splitlines()[0]}"
    return settings.check_value(key, value, spec) or f"{key}={value} must be {spec.describe()}"


def resolve_config(cfg: DictConfig, overrides: list[str] | None = None) -> DictConfig:
    """Merge env defaults under the command-line overrides and fill derived sizes."""
    bad = unknown_keys(cfg, reference_config(str(cfg.algo.name)))
    if bad:
        raise ConfigError(
            "invalid configuration:\n  - "
            + "\n  - ".join(bad)
            + "\n(keys must exist in grpo_marl/settings.py; free-form sections: "
            + ", ".join(FREE_FORM)
            + ")"
        )
    spec = get_spec(str(cfg.env))
    out = cfg.copy()
    OmegaConf.set_struct(out, True)
    for section in FREE_FORM:  # an env's defaults may fill its own free-form keys (env_kwargs)
        node = OmegaConf.select(out, section, throw_on_missing=False)
        if isinstance(node, DictConfig):
            OmegaConf.set_struct(node, False)
    defaults = env_defaults(spec, str(cfg.algo.name))
    if defaults:
        try:
            out = cast(DictConfig, OmegaConf.merge(out, OmegaConf.create(defaults)))
        except Exception as exc:  # struct-mode key errors or a value of the wrong type
            raise ConfigError(
                f"env {spec.name!r} has invalid tuned defaults: {type_error_message(exc) or exc}"
            ) from exc
    user_keys = user_override_keys(overrides or [])
    for key in user_keys:
        value = OmegaConf.select(cfg, key, throw_on_missing=False)
        with open_dict(out):
            OmegaConf.update(out, key, value, merge=False, force_add=True)
    with open_dict(out):
        out.env_kind = spec.kind
        if out.train.threshold is None and spec.threshold is not None:
            out.train.threshold = float(spec.threshold)
        tuned = "eval.every_steps" in user_keys or "eval" in user_keys
        tuned = tuned or OmegaConf.select(OmegaConf.create(defaults or {}), "eval.every_steps") is not None
        if not tuned:
            derive_eval_interval(out)
    derive_sizes(out)
    validate(out)
    late = unreachable_threshold(out)
    if late and ("train.stop_on_threshold" in user_keys or "train" in user_keys):
        raise ConfigError("invalid configuration:\n  - " + late)
    return out


def unreachable_threshold(cfg: DictConfig) -> str | None:
    """Why ``train.stop_on_threshold`` cannot stop this run, or None: its first periodic
    evaluation would come after ``total_steps``, so the threshold is never checked. Asked for by
    the user it is refused (:func:`resolve_config`); inherited from an env's tuned defaults under
    a shorter budget (``env=arithmetic total_steps=64``) the trainer says so in one line."""
    if cfg.train.stop_on_threshold is not True:
        return None
    every, total = int_or_none(cfg.eval.every_steps), int_or_none(cfg.total_steps)
    if not every or total is None or every <= total:
        return None
    return (
        f"train.stop_on_threshold=true but eval.every_steps={every} is larger than total_steps={total}, "
        "so no evaluation runs before the end; set eval.every_steps<=total_steps (e.g. "
        f"{max(1, total // DERIVED_EVALUATIONS)}) or raise total_steps"
    )


#: Periodic evaluations a run gets when its env has a threshold and nobody chose an interval.
DERIVED_EVALUATIONS = 10


def derive_eval_interval(cfg: DictConfig) -> None:
    """``eval.every_steps`` for a run with a threshold whose interval neither the user nor the
    env's tuned defaults set (``gym:<id>`` with a ``reward_threshold``, ``module:factory``, envs
    registered without defaults): ``total_steps / 10``, so ``steps_to_threshold`` is measured
    (with the config file's 0 only the final evaluation would run, and it never records the
    threshold's crossing). An explicit ``eval.every_steps=0`` keeps final-only evaluation."""
    total = int_or_none(cfg.total_steps)
    if cfg.train.threshold is None or int_or_none(cfg.eval.every_steps) != 0 or not total or total <= 0:
        return
    cfg.eval.every_steps = max(1, total // DERIVED_EVALUATIONS)


def derive_sizes(cfg: DictConfig) -> None:
    """Fill sizes that follow from others: the algorithm's own (:meth:`Algorithm.derive_sizes`,
    e.g. GRPO's vector width = num_groups * group_size) in a vectorized family's config."""
    from grpo_marl.algos import ALGOS, _load_builtin_algos
    from grpo_marl.families import family_of

    _load_builtin_algos()
    algo = ALGOS.find(str(cfg.algo.name))  # an unknown name is refused by validate(), naming the choices
    if algo is not None and family_of(cfg).vectorized:
        algo.derive_sizes(cfg)


def _algo_kind_error(cfg: DictConfig) -> str | None:
    """An algorithm that cannot train this env's family (every other check would be noise then).
    Which algorithms train a family is the family's (:attr:`grpo_marl.families.EnvFamily.algos`)."""
    from grpo_marl.algos import ALGOS, _load_builtin_algos
    from grpo_marl.families import FAMILIES, family_of

    _load_builtin_algos()
    name, family = str(cfg.algo.name), family_of(cfg)
    if name not in ALGOS:
        return f"algo.name={name} is not an installed algorithm; choose one of {', '.join(sorted(ALGOS))}"
    if not family.trains(name):
        fits = " or ".join(f"algo={a}" for a in family.algos if a in ALGOS)
        FAMILIES.names()  # every family, the entry points' included
        trained = " and ".join(f.plural for f in FAMILIES.values() if f.trains(name))
        return f"algo={name} trains {trained} only, but env {cfg.env!r} is {family.noun}; use {fits}"
    return None


def validate(cfg: DictConfig) -> None:
    """Check every declared key's type and range (:func:`grpo_marl.settings.check`), then the rules
    across keys of every section (its ``errors``; a section whose values, or those of the sections
    it ``reads``, are already refused is skipped: its rules would repeat the error); raise one
    :class:`ConfigError` listing all problems, one line each."""
    wrong_algo = _algo_kind_error(cfg)
    if wrong_algo:
        raise ConfigError("invalid configuration:\n  - " + wrong_algo)
    bad = settings.check(cfg)
    errors: list[str] = list(bad.values())
    for prefix, section in settings.sections(str(cfg.algo.name)):
        watched = [prefix, *(f"{r}." for r in section.reads)] if prefix else [f"{r}." for r in section.reads]
        own = [k for k in bad if (k.startswith(prefix) if prefix else "." not in k)]
        if own or any(k.startswith(w) or k == w[:-1] for k in bad for w in watched):
            continue
        errors += [m for m in section.errors(cfg) if m not in errors]
    if errors:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(errors))
