"""Declared type and range (or choice set) of every config key, checked before anything is built.

One table per config file: :data:`COMMON` for ``conf/config.yaml`` and one per option of the
``algo``, ``model`` and ``text`` groups. :func:`check` returns one message per bad key, each of the
form ``<dotted key>=<value> <what is wrong>; <what to write instead>``. Cross-key rules (algorithm
vs env kind, group sizes vs ``vec.num_envs``, ...) live in :mod:`grpo_marl.config`.

``tests/test_config.py`` checks that every key of every file in ``grpo_marl/conf`` and
``envs/conf`` is declared here, so a new key cannot be added without a type.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf


@dataclass(frozen=True)
class Key:
    """One key: ``kind`` is int | float | bool | str | ints (list of ints) | map | any."""

    kind: str
    lo: float | None = None  # inclusive lower bound (``gt`` for exclusive)
    gt: float | None = None
    hi: float | None = None  # inclusive upper bound (``lt`` for exclusive)
    lt: float | None = None
    choices: tuple[Any, ...] | None = None
    nullable: bool = False
    hint: str = ""  # appended to a range error: what to set instead
    #: a choice among what a registry holds *at validation time* (so user registrations count)
    registered: Callable[[], tuple[Any, ...]] | None = None

    def options(self) -> tuple[Any, ...] | None:
        """The allowed values of a choice key (None: not a choice)."""
        return self.registered() if self.registered is not None else self.choices

    def describe(self) -> str:
        options = self.options()
        if options is not None:
            return "one of " + ", ".join(_show(c) for c in options)
        if self.kind == "ints":
            return "a list of positive integers, e.g. [64, 64]"
        bounds = []
        if self.gt is not None:
            bounds.append(f"> {_num(self.gt)}")
        if self.lo is not None:
            bounds.append(f">= {_num(self.lo)}")
        if self.lt is not None:
            bounds.append(f"< {_num(self.lt)}")
        if self.hi is not None:
            bounds.append(f"<= {_num(self.hi)}")
        noun = {
            "int": "an integer",
            "float": "a number",
            "bool": "true or false",
            "str": "a string",
        }.get(self.kind, self.kind)
        text = noun + (" " + " and ".join(bounds) if bounds else "")
        return text + (" (or null)" if self.nullable else "")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def Int(lo: int | None = None, gt: int | None = None, nullable: bool = False, hint: str = "") -> Key:
    return Key("int", lo=lo, gt=gt, nullable=nullable, hint=hint)


def Float(
    lo: float | None = None,
    gt: float | None = None,
    hi: float | None = None,
    lt: float | None = None,
    nullable: bool = False,
    hint: str = "",
) -> Key:
    return Key("float", lo=lo, gt=gt, hi=hi, lt=lt, nullable=nullable, hint=hint)


def Choice(*options: Any, nullable: bool = False) -> Key:
    return Key("choice", choices=tuple(options), nullable=nullable)


def Registered(names: Callable[[], tuple[Any, ...]]) -> Key:
    """A choice among the names ``names()`` returns when the config is checked (a registry's)."""
    return Key("choice", registered=names)


def _grpo_losses() -> tuple[str, ...]:
    from grpo_marl.losses import LOSSES, GRPOLoss

    return tuple(k for k in LOSSES.names() if issubclass(LOSSES[k], GRPOLoss))


def _aggregations() -> tuple[str, ...]:
    from grpo_marl.losses import AGGREGATIONS

    return tuple(AGGREGATIONS.names())


def _group_modes() -> tuple[str, ...]:
    from grpo_marl.groups import GROUP_MODES

    GROUP_MODES.names()  # loads the entry points
    return tuple(GROUP_MODES)  # in registration order: the built-ins first, as documented


BOOL = Key("bool")
POS_INT = Int(gt=0)
NONNEG_INT = Int(lo=0)
POS = Float(gt=0)
NONNEG = Float(lo=0)
UNIT = Float(lo=0, hi=1)
SCHEDULES = Choice("constant", "linear", "cosine")

# -- conf/config.yaml ---------------------------------------------------------------------------
COMMON: dict[str, Key] = {
    "env": Key("str"),
    "env_kwargs": Key("map"),
    "seed": Int(lo=0),
    "device": Key("str"),  # auto | cpu | cuda | cuda:N, checked in grpo_marl.config
    "total_steps": POS_INT,
    "resume": Key("str", nullable=True),
    "threads": Int(lo=0, hint="0 = auto"),
    "autocast": Choice("auto", "none", "bf16"),
    "distributed.backend": Choice("auto", "gloo", "nccl"),
    "distributed.find_unused_parameters": Choice("auto", True, False),
    "vec.num_envs": Int(lo=0, hint="0 = derived from the algorithm's batch"),
    "vec.vectorization": Choice("auto", "native", "sync", "async"),
    "vec.max_steps": Int(gt=0, nullable=True, hint="null = the env's own time limit"),
    "policy.hidden": Key("ints"),
    "policy.activation": Choice("tanh", "relu", "elu", "gelu", "silu"),
    "policy.log_std_init": Float(),
    "policy.normalize_obs": BOOL,
    "policy.encoder": Choice("auto", "mlp", "cnn"),
    "env_preprocess.color_reduction": Choice("full", "R", "G", "B", nullable=True),
    "env_preprocess.resize": Key("ints", nullable=True),
    "env_preprocess.frame_stack": POS_INT,
    "env_preprocess.dtype": Choice("uint8", "float32", nullable=True),
    "env_preprocess.state_resize": Key("ints", nullable=True),
    "marl.groups": Key("map", nullable=True),
    "marl.share": Choice("group", "agent"),
    "marl.agent_id": BOOL,
    "marl.num_workers": Int(lo=-1, hint="-1 = auto, 0 = in-process"),
    "eval.episodes": POS_INT,
    "eval.final_episodes": Int(gt=0, nullable=True),
    "eval.every_steps": Int(lo=0, hint="0 = final evaluation only"),
    "eval.deterministic": BOOL,
    "eval.at_start": BOOL,
    "train.stop_on_threshold": BOOL,
    "train.threshold": Float(nullable=True),
    "log.every": POS_INT,
    "log.progress": BOOL,
    "log.tensorboard": BOOL,
    "checkpoint.every": Int(lo=0, hint="0 = only at the end"),
}

#: ``algo=ppo``, ``ippo`` and ``mappo`` are one PPO; the critic options tell them apart.
_PPO: dict[str, Key] = {
    "name": Key("str"),
    "n_envs": POS_INT,
    "n_steps": POS_INT,
    "batch_size": POS_INT,
    "minibatches": Int(lo=0, hint="0 = derived from algo.batch_size"),
    "epochs": POS_INT,
    "lr": POS,
    "lr_schedule": SCHEDULES,
    "adam_eps": POS,
    "gamma": UNIT,
    "gae_lambda": UNIT,
    "clip_eps": Float(gt=0, lt=1),
    "clip_schedule": Choice("constant", "linear"),
    "clip_vf": Float(gt=0, nullable=True),
    "vf_coef": NONNEG,
    "entropy_coef": NONNEG,
    "max_grad_norm": Float(lo=0, hint="0 = no clipping"),
    "normalize_advantage": BOOL,
    "normalize_reward": BOOL,
    "value_hidden": Key("ints", nullable=True),
    "target_kl": Float(gt=0, nullable=True),
    "critic_state": BOOL,
    "critic_time": BOOL,
    "value_norm": BOOL,
    "bootstrap_truncation": BOOL,
}

# -- conf/algo/<name>.yaml (``name`` is checked against the installed algorithms) -----------------
ALGO: dict[str, dict[str, Key]] = {
    "grpo": {
        "name": Key("str"),
        "group_mode": Registered(_group_modes),
        "rollout": Choice("batch", "stream"),
        "group_size": Int(
            lo=2,
            hint="a group needs at least 2 rollouts to compare; set algo.group_size=8, for example",
        ),
        "num_groups": POS_INT,
        "advantage": Choice("outcome", "rtg"),
        "scale": Choice("group", "batch", "none"),
        "gamma": UNIT,
        "lr": POS,
        "lr_schedule": SCHEDULES,
        "epochs": POS_INT,
        "minibatches": POS_INT,
        "clip_eps_low": Float(lo=0, lt=1, hint="ratios are clipped to [1-eps_low, 1+eps_high]"),
        "clip_eps_high": NONNEG,
        "beta": NONNEG,
        "ref_refresh": Int(lo=0, hint="0 = frozen reference"),
        "entropy_coef": NONNEG,
        "aggregation": Registered(_aggregations),
        "loss": Registered(_grpo_losses),
        "max_grad_norm": Float(lo=0, hint="0 = no clipping"),
        "adam_eps": POS,
        "zero_std": Choice("keep", "skip", "resample"),
        "max_resample": NONNEG_INT,
        "micro_batch_rows": Int(lo=0, hint="0 = the whole minibatch in one pass"),
        "minibatch_split": Choice("rows", "groups"),
        "branch_horizon": Int(lo=0, hint="0 = to the episode's end"),
        "state_reset_frac": UNIT,
        "target_kl": Float(gt=0, nullable=True),
    },
    "ppo": _PPO,
    "mappo": _PPO,
    "ippo": _PPO,
}

# -- conf/model/default.yaml and conf/text/default.yaml -----------------------------------------
MODEL: dict[str, Key] = {
    "path": Key("str", nullable=True),
    "arch": Choice("gpt2", "qwen2"),
    "hidden_size": POS_INT,
    "num_layers": POS_INT,
    "num_heads": POS_INT,
    "intermediate_size": POS_INT,
    "tie_embeddings": BOOL,
    "max_positions": POS_INT,
    "dtype": Choice("auto", "float32", "bfloat16", "float16"),
    "gradient_checkpointing": BOOL,
    "trust_remote_code": BOOL,
    "save": BOOL,
    "lora.enabled": BOOL,
    "lora.r": POS_INT,
    "lora.alpha": POS,
    "lora.dropout": Float(lo=0, lt=1),
    "lora.target_modules": Key("any"),  # peft syntax: a string or a list of module names
    "lora.save_adapter": BOOL,
}
TEXT: dict[str, Key] = {
    "max_new_tokens": Int(gt=0, nullable=True, hint="null = the task's hint"),
    "temperature": POS,
    "top_p": Float(gt=0, hi=1),
    "chat_template": Choice("auto", True, False),
    "system_prompt": Key("str", nullable=True),
    "mask_truncated": BOOL,
    "prompt_sampling": Choice("uniform", "hard"),
    "hard_floor": POS,
    "eval_prompts": Int(lo=0, hint="0 = all of them"),
    "eval_batch": POS_INT,
    "log_completions": NONNEG_INT,
    "log_completions_every": Int(lo=0, hint="0 = never"),
    "sft_steps": Int(lo=0, hint="0 = no warm start"),
    "sft_lr": POS,
    "sft_batch": POS_INT,
    "sft_weight_decay": NONNEG,
}


def declared(algo: str) -> dict[str, Key]:
    """Every dotted key of a config using ``algo`` with its declaration."""
    out = dict(COMMON)
    out.update({f"algo.{k}": v for k, v in ALGO.get(algo, {}).items()})
    out.update({f"model.{k}": v for k, v in MODEL.items()})
    out.update({f"text.{k}": v for k, v in TEXT.items()})
    return out


def check_value(key: str, value: Any, spec: Key) -> str | None:
    """The message for one bad value, or None."""
    shown = _show(value) if not isinstance(value, str) else (repr(value) if value == "" else value)
    if value is None:
        return None if spec.nullable else f"{key}=null is not allowed; it must be {spec.describe()}"
    what = f"{key}={shown}"
    if spec.kind == "any":
        return None
    choices = spec.options()
    if choices is not None:
        if any(value == c and isinstance(value, bool) == isinstance(c, bool) for c in choices):
            return None
        options = ", ".join(_show(c) for c in choices)
        return f"{what} is not valid; choose one of {options}"
    if spec.kind == "bool":
        return None if isinstance(value, bool) else f"{what} must be true or false"
    if spec.kind == "str":
        return None if isinstance(value, str) and value else f"{what} must be a non-empty string"
    if spec.kind == "map":
        return None if isinstance(value, (dict, DictConfig)) else f"{what} must be a mapping ({{key: value}})"
    if spec.kind == "ints":
        items = list(value) if isinstance(value, (list, tuple, ListConfig)) else None
        if items is None or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in items):
            return f"{what} must be {spec.describe()}"
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        noun = "an integer" if spec.kind == "int" else "a number"
        return f"{what} must be {noun}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{what} must be a finite number"
    if spec.kind == "int" and int(value) != value:
        return f"{what} must be an integer"
    bad = (
        (spec.gt is not None and not value > spec.gt)
        or (spec.lo is not None and not value >= spec.lo)
        or (spec.lt is not None and not value < spec.lt)
        or (spec.hi is not None and not value <= spec.hi)
    )
    if not bad:
        return None
    return f"{what} must be {_range(spec)}" + (f" ({spec.hint})" if spec.hint else "")


def _range(spec: Key) -> str:
    if spec.lo is not None and spec.hi is not None:
        return f"in [{_num(spec.lo)}, {_num(spec.hi)}]"
    parts = []
    for bound, sign in (
        (spec.gt, ">"),
        (spec.lo, ">="),
        (spec.lt, "<"),
        (spec.hi, "<="),
    ):
        if bound is not None:
            parts.append(f"{sign} {_num(bound)}")
    return " and ".join(parts)


def check(cfg: DictConfig) -> dict[str, str]:
    """``{dotted key: message}`` for every declared key whose value has the wrong type or range."""
    algo = OmegaConf.select(cfg, "algo.name")
    problems: dict[str, str] = {}
    for key, spec in declared(str(algo)).items():
        node = OmegaConf.select(cfg, key, default="__absent__", throw_on_missing=False)
        if isinstance(node, str) and node == "__absent__":
            continue  # sections a config may lack (e.g. built without the text group)
        value = OmegaConf.to_container(node) if isinstance(node, (DictConfig, ListConfig)) else node
        message = check_value(key, value, spec)
        if message:
            problems[key] = message
    return problems
