"""Configuration: per-env defaults, derived sizes and validation with actionable errors.

Hydra composes ``conf/config.yaml`` + ``conf/algo/<algo>.yaml`` + the command line. The env's tuned
defaults must sit *between* the files and the command line (they know better than the generic file,
but never better than the user), which Hydra's defaults list cannot express for envs that are not
config files (``env=gym:ID``, ``env=pkg.mod:factory``, envs registered from Python). So
:func:`resolve_config` merges them after composition and re-applies the user's overrides.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf, open_dict

from grpo_marl import schema
from grpo_marl.errors import ConfigError
from grpo_marl.registry import EnvSpec, get_spec

__all__ = ["ConfigError", "register_validator", "resolve_config", "user_override_keys", "validate"]


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


_CONF_DIR = __import__("pathlib").Path(__file__).parent / "conf"
# Sections whose keys are free-form (passed through to a factory or a mapping).
FREE_FORM = ("env_kwargs", "marl.groups")


def group_choices(overrides: list[str], explicit_only: bool = False) -> dict[str, str]:
    """Which option of each config group the command line selected (``default`` otherwise;
    ``explicit_only``: only the groups the command line names)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    choices = {} if explicit_only else {"algo": "grpo", "model": "default", "text": "default"}
    for ov in OverridesParser.create().parse_overrides(overrides=list(overrides)):
        if ov.key_or_group in CONFIG_GROUPS and not ov.is_delete():
            choices[ov.key_or_group] = str(ov.value())
    return choices


def reference_config(choices: dict[str, str]) -> DictConfig:
    """The config files' own keys: what a key on the command line may name."""
    return _reference_config(tuple(sorted(choices.items()))).copy()


@functools.lru_cache(maxsize=16)
def _reference_config(choices: tuple[tuple[str, str], ...]) -> DictConfig:
    ref = OmegaConf.load(_CONF_DIR / "config.yaml")
    assert isinstance(ref, DictConfig)
    for key in ("defaults", "hydra"):
        ref.pop(key, None)
    for group, option in choices:
        path = _CONF_DIR / group / f"{option}.yaml"
        if path.exists():
            ref[group] = OmegaConf.load(path)
    return ref


def unknown_keys(cfg: DictConfig, ref: DictConfig, prefix: str = "") -> list[str]:
    """Dotted keys of ``cfg`` that no config file defines (e.g. added with ``+algo.grup_size=``)."""
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
            options = sorted(p.stem for p in (_CONF_DIR / ov.key_or_group).glob("*.yaml"))
            if option not in options:
                problems.append(
                    f"{ov.key_or_group}={option} is not a config option; choose one of {', '.join(options)}"
                )
            choices[ov.key_or_group] = option
    if problems:
        return problems
    ref = reference_config(choices)
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
        if not isinstance(node, DictConfig) or not len(node):
            if node is None and parent in FREE_FORM:
                continue
            problems.append(f"unknown key {key}")
            continue
        close = difflib.get_close_matches(leaf, [str(k) for k in node], n=1)
        hint = f" (did you mean {parent + '.' if parent else ''}{close[0]}?)" if close else ""
        problems.append(f"unknown key {key}{hint}")
    return problems


