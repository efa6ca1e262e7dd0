"""Configuration: per-env defaults, derived sizes and validation with actionable errors.

Hydra composes ``conf/config.yaml`` + ``conf/algo/<algo>.yaml`` + the command line. The env's tuned
defaults must sit *between* the files and the command line (they know better than the generic file,
but never better than the user), which Hydra's defaults list cannot express for envs that are not
config files (``env=gym:ID``, ``env=pkg.mod:factory``, envs registered from Python). So
:func:`resolve_config` merges them after composition and re-applies the user's overrides.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf, open_dict

from grpo_marl.registry import EnvSpec, get_spec


class ConfigError(ValueError):
    """Invalid configuration; the message lists every problem and what to change."""


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


def group_choices(overrides: list[str]) -> dict[str, str]:
    """Which option of each config group the command line selected (``default`` otherwise)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    choices = {"algo": "grpo", "model": "default", "text": "default"}
    for ov in OverridesParser.create().parse_overrides(overrides=list(overrides)):
        if ov.key_or_group in CONFIG_GROUPS and not ov.is_delete():
            choices[ov.key_or_group] = str(ov.value())
    return choices


def reference_config(choices: dict[str, str]) -> DictConfig:
    """The config files' own keys: what a key on the command line may name."""
    ref = OmegaConf.load(_CONF_DIR / "config.yaml")
    for key in ("defaults", "hydra"):
        ref.pop(key, None)
    for group, option in choices.items():
        path = _CONF_DIR / group / f"{option}.yaml"
        if path.exists():
            ref[group] = OmegaConf.load(path)
    return ref


def unknown_keys(cfg: DictConfig, ref: DictConfig, prefix: str = "") -> list[str]:
    """Dotted keys of ``cfg`` that no config file defines (e.g. added with ``+algo.grup_size=``)."""
    import difflib

    problems = []
    for key in cfg.keys():
        full = f"{prefix}{key}"
        if full in FREE_FORM or key == "env_kind":
            continue
        if key not in ref:
            close = difflib.get_close_matches(str(key), [str(k) for k in ref.keys()], n=1)
            hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
            problems.append(f"unknown key {full}{hint}")
            continue
        sub, ref_sub = cfg._get_node(key), ref._get_node(key)
        if isinstance(sub, DictConfig) and isinstance(ref_sub, DictConfig) and len(ref_sub):
            problems.extend(unknown_keys(sub, ref_sub, prefix=f"{full}."))
    return problems


def resolve_config(cfg: DictConfig, overrides: list[str] | None = None) -> DictConfig:
    """Merge env defaults under the command-line overrides and fill derived sizes."""
    bad = unknown_keys(cfg, reference_config(group_choices(overrides or [])))
    if bad:
        raise ConfigError(
            "invalid configuration:\n  - " + "\n  - ".join(bad)
            + "\n(keys must exist in grpo_marl/conf; free-form sections: " + ", ".join(FREE_FORM) + ")"
        )
    spec = get_spec(str(cfg.env))
    out = cfg.copy()
    OmegaConf.set_struct(out, True)
    defaults = env_defaults(spec, str(cfg.algo.name))
    if defaults:
        try:
            out = OmegaConf.merge(out, OmegaConf.create(defaults))
        except Exception as exc:  # struct-mode key errors from a bad defaults dict
            raise ConfigError(f"env {spec.name!r} has invalid tuned defaults: {exc}") from exc
    for key in user_override_keys(overrides or []):
        value = OmegaConf.select(cfg, key, throw_on_missing=False)
        with open_dict(out):
            OmegaConf.update(out, key, value, merge=False, force_add=True)
    with open_dict(out):
        out.env_kind = spec.kind
        if out.train.threshold is None and spec.threshold is not None:
            out.train.threshold = float(spec.threshold)
    derive_sizes(out)
    validate(out)
    return out


def derive_sizes(cfg: DictConfig) -> None:
    """Fill sizes that follow from others (e.g. GRPO's vector width = num_groups * group_size)."""
    if cfg.algo.name == "grpo" and cfg.get("env_kind", "gymnasium") == "gymnasium":
        if not cfg.vec.num_envs:
            cfg.vec.num_envs = int(cfg.algo.num_groups) * int(cfg.algo.group_size)
    if cfg.algo.name == "ppo" and cfg.get("env_kind", "gymnasium") == "gymnasium":
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


def _choice(errors: list[str], cfg: DictConfig, key: str, options: tuple[str, ...]) -> None:
    value = OmegaConf.select(cfg, key)
    if value not in options:
        errors.append(f"{key}={value!r} is not valid; choose one of {', '.join(map(str, options))}")


def _positive(errors: list[str], cfg: DictConfig, key: str, strict: bool = True, integer: bool = False) -> None:
    value = OmegaConf.select(cfg, key)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
        errors.append(f"{key}={value!r} must be a number")
        return
    if integer and int(value) != value:
        errors.append(f"{key}={value!r} must be an integer")
    if (strict and value <= 0) or (not strict and value < 0):
        errors.append(f"{key}={value!r} must be {'> 0' if strict else '>= 0'}")


@register_validator
def _validate_common(cfg: DictConfig) -> list[str]:
    errors: list[str] = []
    _positive(errors, cfg, "total_steps", integer=True)
    _positive(errors, cfg, "eval.episodes", integer=True)
    if OmegaConf.select(cfg, "eval.final_episodes") is not None:
        _positive(errors, cfg, "eval.final_episodes", integer=True)
    _positive(errors, cfg, "eval.every_steps", strict=False, integer=True)
    _positive(errors, cfg, "log.every", integer=True)
    _positive(errors, cfg, "checkpoint.every", strict=False, integer=True)
    dev = str(cfg.device)
    if not (dev in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", dev)):
        errors.append(f"device={dev!r} is not valid; use auto, cpu, cuda or cuda:N")
    elif dev.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            errors.append(f"device={dev} but CUDA is not available here; use device=auto or device=cpu")
    _choice(errors, cfg, "vec.vectorization", ("auto", "native", "sync", "async"))
    if not isinstance(cfg.seed, int):
        errors.append(f"seed={cfg.seed!r} must be an integer")
    return errors


@register_validator
def _validate_grpo(cfg: DictConfig) -> list[str]:
    if cfg.algo.name != "grpo":
        return []
    a = cfg.algo
    errors: list[str] = []
    if not isinstance(a.group_size, int) or a.group_size < 2:
        errors.append(
            f"algo.group_size={a.group_size!r}: a group needs at least 2 rollouts to compare "
            "(set algo.group_size=8, for example)"
        )
    _positive(errors, cfg, "algo.num_groups", integer=True)
    _positive(errors, cfg, "algo.lr")
    _positive(errors, cfg, "algo.epochs", integer=True)
    _positive(errors, cfg, "algo.minibatches", integer=True)
    _positive(errors, cfg, "algo.clip_eps_low", strict=False)
    _positive(errors, cfg, "algo.clip_eps_high", strict=False)
    _positive(errors, cfg, "algo.beta", strict=False)
    _positive(errors, cfg, "algo.entropy_coef", strict=False)
    _positive(errors, cfg, "algo.max_grad_norm", strict=False)
    _positive(errors, cfg, "algo.ref_refresh", strict=False, integer=True)
    if isinstance(a.clip_eps_low, (int, float)) and a.clip_eps_low >= 1:
        errors.append(f"algo.clip_eps_low={a.clip_eps_low} must be < 1 (ratios are clipped to [1-eps_low, 1+eps_high])")
    if isinstance(a.gamma, (int, float)) and not 0 <= a.gamma <= 1:
        errors.append(f"algo.gamma={a.gamma} must be in [0, 1]")
    _choice(errors, cfg, "algo.group_mode", ("seed", "state", "agent", "seed_agent"))
    _choice(errors, cfg, "algo.advantage", ("outcome", "rtg"))
    _choice(errors, cfg, "algo.scale", ("group", "batch", "none"))
    _choice(errors, cfg, "algo.lr_schedule", ("constant", "linear", "cosine"))
    _choice(errors, cfg, "algo.zero_std", ("keep", "skip", "resample"))
    _choice(errors, cfg, "algo.rollout", ("batch", "stream"))
    from grpo_marl.losses import AGGREGATIONS, LOSSES

    _choice(errors, cfg, "algo.aggregation", tuple(AGGREGATIONS))
    from grpo_marl.losses import GRPOLoss

    # Only GRPO-family losses take GRPO's inputs (PPO's loss needs values and returns).
    _choice(errors, cfg, "algo.loss", tuple(k for k, v in LOSSES.items() if issubclass(v, GRPOLoss)))
    kind = cfg.get("env_kind", "gymnasium")
    if kind == "gymnasium" and a.group_mode not in ("seed", "state"):
        errors.append(
            f"algo.group_mode={a.group_mode} needs a multi-agent env; single-agent envs use seed or state"
        )
    if a.group_mode == "state" and kind == "gymnasium" and cfg.vec.vectorization == "async":
        errors.append("algo.group_mode=state needs env snapshots: use vec.vectorization=sync or auto")
    if a.get("rollout", "batch") == "stream":
        if kind != "gymnasium" or a.group_mode != "seed":
            errors.append(
                f"algo.rollout=stream streams seed groups of single-agent envs (here group_mode={a.group_mode}, "
                f"env kind {kind}); use algo.rollout=batch"
            )
        elif cfg.vec.vectorization == "async":
            errors.append("algo.rollout=stream starts members from env snapshots: use vec.vectorization=sync or auto")
    return errors


def validate(cfg: DictConfig) -> None:
    """Run every registered validator; raise one :class:`ConfigError` listing all problems."""
    from grpo_marl.algos import _load_builtin_algos

    _load_builtin_algos()  # algorithms register their own validators when imported
    errors: list[str] = []
    for fn in VALIDATORS:
        errors.extend(fn(cfg))
    if errors:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(errors))