def resolve_config(cfg: DictConfig, overrides: list[str] | None = None) -> DictConfig:
    """Merge env defaults under the command-line overrides and fill derived sizes."""
    bad = unknown_keys(cfg, reference_config(group_choices(overrides or [])))
    if bad:
        raise ConfigError(
            "invalid configuration:\n  - "
            + "\n  - ".join(bad)
            + "\n(keys must exist in grpo_marl/conf; free-form sections: "
            + ", ".join(FREE_FORM)
            + ")"
        )
    spec = get_spec(str(cfg.env))
    out = cfg.copy()
    OmegaConf.set_struct(out, True)
    defaults = env_defaults(spec, str(cfg.algo.name))
    if defaults:
        try:
            out = cast(DictConfig, OmegaConf.merge(out, OmegaConf.create(defaults)))
        except Exception as exc:  # struct-mode key errors from a bad defaults dict
            raise ConfigError(f"env {spec.name!r} has invalid tuned defaults: {exc}") from exc
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
    every, total = _int_or_none(cfg.eval.every_steps), _int_or_none(cfg.get("total_steps"))
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
    total = _int_or_none(cfg.get("total_steps"))
    if cfg.train.threshold is None or _int_or_none(cfg.eval.every_steps) != 0 or not total or total <= 0:
        return
    cfg.eval.every_steps = max(1, total // DERIVED_EVALUATIONS)


def derive_sizes(cfg: DictConfig) -> None:
    """Fill sizes that follow from others (e.g. GRPO's vector width = num_groups * group_size)."""
    from grpo_marl.families import family_of

    control = family_of(cfg).vectorized
    if cfg.algo.name == "grpo" and control and not cfg.vec.num_envs:
        cfg.vec.num_envs = int(cfg.algo.num_groups) * int(cfg.algo.group_size)
    if cfg.algo.name in ("ppo", "mappo", "ippo") and control:
        # PPO: n_envs streams of n_steps per update, split into minibatches of ~batch_size (SB3).
        if not cfg.vec.num_envs:
            cfg.vec.num_envs = int(cfg.algo.n_envs)
        if not cfg.algo.minibatches:
            steps = int(cfg.algo.n_envs) * int(cfg.algo.n_steps)
            cfg.algo.minibatches = max(1, steps // max(int(cfg.algo.batch_size), 1))


# Validators registered per section so kinds/algorithms can add their own without editing here.
Validator = Callable[[DictConfig], list[str]]
VALIDATORS: list[Validator] = []


def register_validator(fn: Validator) -> Validator:
    VALIDATORS.append(fn)
    return fn


@register_validator
def _validate_common(cfg: DictConfig) -> list[str]:
    """Cross-key rules shared by every algorithm (types and ranges are in :mod:`grpo_marl.schema`)."""
    errors: list[str] = []
    dev = str(cfg.device)
    if not (dev in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", dev)):
        errors.append(f"device={dev} is not valid; use auto, cpu, cuda or cuda:N")
    elif dev.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            errors.append(f"device={dev} but CUDA is not available here; use device=auto or device=cpu")
    t = cfg.train
    if t.stop_on_threshold is True:
        if t.threshold is None:
            errors.append(
                f"train.stop_on_threshold=true but env {cfg.env!r} has no threshold; set train.threshold=<return>"
            )
        if _int_or_none(cfg.eval.every_steps) == 0:
            errors.append(
                "train.stop_on_threshold=true needs periodic evaluations; set eval.every_steps=<env steps>, e.g. 10000"
            )
    return errors


def _algo_kind_error(cfg: DictConfig) -> str | None:
    """An algorithm that cannot train this env's family (every other check would be noise then).
    Which algorithms train a family is the family's (:attr:`grpo_marl.families.EnvFamily.algos`)."""
    from grpo_marl.algos import ALGOS
    from grpo_marl.families import FAMILIES, family_of

    name, family = str(cfg.algo.name), family_of(cfg)
    if name not in ALGOS:
        return f"algo.name={name} is not an installed algorithm; choose one of {', '.join(sorted(ALGOS))}"
    if not family.trains(name):
        fits = " or ".join(f"algo={a}" for a in family.algos if a in ALGOS)
        trained = " and ".join(f.plural for f in FAMILIES.values() if f.trains(name))
        return f"algo={name} trains {trained} only, but env {cfg.env!r} is {family.noun}; use {fits}"
    return None


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@register_validator
def _validate_grpo(cfg: DictConfig) -> list[str]:
    if cfg.algo.name != "grpo":
        return []
    # algo.loss / algo.aggregation name registries: the schema reads them (schema.Registered).
    from grpo_marl.families import family_of

    return family_of(cfg).grpo_errors(cfg)  # group modes, rollouts, vector widths the family allows


def validate(cfg: DictConfig) -> None:
    """Check every declared key's type and range (:mod:`grpo_marl.schema`), then every registered
    cross-key validator; raise one :class:`ConfigError` listing all problems, one line each."""
    from grpo_marl.algos import _load_builtin_algos

    _load_builtin_algos()  # algorithms register their own validators when imported
    wrong_algo = _algo_kind_error(cfg)
    if wrong_algo:
        raise ConfigError("invalid configuration:\n  - " + wrong_algo)
    bad = schema.check(cfg)
    errors: list[str] = list(bad.values())
    for fn in VALIDATORS:
        try:
            found = fn(cfg)
        except Exception:
            if not bad:
                raise
            continue  # a validator tripped over a value the schema already reported
        for message in found:
            # A rule about a key the schema already refused (or one derived from it) is noise.
            if message in errors or any(re.search(rf"\b{re.escape(k.rpartition('.')[2])}\b", message) for k in bad):
                continue
            errors.append(message)
    if errors:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(errors))
